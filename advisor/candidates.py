"""What the recommender chooses among, and the rule that takes one: the rows on this cluster (``eligible``), the
same plan with activation checkpointing on (``Checkpointed``) or trained another way (``Alternative``), and the
fastest that fits with step times within ``TIE`` as ties, decided by the tie order (``pick``; docs/decisions.md).
Both ``advisor.recommend`` (the decision) and ``advisor.explain`` (its sentences) rank rows with these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .context import StrategyContext
from .memory import StrategyMemory
from .rows import StrategyRow

if TYPE_CHECKING:
    from .timing.step import StepTime

# Step times within 10% of the fastest are ties: the time model cannot tell them apart (bench/PUBLISHED.md: its errors
# against the published runs reach 21%; 2-4% separate autocast's fp32 residual stream from a 16-bit module on the
# same model, a precision detail, not the strategy; and the terms that separate replicating from sharding when both
# fit, the exposed last reduction and the sharded optimizer step, are the least measured: resnet50 on 4 x RTX4090
# models FSDP2 7% faster than DDP while torch's per-unit hooks are not modelled), so the tie order decides among
# them (least communication first: DDP before sharding; docs/decisions.md), then the device total.
TIE = 0.10


@dataclass(frozen=True)
class Checkpointed:
    """The same plan with activation checkpointing on (what the cheapest fix would give), evaluated by
    the planner when it is off and the model has blocks to checkpoint."""

    ctx: StrategyContext
    rows: list[StrategyRow]


@dataclass(frozen=True)
class Alternative:
    """The same plan trained another way, evaluated by the planner to compare: full fine-tuning beside a LoRA
    plan, or LoRA / QLoRA when full fine-tuning fits nowhere. ``label``: how the reasons name it."""

    label: str
    ctx: StrategyContext
    rows: list[StrategyRow]


def sized(r: StrategyRow) -> StrategyMemory:
    """``r.memory`` of a row that applies: ``evaluate_row`` sizes every one (bytes per GPU)."""
    assert r.memory is not None, f"{r.name} applies, so it is sized"
    return r.memory


def timed(r: StrategyRow) -> StepTime:
    """``r.time`` of a row known to be timed (its ``time`` is not None)."""
    assert r.time is not None, f"{r.name} is timed"
    return r.time


def samples_per_s(r: StrategyRow) -> float:
    """Samples per second of a timed row at its global batch (``timed``)."""
    t = timed(r)
    assert r.global_batch_size is not None, f"{r.name} is sized at a global batch"
    return r.global_batch_size / t.step_s


def eligible(rows: list[StrategyRow], gpus: int) -> list[StrategyRow]:
    """The rows the recommender chooses among on ``gpus`` GPUs: with several GPUs, only those that distribute
    (one process, ``single``, is then the baseline row, not a choice); never an estimate-only row
    (``Strategy.estimate_only_for``: no script to run it)."""
    rows = [r for r in rows if r.estimate_only is None]
    return rows if gpus == 1 else [r for r in rows if r.strategy.distributes]


def pick(fitting: list[StrategyRow]) -> StrategyRow:
    """The fastest of ``fitting``; step times within ``TIE`` are ties, decided by the tie order (the strategies'
    ``comm_order``, least communication first), then the lower device total. Rows without a time fall back to that
    order. Plain one-process training (``Strategy.distributes`` False, only among ``eligible`` rows on one GPU) wins
    whenever it fits: on one GPU the others only add a wrapper (DeepSpeed's 16-bit module can time a few per cent
    faster than autocast, not a reason to take on a framework).

    Raises:
        ValueError: ``fitting`` is empty.
    """
    plain = [r for r in fitting if not r.strategy.distributes]
    if plain:
        fitting = plain
    with_time = [r for r in fitting if r.time is not None and r.time.step_s > 0]
    pool = fitting
    if with_time:
        fastest = min(timed(r).step_s for r in with_time)
        pool = [r for r in with_time if timed(r).step_s <= fastest * (1 + TIE)]
    return min(pool, key=lambda r: (r.strategy.comm_order, sized(r).device_total))


def fastest_fitting(rows: list[StrategyRow], offload: bool | None = None) -> StrategyRow | None:
    """The row the recommender would take among ``rows`` that surely fit (``offload``: only rows that
    do, or do not, offload; None: any)."""
    ok = [r for r in rows if r.applicable and r.fits is True and (offload is None or r.strategy.offload == offload)]
    return pick(ok) if ok else None
