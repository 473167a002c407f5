"""The face of the on-disk cache (``advisor.cache``): ``advisor cache info [--json]`` prints the directory, entry
count, size and cap, per namespace; ``advisor cache clear`` deletes every entry. Exit code 0, or 2 for bad input
(one line on stderr, ``advisor.faces.run_face``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .cache import DiskCache
from .errors import AdvisorError
from .faces import OneLineParser, run_face


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def build_parser() -> OneLineParser:
    """The ``advisor cache`` argument parser (subcommands ``info`` and ``clear``)."""
    p = OneLineParser(
        prog="advisor cache",
        description="Inspect or empty advisor's on-disk cache of traces "
        "(directory: $ADVISOR_CACHE_DIR, else $XDG_CACHE_HOME/advisor, else ~/.cache/advisor).",
    )
    sub = p.add_subparsers(dest="command", metavar="{info,clear}", required=True)
    info = sub.add_parser("info", help="print the directory, entry count, size and cap, per namespace")
    info.add_argument("--json", action="store_true", help="print one JSON object (sizes in bytes)")
    sub.add_parser("clear", help="delete every cached entry")
    return p


def unusable_reason(directory: Path) -> str | None:
    """Why ``directory`` cannot hold the cache (a file is in the way, it cannot be written), or None."""
    for d in (directory, *directory.parents):
        if d.exists():
            if not d.is_dir():
                return f"{d} is not a directory"
            if not os.access(d, os.W_OK | os.X_OK):
                return f"{d} is not writable"
            return None
    return None


def write_problem(directory: Path) -> str | None:
    """Why a file cannot be written in ``directory`` (created if missing), found by writing one, or None: checked
    before measuring, so that a minute of benchmarks is never lost to a cache that drops what it is given (the
    cache skips I/O failures silently; root passes ``os.access`` on read-only file systems such as /proc)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as err:
        return f"{directory} cannot be written ({err.strerror or err})"
    return None


def _cache_face(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    cache = DiskCache()
    if args.command == "clear":
        removed = cache.clear()
        print(f"removed {removed} {'entry' if removed == 1 else 'entries'} from {cache.directory}")
        return 0
    if args.command != "info":  # unreachable: argparse checks the choice
        raise AdvisorError(f"unknown cache command {args.command!r}")
    i = cache.info()
    if args.json:
        print(
            json.dumps(
                {
                    "directory": str(i.directory),
                    "entries": i.entries,
                    "total_bytes": i.total_bytes,
                    "max_bytes": i.max_bytes,
                    "by_namespace": {ns: {"entries": n, "bytes": b} for ns, (n, b) in i.by_namespace.items()},
                }
            )
        )
        return 0
    print(f"cache directory: {i.directory}")
    problem = unusable_reason(i.directory) or write_problem(i.directory)
    if problem:
        print(
            f"  ! {problem}: nothing is cached (planning still works); set ADVISOR_CACHE_DIR or XDG_CACHE_HOME "
            "to a writable directory"
        )
    print(f"entries: {i.entries}, {_mib(i.total_bytes)} of {_mib(i.max_bytes)} cap")
    for ns, (n, b) in i.by_namespace.items():
        print(f"  {ns}: {n} {'entry' if n == 1 else 'entries'}, {_mib(b)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``advisor cache info [--json]`` / ``advisor cache clear``; returns the exit code (0 ok, 2 bad
    input: one line on stderr). ``argv`` excludes the program and the word ``cache``."""
    return run_face(lambda: _cache_face(sys.argv[1:] if argv is None else argv))
