"""advisor.cache: hits and misses, corrupt entries, atomic and concurrent writes, LRU eviction,
I/O trouble, the cache directory, and the `advisor cache info|clear` face."""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from advisor import cache as cache_mod
from advisor.cache import (
    DEFAULT_MAX_BYTES,
    CacheInfo,
    DiskCache,
    NullCache,
    cache_dir,
    entry_name,
    library_versions,
    open_cache,
)
from advisor.cache_face import main

ROOT = Path(__file__).resolve().parents[1]
KEY = {
    "model": "llama-2-70b",
    "micro_batch": 2,
    "mode": "autocast",
    "checkpointing": False,
    "tp": 8,
    "seq_len": 4096.0,
    "layers": [1, 2],
    "versions": {"torch": "2.14.1", "advisor": "0.1.0"},
}
VALUE = {
    "fwd": [[1, 2, 3], [4, 5, 6]],
    "activations": 123456789,
    "flops": 1.5e15,
    "label": "flash",
    "ok": True,
    "none": None,
    "nested": {"a": [{"b": -1}]},
}


def entry_files(directory: Path) -> list[Path]:
    """Every file under ``directory`` (entries and temp files), sorted."""
    return sorted(p for p in directory.rglob("*") if p.is_file())


def big_value(n: int = 20_000) -> dict:
    """A deterministic value of ``n`` rows, about 30 bytes of JSON each (the same in every process)."""
    return {"rows": [[i, i * 0.5, f"op{i % 97}"] for i in range(n)], "n": n}


def write_raw(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zlib.compress(json.dumps(record).encode()))


# ---- hits and misses ---------------------------------------------------------------------------


def test_hit_returns_exactly_the_stored_value(tmp_path):
    c = DiskCache(tmp_path)
    assert c.get("trace", KEY) is None
    c.put("trace", KEY, VALUE)
    got = c.get("trace", KEY)
    assert got == VALUE
    assert type(got["activations"]) is int and type(got["flops"]) is float and got["ok"] is True
    # a fresh instance (another process, later) sees it too; key order does not matter
    assert DiskCache(tmp_path).get("trace", dict(reversed(list(KEY.items())))) == VALUE
    assert DiskCache(tmp_path).put("trace", KEY, [1, 2]) is None
    assert DiskCache(tmp_path).get("trace", KEY) == [1, 2]  # overwritten


@pytest.mark.parametrize("field", sorted(KEY))
def test_every_changed_key_field_is_a_miss(tmp_path, field):
    c = DiskCache(tmp_path)
    c.put("trace", KEY, VALUE)
    changed = dict(KEY)
    old = KEY[field]
    change = {
        str: lambda v: v + "x",
        bool: lambda v: not v,
        int: lambda v: v + 1,
        float: lambda v: v + 0.5,
        list: lambda v: v + [3],
        dict: lambda v: {**v, "torch": "2.15.0"},
    }
    changed[field] = change[type(old)](old)
    assert changed != KEY
    assert c.get("trace", changed) is None
    dropped = {k: v for k, v in KEY.items() if k != field}
    assert c.get("trace", dropped) is None
    assert c.get("trace", KEY) == VALUE


def test_type_changes_and_other_namespace_are_misses(tmp_path):
    c = DiskCache(tmp_path)
    c.put("trace", {"n": 1}, VALUE)
    assert c.get("trace", {"n": 1.0}) is None  # 1 and 1.0 are different JSON
    assert c.get("trace", {"n": True}) is None
    assert c.get("trace", {"n": "1"}) is None
    assert c.get("params", {"n": 1}) is None
    assert c.get("trace", {"n": 1}) == VALUE


def test_file_name_and_on_disk_format(tmp_path):
    c = DiskCache(tmp_path)
    c.put("trace", KEY, VALUE)
    canonical = json.dumps({"namespace": "trace", "key": KEY}, sort_keys=True, separators=(",", ":"))
    name = hashlib.sha256(canonical.encode()).hexdigest()
    assert entry_name("trace", KEY) == name
    assert entry_files(tmp_path) == [tmp_path / "trace" / name]
    record = json.loads(zlib.decompress((tmp_path / "trace" / name).read_bytes()))
    assert record == {"format": 1, "namespace": "trace", "key": KEY, "value": VALUE}


def test_bad_arguments_raise(tmp_path):
    c = DiskCache(tmp_path)
    for ns in ["", "Trace", "a/b", "../x", "a.b", "tr ace"]:
        with pytest.raises(ValueError):
            c.put(ns, KEY, VALUE)
        with pytest.raises(ValueError):
            c.get(ns, KEY)
    with pytest.raises(TypeError):
        c.put("trace", KEY, {"s": {1, 2}})
    with pytest.raises(TypeError):
        c.put("trace", KEY, {1: "int key would become '1'"})
    with pytest.raises(TypeError):
        c.put("trace", KEY, "not a dict or list")
    with pytest.raises(TypeError):
        c.get("trace", {"obj": object()})
    with pytest.raises(TypeError):
        c.get("trace", ["not", "a", "dict"])
    with pytest.raises(ValueError):
        c.put("trace", KEY, {"x": float("nan")})
    with pytest.raises(ValueError):
        c.get("trace", {"x": float("inf")})
    with pytest.raises(ValueError):
        DiskCache(tmp_path, max_bytes=-1)
    assert entry_files(tmp_path) == []


# ---- corrupt entries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage", ["garbage", "truncated", "empty", "other_key", "unknown_format", "not_json", "no_value"]
)
def test_corrupt_entry_is_a_miss_deleted_and_rewritten(tmp_path, damage):
    c = DiskCache(tmp_path)
    c.put("trace", KEY, VALUE)
    path = c.path_for("trace", KEY)
    good = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(os.urandom(300))
    elif damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other_key":
        write_raw(path, {"format": 1, "namespace": "trace", "key": {**KEY, "tp": 4}, "value": {"wrong": 1}})
    elif damage == "unknown_format":
        write_raw(path, {"format": 2, "namespace": "trace", "key": KEY, "value": VALUE})
    elif damage == "not_json":
        path.write_bytes(zlib.compress(b'{"format": 1, "key": '))
    elif damage == "no_value":
        write_raw(path, {"format": 1, "namespace": "trace", "key": KEY})
    assert c.get("trace", KEY) is None
    assert not path.exists()
    c.put("trace", KEY, VALUE)
    assert path.read_bytes() == good
    assert c.get("trace", KEY) == VALUE


# ---- atomic writes -----------------------------------------------------------------------------


def test_crash_in_replace_leaves_no_entry_and_no_partial_file(tmp_path, monkeypatch):
    c = DiskCache(tmp_path)
    seen: list[bytes] = []

    def crash(src, dst):
        seen.append(Path(src).read_bytes())  # the temp file was complete and fsynced
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "replace", crash)
    c.put("trace", KEY, VALUE)  # no exception
    assert len(seen) == 1 and json.loads(zlib.decompress(seen[0]))["value"] == VALUE
    assert entry_files(tmp_path) == []  # neither the entry nor the temp file
    assert c.get("trace", KEY) is None
    monkeypatch.undo()
    c.put("trace", KEY, VALUE)
    assert c.get("trace", KEY) == VALUE


def test_interrupt_in_replace_keeps_the_old_entry(tmp_path, monkeypatch):
    c = DiskCache(tmp_path)
    c.put("trace", KEY, VALUE)

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_mod.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):  # not an I/O error: propagates, but cleans up first
        c.put("trace", KEY, {"new": 1})
    monkeypatch.undo()
    assert entry_files(tmp_path) == [c.path_for("trace", KEY)]
    assert c.get("trace", KEY) == VALUE


def test_crash_in_write_and_fsync_is_skipped(tmp_path, monkeypatch):
    c = DiskCache(tmp_path)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_mod.os, "fsync", full)
    c.put("trace", KEY, VALUE)
    assert entry_files(tmp_path) == []
    assert c.get("trace", KEY) is None


def test_stale_temp_files_are_removed_on_put_and_ignored_by_info(tmp_path):
    c = DiskCache(tmp_path)
    (tmp_path / "trace").mkdir()
    old, young = tmp_path / "trace" / ".tmp-crashed", tmp_path / "trace" / ".tmp-inflight"
    old.write_bytes(b"partial")
    young.write_bytes(b"partial")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert c.info().entries == 0 and c.info().total_bytes == 0
    c.put("params", {"n": 1}, VALUE)
    assert not old.exists()
    assert young.exists()  # maybe another process's write in progress
    assert c.get("params", {"n": 1}) == VALUE


# ---- concurrency -------------------------------------------------------------------------------


def _readers(c: DiskCache, value: dict, stop: threading.Event, n: int = 3):
    """Start ``n`` reader threads; returns (threads, results) with results[i] = (hits, misses, bad)."""
    results = [[0, 0, 0] for _ in range(n)]

    def read(i):
        while True:
            done = stop.is_set()
            got = c.get("trace", {"big": 1})
            results[i][0 if got == value else 1 if got is None else 2] += 1
            if done:
                return

    threads = [threading.Thread(target=read, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def _assert_one_valid_entry(directory: Path, c: DiskCache, value: dict) -> None:
    files = entry_files(directory)
    assert [f.name for f in files] == [entry_name("trace", {"big": 1})]
    assert c.get("trace", {"big": 1}) == value


def test_eight_threads_write_one_key_while_readers_read(tmp_path):
    c = DiskCache(tmp_path)
    value = big_value()
    stop = threading.Event()
    readers, results = _readers(c, value, stop)

    def write() -> list[bool]:
        hits = []
        for _ in range(2):
            DiskCache(tmp_path).put("trace", {"big": 1}, value)
            hits.append(DiskCache(tmp_path).get("trace", {"big": 1}) == value)
        return hits

    with ThreadPoolExecutor(8) as pool:
        writers = [pool.submit(write) for _ in range(8)]
        writer_hits = [hit for w in writers for hit in w.result()]  # re-raises a writer's exception
    stop.set()
    for t in readers:
        t.join()
    assert writer_hits == [True] * 16
    assert all(bad == 0 for _, _, bad in results), results
    assert all(hits >= 1 for hits, _, _ in results), results  # the last read of each reader hits
    _assert_one_valid_entry(tmp_path, c, value)


WRITER = """
import sys
from pathlib import Path
from advisor.cache import DiskCache
n = int(sys.argv[2])
value = {"rows": [[i, i * 0.5, f"op{i % 97}"] for i in range(n)], "n": n}
for _ in range(4):
    c = DiskCache(Path(sys.argv[1]))
    c.put("trace", {"big": 1}, value)
    assert c.get("trace", {"big": 1}) == value, "own write not readable"
print("ok")
"""


def test_four_processes_write_one_key_while_readers_read(tmp_path):
    c = DiskCache(tmp_path)
    n = 30_000  # about 0.8 MiB of JSON
    value = big_value(n)
    stop = threading.Event()
    readers, results = _readers(c, value, stop)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(n)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    stop.set()
    for t in readers:
        t.join()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "ok", err
    assert all(bad == 0 for _, _, bad in results), results
    assert all(hits >= 1 for hits, _, _ in results), results
    _assert_one_valid_entry(tmp_path, c, value)


# ---- eviction ----------------------------------------------------------------------------------


def test_lru_evicts_least_recently_used_not_least_recently_written(tmp_path):
    value = {"blob": "x" * 1000}
    probe = DiskCache(tmp_path / "probe")
    probe.put("trace", {"i": 0}, value)
    size = probe.info().total_bytes
    assert 0 < size < 200  # compressed
    c = DiskCache(tmp_path / "c", max_bytes=3 * size + size // 2)  # room for 3 entries
    for i in (1, 2, 3):
        c.put("trace", {"i": i}, value)
    assert c.info().entries == 3
    assert c.get("trace", {"i": 1}) == value  # 1 is now the most recently used; 2 is the LRU
    c.put("params", {"i": 4}, value)  # eviction is across namespaces
    info = c.info()
    assert info.total_bytes <= c.max_bytes and info.entries == 3
    assert c.get("trace", {"i": 2}) is None
    assert c.get("params", {"i": 4}) == value
    assert c.get("trace", {"i": 1}) == value
    assert c.get("trace", {"i": 3}) == value
    # now 4, 1, 3 were read in that order: 4 (the newest write) is the LRU
    c.put("trace", {"i": 5}, value)
    assert c.get("params", {"i": 4}) is None
    assert [c.get("trace", {"i": i}) == value for i in (1, 3, 5)] == [True, True, True]
    assert c.info().total_bytes <= c.max_bytes


def test_entry_larger_than_the_cap_is_not_stored(tmp_path):
    c = DiskCache(tmp_path, max_bytes=500)
    c.put("trace", {"i": 1}, {"small": 1})
    c.put("trace", {"i": 2}, {"small": 2})
    assert c.info().entries == 2
    c.put("trace", {"i": 1}, {"big": os.urandom(2000).hex()})  # alone > 500 bytes even compressed
    assert c.get("trace", {"i": 1}) is None  # neither stored nor the old value left behind
    assert c.get("trace", {"i": 2}) == {"small": 2}  # others not evicted for it
    assert c.info().entries == 1


def test_eviction_keeps_the_entry_just_written_even_if_oldest(tmp_path, monkeypatch):
    value = {"blob": "y" * 500}
    c = DiskCache(tmp_path, max_bytes=10**6)
    c.put("trace", {"i": 1}, value)
    c.put("trace", {"i": 2}, value)
    size = c.info().total_bytes // 2
    past_ns = time.time_ns() - 1000 * 10**9
    monkeypatch.setattr(cache_mod.time, "time_ns", lambda: past_ns)  # a clock gone backwards
    small = DiskCache(tmp_path, max_bytes=size + size // 2)  # room for one entry
    small.put("trace", {"i": 3}, value)
    monkeypatch.undo()
    assert small.path_for("trace", {"i": 3}).stat().st_mtime_ns == past_ns  # the oldest entry by mtime
    assert [f.name for f in entry_files(tmp_path)] == [entry_name("trace", {"i": 3})]
    assert small.get("trace", {"i": 3}) == value


# ---- NullCache, open_cache ---------------------------------------------------------------------


def test_null_cache_neither_reads_nor_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "c"))
    disk = open_cache(True)
    assert isinstance(disk, DiskCache) and disk.directory == tmp_path / "c"
    disk.put("trace", KEY, VALUE)
    before = entry_files(tmp_path / "c")
    null = open_cache(enabled=False)
    assert isinstance(null, NullCache)
    assert null.get("trace", KEY) is None  # the entry is there, but not read
    null.put("trace", {"other": 1}, VALUE)
    assert null.get("trace", {"other": 1}) is None
    assert null.clear() == 0
    assert entry_files(tmp_path / "c") == before
    assert null.info() == CacheInfo(tmp_path / "c", 0, 0, 0, {})
    with pytest.raises(ValueError):
        null.put("Bad", KEY, VALUE)

    fresh = tmp_path / "fresh"
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(fresh))
    NullCache().put("trace", KEY, VALUE)
    assert not fresh.exists()


# ---- I/O trouble -------------------------------------------------------------------------------


def test_directory_that_is_a_regular_file_gives_misses(tmp_path):
    f = tmp_path / "file"
    f.write_text("not a directory")
    for directory in (f, f / "below"):
        c = DiskCache(directory)
        c.put("trace", KEY, VALUE)
        assert c.get("trace", KEY) is None
        assert c.info().entries == 0 and c.clear() == 0
    assert f.read_text() == "not a directory"


def test_missing_directory_is_created_on_put_only(tmp_path):
    d = tmp_path / "a" / "b"
    c = DiskCache(d)
    assert c.get("trace", KEY) is None and c.info().entries == 0 and c.clear() == 0
    assert not d.exists()
    c.put("trace", KEY, VALUE)
    assert c.get("trace", KEY) == VALUE


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory_gives_misses_and_hits(tmp_path):
    c = DiskCache(tmp_path / "c")
    c.put("trace", {"n": 1}, VALUE)
    for d in (tmp_path / "c" / "trace", tmp_path / "c"):
        d.chmod(0o555)
    try:
        c.put("trace", {"n": 2}, VALUE)
        assert c.get("trace", {"n": 2}) is None
        assert c.get("trace", {"n": 1}) == VALUE  # readable entries still hit
        assert c.clear() == 0
    finally:
        for d in (tmp_path / "c", tmp_path / "c" / "trace"):
            d.chmod(0o755)


def test_permission_errors_are_misses_and_skipped_writes(tmp_path, monkeypatch):
    """What a read-only cache looks like, also when running as root: every write call fails."""
    c = DiskCache(tmp_path)
    c.put("trace", {"n": 1}, VALUE)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    for name in ("utime", "unlink"):
        monkeypatch.setattr(cache_mod.os, name, denied)
    monkeypatch.setattr(cache_mod.tempfile, "mkstemp", denied)
    c.put("trace", {"n": 2}, VALUE)
    assert c.get("trace", {"n": 2}) is None
    assert c.get("trace", {"n": 1}) == VALUE  # a hit even though its mtime cannot be updated
    c.path_for("trace", {"n": 1}).write_bytes(b"junk")
    assert c.get("trace", {"n": 1}) is None  # corrupt: a miss even though it cannot be deleted
    assert c.clear() == 0
    monkeypatch.setattr(cache_mod, "open", denied, raising=False)
    assert c.get("trace", {"n": 1}) is None


# ---- cache_dir, library_versions, import cost --------------------------------------------------


def test_cache_dir_env_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ADVISOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == tmp_path / "home" / ".cache" / "advisor"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_dir() == tmp_path / "home" / ".cache" / "advisor"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert cache_dir() == tmp_path / "home" / ".cache" / "advisor"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "advisor"
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"
    assert DiskCache().directory == tmp_path / "explicit"
    assert DiskCache().max_bytes == DEFAULT_MAX_BYTES == 512 * 2**20


def test_library_versions(monkeypatch):
    import importlib.metadata

    v = library_versions()
    assert set(v) == {"torch", "transformers", "torchvision", "peft", "advisor"}
    assert v["torch"] == importlib.metadata.version("torch")
    assert v["advisor"] == importlib.metadata.version("advisor")
    v["torch"] = "changed"
    assert library_versions()["torch"] != "changed"  # a fresh dict each call

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    cache_mod._versions.cache_clear()
    monkeypatch.setattr(importlib.metadata, "version", missing)
    try:
        assert library_versions() == dict.fromkeys(["torch", "transformers", "torchvision", "peft", "advisor"], "none")
    finally:
        monkeypatch.undo()
        cache_mod._versions.cache_clear()
    assert library_versions()["torch"] == importlib.metadata.version("torch")


def test_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import advisor.cache; t = time.perf_counter() - t; "
        "print(sorted(m for m in ('torch', 'transformers', 'torchvision', 'numpy') if m in sys.modules), t)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    heavy, seconds = out.stdout.split("]")
    assert heavy + "]" == "[]", out.stderr
    assert float(seconds) < 0.5  # measured 40-50 ms cold here (dataclasses, tempfile, hashlib)


# ---- the face ----------------------------------------------------------------------------------


def test_face_info_json_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path))
    c = DiskCache()
    for i in range(3):
        c.put("trace", {"i": i}, VALUE)
    c.put("params", {"i": 0}, VALUE)
    (tmp_path / "trace" / ".tmp-inflight").write_bytes(b"x")
    (tmp_path / "README").write_text("not ours")
    sizes = {
        ns: sum(p.stat().st_size for p in (tmp_path / ns).iterdir() if not p.name.startswith("."))
        for ns in ("trace", "params")
    }

    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == {
        "directory": str(tmp_path),
        "entries": 4,
        "total_bytes": sizes["trace"] + sizes["params"],
        "max_bytes": DEFAULT_MAX_BYTES,
        "by_namespace": {
            "params": {"entries": 1, "bytes": sizes["params"]},
            "trace": {"entries": 3, "bytes": sizes["trace"]},
        },
    }

    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cache directory: {tmp_path}"
    assert lines[1] == "entries: 4, 0.00 MiB of 512.00 MiB cap"
    assert lines[2:] == ["  params: 1 entry, 0.00 MiB", "  trace: 3 entries, 0.00 MiB"]

    assert main(["clear"]) == 0
    assert capsys.readouterr().out == f"removed 4 entries from {tmp_path}\n"
    assert entry_files(tmp_path) == [tmp_path / "README"]  # temp file gone, foreign file kept
    assert (tmp_path / "trace").is_dir()
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0


@pytest.mark.parametrize("argv", [[], ["bogus"], ["info", "--nope"], ["clear", "extra"]])
def test_face_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path))
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("advisor: error: ")


def test_face_info_says_when_the_location_is_unusable(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(blocker / "cache"))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"{blocker} is not a directory: nothing is cached" in out
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "fresh"))
    assert main(["info"]) == 0
    assert "nothing is cached" not in capsys.readouterr().out


def test_a_cache_that_takes_no_file_is_named_once(tmp_path, monkeypatch, capsys):
    """A cache directory that exists nowhere writable (XDG_CACHE_HOME=/proc/x: mkdir fails) would cache nothing,
    silently, so every plan traces again: planning and ``cache info`` each say so in one line."""
    from advisor.cli import main as advisor_main

    monkeypatch.delenv("ADVISOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/proc/advisor-no-such-dir")
    assert main(["info"]) == 0
    assert "/proc/advisor-no-such-dir/advisor cannot be written" in capsys.readouterr().out
    tiny = str(Path(__file__).parent / "data" / "small_llama.json")
    assert advisor_main(["--config", tiny, "--seq-len", "32", "--gpus", "2", "--gpu", "A100-80GB", "--json"]) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if "cannot be written" in x]
    assert "nothing is cached" in line and "ADVISOR_CACHE_DIR" in line
    assert (
        advisor_main(["--config", tiny, "--seq-len", "32", "--gpus", "2", "--gpu", "A100-80GB", "--json", "--no-cache"])
        == 0
    )
    assert "cannot be written" not in capsys.readouterr().err
