"""The GPU half of the truth run: ``python -m bench.gpu run --cases bench/gpu_cases --out $OUT`` on the lent machine.

Writes into ``--out`` (at most five files, flat: what the device tool brings back): ``machine.json`` (GPU name,
driver, torch, the packages found, the date), ``calibrate.log`` and ``calibration.tar.gz`` when ``advisor
calibrate`` exists, ``results.jsonl`` (one ``CaseResult`` per line, appended and flushed as each case ends, so a run
stopped midway keeps the finished cases) and ``logs.txt`` (the tail of each case's log). Each case runs its emitted
script through the measurement probe with the strategy's own launcher, in a scratch copy of its folder, and is read
back as ``--verify`` reads it (``advisor.run_report.read_report``, ``advisor.verify.median_step_s``). Needs torch
and what each case's script imports (``expected.json``'s ``needs``); a case whose packages are missing, or whose
budget no longer fits before the deadline, is recorded as skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NotRequired, TypedDict

from advisor.processes import free_port, run_group
from advisor.run_report import failure_message, read_report, teardown_note
from advisor.verify import median_step_s

from .gpu_prepare import OPTIONAL_PACKAGES, CaseSpec, read_cases

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 480.0  # the whole run, calibration included: 8 minutes (of the lease's 15, start-up included)
CALIBRATE_TIMEOUT_S = 150.0  # `advisor calibrate` is specified to take under 2 minutes; 30 s of slack
LOG_TAIL_LINES = 40
RESULTS, MACHINE, LOGS = "results.jsonl", "machine.json", "logs.txt"


class Measured(TypedDict):
    """What the probe measured on rank 0 (the only rank): bytes, seconds."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    step_s: float | None  # median after the warm-up steps
    step_times_s: list[float]
    losses: list[float]
    device: str


class CaseResult(TypedDict):
    """One line of ``results.jsonl``. ``status``: "ok" (measured), "failed" (no whole report; ``error`` says why)
    or "skipped" (``error`` says why: a missing package or the budget). Errors are (estimate - measured) / measured,
    as ``--verify`` reports them."""

    case_id: str
    strategy: str
    model: str
    status: str
    error: str
    wall_s: float
    budget_s: float
    estimate: dict[str, object]
    measured: Measured | None
    allocated_error: float | None
    reserved_error: float | None
    step_error: float | None
    notes: list[str]
    finished_at: NotRequired[str]


def _relative(estimate: object, measured: float | int | None) -> float | None:
    if not isinstance(estimate, (int, float)) or not measured:
        return None
    return (float(estimate) - measured) / measured


def fill_argv(argv: list[str], python: str, probe: str, port: int) -> list[str]:
    """``expected.json``'s command with its placeholders filled: ``{python}`` the interpreter, ``{probe}`` the
    probe's path, ``{port}`` a free port."""
    return [a.replace("{python}", python).replace("{probe}", probe).replace("{port}", str(port)) for a in argv]


def missing_packages(needs: list[str]) -> list[str]:
    """The packages of ``needs`` this interpreter cannot import (found without importing them)."""
    return [p for p in needs if importlib.util.find_spec(p) is None]


def blank_result(spec: CaseSpec, status: str = "failed", error: str = "", wall_s: float = 0.0) -> CaseResult:
    """A result for ``spec`` with nothing measured."""
    return {
        "case_id": spec["case_id"],
        "strategy": spec["strategy"],
        "model": spec["model"],
        "status": status,
        "error": error,
        "wall_s": round(wall_s, 2),
        "budget_s": spec["budget_s"],
        "estimate": dict(spec["estimate"]),
        "measured": None,
        "allocated_error": None,
        "reserved_error": None,
        "step_error": None,
        "notes": [],
    }


def conclude_case(
    spec: CaseSpec, run_dir: Path, rc: int | None, timed_out: bool, timeout_s: float, since: float, wall_s: float
) -> CaseResult:
    """The case's result from its run folder: the probe's ``out/report.json`` when whole (``read_report``: written
    after ``since``, one rank, a loss per measured step), else a failure in one line (``failure_message``: timeout,
    out of memory, or the script's first exception)."""
    result = blank_result(spec, wall_s=wall_s)
    est = result["estimate"]
    report, why = read_report(run_dir / "out" / "report.json", 1, spec["measured_steps"], since)
    if report is None:
        log = run_dir / "run.log"
        result["error"] = (
            f"the run exited 0 but {why}" if rc == 0 else failure_message(log, rc, timed_out, timeout_s)
        ).replace(str(run_dir), spec["case_id"])
        return result
    if rc != 0:
        text = (run_dir / "run.log").read_text(errors="replace") if (run_dir / "run.log").exists() else ""
        result["notes"].append(teardown_note(text, rc, timed_out, timeout_s))
    rank = report["per_rank"][0]
    times = [float(t) for t in rank.get("step_times_s") or []]
    step = median_step_s(times, rank.get("profiled_steps", 0), spec["warmup_steps"])
    raw: dict[str, object] = dict(report)  # the probe writes more keys than RunReport names
    measured: Measured = {
        "peak_allocated_bytes": int(rank["peak_allocated_bytes"]),
        "peak_reserved_bytes": rank.get("peak_reserved_bytes"),
        "step_s": step,
        "step_times_s": times,
        "losses": [float(x) for x in rank["losses"]],
        "device": str(raw.get("device", "")),
    }
    result["status"], result["measured"] = "ok", measured
    result["allocated_error"] = _relative(est.get("peak_allocated_bytes"), measured["peak_allocated_bytes"])
    result["reserved_error"] = _relative(est.get("peak_reserved_bytes"), measured["peak_reserved_bytes"])
    result["step_error"] = _relative(est.get("step_s"), step)
    return result


def launch(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[int | None, bool]:
    """Run ``argv`` in its own process group with its output in ``cwd``/run.log; the whole group is stopped at
    ``timeout_s`` or when it returns. Returns (exit code or None, timed out)."""
    return run_group(argv, cwd, cwd / "run.log", env, timeout_s)


def _append(path: Path, text: str) -> None:
    """Append and push to disk now: a run stopped later keeps what is written."""
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def _case_env(extra_path: str) -> dict[str, str]:
    """The scripts' environment: this checkout importable (the probe imports ``advisor.measure``), unbuffered
    output, no hub."""
    path = os.pathsep.join(filter(None, [extra_path, os.environ.get("PYTHONPATH", "")]))
    return dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=path)


def machine_info() -> dict[str, object]:
    """The GPU, its driver (nvidia-smi, else NVML), torch and CUDA versions, the optional packages' versions, the
    Python version and the date (UTC)."""
    import torch

    cuda = torch.cuda.is_available()
    driver = ""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        driver = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    except OSError:
        pass
    if not driver and cuda:
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # NVML missing or refused: the driver stays unknown
            driver = ""
    packages: dict[str, str | None] = {}
    for name in OPTIONAL_PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    props = torch.cuda.get_device_properties(0) if cuda else None
    return {
        "gpu": torch.cuda.get_device_name(0) if cuda else "no CUDA device",
        "gpu_memory_bytes": int(props.total_memory) if props is not None else None,
        "sm_count": int(props.multi_processor_count) if props is not None else None,
        "driver": driver or None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "packages": packages,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def calibrate_available() -> bool:
    """Whether this checkout's CLI has an ``advisor calibrate`` subcommand."""
    from advisor.cli import SUBCOMMANDS

    return "calibrate" in SUBCOMMANDS


def run_calibrate(out_dir: Path, timeout_s: float, env: dict[str, str], scratch: Path) -> dict[str, object]:
    """``advisor calibrate`` then ``advisor calibrate --show`` into ``out_dir``/calibrate.log, with the cache in a
    scratch folder packed into ``out_dir``/calibration.tar.gz. Returns what happened (rc, seconds, or why not)."""
    if not calibrate_available():
        return {"ran": False, "reason": "this checkout has no `advisor calibrate` subcommand"}
    cache = scratch / "cache"
    env = dict(env, ADVISOR_CACHE_DIR=str(cache))
    t0 = time.monotonic()
    log = out_dir / "calibrate.log"
    rc, _ = run_group([sys.executable, "-m", "advisor", "calibrate"], ROOT, log, env, timeout_s)
    seconds = time.monotonic() - t0
    if rc == 0:
        with open(log, "a") as f:
            subprocess.run(
                [sys.executable, "-m", "advisor", "calibrate", "--show"], stdout=f, stderr=f, env=env, cwd=ROOT
            )
    if cache.exists():
        with tarfile.open(out_dir / "calibration.tar.gz", "w:gz") as tar:
            tar.add(cache, arcname="calibration")
    return {"ran": True, "rc": rc, "timed_out": rc is None, "seconds": round(seconds, 1)}


def run(
    cases_dir: Path,
    out_dir: Path,
    deadline_s: float = DEADLINE_S,
    calibrate: bool = True,
    say: Callable[[str], None] = print,
    only: list[str] | None = None,
) -> list[CaseResult]:
    """Calibrate (when the subcommand exists), then run every case of ``cases_dir`` in order until ``deadline_s``
    seconds from the start have passed, each stopped at its ``timeout_s`` or the deadline, whichever is first.
    ``only``: regular expressions; just the cases whose id matches one.

    Raises:
        ValueError: ``cases_dir`` holds no case, or a file that is not a case's JSON.
    """
    start = time.monotonic()
    specs = [s for s in read_cases(cases_dir) if not only or any(re.search(p, s["case_id"]) for p in only)]
    if not specs:
        raise ValueError(
            f"{cases_dir}: no case folder{' matches ' + str(only) if only else ''} (make them with "
            "`python -m bench.gpu prepare --out DIR`)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (RESULTS, LOGS):
        (out_dir / name).write_text("")
    machine = machine_info()
    (out_dir / MACHINE).write_text(json.dumps(machine, indent=2) + "\n")
    budgeted = sum(s["budget_s"] for s in specs if not missing_packages(s["needs"]))
    say(
        f"{machine['gpu']}, driver {machine['driver']}, torch {machine['torch']}: {len(specs)} cases, "
        f"{budgeted:.0f} s budgeted for those whose packages are here, {deadline_s:.0f} s to the deadline"
    )
    env = _case_env(str(ROOT))
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="gpu-truth-") as tmp:
        scratch = Path(tmp)
        if calibrate:
            left = deadline_s - (time.monotonic() - start)
            machine["calibrate"] = run_calibrate(out_dir, min(CALIBRATE_TIMEOUT_S, left), env, scratch)
            (out_dir / MACHINE).write_text(json.dumps(machine, indent=2) + "\n")
            say(f"calibrate: {machine['calibrate']}")
        for spec in specs:
            result, log = _one_case(spec, cases_dir, scratch, env, deadline_s - (time.monotonic() - start))
            result["finished_at"] = datetime.now(UTC).strftime("%H:%M:%S")
            _append(out_dir / RESULTS, json.dumps(result) + "\n")
            if log:
                _append(out_dir / LOGS, f"===== {spec['case_id']} ({result['status']})\n{log}\n")
            say(_line(result))
            results.append(result)
    return results


def _one_case(
    spec: CaseSpec, cases_dir: Path, scratch: Path, env: dict[str, str], left_s: float
) -> tuple[CaseResult, str]:
    """Run one case in a scratch copy of its folder (removed after: no checkpoint or report piles up on disk);
    (its result, the tail of its log, empty when skipped)."""
    from strategies.launchers import PROBE

    missing = missing_packages(spec["needs"])
    if missing:
        return blank_result(spec, "skipped", f"needs {', '.join(missing)} (not installed here)"), ""
    if spec["budget_s"] > left_s:
        why = f"budget {spec['budget_s']:.0f} s > {max(left_s, 0):.0f} s left before the deadline"
        return blank_result(spec, "skipped", why), ""
    run_dir = scratch / spec["case_id"]
    shutil.copytree(cases_dir / spec["case_id"], run_dir)
    timeout = min(float(spec["timeout_s"]), left_s)
    argv = fill_argv(spec["argv"], sys.executable, str(PROBE), free_port())
    since, t0 = time.time(), time.monotonic()
    rc, timed_out = launch(argv, run_dir, env, timeout)
    result = conclude_case(spec, run_dir, rc, timed_out, timeout, since, time.monotonic() - t0)
    log = _tail(run_dir / "run.log")
    shutil.rmtree(run_dir, ignore_errors=True)
    return result, log


def _line(r: CaseResult) -> str:
    m = r["measured"]
    if r["status"] != "ok" or m is None:
        return f"{r['case_id']}: {r['status']}: {r['error']}"
    step = f"{1e3 * m['step_s']:.0f} ms" if m["step_s"] is not None else "no step time"
    err = f"{100 * r['allocated_error']:+.1f}%" if r["allocated_error"] is not None else "n/a"
    return f"{r['case_id']}: {m['peak_allocated_bytes'] / 2**30:.2f} GiB ({err}), {step}, {r['wall_s']:.0f} s"
