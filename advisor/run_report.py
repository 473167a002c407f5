"""What a verification run leaves behind, read back: its report (``out/report.json``, written by rank 0 of the
probe, ``strategies/probe``) and its log (``run.log``), in one-line messages for a failed run or for a run that
failed only after every rank had reported (``advisor.verify.conclude``)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from .processes import root_cause

_OOM_PATTERNS = ("out of memory", "OutOfMemoryError", "Cannot allocate memory", "std::bad_alloc")


class RankReport(TypedDict):
    """One rank's entry of the report (``per_rank``) as read here; the probe writes more keys. Bytes and
    seconds."""

    rank: int
    peak_allocated_bytes: int
    peak_reserved_bytes: NotRequired[int]
    losses: list[float]  # one per measured step
    step_times_s: NotRequired[list[float]]
    profiled_steps: NotRequired[int]  # the first steps, run under the CPU memory profiler


class RunReport(TypedDict):
    """The report of a run as read here (``read_report`` checks it whole): one entry per rank."""

    per_rank: list[RankReport]


def read_report(path: Path, world_size: int, steps: int, since: float) -> tuple[RunReport | None, str]:
    """The run's report if it is whole, else (None, why not). Whole: written by this run (not before
    ``since``, so a report left by an earlier run in a --force'd directory never counts), valid JSON,
    one entry for each rank 0 .. world_size-1 with its peak and a loss for each of ``steps`` steps.
    Rank 0 writes it only after gathering every rank's figures, so a whole report means every rank
    finished training and measured."""
    try:
        if path.stat().st_mtime < since - 1.0:  # 1 s: file time stamps are coarser than time.time()
            return None, f"{path} is left over from an earlier run"
        report: object = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no report was written"
    except (OSError, ValueError) as err:
        return None, f"the report {path} is unreadable or cut short ({err})"
    per_rank = report.get("per_rank") if isinstance(report, dict) else None
    if not isinstance(per_rank, list) or not all(isinstance(r, dict) for r in per_rank):
        return None, f"the report {path} has no per-rank list"
    ranks = [r.get("rank") for r in per_rank]
    if not all(type(x) is int for x in ranks) or sorted(ranks) != list(range(world_size)):
        return None, f"the report has ranks {ranks}, expected 0..{world_size - 1}"
    for r in per_rank:
        if not isinstance(r.get("peak_allocated_bytes"), int) or len(r.get("losses") or []) != steps:
            return None, f"rank {r['rank']} reported {len(r.get('losses') or [])} of {steps} steps or no peak"
    return cast(RunReport, report), ""  # checked above: a dict whose per_rank is whole


_DS_EXIT = re.compile(r"--local_rank=(\d+)'.*exits with return code = (-?\d+)")
_TORCHRUN_EXIT = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def teardown_note(log_text: str, rc: int | None, timed_out: bool, timeout_s: float) -> str:
    """What went wrong after every rank had reported, in one line, from the launcher's log: the
    deepspeed launcher names the failed rank's --local_rank and return code, torchrun's failure
    summary its rank and exit code."""
    if timed_out:
        return (
            f"all ranks reported, then the run did not exit within {timeout_s:.0f} s (stuck in teardown) and "
            "was stopped: figures are valid"
        )
    m = _DS_EXIT.search(log_text) or _TORCHRUN_EXIT.search(log_text)
    if m:
        code = int(m.group(2))
        sig = ""
        if code < 0:
            try:
                sig = f" ({signal.Signals(-code).name})"
            except ValueError:
                pass
        what = f"rank {m.group(1)} exited with {code}{sig}"
    else:
        what = f"the launcher exited with code {rc}"
    return f"all ranks reported, then {what} during teardown: figures are valid"


def failure_message(log_path: Path, rc: int | None, timed_out: bool, timeout_s: float) -> str:
    """Why a run without a whole report failed, in one line naming its log: stopped at ``timeout_s`` seconds,
    out of memory or SIGKILLed (the OOM killer), or the script's own error (``root_cause`` of the log)."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    tail = root_cause(text)
    if timed_out:
        return (
            f"the run did not finish within {timeout_s:.0f} s and was stopped (all ranks killed); "
            f"raise --timeout or lower --steps. Log: {log_path}"
        )
    killed = rc in (-9, 137, 247) or "return code = -9" in text or "Signal 9 (SIGKILL)" in text
    if any(p in text for p in _OOM_PATTERNS) or killed:
        return (
            f"the run ran out of memory or a rank was killed (SIGKILL: the kernel's OOM killer, exit code "
            f"{rc}); lower --micro-batch-size or pick a sharded "
            f"strategy. Log: {log_path}. Cause: {tail}"
        )
    return f"the training script failed with exit code {rc}: {tail}. Log: {log_path}"
