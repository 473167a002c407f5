"""A value one pytest-xdist worker computes and the run's other workers read: a module-scoped fixture that two test
files use (``emitted``: every family x strategy x mode rendered, about 13 s on 2 busy cores) is computed once per run,
not once per worker that runs one of the files.

The value goes to the run's shared folder (``ADVISOR_TEST_CACHE``, made and removed by the controller in
tests/conftest.py) as JSON; a lock on the key makes a second worker wait for the first one's result instead of
computing it again beside it. Values must survive a JSON round trip (the reader compares them as loaded)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def computed_once(key: str, compute: Callable[[], T]) -> T:
    """``compute()``, or the value another worker of this run already computed for ``key`` (a file-name-safe
    string). Without ``ADVISOR_TEST_CACHE`` (a plain ``python -m pytest`` sets it too), it computes."""
    folder = os.environ.get("ADVISOR_TEST_CACHE")
    if not folder:
        return compute()
    path = Path(folder) / f"shared-{key}.json"
    with open(Path(folder) / f"shared-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.exists():
            value: T = json.loads(path.read_text())
            return value
        value = compute()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)  # never a half-written file for a reader
        return value
