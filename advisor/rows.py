"""A plan's rows and its recommendation, as data, and the checks both the planner and the recommender
apply to a row (does it fit, how large can the micro-batch be). Sits below ``recommend`` and ``plan``
so both import it; it reads strategies only through the ``Strategy`` interface it is handed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .choices import Framework
from .context import StrategyContext
from .hardware import HOST_UNKNOWN, Hardware
from .memory import StrategyMemory
from .units import fmt_gib

if TYPE_CHECKING:
    from strategies.base import Strategy

    from .timing.step import StepTime
    from .training_options import TrainingOptions

MAX_SEARCH_MICRO_BATCH = 1 << 16


@dataclass
class StrategyRow:
    """One strategy sized for the plan. ``fits`` is None when it depends on host RAM nobody gave."""

    name: str
    title: str
    applicable: bool
    strategy: Strategy = field(repr=False, compare=False)  # read through its interface only
    reason: str | None = None
    fits: bool | None = False
    short_of: str | None = None  # what is short when it does not fit: "GPU memory" / "host RAM" / "host RAM unknown"
    fit_note: str | None = None  # when it does not surely fit: the short resource with both figures
    # host RAM while the script builds the model, or with --init-from loads the pretrained weights
    # (Strategy.load_host_bytes_per_node)
    load_host_bytes_per_node: int = 0
    memory: StrategyMemory | None = None
    rule_of_thumb_bytes: int | None = None  # after the safety factor
    rule_of_thumb_fits: bool | None = None
    max_micro_batch_size: int = 0
    dp_size: int = 0
    tp_degree: int = 1
    grad_accum_steps: int | None = None
    global_batch_size: int | None = None
    comm_bytes_per_step: int = 0
    deepspeed_estimate: dict[str, int] | None = None
    learning_rate: float | None = None
    time: StepTime | None = None  # at the global batch (None: no time rule / no GPU preset)
    estimate_only: str | None = None  # why no script is emitted for this row (``Strategy.estimate_only_for``)


@dataclass
class Recommendation:
    strategy: str | None
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)
    min_gpus: int | None = None
    min_nodes: int | None = None
    # what the smallest cluster also needs beyond its GPUs (``--activation-checkpointing``, or nothing)
    min_cluster_flags: str = ""
    offload_host_bytes_per_node: int | None = None
    micro_batch_size: int | None = None  # the micro-batch the recommendation runs (chosen for throughput unless set)
    micro_batch_note: str | None = None  # how it was chosen, with the figures


def fit_verdict(memory: StrategyMemory, hw: Hardware, load_bytes: int = 0) -> tuple[bool | None, str | None]:
    """(fits, what is short): the device total within the usable GPU memory, and within the node's
    RAM both what offload keeps in host RAM and ``load_bytes`` (what the script needs while it builds
    the model; not at the same time, so the larger of the two). Host RAM unknown: (None, "host RAM
    unknown") when offload needs it, unless the GPU memory alone already rules it out; the load alone
    is only checked when the RAM is known."""
    if memory.device_total > hw.gpu_memory_bytes:
        return False, "GPU memory"
    host = hw.host_mem_bytes if hw.host_mem_state != HOST_UNKNOWN else None
    if memory.host_bytes_per_node and host is None:
        return None, "host RAM unknown"
    if host is not None and max(memory.host_bytes_per_node, load_bytes) > host:
        return False, "host RAM"
    return True, None


def fit_note(row: StrategyRow, hw: Hardware, ctx: StrategyContext | None = None) -> str | None:
    """The short resource of a row that does not surely fit, with the need and what there is (``ctx``: the plan's,
    which says whether the script loads ``--init-from``'s pretrained weights or builds a fresh model)."""
    mem = row.memory
    if row.fits is True or mem is None:
        return None
    if row.short_of == "GPU memory":
        return f"needs {fmt_gib(mem.device_total)} per GPU, {fmt_gib(hw.gpu_memory_bytes)} usable"
    if row.short_of == "host RAM unknown":
        return (
            f"keeps {fmt_gib(mem.host_bytes_per_node)} of model states in host RAM per node; the target's "
            "host RAM is unknown"
        )
    assert hw.host_mem_bytes is not None, "short of host RAM: the RAM is known (fit_verdict)"
    have = fmt_gib(hw.host_mem_bytes)
    if mem.host_bytes_per_node >= row.load_host_bytes_per_node:
        return (
            f"needs {fmt_gib(mem.host_bytes_per_node)} of host RAM per node for offloaded model states, the "
            f"node has {have}"
        )
    if ctx is not None and ctx.options.init_from:
        return (
            f"needs {fmt_gib(row.load_host_bytes_per_node)} of host RAM per node while the script loads the "
            f"pretrained weights (--init-from), the node has {have}: {row.strategy.load_fix(ctx)}"
        )
    ranks = f"{hw.gpus_per_node} ranks build" if hw.gpus_per_node > 1 else "the rank builds"
    return (
        f"needs {fmt_gib(row.load_host_bytes_per_node)} of host RAM per node while {ranks} the model, the node "
        f"has {have}: {row.strategy.load_fix(ctx)}"
    )


FRAMEWORK_NAMES = {"torch": "PyTorch alone", "deepspeed": "DeepSpeed"}


def framework_excludes(strategy: Strategy, ctx: StrategyContext) -> str | None:
    """Why ``--framework`` leaves ``strategy`` out (None: it does not): the strategy needs another framework."""
    chosen = ctx.options.framework
    if chosen in (None, Framework.ANY) or strategy.framework == chosen:
        return None
    return f"needs {FRAMEWORK_NAMES.get(strategy.framework, strategy.framework)}; --framework {chosen} leaves it out"


def fits(memory: StrategyMemory, hw: Hardware) -> bool:
    """Whether it surely fits (``fit_verdict`` is True)."""
    return fit_verdict(memory, hw)[0] is True


def max_micro_batch_text(size: int) -> str:
    """``max_micro_batch``'s answer for people: at the search's ceiling, ``"65536 or more (the search's limit)"``
    (the GPU was not full there: a larger one may fit too)."""
    return f"{size} or more (the search's limit)" if size >= MAX_SEARCH_MICRO_BATCH else str(size)


def max_micro_batch(strategy: Strategy, ctx: StrategyContext, hint: int | None = None) -> int:
    """Largest micro-batch whose device total fits the GPU (0 when even 1 does not). Doubling then
    bisection; device total is non-decreasing in the micro-batch. ``hint``: a previous answer for the same
    strategy and cluster, checked first (two evaluations when it still holds)."""
    limit = ctx.hardware.gpu_memory_bytes

    def ok(b: int) -> bool:
        return strategy.memory(ctx, b).device_total <= limit

    if hint and hint < MAX_SEARCH_MICRO_BATCH and ok(hint) and not ok(hint + 1):
        return hint
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_SEARCH_MICRO_BATCH and ok(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_SEARCH_MICRO_BATCH:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def batch_ranks(opts: TrainingOptions, num_gpus: int) -> int:
    """The data-parallel ranks a ``--global-batch-size`` must split over evenly: every GPU, or with a pinned
    ``--tp-degree`` / ``--pp-degree`` the GPUs over tp x pp (Megatron-LM's rule: the global batch is a multiple of
    micro-batch x data-parallel size, megatron/core/num_microbatches_calculator.py). Rows with more data-parallel
    ranks than that are then n/a where the batch does not split (``evaluate_row``)."""
    model = (opts.tp_degree or 1) * (opts.pp_degree or 1)
    return num_gpus // model if num_gpus % model == 0 else num_gpus


def evaluate_row(strategy: Strategy, ctx: StrategyContext, compare: bool, max_hint: int | None = None) -> StrategyRow:
    """Size ``strategy`` for ``ctx``: applicability, memory at the micro-batch, fit, the largest
    micro-batch (``max_hint``: as ``max_micro_batch``'s), data-parallel and TP sizes, accumulation steps,
    traffic, the step time (``Strategy.step_time``), the scaled learning rate."""
    row = StrategyRow(name=strategy.name, title=strategy.title, applicable=True, strategy=strategy)
    row.estimate_only = strategy.estimate_only_for(ctx)
    reason = framework_excludes(strategy, ctx) or strategy.fine_tuning_blocker(ctx) or strategy.not_applicable(ctx)
    opts, hw = ctx.options, ctx.hardware
    mb = ctx.micro_batch_size
    dp = 0 if reason else strategy.dp_size(ctx)
    if dp and opts.global_batch_size and opts.global_batch_size % (mb * dp):
        reason = f"--global-batch-size {opts.global_batch_size} does not split over " + (
            f"micro-batch {mb} x its {dp} data-parallel ranks = {mb * dp}"
            if opts.global_batch_size % dp == 0
            else f"its {dp} data-parallel ranks"
        )
    if reason:
        row.applicable, row.reason = False, reason
        return row
    row.memory = strategy.memory(ctx, mb)
    row.load_host_bytes_per_node = strategy.load_host_bytes_per_node(ctx)
    row.fits, row.short_of = fit_verdict(row.memory, hw, row.load_host_bytes_per_node)
    row.fit_note = fit_note(row, hw, ctx)
    rule = int(strategy.rule_of_thumb_bytes(ctx) * opts.safety_factor)
    row.rule_of_thumb_bytes, row.rule_of_thumb_fits = rule, rule <= hw.gpu_memory_bytes
    row.max_micro_batch_size = max_micro_batch(strategy, ctx, max_hint)
    row.dp_size = strategy.dp_size(ctx)
    row.tp_degree = strategy.tp_degree_of(ctx)
    # Every row at the same global batch: --global-batch-size, else micro-batch x all GPUs; a row
    # with a smaller data-parallel size (TP) accumulates to reach it.
    per_step = mb * row.dp_size
    target = opts.global_batch_size or mb * hw.num_gpus
    row.grad_accum_steps = ga = max(1, -(-target // per_step))
    row.global_batch_size = global_batch = ga * per_step
    row.comm_bytes_per_step = strategy.comm_bytes_per_step(ctx, ga)
    row.time = strategy.step_time(ctx, row)
    if opts.base_lr is not None:
        assert opts.base_batch_size is not None, "--base-lr comes with --base-batch-size (advisor.schema.validate)"
        # Linear scaling rule (Goyal et al. 2017, section 2.1): lr x (global / base).
        row.learning_rate = opts.base_lr * global_batch / opts.base_batch_size
    if compare:
        row.deepspeed_estimate = strategy.deepspeed_estimate(ctx)
    return row


def time_at(
    strategy: Strategy, ctx: StrategyContext, row: StrategyRow, micro_batch: int
) -> tuple[StepTime | None, StrategyRow]:
    """(step time, the row's batch figures) of ``strategy`` at another ``micro_batch`` at the global batch
    that micro-batch gives (``--global-batch-size``, else micro-batch x GPUs); memory is not re-evaluated."""
    opts = ctx.options
    trial = replace(ctx, options=replace(opts, micro_batch_size=micro_batch))
    per_step = micro_batch * row.dp_size
    target = opts.global_batch_size or micro_batch * ctx.hardware.num_gpus
    ga = max(1, -(-target // per_step))
    shadow = replace(row, grad_accum_steps=ga, global_batch_size=ga * per_step, time=None)
    return strategy.step_time(trial, shadow), shadow


def gpus_used(row: StrategyRow, num_gpus: int) -> int:
    """GPUs a row's plan runs on: all ``num_gpus`` of the cluster, or one for a strategy that does not distribute
    (``single``): its per-GPU throughput, GPU-hours and cost count one GPU."""
    return num_gpus if row.strategy is None or row.strategy.distributes else 1


def one_gpu_step_times(strategies: Iterable[Strategy], ctx: StrategyContext, global_batch: int) -> dict[str, float]:
    """Seconds per optimizer step of each strategy that surely fits on one GPU of this kind without CPU offload,
    training the same model at the same micro-batch and reaching ``global_batch`` by accumulation, by name (the
    untimed ones left out). Speed-ups are against the fastest of them (``single_gpu_step_s``): one baseline for
    every row, so rows with equal step times show equal speed-ups, and a cluster is not credited with autocast
    casts that a one-GPU run of DeepSpeed's 16-bit module skips too. Offload is left out: its host step would make
    any cluster look super-linear."""
    hw, mb = ctx.hardware, ctx.micro_batch_size
    one = replace(
        ctx,
        hardware=replace(hw, gpus_per_node=1, num_nodes=1, network=None),
        options=replace(ctx.options, global_batch_size=None),
    )
    ga = max(1, -(-global_batch // mb))
    out: dict[str, float] = {}
    for s in strategies:
        if (
            s.offload
            or s.not_applicable(one)
            or fit_verdict(s.memory(one, mb), one.hardware, s.load_host_bytes_per_node(one))[0] is not True
        ):
            continue
        row = StrategyRow(
            name=s.name,
            title=s.title,
            applicable=True,
            strategy=s,
            dp_size=1,
            tp_degree=1,
            grad_accum_steps=ga,
            global_batch_size=ga * mb,
        )
        t = s.step_time(one, row)
        if t is not None:
            out[s.name] = t.step_s
    return out


def single_gpu_step_s(times: dict[str, float]) -> float | None:
    """The one-GPU baseline among ``times`` (``one_gpu_step_times``): the fastest recipe that fits one GPU without
    offload; None when the GPU cannot hold the model states itself or nothing can be timed."""
    return min(times.values(), default=None)


def with_speedup(t: StepTime | None, baseline_s: float | None, gpus: int) -> StepTime | None:
    """``t`` with its speed-up over one GPU at the same global batch and the scaling efficiency (speed-up / GPUs)."""
    if t is None or baseline_s is None or not t.step_s:
        return t
    speedup = baseline_s / t.step_s
    return replace(t, speedup_vs_single_gpu=speedup, scaling_efficiency=speedup / gpus)
