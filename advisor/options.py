"""Training options and the context a strategy's memory rules read. One validation place."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import AdvisorError
from .hardware import Hardware
from .memory import OPTIMIZERS, PRECISIONS
from .profile import ModelProfile

ATTENTION_CHOICES = ("auto", "flash", "mem-efficient", "math")
DEVICES = ("cuda", "cpu")

# DeepSpeed defaults (deepspeed/runtime/zero/config.py) and what generated ds_configs use.
DS_REDUCE_BUCKET_ELEMS = 500_000_000
DS_ALLGATHER_BUCKET_ELEMS = 500_000_000
DS_PREFETCH_BUCKET_ELEMS = 50_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000


@dataclass(frozen=True)
class TrainingOptions:
    precision: str = "bf16"
    optimizer: str = "adamw"
    micro_batch_size: int | None = None  # None: 1 for transformers, 32 for vision models
    global_batch_size: int | None = None  # None: micro-batch x data-parallel size (no accumulation)
    activation_checkpointing: bool = False
    attention: str = "auto"
    tp_degree: int | None = None
    safety_factor: float = 1.2
    gradient_as_bucket_view: bool = True  # generated DDP scripts set it (PyTorch DDP docs)
    base_lr: float | None = None
    base_batch_size: int | None = None

    def validate(self) -> None:
        """Raises AdvisorError naming the bad value and the accepted range."""
        if self.precision not in PRECISIONS:
            raise AdvisorError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.optimizer not in OPTIMIZERS:
            raise AdvisorError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise AdvisorError(f"--attention must be one of {', '.join(ATTENTION_CHOICES)}, got {self.attention!r}")
        if self.micro_batch_size is not None and not 1 <= self.micro_batch_size <= 2**20:
            raise AdvisorError(f"--micro-batch-size must be between 1 and {2**20}, got {self.micro_batch_size}")
        if self.global_batch_size is not None and not 1 <= self.global_batch_size <= 2**30:
            raise AdvisorError(f"--global-batch-size must be between 1 and {2**30}, got {self.global_batch_size}")
        if self.tp_degree is not None and not 1 <= self.tp_degree <= 64:
            raise AdvisorError(f"--tp-degree must be between 1 and 64, got {self.tp_degree}")
        if not 1.0 <= self.safety_factor <= 2.0:
            raise AdvisorError(f"--safety-factor must be between 1.0 and 2.0 (the usual range for activations "
                               f"and overheads on top of 16 bytes/parameter), "
                               f"got {self.safety_factor}")
        if (self.base_lr is None) != (self.base_batch_size is None):
            raise AdvisorError("--base-lr and --base-batch-size go together: give both or neither")
        if self.base_lr is not None and not self.base_lr > 0:
            raise AdvisorError(f"--base-lr must be positive, got {self.base_lr}")
        if self.base_batch_size is not None and self.base_batch_size < 1:
            raise AdvisorError(f"--base-batch-size must be a positive integer, got {self.base_batch_size}")


@dataclass(frozen=True)
class StrategyContext:
    """What every strategy's memory rule reads.

    ``device`` is "cuda" when planning and "cpu" when estimating a CPU verification run (no CUDA
    context, CPU optimizer loop). ``attention`` is the resolved kernel used in the traces.
    """

    profile: ModelProfile
    hardware: Hardware
    options: TrainingOptions
    device: str = "cuda"

    @property
    def world_size(self) -> int:
        return self.hardware.num_gpus

    @property
    def mixed(self) -> bool:
        return self.options.precision in ("bf16", "fp16")

    def tp_degree(self) -> int:
        """The tensor-parallel degree: --tp-degree, else the largest divisor of the heads (and kv heads)
        that is at most the GPUs per node."""
        if self.options.tp_degree:
            return self.options.tp_degree
        cfg = self.profile.spec.config or {}
        heads = int(cfg.get("num_attention_heads") or 1)
        kv = int(cfg.get("num_key_value_heads") or heads)
        for t in range(self.hardware.gpus_per_node, 0, -1):
            if heads % t == 0 and kv % t == 0 and (self.hardware.num_gpus % t == 0):
                return t
        return 1
