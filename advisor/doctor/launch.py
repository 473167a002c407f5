"""Check 4: two ranks through the real launcher (torchrun) on this machine."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from .checks import FAIL, PASS, WARN, Check

_MARK = "DOCTOR_OK"
_WORKER = Path(__file__).with_name("_allreduce_worker.py")


def check_allreduce(gpu_count: int, timeout_s: float) -> Check:
    """Check 4: two ranks on this machine through the real launcher (``python -m torch.distributed.run
    --nproc_per_node 2 --master_addr 127.0.0.1 --master_port <free port>``): all-reduce a tensor of ones (must
    equal the world size) and run 2 DDP steps (weights must stay equal). nccl with >= 2 GPUs, else gloo.
    Takes verify's machine lock (waiting up to ``timeout_s`` for a running verification); on timeout kills the
    launcher's process group and the ranks it started.
    The script and its log live in a temp dir, removed on success and kept (and named) on failure."""
    from ..processes import MachineLock, VerifyBusy, free_port, root_cause

    backend = "nccl" if gpu_count >= 2 else "gloo"
    how = {0: "gloo (CPU)", 1: "gloo (1 GPU: NCCL needs a GPU per rank, so the 2 ranks run on CPU)"}.get(
        gpu_count, f"nccl on 2 of {gpu_count} GPUs"
    )
    work = Path(tempfile.mkdtemp(prefix="advisor-doctor-"))
    script, log_path = work / "allreduce.py", work / "run.log"
    shutil.copyfile(_WORKER, script)
    try:
        with MachineLock(wait_s=timeout_s):
            port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=1",
                "--nproc_per_node=2",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                str(script),
                backend,
                f"{timeout_s:g}",
            ]
            env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
            start = time.monotonic()
            rc, timed_out = _run_group(cmd, work, log_path, env, timeout_s)
            elapsed = time.monotonic() - start
    except VerifyBusy:
        shutil.rmtree(work, ignore_errors=True)
        return Check(
            "allreduce",
            WARN,
            f"skipped: an advisor verification kept this machine busy for {timeout_s:g} s",
            "rerun advisor doctor when it has finished (the two ranks would compete "
            "for the same cores), or raise --timeout to wait longer",
        )
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    ok_ranks = set(re.findall(rf"{_MARK} rank=(\d+) allreduce=\S+ expected=2 ok=True", text))
    if rc == 0 and ok_ranks == {"0", "1"}:
        shutil.rmtree(work, ignore_errors=True)
        return Check(
            "allreduce",
            PASS,
            f"2 ranks over {how} via torchrun on 127.0.0.1:{port}: all_reduce(ones) "
            f"= 2 on both ranks, 2 DDP steps kept the weights equal, {elapsed:.1f} s",
        )
    if not text.strip():  # nothing to read there: do not leave an empty directory behind
        shutil.rmtree(work, ignore_errors=True)
        rerun = f"the ranks printed nothing; rerun by hand: {shlex.join(cmd[:-3] + [str(_WORKER)] + cmd[-2:])}"
    else:
        rerun = f"script and log kept in {work}; rerun by hand: {shlex.join(cmd)}"
    if timed_out:
        return Check(
            "allreduce",
            FAIL,
            f"2 ranks over {backend} did not finish within {timeout_s:g} s (launcher and ranks killed)",
            "a hang means a rank cannot reach the other (firewall, "
            f"GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) or a very slow start: raise --timeout; {rerun}",
        )
    wrong = re.findall(rf"{_MARK} rank=\d+ allreduce=\S+ expected=\d+ ok=False", text)
    if wrong:
        return Check(
            "allreduce",
            FAIL,
            f"2 ranks over {backend} computed wrong results: {'; '.join(wrong)}",
            f"a broken collective library or hardware fault: reinstall torch, check the GPUs; {rerun}",
        )
    if rc == 0:
        return Check(
            "allreduce",
            FAIL,
            f"torchrun exited 0 but ranks {sorted(ok_ranks) or 'none'} of 0, 1 reported success",
            f"read the log; {rerun}",
        )
    cause = root_cause(text) or f"exit code {rc}"
    fix = (
        "another process took the port: rerun"
        if "Address already in use" in text
        else "fix the cause above (a broken torch/NCCL install, or run with NCCL_DEBUG=INFO for NCCL)"
    )
    return Check("allreduce", FAIL, f"2 ranks over {backend} failed (exit code {rc}): {cause}", f"{fix}; {rerun}")


def _run_group(
    cmd: list[str], cwd: Path, log_path: Path, env: dict[str, str], timeout_s: float
) -> tuple[int | None, bool]:
    """Run ``cmd`` in its own process group with output to ``log_path`` (``advisor.processes.run_group``); returns
    (exit code, timed_out). Ranks that printed ``DOCTOR_PID`` and still run this script are then killed by pid, in
    case one was started outside the launcher's descendants."""
    from ..processes import run_group

    try:
        return run_group(cmd, cwd, log_path, env, timeout_s)
    finally:
        _kill_ranks(log_path, str(cwd))


def _kill_ranks(log_path: Path, marker: str) -> None:
    """SIGKILL the ranks named by ``DOCTOR_PID`` lines whose command line still names ``marker`` (the unique
    temp dir), so a pid reused by another process is left alone."""
    for pid in re.findall(r"DOCTOR_PID (\d+)", log_path.read_text(errors="replace")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
