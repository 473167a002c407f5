"""The closed sets of values the code branches on, as ``enum.StrEnum``s: the precision, the optimizer, the device,
the traced step's mode, the launcher, the attention kernel, an adapter's dtype, the quantized base's format, the
framework, FSDP2's gradient sync and the pipeline schedule.

A member is its value: ``Precision.BF16 == "bf16"``, it hashes as ``"bf16"``, ``f"{Precision.BF16}"`` and
``str()`` are ``bf16`` and ``json.dumps`` writes ``"bf16"``, so the faces keep accepting and printing the same
strings (``Precision("bf16")`` parses one). Only ``repr`` differs (``<Precision.BF16: 'bf16'>``): argparse's
"invalid choice" message and a generated script's constants (``repr``) are given ``values(...)`` and
``plain(...)``, plain strings.

No code outside this module compares one of these values with a string literal (tests/test_architecture.py scans
for it): it compares with the member (``precision == Precision.FP32``) or asks a property here.

Nothing here imports anything but the standard library's ``enum``.
"""

from __future__ import annotations

from enum import Enum, StrEnum


class Precision(StrEnum):
    """``--precision``: bf16 / fp16 mixed precision (16-bit compute, fp32 master weights somewhere), fp32, or pure
    bf16 (bf16 weights, gradients and optimizer states, no fp32 master copy)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    PURE_BF16 = "pure-bf16"

    @property
    def is_mixed(self) -> bool:
        """bf16 or fp16 mixed precision: 16-bit compute over fp32 master weights (PyTorch AMP's autocast over fp32
        weights; DeepSpeed's bf16/fp16 modes keep an fp32 master copy)."""
        return self in (Precision.BF16, Precision.FP16)

    @property
    def uses_bf16(self) -> bool:
        """Computes in bf16 (bf16 mixed precision and pure bf16): needs bf16 tensor cores, compute capability 8.0
        (Ampere) or newer; NVIDIA's Volta and Turing whitepapers list fp16 tensor cores only."""
        return self in (Precision.BF16, Precision.PURE_BF16)

    @property
    def param_bytes(self) -> int:
        """Bytes per element of the weights, gradients and optimizer states where PyTorch AMP's semantics hold
        (DDP, TP, one GPU): mixed precision is autocast over fp32 weights (PyTorch AMP docs), so 4; pure bf16 keeps
        everything in bf16, 2."""
        return 2 if self is Precision.PURE_BF16 else 4

    @property
    def compute_dtype(self) -> Dtype:
        """The dtype QLoRA's quantized layers compute in (``bnb_4bit_compute_dtype``) unless ``--bnb-compute-dtype``
        names one: the precision's (fp16 under fp16, fp32 under fp32), else bf16 (``--bnb-compute-dtype``'s help)."""
        return {Precision.FP16: Dtype.FP16, Precision.FP32: Dtype.FP32}.get(self, Dtype.BF16)


class Optimizer(StrEnum):
    """``--optimizer``: torch.optim's, bitsandbytes' and transformers' Adafactor (each one's class:
    ``advisor.bnb_layout.optimizer_source``)."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD_MOMENTUM = "sgd-momentum"
    SGD = "sgd"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    ADAFACTOR = "adafactor"
    LION = "lion"

    @property
    def is_adam(self) -> bool:
        """torch.optim.Adam or AdamW: two moments per parameter in its dtype (torch/optim/adam.py
        ``Adam._init_group``), which DeepSpeed takes as a client optimizer without
        ``zero_allow_untested_optimizer``."""
        return self in (Optimizer.ADAM, Optimizer.ADAMW)

    @property
    def is_sgd(self) -> bool:
        """torch.optim.SGD, with momentum (``sgd-momentum``) or without (``sgd``)."""
        return self in (Optimizer.SGD, Optimizer.SGD_MOMENTUM)

    @property
    def is_torch(self) -> bool:
        """One of torch.optim's (AdamW, Adam, SGD with or without momentum), which every strategy steps, DTensor
        shards included."""
        return self.is_adam or self.is_sgd

    @property
    def is_paged(self) -> bool:
        """bitsandbytes may page its state (``Optimizer8bit.get_state_buffer`` with ``is_paged=True``: on CUDA,
        state buffers of >= 1e5 elements come from ``functional.get_paged``, i.e. cudaMallocManaged unified memory
        outside PyTorch's caching allocator)."""
        return self in (Optimizer.PAGED_ADAMW_8BIT, Optimizer.PAGED_ADAMW)


class Device(StrEnum):
    """Where a plan's ranks run: CUDA GPUs, or the CPU (a verification run with gloo); also torch's
    ``tensor.device.type`` of the same two."""

    CUDA = "cuda"
    CPU = "cpu"


class TraceMode(StrEnum):
    """Which traced step a precision runs (``advisor.memory.trace_mode``): fp32 weights; ``autocast`` (fp32 weights
    under bf16/fp16 autocast: PyTorch AMP); ``half`` (16-bit weights: pure bf16, and a framework that casts the
    module itself, as DeepSpeed's bf16/fp16 modes do)."""

    FP32 = "fp32"
    AUTOCAST = "autocast"
    HALF = "half"


class LauncherKind(StrEnum):
    """The program that starts a generated script (``strategies.launchers.Launcher.name``): torchrun
    (torch.distributed.run), the deepspeed launcher, or plain python for one process."""

    TORCHRUN = "torchrun"
    PYTHON = "python"
    DEEPSPEED = "deepspeed"


class Attention(StrEnum):
    """``--attention``: the scaled-dot-product attention kernel modelled; ``auto``: the one PyTorch SDPA picks on the
    target (``advisor.plan.resolve_attention``)."""

    AUTO = "auto"
    FLASH = "flash"
    MEM_EFFICIENT = "mem-efficient"
    MATH = "math"


class Dtype(StrEnum):
    """A dtype named on the command line: LoRA adapters' (``--lora-dtype``; ``auto``: what the strategy keeps them
    in) and QLoRA's compute dtype (``--bnb-compute-dtype``, never ``auto``)."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class Quant(StrEnum):
    """``--quantize``: bitsandbytes' storage of a frozen base: 4-bit NormalFloat, 4-bit float, LLM.int8()."""

    NF4 = "nf4"
    FP4 = "fp4"
    INT8 = "int8"


class Framework(StrEnum):
    """``--framework``: the strategies one framework runs (``Strategy.framework``); ``any``: every strategy."""

    ANY = "any"
    TORCH = "torch"
    DEEPSPEED = "deepspeed"


class FsdpGradSync(StrEnum):
    """``--fsdp-grad-sync``: FSDP2 with gradient accumulation reduce-scatters the gradients on every micro-step or
    only on the last."""

    EVERY_MICRO_STEP = "every-micro-step"
    LAST_MICRO_STEP = "last-micro-step"


class Zero3Fetch(StrEnum):
    """``--zero3-fetch``: how DeepSpeed's ZeRO-3 gathers a module's parameters before its forward and backward.
    Coalesced: one all-gather per module, queued without waiting on the host (DeepSpeed 0.6 and later,
    ``partitioned_param_coordinator.py``); per-parameter: one all-gather per parameter tensor, each followed by a host
    synchronize (DeepSpeed before 0.6, as in published runs of 2021)."""

    COALESCED = "coalesced"
    PER_PARAMETER = "per-parameter"


class SelectiveCheckpointing(StrEnum):
    """``--selective-checkpointing``: torchtitan's selective activation checkpointing policies
    (``advisor.selective_ac``): per op inside every block, or every k-th block whole."""

    OP = "op"
    LAYER = "layer"


class PipelineSchedule(StrEnum):
    """A pipeline-parallel schedule (``torch.distributed.pipelining``'s ``ScheduleGPipe``, ``Schedule1F1B``,
    ``ScheduleInterleaved1F1B``): its bubble and micro-batches in flight are ``advisor.timing.pipeline``'s."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"

    @property
    def interleaved(self) -> bool:
        """Several model chunks (virtual stages) per rank: interleaved 1F1B (Narayanan et al. 2021, section 2.2)."""
        return self is PipelineSchedule.INTERLEAVED_1F1B


# Every set above (the architecture test's scan takes its values from here).
CHOICES: tuple[type[StrEnum], ...] = (
    Precision,
    Optimizer,
    Device,
    TraceMode,
    LauncherKind,
    Attention,
    Dtype,
    Quant,
    Framework,
    FsdpGradSync,
    PipelineSchedule,
)


def values(choice: type[StrEnum]) -> tuple[str, ...]:
    """The values of ``choice``'s members in declaration order, as plain ``str`` (choices for argparse, whose
    "invalid choice" message lists them with ``repr``, and for the page)."""
    return tuple(member.value for member in choice)


def plain(value: object) -> object:
    """``value`` with every enum member in it (nested in dicts, lists and tuples too) replaced by its value: what
    ``repr`` may write into a generated script."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value
