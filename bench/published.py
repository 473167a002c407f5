"""Step time against published GPU training runs: ``python -m bench.published`` (no training).

    .venv/bin/python -m bench.published            # every row -> bench/PUBLISHED.md
    .venv/bin/python -m bench.published --fit      # also refit the GpuModel constants and print them to paste
    .venv/bin/python -m bench.published --cold     # the same in an empty trace cache (records the cold time)
    .venv/bin/python -m bench.published --rows F41,F42 --out /tmp/p.md   # a subset

Each row (bench/published_cases.py) is planned once (``advisor.plan.plan``, traces on the meta device, cached);
its strategy's time rule is then evaluated at the published micro-batch and accumulation steps
(``step_of``), with the plan context's ``hardware.gpu_model`` replaced for each trial of the fit
(bench/published_fit.py): no re-planning, no re-tracing. Errors are of throughput: predicted / published - 1
(for a published time, published / predicted - 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from .published_case import OVERLAP_DDP, OVERLAP_MEGATRON_CORE
from .published_cases import S_EPOCH, S_ITER, S_RUN, THROUGHPUT_UNITS, TOK_S_GPU, Case, cases
from .published_fit import Fit, Target, fit_all, leave_one_source_out, paste, paste_bands
from .published_results import TARGETS, Results, RowResult, stats

__all__ = ["TARGETS", "Results", "RowResult", "evaluate", "stats"]

if TYPE_CHECKING:
    from advisor.context import StrategyContext as PlanContext
    from advisor.plan import Plan
    from advisor.rows import StrategyRow
    from advisor.timing.gpu_model import GpuModel
    from advisor.timing.step import StepTime

BENCH_DIR = Path(__file__).resolve().parent
PUBLISHED_MD = BENCH_DIR / "PUBLISHED.md"
TIMES_JSON = BENCH_DIR / "published_times.json"  # the cold and warm wall times PUBLISHED.md states


def start_models() -> dict[str, GpuModel]:
    """The constants each generation's fit starts from: advisor/timing/gpu_model.py's ``INITIAL``
    table, the microbenchmarked (or borrowed) constants before any fit. Cross-validation starts there too, so a
    held-out source never reaches its own prediction through the start (``MODELS`` saw every source)."""
    from advisor.timing.gpu_model import INITIAL

    return dict(INITIAL)


def generation(case: Case) -> str:
    """The GPU generation of ``case``'s preset (``advisor.timing.compute.GENERATION``)."""
    from advisor.timing.compute import GENERATION

    return GENERATION[case.gpu.lower()]


def plan_case(case: Case) -> Plan:
    """``case`` planned once (its plan inputs, ``Case.plan_values``).

    Raises:
        AdvisorError: the inputs are rejected.
    """
    from advisor.plan import plan
    from advisor.schema import plan_inputs

    return plan(plan_inputs(**case.plan_values()))


def step_of(case: Case, p: Plan, gpu_model: GpuModel | None = None) -> tuple[StepTime, int]:
    """(the strategy's step at ``case``'s micro-batch and accumulation steps, its data-parallel size), with the
    plan context's ``hardware.gpu_model`` replaced by ``gpu_model`` when given: the plan's row for the strategy
    with its accumulation and global batch set, evaluated by the strategy's own time rule; a source that fuses its
    element-wise ops (``Case.fused``) with those constants' ``fused_elementwise`` set.

    Raises:
        KeyError: the plan has no row for the strategy. ValueError: the row does not apply or has no time rule.
    """
    ctx = p.context()
    if case.fused:  # the source fuses its element-wise ops (Case.fused): the same constants, fused kernels
        from advisor.timing.compute import model_for, preset_for_gpu

        preset = preset_for_gpu(ctx.hardware.gpu_name, ctx.hardware.gpu_memory_bytes)
        base = gpu_model or ctx.hardware.gpu_model or (model_for(preset) if preset is not None else None)
        gpu_model = replace(base, fused_elementwise=True) if base is not None else None
    if gpu_model is not None:
        ctx = replace(ctx, hardware=replace(ctx.hardware, gpu_model=gpu_model))
    row = p.row(case.strategy)
    if not row.applicable:
        raise ValueError(f"{case.strategy} does not apply: {row.reason}")
    shadow = replace(
        row, grad_accum_steps=case.grad_accum, global_batch_size=case.grad_accum * row.dp_size * case.micro_batch
    )
    t = row.strategy.step_time(ctx, shadow)
    if t is None:
        raise ValueError(f"{case.strategy} has no step time for {case.gpu}")
    if case.overlap:
        t = source_overlap(case, ctx, row, t)
    return t, max(1, row.dp_size)


# Megatron-core's gradient bucket: max(40M, 1M x DP) parameters (megatron/core/distributed/
# distributed_data_parallel.py, ``ddp_config.bucket_size`` when --overlap-grad-reduce sets none).
MEGATRON_BUCKET_PARAMS = 40_000_000


def source_overlap(case: Case, ctx: PlanContext, row: StrategyRow, t: StepTime) -> StepTime:
    """``t`` with the source's own overlap (``Case.overlap``) in place of the strategy's exposed communication:

    * the data-parallel gradient reduction (replacing the strategy's ``data-parallel`` collectives, same bytes, same
      fabric as TP x DP's: one group per TP rank across the nodes) in the source's buckets beside the last
      micro-step's backward, the last bucket after it (``advisor.timing.step.exposed_s``, as DDP's rule): torch
      DDP's 25 MiB all-reduce buckets (``OVERLAP_DDP``, advisor.timing.comm.DDP_BUCKET_CAP_BYTES); Megatron-core's
      max(40M, 1M x DP) parameters (``OVERLAP_MEGATRON_CORE``, ``MEGATRON_BUCKET_PARAMS``) with the distributed
      optimizer (--overlap-param-gather needs --use-distributed-optimizer): each bucket reduce-scattered beside the
      last backward and its updated parameters all-gathered beside the next forward;
    * Megatron-core also: the tensor-parallel collectives hidden behind the GEMMs they are split with
      (--tp-comm-overlap: Transformer Engine's userbuffers pipeline each all-gather / reduce-scatter with its GEMM
      in chunks), exposed only where they outlast the compute (``exposed_s``, one piece per call); and the
      optimizer step over 1 / DP of the states on each rank (the distributed optimizer).

    Raises:
        ValueError: an unknown ``Case.overlap``.
    """
    from advisor.timing.comm import DDP_BUCKET_CAP_BYTES, split_buckets
    from advisor.timing.step import exposed_s
    from strategies.base import fabric_of, timing_of

    if case.overlap not in (OVERLAP_DDP, OVERLAP_MEGATRON_CORE):
        raise ValueError(f"unknown overlap {case.overlap!r}")
    timing = timing_of(ctx)
    if timing is None:
        return t
    deg, hw = row.tp_degree or 1, ctx.hardware
    c = row.strategy.compute_time(ctx, timing, deg)
    dp_bytes = sum(x.nbytes for x in t.collectives if x.group == "data-parallel")
    tp = [x for x in t.collectives if x.group != "data-parallel"]
    exposed = 0.0
    if dp_bytes:
        fabric = fabric_of(ctx, timing, max(1, hw.gpus_per_node // deg), hw.num_nodes, concurrent_groups=deg)
        if case.overlap == OVERLAP_DDP:
            ar = [fabric.time_s("all_reduce", x) for x in split_buckets(dp_bytes, DDP_BUCKET_CAP_BYTES)]
            exposed = exposed_s(sum(ar), c.bwd_s, len(ar), last_s=ar[-1])
        else:  # the bucket in the gradients' bytes per element (dp_bytes / trainable parameters of the shard)
            shard = ctx.profile.tp_stats(deg).num_trainable
            bucket = max(MEGATRON_BUCKET_PARAMS, 1_000_000 * max(1, row.dp_size)) * dp_bytes // max(1, shard)
            sizes = split_buckets(dp_bytes, max(1, bucket))
            rs = [fabric.time_s("reduce_scatter", x) for x in sizes]
            ag = [fabric.time_s("all_gather", x) for x in sizes]
            exposed = exposed_s(sum(rs), c.bwd_s, len(rs), last_s=rs[-1]) + exposed_s(sum(ag), c.fwd_s, len(ag))
    tp_s = sum(x.seconds for x in tp)
    optimizer_s = t.optimizer_s
    if case.overlap == OVERLAP_MEGATRON_CORE:
        exposed += exposed_s(tp_s, t.compute_s, max(1, sum(x.calls for x in tp))) if tp_s else 0.0
        optimizer_s /= max(1, row.dp_size)
    else:
        exposed += tp_s
    return replace(
        t,
        exposed_comm_s=exposed,
        optimizer_s=optimizer_s,
        overlap=f"the source's ({case.overlap}): bench.published.source_overlap",
    )


def in_unit(case: Case, step_s: float, dp: int) -> float:
    """A predicted step of ``step_s`` seconds as ``case``'s figure, in its unit (``bench.published_cases``)."""
    samples = case.micro_batch * case.grad_accum * dp  # per optimizer step, the whole job
    if case.unit == TOK_S_GPU:
        return samples * case.seq / step_s / case.gpus
    if case.unit in THROUGHPUT_UNITS:
        return samples / step_s
    if case.unit == S_ITER:
        return step_s
    if case.unit == S_EPOCH:
        return (case.samples or 0) / samples * step_s
    if case.unit == S_RUN:
        return (case.samples or 0) * step_s
    raise ValueError(f"unknown unit {case.unit!r}")


def throughput(case: Case, value: float) -> float:
    """A figure in ``case``'s unit as a throughput (a time's reciprocal): errors are of throughput."""
    return value if case.unit in THROUGHPUT_UNITS else 1.0 / value


def error(case: Case, predicted: float) -> float:
    """Signed throughput error: predicted / published - 1 (a time: published / predicted - 1)."""
    return throughput(case, predicted) / throughput(case, case.published) - 1


def target(case: Case, p: Plan) -> Target:
    """``case`` as a fit row: its published throughput and a predictor of it from a ``GpuModel``."""

    def predict(model: GpuModel) -> float:
        t, dp = step_of(case, p, model)
        return throughput(case, in_unit(case, t.step_s, dp))

    return Target(case.row, generation(case), case.source, throughput(case, case.published), predict)


def evaluate(chosen: Sequence[Case], do_fit: bool, log: bool = True) -> Results:
    """Plan, predict, cross-validate (and with ``do_fit`` refit) ``chosen``: the results ``render`` writes."""
    t0 = time.perf_counter()
    plans: dict[str, Plan] = {}
    failed: dict[str, str] = {}
    for c in chosen:
        t1 = time.perf_counter()
        try:
            plans[c.row] = plan_case(c)
            step_of(c, plans[c.row])
        except Exception as err:  # noqa: BLE001 - one row's failure is reported in the table, not fatal
            plans.pop(c.row, None)
            failed[c.row] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        if log:
            print(f"  planned {c.row:<22} {time.perf_counter() - t1:6.1f} s", file=sys.stderr, flush=True)
    planned_s = time.perf_counter() - t0
    ok = [c for c in chosen if c.row in plans]
    starts = start_models()
    targets = [target(c, plans[c.row]) for c in ok if c.fitted]
    shown = [target(c, plans[c.row]) for c in ok if not c.fitted]
    t2 = time.perf_counter()
    held = leave_one_source_out(targets, starts, shown)
    fits: dict[str, Fit] = fit_all(targets, starts) if do_fit else {}
    fit_s = time.perf_counter() - t2
    rows: list[RowResult] = []
    for c in ok:
        t, dp = step_of(c, plans[c.row])
        value = in_unit(c, t.step_s, dp)
        pub = throughput(c, c.published)
        refit = fits.get(generation(c))
        again = target(c, plans[c.row]).predict(refit.model) / pub - 1 if refit else None
        rows.append(RowResult(c, generation(c), value, error(c, value), held[c.row] / pub - 1, again, t))
    return Results(rows, failed, fits, starts, planned_s, fit_s, time.perf_counter() - t0)


def _times(mode: str, wall_s: float, rows: int) -> dict[str, dict[str, object]]:
    """The recorded cold and warm wall times, this run's (``mode``) updated when it ran every row."""
    try:
        recorded = json.loads(TIMES_JSON.read_text())
    except (OSError, ValueError):
        recorded = {}
    if rows == len(cases()):
        recorded[mode] = {"wall_s": round(wall_s, 1), "date": datetime.now(UTC).strftime("%Y-%m-%d"), "rows": rows}
        TIMES_JSON.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return dict(recorded)


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring): 0 when every chosen row planned, 1 when one failed, 2 on bad arguments."""
    started = time.perf_counter()
    ap = argparse.ArgumentParser(prog="python -m bench.published", description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the GpuModel constants per generation and print them")
    ap.add_argument("--rows", metavar="IDS", help="only these rows (comma-separated ids, or id prefixes ending in *)")
    ap.add_argument("--out", metavar="FILE", help="write the table here (default bench/PUBLISHED.md)")
    ap.add_argument("--cold", action="store_true", help="run in a new, empty trace cache (records the cold time)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.cold:
        os.environ["ADVISOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="advisor-published-cold-")
    chosen = list(cases())
    if args.rows:
        wanted = [w.strip() for w in args.rows.split(",") if w.strip()]
        chosen = [
            c for c in chosen if any(c.row == w or (w.endswith("*") and c.row.startswith(w[:-1])) for w in wanted)
        ]
        if not chosen:
            print(f"error: no row matches --rows {args.rows}", file=sys.stderr)
            return 2
    results = evaluate(chosen, args.fit)
    from .published_report import render

    results.wall_s = time.perf_counter() - started  # the whole command: imports, planning, fits
    times = _times("cold" if args.cold else "warm", results.wall_s, len(chosen))
    text = render(results, times, full=len(chosen) == len(cases()))
    out = Path(args.out) if args.out else PUBLISHED_MD
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    if args.fit:
        print("# constants to paste into advisor/timing/gpu_model.py:\n" + paste(results.fits))
        print("# leave-one-source-out residual bands for the error band on time figures:")
        print(paste_bands(stats(results.rows, "loso_error").bands))
    return 0 if not results.failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
