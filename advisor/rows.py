"""A plan's rows and its recommendation, as data, and the checks both the planner and the recommender
apply to a row (does it fit, how large can the micro-batch be). Sits below ``recommend`` and ``plan``
so both import it; it reads strategies only through the ``Strategy`` interface it is handed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .context import StrategyContext
from .hardware import HOST_UNKNOWN, Hardware
from .memory import StrategyMemory

MAX_SEARCH_MICRO_BATCH = 1 << 16


@dataclass
class StrategyRow:
    """One strategy sized for the plan. ``fits`` is None when it depends on host RAM nobody gave."""

    name: str
    title: str
    applicable: bool
    strategy: Any = field(default=None, repr=False, compare=False)  # the Strategy (interface only)
    reason: str | None = None
    fits: bool | None = False
    short_of: str | None = None  # what is short when it does not fit: "GPU memory" / "host RAM" / "host RAM unknown"
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


@dataclass
class Recommendation:
    strategy: str | None
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)
    min_gpus: int | None = None
    min_nodes: int | None = None
    offload_host_bytes_per_node: int | None = None


def fit_verdict(memory: StrategyMemory, hw: Hardware) -> tuple[bool | None, str | None]:
    """(fits, what is short): the device total within the usable GPU memory and what offload keeps in
    host RAM within the node's RAM. Host RAM unknown and needed: (None, "host RAM unknown") unless the
    GPU memory alone already rules it out."""
    if memory.device_total > hw.gpu_memory_bytes:
        return False, "GPU memory"
    if memory.host_bytes_per_node:
        if hw.host_mem_state == HOST_UNKNOWN or hw.host_mem_bytes is None:
            return None, "host RAM unknown"
        if memory.host_bytes_per_node > hw.host_mem_bytes:
            return False, "host RAM"
    return True, None


def fits(memory: StrategyMemory, hw: Hardware) -> bool:
    """Whether it surely fits (``fit_verdict`` is True)."""
    return fit_verdict(memory, hw)[0] is True


def max_micro_batch(strategy: Any, ctx: StrategyContext) -> int:
    """Largest micro-batch whose device total fits the GPU (0 when even 1 does not). Doubling then
    bisection; device total is non-decreasing in the micro-batch."""
    limit = ctx.hardware.gpu_memory_bytes

    def ok(b: int) -> bool:
        return strategy.memory(ctx, b).device_total <= limit

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


def evaluate_row(strategy: Any, ctx: StrategyContext, compare: bool) -> StrategyRow:
    """Size ``strategy`` for ``ctx``: applicability, memory at the micro-batch, fit, the largest
    micro-batch, data-parallel and TP sizes, accumulation steps, traffic, the scaled learning rate."""
    row = StrategyRow(name=strategy.name, title=strategy.title, applicable=True, strategy=strategy)
    reason = strategy.not_applicable(ctx)
    if reason:
        row.applicable, row.reason = False, reason
        return row
    opts, hw = ctx.options, ctx.hardware
    row.memory = strategy.memory(ctx, opts.micro_batch_size)
    row.fits, row.short_of = fit_verdict(row.memory, hw)
    rule = int(strategy.rule_of_thumb_bytes(ctx) * opts.safety_factor)
    row.rule_of_thumb_bytes, row.rule_of_thumb_fits = rule, rule <= hw.gpu_memory_bytes
    row.max_micro_batch_size = max_micro_batch(strategy, ctx)
    row.dp_size = strategy.dp_size(ctx)
    row.tp_degree = hw.num_gpus // row.dp_size if row.dp_size else 1
    row.comm_bytes_per_step = strategy.comm_bytes_per_step(ctx)
    per_step = opts.micro_batch_size * row.dp_size
    target = opts.global_batch_size or per_step
    row.grad_accum_steps = max(1, -(-target // per_step))
    row.global_batch_size = row.grad_accum_steps * per_step
    if opts.base_lr is not None:
        # Linear scaling rule (Goyal et al. 2017; field notes 000 section 3.4): lr x (global / base).
        row.learning_rate = opts.base_lr * row.global_batch_size / opts.base_batch_size
    if compare:
        row.deepspeed_estimate = strategy.deepspeed_estimate(ctx)
    return row
