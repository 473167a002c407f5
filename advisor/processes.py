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
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

from .errors import AdvisorError


def lock_path() -> Path:
    """Machine-wide lock file (ADVISOR_VERIFY_LOCK overrides it, e.g. for isolated test runs)."""
    return Path(os.environ.get("ADVISOR_VERIFY_LOCK") or Path(tempfile.gettempdir()) / "advisor-verify.lock")


class VerifyBusy(AdvisorError):
    """Another verification is running on this machine: not bad input, so not exit 2. Exit 75 is sysexits.h's
    EX_TEMPFAIL ("a temporary failure ... the user is invited to retry")."""

    exit_code = 75


class MachineLock:
    """One verification (or doctor's 2-rank run) per machine: an exclusive ``flock`` on a lock file, which the
    holder fills with who it is (pid, command, start time) so a second run can say who holds it.
    ``wait_s``: how long to wait for a running one to finish before raising ``VerifyBusy``."""

    def __init__(self, wait_s: float = 0.0) -> None:
        self._fh: TextIO | None = None
        self._wait_s = wait_s

    def __enter__(self) -> MachineLock:
        deadline = time.monotonic() + self._wait_s
        self._fh = open(lock_path(), "a+")
        while True:
            try:
                fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    holder = _holder(self._fh)
                    self._fh.close()
                    raise VerifyBusy(
                        f"another verification is running on this machine ({holder}): wait for it to finish and retry"
                    )
                time.sleep(min(2.0, max(0.1, left)))
        self._fh.seek(0)
        self._fh.truncate()
        command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:160]
        self._fh.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {command}\n")
        self._fh.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._fh is not None, "MachineLock exits only after it entered"
        self._fh.seek(0)
        self._fh.truncate()
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()


def _holder(fh: TextIO) -> str:
    """Who holds the lock, as its holder wrote it in the lock file (one line), or that it is not known."""
    fh.seek(0)
    text = fh.read(400).strip().splitlines()
    return f"held by {text[0]}" if text else "its holder is starting and has not said who it is yet"


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it), so a taken default port never fails a run."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent, ...; the start time
    is index 19), or None for a process that is gone (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()  # comm may hold spaces and ')': split after its last ')'


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every live process below ``pid`` (children, their children, ...) as (pid, start time), read from Linux's
    /proc; [] where /proc is missing. The start time tells a process from a later one given the same pid."""
    try:
        entries = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    info = {e: s for e in entries if (s := _stat(e)) is not None and len(s) > 19}
    found: list[tuple[int, str]] = []
    frontier = {pid}
    while frontier:
        children = {c for c, s in info.items() if int(s[1]) in frontier}
        found += [(c, info[c][19]) for c in sorted(children)]
        frontier = children
    return found


def _alive(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs (not a zombie, not a newer process
    given the same pid)."""
    s = _stat(pid)
    return s is not None and len(s) > 19 and s[19] == started and s[0] not in ("Z", "X")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launcher's whole process group, then SIGKILL whatever is left after 5 s, its descendants in
    other sessions included: torchrun starts each rank in a session of its own (torch.distributed.elastic's
    subprocess handler, ``start_new_session``), so a killpg of the launcher's group misses the ranks, and a
    launcher killed before it has stopped them (a busy machine: more than 5 s to act on SIGTERM) would leave
    them training. The descendants are listed before the first signal, while they still have their parent."""
    below = descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if sig == signal.SIGKILL:
            for pid, started in below:
                if _alive(pid, started):
                    try:
                        os.kill(pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
        try:
            os.killpg(proc.pid, sig)
            group = True
        except ProcessLookupError:
            group = False
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so it does not linger as a zombie
            if group:
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    group = False
            if not group and not any(_alive(pid, started) for pid, started in below):
                return
            time.sleep(0.1)


def run_group(
    argv: list[str], cwd: Path, log_path: Path, env: dict[str, str], timeout_s: float
) -> tuple[int | None, bool]:
    """Run ``argv`` in ``cwd`` in a session (process group) of its own, stdout and stderr to ``log_path``, stdin
    closed; wait at most ``timeout_s`` seconds, then stop the group and its descendants (``kill_group``) whether it
    returned or not (torchrun's ranks may outlive it). Returns (exit code, or None when it timed out; timed out)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            proc.wait(timeout=timeout_s)
            return proc.returncode, False
        except subprocess.TimeoutExpired:
            return None, True
        finally:
            kill_group(proc)


_ERROR_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?([A-Za-z_.]*(?:Error|Exception|Interrupt)\b.*)$")


def root_cause(text: str) -> str:
    """The first exception line the ranks printed (the launcher's own summary comes later)."""
    for line in text.splitlines():
        m = _ERROR_LINE.match(line)
        if m and "ChildFailedError" not in line and "elastic" not in line:
            return m.group(1).strip()[:300]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-300:]
