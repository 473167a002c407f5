"""Verify: render the script for a strategy, launch it on this machine, measure, compare.

The comparison uses an estimate recomputed for exactly what runs: the device (a CPU run has no
CUDA context, uses the CPU attention kernel and optimizer loop, and reports peak allocated only),
the world size after capping (CPU: at most ``MAX_CPU_RANKS``; CUDA: the GPUs present) and the
precision (on CPU bf16 is emulated and very slow, so fp32 unless asked for explicitly), as
``advisor.verify_setup`` chooses them.
One verification runs at a time per machine (a file lock); runs compete for the same cores/GPUs.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from strategies import get_strategy
from strategies.render import fresh_weights_note, job_from_plan, render_job, write_files

from .applied_options import unscripted_error
from .choices import Device
from .errors import AdvisorError
from .hardware import Hardware, host_memory_bytes, without_gpu_calibration
from .processes import (
    MachineLock,
    VerifyBusy,
    free_port,
    kill_group,
    lock_path,
)
from .run_report import RunReport, failure_message, read_report, teardown_note
from .schema import PlanInputs
from .timing.calibrate import OtherCpu
from .verify_setup import CPU_RANK_THREADS, verify_plan

if TYPE_CHECKING:
    from .plan import Plan
    from .timing.step import StepTime

__all__ = [
    "TIMING_STEPS",
    "TOLERANCE",
    "WARMUP_STEPS",
    "MachineLock",
    "VerifyBusy",
    "VerifyResult",
    "add_step_time",
    "conclude",
    "free_port",
    "lock_path",
    "median_step_s",
    "predicted_step_s",
    "preset_step_s",
    "step_time_line",
    "verify",
]

WARMUP_STEPS = 2  # optimizer steps left out of the measured step time (allocator, lazy init, optimizer states)
TIMING_STEPS = 5  # steps run after the measured ones with the memory meter off: the measured step time's
BUSY_SHARE = 0.10  # other processes' share of the CPUs during a run above which the step time is said inflated
TOLERANCE = 0.25  # |estimate - measured| / measured; the benchmark's worst-case target (bench/README)
_STEP_RE = re.compile(r"step (\d+)/(\d+) loss ([-\d.naninf]+)")


class RankResult(TypedDict):
    """One rank's figures in ``VerifyResult.per_rank``: bytes, seconds; ``relative_error`` is (estimate - measured)
    / measured (None: nothing measured)."""

    rank: int
    measured_peak_bytes: int
    measured_reserved_bytes: int | None
    estimated_peak_bytes: int
    relative_error: float | None
    measured_step_s: NotRequired[float | None]  # ``add_step_time``


@dataclass
class VerifyResult:
    strategy: str
    device: Device
    world_size: int
    steps: int  # steps measured for memory (``losses`` are theirs)
    log_dir: str
    timing_steps: int = 0  # steps run after them with the memory meter off, for the step time
    ok: bool = False
    message: str = ""
    per_rank: list[RankResult] = field(default_factory=list)
    relative_error: float | None = None
    within_tolerance: bool = False
    losses: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    estimated_peak_bytes: int | None = None
    rank_estimates: list[int] | None = None  # each rank's estimate where ranks differ (pipeline stages)
    predicted_step_s: float | None = None  # the step-time model's, for this machine (CPU: its calibration)
    measured_step_s: float | None = None  # max over ranks of each rank's median (``median_step_s``)
    step_time_error: float | None = None  # (predicted - measured) / measured
    # GPU runs timed by this machine's calibration (advisor calibrate): what the GPU preset's constants predict,
    # shown beside the calibrated prediction; and where the prediction's constants come from
    preset_step_s: float | None = None
    time_source: str | None = None
    cpu_contention: float | None = None  # share of all cores' time other processes took during the run (CPU runs)
    # the job's estimate (``strategies.render.Estimate``: bytes, breakdown, phase); empty before the job is rendered
    estimate: Mapping[str, object] = field(default_factory=dict)

    @property
    def preset_step_time_error(self) -> float | None:
        """(preset prediction - measured) / measured; None without both."""
        if self.preset_step_s is None or not self.measured_step_s:
            return None
        return (self.preset_step_s - self.measured_step_s) / self.measured_step_s

    def to_dict(self) -> dict[str, object]:
        return {
            "strategy": self.strategy,
            "device": self.device,
            "world_size": self.world_size,
            "steps": self.steps,
            "timing_steps": self.timing_steps,
            "per_rank": self.per_rank,
            "relative_error": self.relative_error,
            "tolerance": TOLERANCE,
            "within_tolerance": self.within_tolerance,
            "log_dir": self.log_dir,
            "ok": self.ok,
            "message": self.message,
            "losses": self.losses,
            "notes": self.notes,
            "estimated_peak_bytes": self.estimated_peak_bytes,
            "predicted_step_s": self.predicted_step_s,
            "measured_step_s": self.measured_step_s,
            "step_time_error": self.step_time_error,
            "preset_step_s": self.preset_step_s,
            "preset_step_time_error": self.preset_step_time_error,
            "time_source": self.time_source,
            "cpu_contention": self.cpu_contention,
        }


def available_memory_bytes() -> int:
    """RAM available to new processes now (psutil), falling back to the physical total."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:
        return host_memory_bytes()


def remove_deepspeed_shm(port: int, shm_dir: Path = Path("/dev/shm")) -> int:
    """Delete the shared-memory all-reduce buffers DeepSpeed's CPU accelerator leaves behind for the
    run on ``port``; returns the bytes freed. Each CPU rank creates
    ``deepspeed_allreduce_buffer_{uid}_{master addr}_{master port}_{rank}`` (deepspeed/ops/csrc/cpu/comm/
    shm.cpp, ``shm_create``, about 66 MiB each) and no code path unlinks it at exit: measured here, 240
    of them filled 16 GiB of this 24 GiB machine's /dev/shm (RAM) over a day of verification runs."""
    freed = 0
    for path in shm_dir.glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
        try:
            freed += path.stat().st_size
            path.unlink()
        except OSError:
            pass
    return freed


def _launch(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float, total_steps: int, progress: Callable[[str], None]
) -> tuple[int | None, bool]:
    """Run ``cmd`` in its own process group, log to cwd/run.log, report progress; returns
    (exit code or None, timed_out)."""
    log_path = cwd / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )

        def pump() -> None:
            assert proc.stdout is not None, "stdout=PIPE"
            for line in proc.stdout:
                log.write(line)
                log.flush()
                m = _STEP_RE.search(line)
                if m:
                    progress(f"step {m.group(1)}/{total_steps} loss {m.group(3)}")

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:  # Ctrl-C: stop every child before re-raising
            kill_group(proc)
            raise
        finally:
            kill_group(proc)
            reader.join(timeout=5)
    return (None if timed_out else proc.returncode), timed_out


def verify(
    inputs: PlanInputs,
    strategy: str | None = None,
    *,
    steps: int = 6,
    timeout_s: float = 600.0,
    out_dir: str | None = None,
    force: bool = False,
    precision_explicit: bool = False,
    progress: Callable[[str], None] | None = None,
    timing_steps: int = TIMING_STEPS,
) -> VerifyResult:
    """Emit, launch and measure ``strategy`` (default: the recommended one) for ``inputs``.

    ``steps`` optimizer steps are measured for memory, then ``timing_steps`` more run with the memory meter off
    for the measured step time (``median_step_s``).

    Returns a ``VerifyResult`` (``ok`` False with a message for crash / OOM / timeout).
    ``progress`` receives one-line status messages; it is called from a log-reader thread.

    Raises:
        AdvisorError: bad input, an option the generated scripts do not write yet, nothing to verify (no strategy
            fits and none was named).
        VerifyBusy: another verification holds this machine's lock.
    """
    say = progress or (lambda _msg: None)
    if steps < 1 or steps > 10_000:
        raise AdvisorError(f"--steps must be between 1 and 10000, got {steps}")
    if not timeout_s > 0:
        raise AdvisorError(f"--timeout must be positive, got {timeout_s}")
    if why := unscripted_error(inputs.training):
        raise AdvisorError(why)
    import torch

    device = Device.CUDA if torch.cuda.is_available() else Device.CPU
    name, run_plan, hw, notes = verify_plan(inputs, strategy, device, precision_explicit, inputs.use_cache, say)
    run_row, unit = run_plan.row(name), get_strategy(name)
    run_memory = run_row.memory
    assert run_memory is not None, "verify_plan checked that the row applies"
    need = run_memory.peak.total * hw.num_gpus
    if device == Device.CPU and need > 0.8 * available_memory_bytes():
        raise AdvisorError(
            f"verifying {name} on {hw.num_gpus} CPU ranks needs about {need / 2**30:.1f} GiB of RAM "
            f"(estimated peak per rank x ranks), more than this machine can spare "
            f"({available_memory_bytes() / 2**30:.1f} GiB available): verify a smaller model, "
            "sequence or micro-batch here and the full one on the GPU machine"
        )
    blocker = unit.verify_blocker(device)
    if blocker:
        raise AdvisorError(blocker)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_plan.spec.name)
    run_dir = Path(out_dir) if out_dir else Path("advisor-runs") / f"{safe}-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    world = hw.num_gpus
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS=str(CPU_RANK_THREADS),
        PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")])),
    )
    if device == Device.CPU:
        env.update(unit.launcher.cpu_env)
        # The memory meter's CPU profiler (kineto) logs "ERROR: gpuGetDeviceCount failed" into run.log on a CUDA build
        # without a GPU, and its start and stop: level 6 silences them (torch 2.14.1); a user's own level wins.
        env.setdefault("KINETO_LOG_LEVEL", "6")
    with MachineLock():  # before writing anything: a busy machine leaves no empty run directory
        port = free_port()
        job = job_from_plan(run_plan, name, steps=steps, master_port=port)
        if note := fresh_weights_note(job):
            notes.append(note)
        write_files(render_job(job), run_dir, force=force)
        earlier = run_dir / "out"
        if earlier.exists():  # (only with --force: write_files refuses a folder with files in it otherwise)
            # An earlier verification's output: the script refuses an --out with its checkpoints (no --resume).
            shutil.rmtree(earlier)
            say(f"removed the earlier run's output in {earlier} (--force)")
        result = VerifyResult(
            strategy=name,
            device=device,
            world_size=world,
            steps=steps,
            timing_steps=timing_steps,
            log_dir=str(run_dir),
            notes=notes,
            estimated_peak_bytes=run_memory.peak.total,
            rank_estimates=unit.rank_peak_bytes(run_plan.context(), run_plan.context().micro_batch_size),
            predicted_step_s=predicted_step_s(hw, run_row.time),
            preset_step_s=preset_step_s(run_plan, name),
            time_source=run_plan.hardware.sources.get("time_model"),
            estimate=job.estimate,
        )
        say(f"launching {name} on {world} {device} rank(s) in {run_dir}")
        first_use = unit.launcher.first_use_note(device, env)
        if first_use:
            say(first_use)
        started = time.time()
        try:
            # No evaluation and no periodic checkpoint among the measured steps (they would run under the memory
            # meter); the run's last checkpoint is still written after training.
            # The probe measures memory over the first ``steps`` steps, then the ``timing_steps`` after them run
            # unmetered for the step time.
            cmd = unit.launcher.verify_argv(
                world,
                port,
                ["--steps", str(steps + timing_steps), "--out", "out", "--eval-every", "0", "--save-every", "0"],
                probe=["--measured-steps", str(steps)],
            )
            others = OtherCpu()
            rc, timed_out = _launch(cmd, run_dir, env, timeout_s, steps + timing_steps, say)
            result.cpu_contention = others.share() if device == Device.CPU else None
        finally:
            remove_deepspeed_shm(port)
    return conclude(result, rc, timed_out, timeout_s, started)


def conclude(result: VerifyResult, rc: int | None, timed_out: bool, timeout_s: float, since: float) -> VerifyResult:
    """Measured or failed, from the launcher's exit and the report in ``result.log_dir``/out. A run
    whose ranks all reported and which then crashed or hung in teardown (e.g. a rank aborting in
    interpreter shutdown) is measured, with a note: the figures were taken before. A run without a
    whole report is a failure, whatever the exit code."""
    run_dir = Path(result.log_dir)
    report, why = read_report(run_dir / "out" / "report.json", result.world_size, result.steps, since)
    if report is None:
        if rc == 0:
            result.message = f"the run exited 0 but {why}. Log: {run_dir / 'run.log'}"
        else:
            result.message = failure_message(run_dir / "run.log", rc, timed_out, timeout_s)
        return result
    if rc != 0:
        log_path = run_dir / "run.log"
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        result.notes.append(teardown_note(text, rc, timed_out, timeout_s))
    return _compare(result, report)


def _compare(result: VerifyResult, report: RunReport) -> VerifyResult:
    est = result.estimated_peak_bytes
    assert est is not None, "a run is launched with its estimate"
    worst = None
    for r in report["per_rank"]:
        if result.rank_estimates is not None:
            est = result.rank_estimates[r["rank"]]
        measured = int(r["peak_allocated_bytes"])
        err = (est - measured) / measured if measured else None
        result.per_rank.append(
            {
                "rank": r["rank"],
                "measured_peak_bytes": measured,
                "measured_reserved_bytes": r.get("peak_reserved_bytes"),
                "estimated_peak_bytes": est,
                "relative_error": err,
            }
        )
        if err is not None and (worst is None or abs(err) > abs(worst)):
            worst = err
    result.losses = report["per_rank"][0]["losses"]
    result.relative_error = worst
    result.ok = len(result.per_rank) == result.world_size
    result.within_tolerance = worst is not None and abs(worst) <= TOLERANCE
    add_step_time(result, report)
    result.message = (
        "completed" if result.ok else f"report has {len(result.per_rank)} ranks, expected {result.world_size}"
    )
    return result


def predicted_step_s(hw: Hardware, t: StepTime | None) -> float | None:
    """The step time the model predicts for the run: the row's ``StepTime`` (``t``; None: untimed), on a
    calibrated CPU with the CPU's overlap rule (``CpuCalibration.step_s``)."""
    if t is None:
        return None
    return hw.calibration.step_s(t) if hw.calibration is not None else t.step_s


def preset_step_s(p: Plan, name: str) -> float | None:
    """Row ``name``'s step time by the GPU preset's constants, when ``p`` is timed by this machine's GPU calibration
    (``Hardware.gpu_model``, ``advisor.hardware.with_gpu_calibration``): the strategy's time rule on the same plan
    without it. None otherwise (a CPU run, or a GPU without a calibration: one prediction only)."""
    hw = p.hardware
    if hw.gpu_model is None or hw.calibration is not None:
        return None
    row = p.row(name)
    t = row.strategy.step_time(replace(p.context(), hardware=without_gpu_calibration(hw)), row)
    return t.step_s if t is not None else None


def median_step_s(step_times: list[float], profiled_steps: int = 0, warmup: int = WARMUP_STEPS) -> float | None:
    """Seconds per optimizer step of one rank: the median of its steps after the first ``warmup`` and after the
    ``profiled_steps`` that ran under the CPU memory profiler (which slows steps down); None when none is left."""
    rest = [float(t) for t in step_times[max(warmup, profiled_steps) :]]
    return statistics.median(rest) if rest else None


def add_step_time(result: VerifyResult, report: RunReport) -> None:
    """Each rank's measured step time into ``result.per_rank`` (same order as the report), the run's (the
    slowest rank's: ranks wait for each other) and its error against ``result.predicted_step_s``."""
    medians: list[float | None] = []
    for r, mine in zip(report["per_rank"], result.per_rank):
        losses = r.get("losses") or []
        profiled = r.get("profiled_steps", 0 if result.device == Device.CUDA else len(losses))
        mine["measured_step_s"] = median_step_s(r.get("step_times_s") or [], profiled)
        medians.append(mine["measured_step_s"])
    measured = [m for m in medians if m is not None]
    if medians and len(measured) == len(medians):
        result.measured_step_s = max(measured)
        if result.predicted_step_s is not None and result.measured_step_s > 0:
            result.step_time_error = (result.predicted_step_s - result.measured_step_s) / result.measured_step_s


def step_time_line(result: VerifyResult) -> str | None:
    """ "step time: measured X ms, predicted Y ms (error Z%)", or what is missing; None without a measurement."""
    if result.measured_step_s is None:
        return None
    measured = f"step time: measured {1e3 * result.measured_step_s:.1f} ms"
    busy = ""
    if result.cpu_contention is not None and result.cpu_contention > BUSY_SHARE:
        busy = (
            f"; other processes took {100 * result.cpu_contention:.0f}% of the CPUs during the run: the measured "
            "time is inflated"
        )
    if result.predicted_step_s is None or result.step_time_error is None:
        return measured + ", no prediction (no time model for this device)" + busy
    preset = ""
    if result.preset_step_s is not None and (preset_error := result.preset_step_time_error) is not None:
        preset = (
            f", preset constants {1e3 * result.preset_step_s:.1f} ms (error {100 * preset_error:+.1f}%); the "
            f"prediction is {result.time_source or 'calibrated on this machine'}"
        )
    return (
        f"{measured}, predicted {1e3 * result.predicted_step_s:.1f} ms (error {100 * result.step_time_error:+.1f}%"
        f"{preset}; median after {WARMUP_STEPS} warm-up steps, memory profiler off; data loading not modelled{busy})"
    )
