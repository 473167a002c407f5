"""Benchmark of advisor's per-rank peak-memory estimate against measured CPU runs and today's tools.

    .venv/bin/python -m bench.run            # the full suite -> bench/RESULTS.md, results.json, PNG
    .venv/bin/python -m bench.run --smoke    # 3 small cases into a temporary directory (CI)

Every case renders the training script for its strategy and runs it through ``advisor.verify.verify``
(the ``--verify`` machinery: gloo, ``DS_ACCELERATOR=cpu``), which measures each rank's peak
allocated bytes with the profiler's allocator events. The table compares, per case, the measured
peak (max over ranks) with our estimate, DeepSpeed's estimators, accelerate's estimate-memory and
the 16-bytes-per-parameter rule of thumb (see bench/baselines.py). A second table times the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from .cases import BENCH_DIR, SMOKE, SUITE, Case

CASE_TIMEOUT_S = 420.0
TIMING_STEPS = 3  # steps verify times after each case's measured ones (the median of 3: the suite stays < 30 min)
BUSY_WAIT_S = 900.0  # another verification holds the machine lock: wait this long at most
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.25
# Issue 13: CPU verification runs' step time, median |error| <= 20%, worst <= 50%, over the suite.
TARGET_STEP_MEDIAN, TARGET_STEP_WORST = 0.20, 0.50
_70B = ["-m", "advisor", "llama-2-70b", "--json"]
# (label, python arguments, the untimed question asked first in the same fresh cache, or None: no cache).
CLI_COMMANDS = (
    ("cold: python -m advisor llama-2-70b --gpus 8 --json --no-cache", [*_70B, "--gpus", "8", "--no-cache"], None),
    (
        "warm: python -m advisor llama-2-70b --gpus 8 --nodes 2 --json (after --gpus 8)",
        [*_70B, "--gpus", "8", "--nodes", "2"],
        [*_70B, "--gpus", "8"],
    ),
    (
        "warm: python -m advisor llama-2-70b --gpus 4 --json (after --gpus 8, whose plan also traced the TP "
        "shards for 2 and 4 GPUs)",
        [*_70B, "--gpus", "4"],
        [*_70B, "--gpus", "8"],
    ),
    (
        "warm: python -m advisor llama-2-70b --gpus 8 --json (the same question again)",
        [*_70B, "--gpus", "8"],
        [*_70B, "--gpus", "8"],
    ),
    (
        "cold: python -m advisor resnet50 --gpus 4 --json --no-cache",
        ["-m", "advisor", "resnet50", "--gpus", "4", "--json", "--no-cache"],
        None,
    ),
    ('python -c "import torch, transformers"', ["-c", "import torch, transformers"], None),
    # `import transformers` is lazy: it loads no model code. Any tool that builds Llama with transformers'
    # classes pays at least this (LlamaConfig alone pulls image utilities -> torchvision -> torch._dynamo).
    (
        'python -c "import torch; from transformers import LlamaConfig, LlamaForCausalLM"',
        ["-c", "import torch; from transformers import LlamaConfig, LlamaForCausalLM"],
        None,
    ),
)
# Issue 11: warm (another --gpus) <= 1.3 x `import torch, transformers`; cold <= 1.25 x the Llama import floor.
TARGET_WARM_RATIO, TARGET_COLD_RATIO = 1.3, 1.25
TARGET_CLI_RSS = 1.5 * 2**30
COLUMNS = (
    ("ours", "advisor (ours)"),
    ("deepspeed", "DeepSpeed estimator"),
    ("accelerate", "accelerate estimate-memory"),
    ("rule", "16 B/param x 1.2"),
)


def plan_inputs(case: Case):
    """The PlanInputs a user would type for ``case`` (no hardware detection; one node)."""
    from advisor.schema import inputs_from_values

    return inputs_from_values(case.values())[0]


def _children_cpu_s() -> float:
    """User + system CPU seconds of every finished child process (and theirs), so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _verify(inputs, case: Case, run_dir: Path, say):
    """``verify`` for ``case``; (result, wall seconds and CPU seconds of all its processes, for the
    attempt that ran). Waits while another
    verification holds the machine lock (their runs would compete for the same cores)."""
    from advisor.verify import VerifyBusy, verify

    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        t0, cpu0 = time.perf_counter(), _children_cpu_s()
        try:
            result = verify(
                inputs,
                case.strategy,
                steps=case.steps,
                timeout_s=CASE_TIMEOUT_S,
                out_dir=str(run_dir),
                precision_explicit=case.precision != "fp32",
                progress=say,
                timing_steps=TIMING_STEPS,
            )
            return result, time.perf_counter() - t0, _children_cpu_s() - cpu0
        except VerifyBusy:
            if time.monotonic() > deadline:
                raise
            say("another verification is running on this machine; waiting")
            shutil.rmtree(run_dir, ignore_errors=True)  # verify wrote the files before it found the lock taken
            time.sleep(10)


def run_case(case: Case, work: Path, log) -> dict:
    """Measure ``case`` and compute every estimate; the run directory is removed afterwards."""
    from advisor.models import resolve_source
    from advisor.profile import build_profile

    from . import baselines

    inputs = plan_inputs(case)
    spec = resolve_source(inputs.source)
    num_params, total_size = baselines.model_sizes(spec)
    profile = build_profile(spec, "flash", False)
    row = case.as_dict() | {
        "num_params": num_params,
        "estimates": {
            "deepspeed": baselines.deepspeed_bytes(profile, case.strategy, case.world),
            "accelerate": baselines.accelerate_training_bytes(total_size, case.precision),
            "rule": baselines.rule_of_thumb_bytes(num_params),
        },
    }
    run_dir = work / case.case_id
    t0 = time.perf_counter()
    try:
        result, wall, cpu = _verify(inputs, case, run_dir, lambda msg: log(f"    {msg}"))
        row["wall_s"], row["cpu_s"] = round(wall, 1), round(cpu, 1)
        row["ok"], row["message"], row["notes"] = result.ok, result.message, result.notes
        row["per_rank_peak_bytes"] = [r["measured_peak_bytes"] for r in result.per_rank]
        row["estimates"]["ours"] = result.estimated_peak_bytes
        # Step time (verify: max over ranks of the median unprofiled step; predicted from this machine's calibration)
        row["measured_step_s"], row["predicted_step_s"] = result.measured_step_s, result.predicted_step_s
        row["step_time_error"] = result.step_time_error
        row["cpu_contention"] = result.cpu_contention  # other processes' share of the CPUs during the run
        if result.estimate:
            est = result.estimate
            row["our_breakdown_bytes"], row["our_peak_phase"] = est["breakdown_bytes"], est["peak_phase"]
        if not result.ok:
            log_path = run_dir / "run.log"
            row["log_tail"] = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
    except Exception as err:  # one broken case must not lose the others
        row.update(ok=False, message=f"{err.__class__.__name__}: {err}", wall_s=round(time.perf_counter() - t0, 1))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if row.get("ok") and row.get("per_rank_peak_bytes"):
        measured = max(row["per_rank_peak_bytes"])
        row["measured_peak_bytes"] = measured
        row["errors"] = {k: (v - measured) / measured if v is not None else None for k, v in row["estimates"].items()}
    return row


def _wait4(args: list[str], cwd: str, env: dict | None = None) -> tuple[float, int, int]:
    """Run ``python *args``; (wall seconds, peak RSS bytes of that child alone, exit code)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss * 1024, proc.returncode  # ru_maxrss is KiB on Linux


def cli_cost(repeats: int = 3) -> list[dict]:
    """Wall time and peak RSS of the advisor CLI and of importing torch + transformers (median of
    ``repeats`` runs each, interleaved so background load hits all of them alike)."""
    runs: dict[str, list] = {label: [] for label, _, _ in CLI_COMMANDS}
    with tempfile.TemporaryDirectory(prefix="advisor-bench-cli-") as cwd:
        for i in range(repeats):
            for j, (label, args, prime) in enumerate(CLI_COMMANDS):
                env = dict(os.environ, ADVISOR_CACHE_DIR=str(Path(cwd) / f"cache-{i}-{j}"))  # a fresh cache each
                if prime:
                    _wait4(prime, cwd, env)
                runs[label].append(_wait4(args, cwd, env))
    return [
        {
            "command": label,
            "wall_s": statistics.median(r[0] for r in rs),
            "peak_rss_bytes": max(r[1] for r in rs),
            "exit_codes": sorted({r[2] for r in rs}),
            "repeats": repeats,
        }
        for label, rs in runs.items()
    ]


def machine_info() -> dict:
    import deepspeed  # noqa: F401  (version only)
    import torch
    import transformers

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    mem_kib = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_bytes": mem_kib * 1024,
        "native_bf16": any(f in flags.split() for f in ("avx512_bf16", "amx_bf16")),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "deepspeed": sys.modules["deepspeed"].__version__,
    }


def merged(old: dict, rows: list[dict], machine: dict, wall_s: float) -> dict:
    """``old`` (a full run's results) with ``rows`` replacing the cases of the same id and the new ones added, in
    the suite's order; each case keeps the date of the run that measured it (``run_date``), the summary is
    recomputed and the merge is recorded (``merges``: date, cases, wall time)."""
    order = {c.case_id: i for i, c in enumerate(SUITE)}
    for r in old["cases"]:
        r.setdefault("run_date", old["machine"]["date"])
    for r in rows:
        r["run_date"] = machine["date"]
    cases = {r["case_id"]: r for r in old["cases"]} | {r["case_id"]: r for r in rows}
    data = dict(old, cases=sorted(cases.values(), key=lambda r: order.get(r["case_id"], len(order))))
    data["summary"] = summarize(data["cases"])
    data["merges"] = old.get("merges", []) + [
        {"date": machine["date"], "cases": [r["case_id"] for r in rows], "wall_s": round(wall_s, 1)}
    ]
    return data


def summarize(rows: list[dict]) -> dict:
    """Median and worst absolute relative error per column, over the cases where it applies."""
    out = {}
    for key, _ in COLUMNS:
        errs = [abs(r["errors"][key]) for r in rows if r.get("errors") and r["errors"].get(key) is not None]
        out[key] = {
            "n": len(errs),
            "median_abs": statistics.median(errs) if errs else None,
            "worst_abs": max(errs) if errs else None,
        }
    out["step_time"] = summarize_step_time(rows)
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.get("errors") and r["errors"].get("ours") is not None:
            group = (
                ("qlora" if r.get("quantize") else "lora")
                if r.get("lora_rank")
                else STRATEGY_GROUPS.get(r["strategy"], r["strategy"])
            )
            groups.setdefault(group, []).append(abs(r["errors"]["ours"]))
    out["by_strategy"] = {
        g: {"n": len(e), "median_abs": statistics.median(e), "worst_abs": max(e)} for g, e in groups.items()
    }
    return out


# Strategy families in the per-strategy summary (issue 15's targets are on the FSDP2 and single cases).
STRATEGY_GROUPS = {
    "zero1": "zero",
    "zero2": "zero",
    "zero3": "zero",
    "tp": "tp",
    "tp_dp": "tp",
    "fsdp2": "fsdp2",
    "fsdp2_noreshard": "fsdp2",
    "single": "single",
    "ddp": "ddp",
}


def summarize_step_time(rows: list[dict]) -> dict:
    """Median and worst absolute step-time error, over the cases that measured and predicted one, and the same over
    the quiet ones (``quiet``: other processes took at most ``CONTENDED_SHARE`` of the CPUs during the run, so the
    measured time is this machine's own)."""
    from advisor.timing.calibrate import CONTENDED_SHARE

    def stats(errs: list[float]) -> dict:
        return {
            "n": len(errs),
            "median_abs": statistics.median(errs) if errs else None,
            "worst_abs": max(errs) if errs else None,
        }

    timed = [r for r in rows if r.get("ok") and r.get("step_time_error") is not None]
    quiet = [r for r in timed if (r.get("cpu_contention") or 0.0) <= CONTENDED_SHARE]
    return stats([abs(r["step_time_error"]) for r in timed]) | {
        "quiet": stats([abs(r["step_time_error"]) for r in quiet]),
        "contended_share": CONTENDED_SHARE,
    }


def repredict(data: dict, log) -> dict:
    """``data`` (a results.json) with every measured case's predicted step time computed again by today's step-time
    model and this machine's CPU calibration, as ``verify`` would predict it (``advisor.verify_setup.verify_plan``), no
    training run: the measured step times keep the date and the CPU contention of their runs. Cases measured
    while other processes took more than ``CONTENDED_SHARE`` of the CPUs stay in the table and are counted
    separately in the summary (``report``)."""
    from dataclasses import fields

    from advisor.verify import predicted_step_s
    from advisor.verify_setup import verify_plan

    names = {f.name for f in fields(Case)}
    for row in data["cases"]:
        measured = row.get("measured_step_s")
        if not row.get("ok") or not measured:
            continue
        case = Case(**{k: row[k] for k in names if k in row})
        name, p, hw, _ = verify_plan(plan_inputs(case), case.strategy, "cpu", case.precision != "fp32")
        predicted = predicted_step_s(hw, p.row(name).time)
        log(
            f"{case.case_id}: measured {1e3 * measured:.1f} ms, predicted {1e3 * row['predicted_step_s']:.1f} -> "
            f"{1e3 * predicted:.1f} ms"
        )
        row["predicted_step_s"], row["step_time_error"] = predicted, (predicted - measured) / measured
    data["step_time_repredicted"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    data["summary"] = summarize(data["cases"])
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="3 small cases (well under 2 minutes)")
    p.add_argument("--only", metavar="SUBSTR", help="only cases whose id contains SUBSTR (several: comma-separated)")
    p.add_argument(
        "--out",
        metavar="DIR",
        help="output directory (default: bench/ for the full suite, a new temporary directory for --smoke/--only)",
    )
    p.add_argument("--no-cli", action="store_true", help="skip the CLI cost table")
    p.add_argument("--render", metavar="RESULTS_JSON", help="re-render tables and plot from a results.json")
    p.add_argument(
        "--cli-only",
        action="store_true",
        help="re-measure only the CLI cost table into the results.json in --out (default bench/) and re-render",
    )
    p.add_argument(
        "--merge",
        metavar="RESULTS_JSON",
        help="with --only: replace or add the cases run in this earlier "
        "full results.json and re-render it (in --out, default bench/); the cases not run keep their "
        "figures and the date of their run",
    )
    p.add_argument(
        "--repredict",
        metavar="RESULTS_JSON",
        help="predict every measured case's step time again with "
        "today's model and this machine's calibration (no training) and re-render (in --out, default bench/)",
    )
    args = p.parse_args(argv)
    from .report import write_outputs

    if args.merge and not args.only:
        p.error("--merge needs --only (the cases to rerun)")
    partial = (args.smoke or args.only) and not args.merge
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="advisor-bench-")) if partial else BENCH_DIR)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.cli_only:
        data = json.loads((out / "results.json").read_text())
        data["cli"] = cli_cost()
        data["cli_date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        write_outputs(data, out)
        log(f"re-measured the CLI cost into {out / 'results.json'} and {out / 'RESULTS.md'}")
        return 0
    if args.repredict:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        data = repredict(json.loads(Path(args.repredict).read_text()), log)
        write_outputs(data, out)
        log(f"re-predicted the step times into {out / 'results.json'} and {out / 'RESULTS.md'}")
        return 0
    if args.render:
        data = json.loads(Path(args.render).read_text())
        write_outputs(data, out)
        log(f"rendered {out / 'RESULTS.md'}")
        return 0
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never contact a model hub (set at the entry point)
    cases = SMOKE if args.smoke else SUITE
    if args.only:
        cases = tuple(c for c in SUITE + SMOKE if any(s in c.case_id for s in args.only.split(",")))
    t0, load_start = time.perf_counter(), os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="advisor-bench-runs-") as work:
        for i, case in enumerate(cases, 1):
            log(f"[{i}/{len(cases)}] {case.case_id}")
            row = run_case(case, Path(work), log)
            err = row.get("errors", {}).get("ours")
            outcome = (
                f"measured {row['measured_peak_bytes'] / 2**20:.1f} MiB, ours {100 * err:+.1f}%"
                if err is not None
                else "FAILED: " + row.get("message", "")[:300]
            )
            log(f"    -> {outcome} ({row.get('wall_s')} s)")
            if row.get("step_time_error") is not None:
                log(
                    f"    -> step time measured {1e3 * row['measured_step_s']:.1f} ms, predicted "
                    f"{1e3 * row['predicted_step_s']:.1f} ms ({100 * row['step_time_error']:+.1f}%)"
                )
            rows.append(row)
    suite_wall = time.perf_counter() - t0
    if args.merge:
        data = merged(json.loads(Path(args.merge).read_text()), rows, machine_info(), suite_wall)
        write_outputs(data, out)
        log(f"merged {len(rows)} case(s) into {out / 'results.json'} and re-rendered {out / 'RESULTS.md'}")
        return 0 if all(r.get("ok") for r in rows) else 1
    data = {
        "machine": machine_info(),
        "suite": "smoke" if args.smoke else ("partial" if args.only else "full"),
        "suite_wall_s": round(suite_wall, 1),
        "suite_cpu_s": round(sum(r.get("cpu_s", 0) for r in rows), 1),
        "load_avg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "cases": rows,
        "summary": summarize(rows),
        "targets": {"median_abs": TARGET_MEDIAN, "worst_abs": TARGET_WORST},
        "step_time_targets": {"median_abs": TARGET_STEP_MEDIAN, "worst_abs": TARGET_STEP_WORST},
        "cli": [] if args.no_cli else cli_cost(),
        "cli_targets": {"warm_ratio": TARGET_WARM_RATIO, "cold_ratio": TARGET_COLD_RATIO, "rss_bytes": TARGET_CLI_RSS},
    }
    write_outputs(data, out)
    log(
        f"suite wall time {suite_wall:.0f} s; wrote {out / 'RESULTS.md'}, {out / 'results.json'}, "
        f"{out / 'estimate_vs_measured.png'}"
    )
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
