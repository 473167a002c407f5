"""A small on-disk cache for expensive, deterministic results (meta traces, parameter statistics).

Pure library code: nothing here imports torch or transformers, so ``import advisor.cache`` costs
milliseconds. The caller builds the key (a JSON-able dict) and adds ``library_versions()`` to it. The face,
``advisor cache info|clear``, is ``advisor.cache_face``.

Layout and format (``format`` 1)::

    <cache_dir()>/<namespace>/<sha256 hex>      one entry per file, 64 lowercase hex characters
    <cache_dir()>/<namespace>/.tmp-*            a write in progress (or left by a crash)

The file name is the sha256 of the canonical JSON (``sort_keys=True, separators=(",", ":")``) of
``{"namespace": namespace, "key": key}``. The file holds the zlib-compressed (level 6, RFC 1950)
UTF-8 JSON of ``{"format": 1, "namespace": namespace, "key": key, "value": value}``; read one with
``python -c "import sys, zlib; print(zlib.decompress(open(sys.argv[1], 'rb').read()).decode())" FILE``.
Compression because traces are long lists of similar integers: a llama-2-70b activation profile
(4 timelines) measured 158,344 bytes of JSON and 11,439 bytes compressed.

Robustness:

* Writes are atomic: a temp file in the entry's directory, flushed and ``os.fsync``-ed, then
  ``os.replace``-d onto the final name. Readers see the old entry, the new one or none, never a
  partial file; concurrent writers of one key (threads or processes) all succeed, the last rename wins.
* A file that cannot be read, decoded, has an unknown ``format`` or stores another key is a miss
  and is deleted, so the next ``put`` rewrites it.
* LRU: a hit sets the entry's mtime to now; after each ``put`` the least-recently-used entries
  (oldest mtime first, across all namespaces) are deleted until the total is at most ``max_bytes``.
  Temp files older than an hour (a crashed writer's) are deleted at the same time.
* I/O trouble (missing or read-only directory, a file where the directory should be, disk full,
  permissions) never raises: a failed read is a miss, a failed write is skipped. Bad arguments
  (a namespace outside ``[a-z0-9_-]+``, a key or value that is not JSON) raise ``ValueError`` or
  ``TypeError``.
* Only names the cache itself makes (64-hex entries and ``.tmp-*`` files inside namespace-named
  folders) are ever deleted, so pointing ``ADVISOR_CACHE_DIR`` at a folder with other files is safe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import tempfile
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
# 512 MiB, in bytes. Entries are small: a llama-2-70b activation profile (`profile_activations`,
# autocast, flash: 4 timelines, micro-batch 2 and 3 at depth 1 and 2), as `dataclasses.asdict` JSON,
# measured 158,344 bytes, 11,439 bytes on disk after zlib. So the cap holds ~45,000 such entries, or
# a hundred-plus models even at "a few MiB" of traces per model, and stays small next to ~/.cache.
DEFAULT_MAX_BYTES = 512 * 2**20
STALE_TMP_SECONDS = 3600  # a temp file older than this belongs to a crashed writer
TMP_PREFIX = ".tmp-"
COMPRESS_LEVEL = 6

_NAMESPACE = re.compile(r"[a-z0-9_-]+")
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
_VERSIONED = ("torch", "transformers", "torchvision", "peft", "advisor")

JSONValue = dict | list  # what get returns on a hit (top level)
JSONKey = Mapping[str, object]  # a key: a JSON object (a dict at run time)
JSONInput = Mapping[str, object] | Sequence[object]  # what put stores: a dict or a list at run time


def cache_dir() -> Path:
    """The cache directory: ``$ADVISOR_CACHE_DIR`` if set and non-empty, else
    ``$XDG_CACHE_HOME/advisor`` if XDG_CACHE_HOME is set, non-empty and absolute (the XDG Base
    Directory spec says to ignore a relative one), else ``~/.cache/advisor``. Not created here."""
    explicit = os.environ.get("ADVISOR_CACHE_DIR", "")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "advisor"
    try:
        home = Path.home()
    except (RuntimeError, KeyError):  # no HOME and no passwd entry
        return Path(tempfile.gettempdir()) / f"advisor-cache-{os.getuid() if hasattr(os, 'getuid') else 0}"
    return home / ".cache" / "advisor"


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str], ...]:
    import importlib.metadata  # lazy: about 40 ms of imports (email, zipfile) that a cache hit never needs

    out = []
    for name in _VERSIONED:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "none"
        except (OSError, ValueError):  # an unreadable dist-info: unknown, but never raise
            version = "unknown"
        out.append((name, version if isinstance(version, str) and version else "unknown"))
    return tuple(out)


def library_versions() -> dict[str, str]:
    """Installed versions of torch, transformers, torchvision and advisor, from package metadata
    (``importlib.metadata.version``; no import of the packages), ``"none"`` for one not installed.
    Read once per process (about 40 ms the first time, then free); returns a fresh dict."""
    return dict(_versions())


def _check_json(obj: object, what: str, depth: int = 0) -> None:
    """Raise unless ``obj`` round-trips through JSON unchanged (up to tuples becoming lists):
    dict keys must be ``str`` (json would turn 1 into "1" and collide it with "1"), floats finite."""
    if depth > 200:
        raise ValueError(f"{what} is nested more than 200 levels deep")
    if obj is None or isinstance(obj, (str, bool, int)):
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"{what} contains {obj!r}, which JSON cannot represent")
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"{what} has a dict key {k!r} of type {type(k).__name__}; JSON keys must be str")
            _check_json(v, what, depth + 1)
        return
    if isinstance(obj, (list, tuple)):
        for v in obj:
            _check_json(v, what, depth + 1)
        return
    raise TypeError(
        f"{what} contains {type(obj).__name__} {obj!r:.60}, which is not JSON "
        "(use dict, list, str, int, float, bool or None)"
    )


def _check_namespace(namespace: str) -> None:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
    if not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} must match [a-z0-9_-]+")


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def entry_name(namespace: str, key: JSONKey) -> str:
    """The file name of ``key``'s entry: sha256 hex of the canonical JSON of
    ``{"namespace": namespace, "key": key}``.

    Raises:
        ValueError: bad namespace, or a non-finite float in ``key``.
        TypeError: ``key`` is not a dict or contains something that is not JSON.
    """
    _check_namespace(namespace)
    if not isinstance(key, dict):
        raise TypeError(f"key must be a dict, got {type(key).__name__}")
    _check_json(key, "key")
    return hashlib.sha256(_canonical({"namespace": namespace, "key": key}).encode()).hexdigest()


def _unlink(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _touch(target: int | Path) -> None:
    """Set mtime (and atime) to ``time.time_ns()``: one fine-grained clock for writes and hits, so
    LRU order is right even for operations a few microseconds apart (the kernel's file timestamps
    are coarser, a few ms). Best effort: a read-only file or filesystem keeps its old time."""
    now = time.time_ns()
    try:
        os.utime(target, ns=(now, now))
    except (OSError, NotImplementedError):
        pass


@dataclass(frozen=True)
class CacheInfo:
    """What a cache holds. ``total_bytes``/``max_bytes`` and the per-namespace bytes are bytes on
    disk of the entries (temp files not counted); ``by_namespace``: namespace -> (entries, bytes)."""

    directory: Path
    entries: int
    total_bytes: int
    max_bytes: int
    by_namespace: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class _Entry:
    path: Path
    namespace: str
    size: int  # bytes
    mtime_ns: int


class DiskCache:
    """The on-disk cache (see the module docstring). Safe to share between threads and processes.

    Args:
        directory: where entries live; default ``cache_dir()``. Created on the first ``put``.
        max_bytes: cap on the total size of entries, in bytes (>= 0); default ``DEFAULT_MAX_BYTES``.

    Raises:
        ValueError: ``max_bytes`` is negative.
        TypeError: ``max_bytes`` is not an int.
    """

    def __init__(self, directory: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(f"max_bytes must be an int (bytes), got {type(max_bytes).__name__}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.directory = Path(directory) if directory is not None else cache_dir()
        self.max_bytes = max_bytes

    def __repr__(self) -> str:
        return f"DiskCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    def path_for(self, namespace: str, key: JSONKey) -> Path:
        """Where ``key``'s entry lives (whether or not it exists). Raises as ``entry_name``."""
        return self.directory / namespace / entry_name(namespace, key)

    # ---- reading -----------------------------------------------------------------------------

    def get(self, namespace: str, key: JSONKey) -> JSONValue | None:
        """The value stored under ``key`` in ``namespace``, or None (a miss: absent, unreadable,
        corrupt, another key, unknown format). A hit marks the entry as recently used.

        Raises:
            ValueError, TypeError: bad namespace or key (as ``entry_name``); never for I/O trouble.
        """
        path = self.path_for(namespace, key)
        want_key = _canonical(key)
        try:
            with open(path, "rb") as f:
                ino = os.fstat(f.fileno()).st_ino
                blob = f.read()
        except OSError:
            return None
        try:
            record = json.loads(zlib.decompress(blob).decode("utf-8"))
            ok = (
                isinstance(record, dict)
                and record.get("format") == FORMAT
                and record.get("namespace") == namespace
                and "value" in record
                and isinstance(record["value"], (dict, list))
                and _canonical(record.get("key")) == want_key
            )
        except (zlib.error, ValueError, TypeError, RecursionError):
            ok = False
        if not ok:
            self._drop_if_same(path, ino)
            return None
        _touch(path)  # read-only cache: still a hit, just not recorded as recently used
        return record["value"]

    @staticmethod
    def _drop_if_same(path: Path, ino: int) -> None:
        """Delete a bad entry unless a writer has just replaced it with a new file."""
        try:
            if os.stat(path).st_ino == ino:
                os.unlink(path)
        except OSError:
            pass

    # ---- writing -----------------------------------------------------------------------------

    def put(self, namespace: str, key: JSONKey, value: JSONInput) -> None:
        """Store ``value`` (a JSON-able dict or list) under ``key``, then evict least-recently-used
        entries until the total is at most ``max_bytes``. An entry larger than ``max_bytes`` on its
        own is not stored (and an older entry of that key is removed). I/O failures are skipped silently.

        Raises:
            ValueError: bad namespace; a non-finite float in ``key`` or ``value``.
            TypeError: ``key`` not a dict, ``value`` not a dict or list, or either holds non-JSON.
        """
        path = self.path_for(namespace, key)
        if not isinstance(value, (dict, list)):
            raise TypeError(f"value must be a dict or a list, got {type(value).__name__}")
        _check_json(value, "value")
        record = {"format": FORMAT, "namespace": namespace, "key": key, "value": value}
        blob = zlib.compress(json.dumps(record, separators=(",", ":"), allow_nan=False).encode("utf-8"), COMPRESS_LEVEL)
        if len(blob) > self.max_bytes:
            _unlink(path)  # never leave an older value of this key behind
            return
        if self._write_atomic(path, blob):
            self._evict(keep=path)

    @staticmethod
    def _write_atomic(path: Path, blob: bytes) -> bool:
        """Write ``blob`` to ``path`` via a temp file + fsync + ``os.replace``; False on any OSError."""
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                _touch(f.fileno())
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
            return True
        except OSError:
            return False
        finally:
            if tmp is not None:  # failed (or interrupted) before the rename: leave nothing behind
                _unlink(Path(tmp))

    # ---- scanning, eviction ------------------------------------------------------------------

    def _scan(self) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """(namespace, dir entry) for every file in a namespace folder; nothing on I/O trouble."""
        try:
            with os.scandir(self.directory) as top:
                namespaces = [d for d in top if _NAMESPACE.fullmatch(d.name) and d.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for ns in namespaces:
            try:
                with os.scandir(ns.path) as files:
                    found = list(files)
            except OSError:
                continue
            for f in found:
                yield ns.name, f

    def _entries(self, stale_before_ns: int | None = None) -> list[_Entry]:
        """Every entry file; with ``stale_before_ns``, also delete temp files older than that."""
        out: list[_Entry] = []
        for ns, f in self._scan():
            try:
                if f.name.startswith(TMP_PREFIX):
                    if stale_before_ns is not None and f.stat(follow_symlinks=False).st_mtime_ns < stale_before_ns:
                        _unlink(Path(f.path))
                    continue
                if not _ENTRY_NAME.fullmatch(f.name) or not f.is_file(follow_symlinks=False):
                    continue
                st = f.stat(follow_symlinks=False)
            except OSError:  # vanished under us (another process evicted it)
                continue
            out.append(_Entry(Path(f.path), ns, st.st_size, st.st_mtime_ns))
        return out

    def _evict(self, keep: Path) -> None:
        """Delete stale temp files, then LRU entries (never ``keep``) until total <= ``max_bytes``."""
        entries = self._entries(stale_before_ns=time.time_ns() - STALE_TMP_SECONDS * 10**9)
        total = sum(e.size for e in entries)
        if total <= self.max_bytes:
            return
        for e in sorted(entries, key=lambda e: (e.mtime_ns, e.path.name)):
            if total <= self.max_bytes:
                break
            if e.path == keep:
                continue
            _unlink(e.path)  # counted as gone even if another process deleted it first
            total -= e.size

    # ---- info, clear -------------------------------------------------------------------------

    def info(self) -> CacheInfo:
        """Entry counts and bytes on disk, in total and per namespace (never raises for I/O)."""
        by_ns: dict[str, tuple[int, int]] = {}
        for e in self._entries():
            n, b = by_ns.get(e.namespace, (0, 0))
            by_ns[e.namespace] = (n + 1, b + e.size)
        return CacheInfo(
            directory=self.directory,
            entries=sum(n for n, _ in by_ns.values()),
            total_bytes=sum(b for _, b in by_ns.values()),
            max_bytes=self.max_bytes,
            by_namespace=dict(sorted(by_ns.items())),
        )

    def clear(self) -> int:
        """Delete every entry and temp file (the folders stay); returns the number of entries deleted."""
        removed = 0
        for _, f in self._scan():
            if f.name.startswith(TMP_PREFIX):
                _unlink(Path(f.path))
            elif _ENTRY_NAME.fullmatch(f.name) and _unlink(Path(f.path)):
                removed += 1
        return removed


class NullCache:
    """The cache of ``--no-cache``: ``get`` always misses, ``put`` stores nothing, nothing touches
    the disk. Arguments are still checked, so code that works with it works with ``DiskCache``."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else cache_dir()
        self.max_bytes = 0

    def __repr__(self) -> str:
        return "NullCache()"

    def get(self, namespace: str, key: JSONKey) -> JSONValue | None:
        """Always None. Raises ``ValueError``/``TypeError`` for a bad namespace or key."""
        entry_name(namespace, key)
        return None

    def put(self, namespace: str, key: JSONKey, value: JSONInput) -> None:
        """Does nothing. Raises ``ValueError``/``TypeError`` for bad arguments, as ``DiskCache.put``."""
        entry_name(namespace, key)
        if not isinstance(value, (dict, list)):
            raise TypeError(f"value must be a dict or a list, got {type(value).__name__}")
        _check_json(value, "value")

    def info(self) -> CacheInfo:
        """An empty cache (0 entries, 0 bytes, cap 0) at ``directory``."""
        return CacheInfo(directory=self.directory, entries=0, total_bytes=0, max_bytes=0, by_namespace={})

    def clear(self) -> int:
        """Deletes nothing; returns 0."""
        return 0


def open_cache(enabled: bool = True) -> DiskCache | NullCache:
    """``DiskCache()`` at ``cache_dir()`` with the default cap, or ``NullCache()`` when not ``enabled``."""
    return DiskCache() if enabled else NullCache()
