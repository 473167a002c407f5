"""The layout search (``--top N``): every layout of the cluster that validates (``advisor.layout.layouts_for``: TP
inside a node, PP across, data parallel the rest), each data-parallel policy that runs on it, micro-batch sizes and
activation checkpointing off and on, sized and timed by the strategies' own rules at one global batch; the fastest
that fit first.

What runs on a layout (the strategies the planner hands in, by their interface only):

* ``tp = pp = 1``: every data-parallel row of the plan (DDP, ZeRO-1/2/3, FSDP2, HSDP, with offload);
* ``tp > 1``, ``pp = 1``: the TP rows (``strategies.tp``: TP inside, DDP across), pinned to the layout's ``tp``;
* ``pp > 1``: the pipeline rows (``strategies.pp``: PP x DDP and PP x ZeRO-1, TP inside the stages), pinned to
  ``pp`` and ``tp``, with 1F1B and with interleaved 1F1B at 2 model chunks per rank (torchtitan's default; its bubble
  is half 1F1B's for a larger share of activations in flight), unless ``--pp-schedule`` pins one; PP x TP and
  PP x ZeRO-1 are sized and timed only (their ``estimate_only_for`` says why), as are other rows without a script.

Every candidate trains the same global batch: ``--global-batch-size``, else the plan's micro-batch x GPUs. Micro-batch
sizes are the divisors of the global batch over the data-parallel size (so the accumulation steps are whole), up to
the largest that fits (the device total grows with the micro-batch, so the search stops at the first that does
not), or only the user's ``--micro-batch-size``. Activation checkpointing is tried off and on unless the user turned
it on. The trace is reused: the layouts only cut the same traced blocks differently (``strategies.pipeline``), so the
search costs one more trace at most (the checkpointed one; the planner often made it already for the cheapest fix).
Measured: ``advisor llama-2-70b --gpus 8 --nodes 8 --network ib-hdr`` took 6.9-7.2 s warm with and without
``--top 10`` on this 2-core machine (22 layouts, 46 candidates that fit).

The memory options of the ladder (``--selective-checkpointing``, ``--chunked-cross-entropy``, ...) come after a
layout is chosen, not in the search (``advisor.ladder``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .cache import DiskCache, NullCache
from .candidates import TIE
from .choices import PipelineSchedule
from .context import StrategyContext
from .layout import Layout, layouts_for
from .memory import trace_mode
from .models.limits import layout_dims
from .profile import build_profile
from .rows import StrategyRow, fit_verdict, framework_excludes
from .timing.pipeline import bubble_fraction

if TYPE_CHECKING:
    from strategies.base import Strategy

# A plan's recommended row as the search names its candidates: (strategy, tp, pp, micro-batch, checkpointing).
PlannedKey = tuple[str, int, int, int, bool]


@dataclass(frozen=True)
class LayoutCandidate:
    """One layout, policy, micro-batch and checkpointing choice that fits, sized and timed (bytes per GPU, seconds).

    ``device_total``: the most-loaded rank's (a pipeline's peak stage); ``stage_totals``: every pipeline stage's, first
    stage first (empty without PP); ``bubble_fraction``: the pipeline bubble over the ideal compute (0 without PP);
    ``estimate_only``: why no script runs it (None: ``--emit`` writes it)."""

    layout: Layout
    strategy: str
    title: str
    micro_batch_size: int
    activation_checkpointing: bool
    grad_accum_steps: int
    global_batch_size: int
    device_total: int
    stage_totals: tuple[int, ...]
    step_s: float
    samples_per_s: float
    mfu: float | None
    bubble_fraction: float
    estimate_only: str | None
    # the recommender's tie order: plain one-process training first (Strategy.distributes False), then the row's
    # Strategy.comm_order (least communication first; advisor.candidates.pick)
    tie_order: int
    schedule: PipelineSchedule | None = None  # the pipeline's (None without PP)

    @property
    def key(self) -> PlannedKey:
        """How ``best_layout`` matches this candidate to a plan's recommended row (``Plan.planned_key``)."""
        return (self.strategy, self.layout.tp, self.layout.pp, self.micro_batch_size, self.activation_checkpointing)

    def flags(self) -> str:
        """The command-line flags that plan this candidate as it is sized here: its degrees, schedule, micro-batch,
        checkpointing and the search's global batch (``--emit DIR --strategy`` with the row's name writes its
        script)."""
        parts = [f"--global-batch-size {self.global_batch_size}"]
        if self.layout.tp > 1:
            parts.append(f"--tp {self.layout.tp}")
        if self.layout.pp > 1:
            parts.append(f"--pp {self.layout.pp}")
            if self.schedule is not None and self.schedule is not PipelineSchedule.ONE_F_ONE_B:
                parts.append(f"--pp-schedule {self.schedule}")
        parts.append(f"--micro-batch-size {self.micro_batch_size}")
        if self.activation_checkpointing:
            parts.append("--activation-checkpointing")
        return " ".join(parts)


def _pinned(layout: Layout, ctx: StrategyContext) -> bool:
    """Whether ``layout`` keeps the degrees the user pinned (``--tp-degree``, ``--pp-degree``)."""
    opts = ctx.options
    return (opts.tp_degree is None or layout.tp == opts.tp_degree) and (
        opts.pp_degree is None or layout.pp == opts.pp_degree
    )


def search_layouts(
    contexts: Sequence[StrategyContext],
    dp_rows: Sequence[Strategy],
    tp_rows: Sequence[Strategy],
    pp_rows: Sequence[Strategy],
    micro_batch: int | None = None,
) -> list[LayoutCandidate]:
    """Every candidate that fits (module docstring), fastest first: samples per second at the one global batch,
    then the lower device total (``best_layout`` takes one).

    ``contexts``: the plan's context with activation checkpointing off and/or on (each with its own profile: the
    checkpointed trace differs); their options give the cluster, the global batch and the pinned degrees.
    ``dp_rows`` / ``tp_rows`` / ``pp_rows``: the strategies that run on a layout without model parallelism, with TP
    only, with PP. ``micro_batch``: the user's ``--micro-batch-size`` (None: searched).
    """
    base = contexts[0]
    hw = base.hardware
    target = base.options.global_batch_size or base.micro_batch_size * hw.num_gpus
    cuts = base.profile.spec.is_transformer and base.profile.spec.tp_capable
    stages = cuts and base.profile.spec.pp_blocker is None
    heads, kv, layers = layout_dims(base.profile.spec.config or {}) if cuts else (None, None, None)
    layouts = layouts_for(hw.gpus_per_node, hw.num_nodes, heads, kv, layers, None if cuts else 1, None if stages else 1)
    out: list[LayoutCandidate] = []
    for ctx in contexts:
        for layout in (lay for lay in layouts if _pinned(lay, ctx)):
            opts = replace(
                ctx.options,
                tp_degree=layout.tp if layout.tp > 1 else None,
                pp_degree=layout.pp if layout.pp > 1 else None,
                global_batch_size=target,
            )
            schedules = [opts.pp_schedule]
            if layout.pp > 1 and opts.pp_schedule is None:
                schedules.append(PipelineSchedule.INTERLEAVED_1F1B)
            group = pp_rows if layout.pp > 1 else tp_rows if layout.tp > 1 else dp_rows
            for schedule in schedules:
                c = replace(ctx, options=replace(opts, pp_schedule=schedule))
                for s in group:
                    if framework_excludes(s, c) or s.fine_tuning_blocker(c) or s.not_applicable(c):
                        continue
                    out += _sized(s, c, layout, target, micro_batch)
    return sorted(out, key=lambda c: (-c.samples_per_s, c.device_total))


def search_for_plan(
    ctx: StrategyContext, cache: DiskCache | NullCache, scratch_threads: int, micro_batch: int | None
) -> list[LayoutCandidate]:
    """``search_layouts`` for ``advisor.plan``: over the registered strategies (data-parallel rows, TP rows) and the
    pinned pipeline rows, with activation checkpointing as planned and, when it is off and the model has blocks to
    checkpoint, on (its own trace, ``advisor.profile.build_profile``; ``cache`` and ``scratch_threads`` as there)."""
    from strategies import PINNED, all_strategies

    contexts = [ctx]
    if not ctx.options.activation_checkpointing:
        spec, mode = ctx.profile.spec, trace_mode(ctx.options.precision, casts_weights=False)
        profile = build_profile(
            spec, ctx.profile.attention, True, cache=cache, cpu_conv_scratch_threads=scratch_threads
        )
        if profile.activations(mode).checkpointed_blocks:
            contexts.append(replace(ctx, profile=profile, options=replace(ctx.options, activation_checkpointing=True)))
    registered = all_strategies()
    dp_rows = [s for s in registered if not s.uses_tp_degree and (s.distributes or ctx.hardware.num_gpus == 1)]
    tp_rows = [s for s in registered if s.uses_tp_degree]
    return search_layouts(contexts, dp_rows, tp_rows, PINNED, micro_batch)


def best_layout(candidates: Sequence[LayoutCandidate], planned: PlannedKey | None = None) -> LayoutCandidate | None:
    """The candidate to take: among those with a script (not ``estimate_only``) within ``advisor.candidates.TIE`` of
    the fastest of them, the plan's recommendation when it is one of them (``planned``: its strategy, TP and PP degrees,
    micro-batch and checkpointing: the search does not overrule a tie the recommender decided), else the least model
    parallelism (fewer pipeline stages, then fewer TP ranks: each adds a bubble or collectives on the critical path
    that the time model sizes least surely), then the row's tie order (``tie_order``), then the faster, then the
    lower device total. None: nothing with a script fits."""
    runnable = [c for c in candidates if c.estimate_only is None]
    if not runnable:
        return None
    fastest = max(c.samples_per_s for c in runnable)
    pool = [c for c in runnable if c.samples_per_s * (1 + TIE) >= fastest]
    for c in pool:
        if planned == c.key:
            return c
    return min(pool, key=lambda c: (c.layout.pp, c.layout.tp, c.tie_order, -c.samples_per_s, c.device_total))


def _sized(
    s: Strategy, ctx: StrategyContext, layout: Layout, target: int, micro_batch: int | None
) -> list[LayoutCandidate]:
    """``s`` on ``layout`` at each micro-batch the search tries (module docstring) that fits, sized and timed."""
    dp = s.dp_size(ctx)
    per_replica = target // dp if target % dp == 0 else 0
    sizes = [micro_batch] if micro_batch else [d for d in range(1, per_replica + 1) if per_replica % d == 0]
    found = []
    for mb in sizes:
        if target % (mb * dp):
            continue
        memory = s.memory(ctx, mb)
        if fit_verdict(memory, ctx.hardware, s.load_host_bytes_per_node(ctx))[0] is not True:
            break  # larger micro-batches hold more
        at = replace(ctx, options=replace(ctx.options, micro_batch_size=mb))
        ga = target // (mb * dp)
        schedule, v = ctx.options.pipeline_schedule
        if layout.pp > 1 and schedule.interleaved and ga % max(1, ga // layout.pp):
            continue  # torch's ScheduleInterleaved1F1B raises unless the micro-batches split into whole rounds of pp
        row = StrategyRow(
            name=s.name,
            title=s.title,
            applicable=True,
            strategy=s,
            dp_size=dp,
            tp_degree=s.tp_degree_of(at),
            grad_accum_steps=ga,
            global_batch_size=target,
        )
        t = s.step_time(at, row)
        if t is None or t.step_s <= 0:
            continue
        ranks = s.rank_peak_bytes(at, mb) if layout.pp > 1 else None
        stages = tuple(ranks[:: len(ranks) // layout.pp]) if ranks else ()
        found.append(
            LayoutCandidate(
                layout=layout,
                strategy=s.name,
                title=s.title,
                micro_batch_size=mb,
                activation_checkpointing=ctx.options.activation_checkpointing,
                grad_accum_steps=ga,
                global_batch_size=target,
                device_total=memory.device_total,
                stage_totals=stages,
                step_s=t.step_s,
                samples_per_s=target / t.step_s,
                mfu=t.mfu,
                bubble_fraction=bubble_fraction(schedule, layout.pp, ga, v) if layout.pp > 1 else 0.0,
                estimate_only=s.estimate_only_for(at),
                tie_order=s.comm_order if s.distributes else -1,
                schedule=schedule if layout.pp > 1 else None,
            )
        )
    return found


def trade_off(best: LayoutCandidate, candidates: Sequence[LayoutCandidate], cuts: bool = True) -> str:
    """One sentence on what ``best`` pays and what the other kind of layout would give: its pipeline bubble and TP
    collectives, against the fastest layout without model parallelism (or with it, when ``best`` has none; ``cuts``:
    whether TP and PP apply to the model at all, ``ModelSpec.tp_capable``)."""
    parts = []
    if best.layout.pp > 1:
        parts.append(f"PP {best.layout.pp} adds a {best.bubble_fraction:.0%} bubble over the ideal compute")
    if best.layout.tp > 1:
        parts.append(f"TP {best.layout.tp} all-reduces activations inside every block")
    plain = best.layout.pp == best.layout.tp == 1
    other = [c for c in candidates if (c.layout.pp == c.layout.tp == 1) != plain]
    kind = "with TP or PP" if plain else "without TP or PP"
    if other:
        parts.append(f"the fastest layout {kind} reaches {other[0].samples_per_s / best.samples_per_s:.0%} of its rate")
    elif plain and not cuts:
        parts.append("TP and PP do not apply to this model here (its row in the memory table says why)")
    elif plain and best.layout.world_size == 1:
        parts.append("one GPU: no layout with TP or PP")
    else:
        parts.append(f"no layout {kind} fits")
    return "; ".join(parts)


def layouts_doc(
    candidates: Sequence[LayoutCandidate],
    top: int,
    planned: PlannedKey | None = None,
    cuts: bool = True,
) -> list[dict[str, object]]:
    """The ``top`` fastest candidates as JSON rows (``layouts[]``; bytes per GPU, seconds), ``best`` marking the one
    ``best_layout`` takes (``planned``, ``cuts``: as ``best_layout``'s and ``trade_off``'s)."""
    best = best_layout(candidates, planned)
    return [
        {
            "dp_replicate": c.layout.dp_replicate,
            "dp_shard": c.layout.dp_shard,
            "tp": c.layout.tp,
            "pp": c.layout.pp,
            "label": c.layout.label(),
            "strategy": c.strategy,
            "micro_batch_size": c.micro_batch_size,
            "activation_checkpointing": c.activation_checkpointing,
            "grad_accum_steps": c.grad_accum_steps,
            "global_batch_size": c.global_batch_size,
            "device_bytes": c.device_total,
            "stage_device_bytes": list(c.stage_totals),
            "step_s": c.step_s,
            "samples_per_s": c.samples_per_s,
            "mfu": c.mfu,
            "bubble_fraction": c.bubble_fraction,
            "bubble_share": c.bubble_fraction / (1 + c.bubble_fraction),
            "pp_schedule": c.schedule,
            "estimate_only": c.estimate_only,
            "flags": c.flags(),
            "best": c is best,
            "trade_off": trade_off(c, candidates, cuts) if c is best else None,
        }
        for c in candidates[:top]
    ]
