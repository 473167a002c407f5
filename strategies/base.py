"""The interface every strategy module implements.

A strategy owns everything that differs between strategies: whether it applies (and why not), its
data-parallel size, its per-GPU memory rule, its share of the 16-bytes-per-parameter rule of thumb,
its communication volume and pattern, which traced step its precision runs, its launcher, script
template and extra files, and what verifying it needs. Code outside ``strategies/`` reads these
attributes; it never compares a strategy's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from advisor.context import StrategyContext
from advisor.hardware import Hardware
from advisor.memory import StrategyMemory, trace_mode
from advisor.schema import TrainingOptions

from .launchers import TORCHRUN, Launcher


class Strategy(ABC):
    name: str  # CLI / JSON name
    title: str  # human name
    framework: str = "torch"  # "torch" | "deepspeed": what the script needs installed
    launcher: Launcher = TORCHRUN
    template: str = "ddp.py"  # file in strategies/templates/
    # Recommender's preference (field notes 004 section 2/7): least communication first.
    # 0 DDP; 1 ZeRO-1/2 (same volume as DDP); 2 ZeRO-3 (about 1.5x); 3 TP; 4 offload.
    comm_order: int = 0
    comm_pattern: str = ""  # one line: which collectives run, per step
    offload: bool = False  # model states (partly) in host RAM: needs host RAM, a GPU to verify
    shards_everything: bool = False  # weights, gradients and optimizer states sharded (the scale-out answer)
    uses_tp_degree: bool = False  # reads --tp-degree
    casts_weights: bool = False  # mixed precision by casting the module to 16 bits (DeepSpeed), not autocast

    def trace_mode(self, precision: str) -> str:
        """The traced step this strategy runs at ``precision`` (``advisor.memory.trace_mode``)."""
        return trace_mode(precision, self.casts_weights)

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

    def what_if_traces(self, ctx: StrategyContext) -> list[tuple[str, int]]:
        """Traces (trace mode, TP degree) this strategy would need if only the GPU count changed, beyond
        the ones this plan used: the planner makes them while the model's classes are loaded anyway, so a
        later what-if question reads them from the cache instead of tracing."""
        return []

    def ds_config(self, ctx: StrategyContext, row: Any) -> dict | None:
        """The DeepSpeed config the script reads (None: the strategy is not DeepSpeed's)."""
        return None

    # Imports the strategy's template needs beyond common.py's (one statement per line).
    script_imports: tuple[str, ...] = ()

    def script_constants(self, job: Any, family: Any) -> dict[str, Any]:
        """Constants the strategy's template reads (JSON-like values), given the job and its model family."""
        return {}

    def extra_files(self, job: Any) -> dict[str, str]:
        """Files written beside train.py and launch.sh (name -> text)."""
        return {}

    def deepspeed_estimate(self, ctx: StrategyContext) -> dict[str, int] | None:
        """DeepSpeed's own model-state estimate for ``--compare`` (None where DeepSpeed has none)."""
        return None

    def verify_blocker(self, device: str) -> str | None:
        """Why this strategy cannot be verified on ``device`` here (None: it can)."""
        if self.offload and device == "cpu":
            return (f"{self.name} offloads to host memory from a GPU; on a CPU-only machine use --emit to write "
                    "the script and verify it where a GPU is present")
        return None

    def verify_cluster(self, hw: Hardware, options: TrainingOptions, row: Any) -> tuple[Hardware, TrainingOptions]:
        """The cluster and options a verification on ``hw`` (this machine's ranks) runs with.

        Raises:
            AdvisorError: this machine cannot run the strategy.
        """
        return hw, options
