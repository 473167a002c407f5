"""The shape of FSDP2's sharding: its ``fully_shard`` units at a shard world size (``Unit``, ``units``), the bytes
per element of each role (``Dtypes``, ``dtypes``), and what FSDP2's memory and time rules read of their strategy
(``FSDP2Rule``). Torch 2.14, torch/distributed/fsdp/_fully_shard/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from advisor.choices import Precision, TraceMode
from advisor.context import StrategyContext
from advisor.profile import ParamStats


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard`` unit at shard world size N: ``padded``/``trainable_padded`` are its (trainable)
    parameters' numel with dim 0 padded to a multiple of N (the all-gather output and the reduce-scatter input);
    ``numel``/``trainable_numel`` unpadded (autograd's unsharded gradients); ``late_numel``: trainable parameters
    whose gradient reaches ``.grad`` last (the input embedding)."""

    padded: int
    numel: int
    trainable_padded: int
    trainable_numel: int
    late_numel: int = 0

    def shard(self, n: int) -> int:
        return self.padded // n

    def trainable_shard(self, n: int) -> int:
        return self.trainable_padded // n


def units(stats: ParamStats, n: int) -> list[Unit]:
    """``stats.fsdp_units`` at shard world size ``n``, the root first (``advisor.profile.fsdp_units``)."""
    if not stats.fsdp_units:  # no unit list (a hand-made ParamStats): one root unit, unpadded
        return [Unit(stats.num_params, stats.num_params, stats.num_trainable, stats.num_trainable)]
    out = []
    for unit in stats.fsdp_units:
        padded = train_padded = numel = train_numel = late = 0
        for dim0, size, trainable, last in unit:
            rows = max(1, dim0)
            p = -(-rows // n) * n * (size // rows)
            padded, numel = padded + p, numel + size
            if trainable:
                train_padded, train_numel = train_padded + p, train_numel + size
                late += size if last else 0
        out.append(Unit(padded, numel, train_padded, train_numel, late))
    return out


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element: ``orig`` the parameters' own dtype (sharded parameters, gradients, optimizer states),
    ``param`` the MixedPrecisionPolicy's param_dtype (gathered parameters, autograd's gradients), ``reduce`` its
    reduce_dtype (reduce-scatter buffers; the emitted policy sets fp32 under mixed precision)."""

    orig: int
    param: int
    reduce: int


def dtypes(precision: Precision | None, trainable_elem: int | None = None) -> Dtypes:
    """``Dtypes`` at ``precision`` (None, not yet resolved: as fp32); ``trainable_elem``: the trainable parameters'
    own bytes per element when they differ from the precision's (LoRA adapters in bf16,
    ``advisor.memory.weight_bytes``)."""
    if precision == Precision.PURE_BF16:  # the module is bf16 itself; no policy, so gradients are reduced in bf16
        return Dtypes(2, 2, 2)
    orig = trainable_elem or 4
    if precision is not None and precision.is_mixed:
        return Dtypes(orig, 2, 4)
    return Dtypes(orig, 4, 4)


class FSDP2Rule(Protocol):
    """What FSDP2's memory and time rules read of their strategy (``strategies.fsdp2.FSDP2``): how it shards
    (``reshard`` after forward, ``offload`` to host memory, ``hybrid``: HSDP's 2-D mesh), over how many ranks, in
    which dtypes, its data-parallel size, its trace mode and whether gradients are reduced on every micro-step."""

    reshard: bool
    offload: bool
    hybrid: bool

    def shard_size(self, ctx: StrategyContext) -> int: ...

    def dtypes(self, ctx: StrategyContext) -> Dtypes: ...

    def dp_size(self, ctx: StrategyContext) -> int: ...

    def trace_mode(self, precision: Precision | None) -> TraceMode: ...

    def sync_every(self, ctx: StrategyContext) -> bool: ...
