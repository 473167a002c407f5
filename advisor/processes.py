"""Processes and the machine: one verification (or doctor's 2-rank run) at a time per machine, a free
port, killing a launcher's whole process group, the first exception line of a log. Bottom layer:
``verify`` and ``doctor`` both use it, neither imports the other."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import AdvisorError


def lock_path() -> Path:
    """Machine-wide lock file (ADVISOR_VERIFY_LOCK overrides it, e.g. for isolated test runs)."""
    return Path(os.environ.get("ADVISOR_VERIFY_LOCK") or Path(tempfile.gettempdir()) / "advisor-verify.lock")

class VerifyBusy(AdvisorError):
    """Another verification is running on this machine."""


class MachineLock:
    """One verification (or doctor's 2-rank run) per machine: an exclusive ``flock`` on a lock file.
    ``wait_s``: how long to wait for a running one to finish before raising ``VerifyBusy``."""

    def __init__(self, wait_s: float = 0.0) -> None:
        self._fh = None
        self._wait_s = wait_s

    def __enter__(self) -> "MachineLock":
        deadline = time.monotonic() + self._wait_s
        self._fh = open(lock_path(), "a+")
        while True:
            try:
                fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._fh.close()
                    raise VerifyBusy("another verification is running on this machine: wait for it to finish "
                                     "and retry")
                time.sleep(min(2.0, max(0.1, left)))

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it), so a taken default port never fails a run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's whole process group, then SIGKILL whatever is left after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so it does not linger as a zombie
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


_ERROR_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_.]*(?:Error|Exception|Interrupt)\b.*)$")


def root_cause(text: str) -> str:
    """The first exception line the ranks printed (the launcher's own summary comes later)."""
    for line in text.splitlines():
        m = _ERROR_LINE.match(line)
        if m and "ChildFailedError" not in line and "elastic" not in line:
            return m.group(1).strip()[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-300:]


