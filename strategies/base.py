"""The interface every strategy module implements.

A strategy owns: whether it applies (and why not), its data-parallel size, its per-GPU memory rule,
its share of the 16-bytes-per-parameter rule of thumb and its gradient-communication volume. Script
rendering and launch lines are added by the script-generation layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from advisor.memory import StrategyMemory
from advisor.options import StrategyContext


class Strategy(ABC):
    name: str  # CLI / JSON name
    title: str  # human name
    launcher: str  # "torchrun" | "deepspeed"
    # Recommender's preference (field notes 004 section 2/7): least communication first.
    # 0 DDP; 1 ZeRO-1/2 (same volume as DDP); 2 ZeRO-3 (about 1.5x); 3 TP; 4 offload.
    comm_order: int

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        """``None`` when the strategy applies, else the reason in one sentence."""
        return None

    def dp_size(self, ctx: StrategyContext) -> int:
        """Data-parallel world size (the sampler's number of replicas)."""
        return ctx.world_size

    @abstractmethod
    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        """Per-GPU bytes at ``micro_batch`` samples per GPU per step."""

    @abstractmethod
    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        """16 bytes per parameter, sharded as this strategy shards it (before the safety factor)."""

    def comm_bytes_per_step(self, ctx: StrategyContext) -> int:
        """Bytes each GPU sends per optimizer step for gradients/parameters (ring all-reduce sends
        about 2x the gradient bytes; field notes 004 section 3.1, ZeRO paper section 7)."""
        grad_bytes = 2 if ctx.mixed else 4
        return 2 * ctx.profile.stats.num_trainable * grad_bytes
