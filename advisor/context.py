"""``StrategyContext``: what every strategy's rules read (the model's profile, the cluster, the
training options, the device the estimate is for)."""

from __future__ import annotations

from dataclasses import dataclass

from .choices import Device
from .hardware import Hardware
from .models.limits import as_int
from .profile import ModelProfile
from .training_options import TrainingOptions


@dataclass(frozen=True)
class StrategyContext:
    """What every strategy's memory rule reads.

    ``device`` is "cuda" when planning and "cpu" when estimating a CPU verification run (no CUDA
    context, CPU optimizer loop). ``options`` has its defaults resolved (the micro-batch size).
    """

    profile: ModelProfile
    hardware: Hardware
    options: TrainingOptions
    device: Device = Device.CUDA

    @property
    def world_size(self) -> int:
        return self.hardware.num_gpus

    @property
    def micro_batch_size(self) -> int:
        """``options.micro_batch_size``, which the planner resolves before any rule reads it (the family's default
        when not given)."""
        mb = self.options.micro_batch_size
        assert mb is not None, "StrategyContext.options.micro_batch_size is resolved before any rule reads it"
        return mb

    @property
    def mixed(self) -> bool:
        """Mixed precision (bf16/fp16 compute, fp32 master weights somewhere)."""
        precision = self.options.precision
        return precision is not None and precision.is_mixed

    def tp_degree(self) -> int:
        """The tensor-parallel degree: --tp-degree, else the largest divisor of the heads (and kv heads)
        that is at most the GPUs per node."""
        if self.options.tp_degree:
            return self.options.tp_degree
        cfg = self.profile.spec.config or {}
        heads = as_int(cfg.get("num_attention_heads") or 1)
        kv = as_int(cfg.get("num_key_value_heads") or heads)
        for t in range(self.hardware.gpus_per_node, 0, -1):
            if heads % t == 0 and kv % t == 0 and (self.hardware.num_gpus % t == 0):
                return t
        return 1
