"""Shared memory arithmetic: the breakdown type, bytes per element, optimizer states, device overheads,
the 16-bytes-per-parameter rule of thumb and the ZeRO paper's own accounting.

Strategy-specific rules live in ``strategies/``; this module knows nothing of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from . import bnb_layout
from .choices import Device, Dtype, Optimizer, Precision, TraceMode
from .units import MiB

if TYPE_CHECKING:
    from .models import AdapterSpec
    from .profile import ParamStats

# Optimizer state tensors per parameter (torch.optim docs: Adam/AdamW keep exp_avg and exp_avg_sq;
# SGD with momentum keeps momentum_buffer; plain SGD keeps nothing).
OPTIMIZER_STATES_PER_PARAM = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}

# CUDA-only device overheads (not counted by torch.cuda.max_memory_allocated):
# - CUDA context + cuBLAS/cuDNN handles: 300-900 MiB with lazy module loading (CUDA >= 11.7,
#   PyTorch "CUDA semantics" notes); we take 600 MiB.
CUDA_CONTEXT_BYTES = 600 * MiB
# - NCCL communicator buffers: NCCL_BUFFSIZE (4 MiB, NCCL env docs) x channels x peers; about
#   256 MiB for a ring over one node.
NCCL_BUFFER_BYTES = 256 * MiB
# - Caching-allocator fragmentation: reserved exceeds allocated by 5-20% in steady training
#   (PyTorch "CUDA semantics: memory management"); we take 10% of the peak allocated.
FRAGMENTATION = 0.10

# The usual rule of thumb (ZeRO paper section 3.1: mixed-precision Adam): bytes per parameter.
RULE_OF_THUMB = {"half_weights": 2, "half_grads": 2, "fp32_master": 4, "adam_m": 4, "adam_v": 4}
RULE_OF_THUMB_BYTES_PER_PARAM = sum(RULE_OF_THUMB.values())  # 16


@dataclass(frozen=True)
class Breakdown:
    """Per-GPU bytes at the peak moment of a training step; ``total`` is the peak allocated.

    params: weights held by this rank (incl. model buffers such as BatchNorm statistics);
    grads: parameter gradients (incl. fp32 gradient partitions); optimizer_states: optimizer
    moments plus fp32 master weights; activations: forward-retained tensors alive at the peak;
    buffers: communication/framework buffers (DDP buckets, ZeRO buckets and prefetch);
    other: temporaries (logits, recompute of one block, optimizer-step temporaries).
    """

    params: int = 0
    grads: int = 0
    optimizer_states: int = 0
    activations: int = 0
    buffers: int = 0
    other: int = 0
    phase: str = ""  # which part of the step the peak falls in
    # What ``params`` holds, named, where the strategy builds it from parts a reader would not guess (QLoRA: the
    # quantized weights, a mixture of experts' fused expert weights that bitsandbytes leaves unquantized, the rest);
    # () when undivided. The parts sum to ``params`` (``advisor.invariants``).
    params_parts: tuple[tuple[str, int], ...] = field(default=(), compare=False)

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_states + self.activations + self.buffers + self.other

    def as_dict(self) -> dict[str, int]:
        d = {k: v for k, v in asdict(self).items() if k not in ("phase", "params_parts")}
        d["total"] = self.total
        return d

    def named_parts(self) -> list[tuple[str, int]]:
        """Every non-zero part of ``total`` with its name, ``params`` split as ``params_parts`` says: what a line that
        quotes the total lists (they sum to ``total``)."""
        parts = list(self.params_parts) if self.params_parts else [("weights", self.params)]
        parts += [
            ("gradients", self.grads),
            ("optimizer states", self.optimizer_states),
            ("activations", self.activations),
            ("gathered parameters and buffers", self.buffers),
            ("temporaries", self.other),
        ]
        return [(name, n) for name, n in parts if n]


DTYPE_NAMES = {2: "16 bits", 4: "fp32"}


def quantized_base_parts(
    stats: ParamStats,
    quantized: int,
    rest_elem: int,
    rest_elems: int,
    extra: int = 0,
    extra_name: str = "the trainable adapters and the buffers",
) -> tuple[tuple[str, int], ...]:
    """``Breakdown.params_parts`` of a whole QLoRA base held on one rank: ``quantized`` bytes of packed 4-bit storage
    and quant states; ``rest_elems`` unquantized frozen elements at ``rest_elem`` bytes, of which a mixture of experts'
    fused expert weights (``ParamStats.unquantized_expert_numel``: transformers' fused 3-D expert parameters, which
    bitsandbytes' ``replace_with_bnb_linear`` does not replace) are named on their own; ``extra``: what else the
    weights hold (the adapters, the buffers)."""
    experts = min(stats.unquantized_expert_numel, rest_elems)
    dtype = DTYPE_NAMES.get(rest_elem, f"{rest_elem} bytes per element")
    parts = [
        ("quantized weights (packed storage and quant states)", quantized),
        (f"fused expert weights, which bitsandbytes does not quantize, in {dtype}", experts * rest_elem),
        (f"other unquantized weights (embeddings, norms, LM head) in {dtype}", (rest_elems - experts) * rest_elem),
        (extra_name, extra),
    ]
    return tuple((name, n) for name, n in parts if n)


def peak_of(*phases: Breakdown) -> Breakdown:
    """The phase with the largest total (peak allocated is a maximum over phases, not a sum)."""
    return max(phases, key=lambda b: b.total)


def trace_mode(precision: Precision | None, casts_weights: bool) -> TraceMode:
    """Which traced step a precision runs, the one place this mapping lives: ``fp32``; ``autocast``
    (fp32 weights under bf16/fp16 autocast: PyTorch AMP, what DDP/TP/single-GPU scripts do; also for a
    precision not yet resolved, None); ``half``
    (16-bit weights: pure bf16, and mixed precision in a framework that casts the module itself,
    ``casts_weights``, as DeepSpeed's bf16/fp16 modes do with ``module.half()``/``bfloat16()``)."""
    if precision == Precision.FP32:
        return TraceMode.FP32
    if precision == Precision.PURE_BF16 or casts_weights:
        return TraceMode.HALF
    return TraceMode.AUTOCAST


def bytes_per_element(precision: Precision | None, role: str) -> int:
    """Bytes per parameter element for ``role`` in ("weights", "grads", "optim") under DDP/TP
    precision semantics (``Precision.param_bytes``): mixed precision is autocast over fp32 weights (PyTorch AMP
    docs), so weights, grads and optimizer states stay fp32; pure bf16 keeps everything in bf16 (a precision not yet
    resolved, None, counts as mixed)."""
    return Precision.FP32.param_bytes if precision is None else precision.param_bytes


def optimizer_state_bytes(optimizer: str, numel: int, state_bytes: int = 4) -> int:
    """Optimizer states for ``numel`` parameters in one flat tensor (excluding master weights), as DeepSpeed's
    flat partitions hold them (``advisor.bnb_layout.optimizer_state_bytes``: torch's moments in the
    parameter's dtype, bitsandbytes' 8-bit blocks, Adafactor's full second moment for a 1-D tensor)."""
    return bnb_layout.optimizer_state_bytes(optimizer, ((numel,),) if numel else (), state_bytes)


def states_per_element(optimizer: str, state_bytes: int) -> float:
    """State bytes per parameter element of a large tensor (``advisor.bnb_layout.state_bytes_per_element``):
    what an optimizer step reads and writes besides the weight and gradient."""
    return bnb_layout.state_bytes_per_element(optimizer, state_bytes)


@dataclass(frozen=True)
class WeightBytes:
    """What one full replica's parameters take, split as fine-tuning splits them.

    ``frozen``: bytes of the frozen parameters (a LoRA base; with QLoRA the quantized storage and its quant
    states plus the fp32 rest). ``trainable_elem``: bytes per trainable element (the adapters' dtype, or the
    weights' under full fine-tuning), which their gradients and torch's optimizer moments share.
    """

    frozen: int
    trainable_elem: int
    frozen_elem: int


def weight_bytes(stats: ParamStats, adapter: AdapterSpec | None, mode: TraceMode) -> WeightBytes:
    """``WeightBytes`` of ``stats`` (``advisor.profile.ParamStats``) under the trace ``mode`` (``trace_mode``).

    Full fine-tuning (``adapter`` None): every parameter in the mode's weight dtype (fp32 under autocast: PyTorch
    AMP keeps fp32 weights; 16 bits under ``half``). LoRA (``adapter``: ``advisor.models.AdapterSpec``): the frozen
    base in 16 bits unless fp32 (loaded with ``from_pretrained(..., dtype=...)``); the adapters in ``adapter.dtype``,
    ``auto`` being fp32 (peft's ``get_peft_model(..., autocast_adapter_dtype=True)`` upcasts them) except under ``half``
    (DeepSpeed's bf16/fp16 modes and pure bf16 cast the whole module). QLoRA adds ``stats.quantized_bytes`` for the
    quantized weights (``advisor.bnb_layout.quantized_weight_bytes``) and keeps every other frozen parameter in fp32
    (peft's ``prepare_model_for_kbit_training`` upcasts the non-quantized fp16/bf16 parameters).
    """
    full = 2 if mode == TraceMode.HALF else 4
    if adapter is None:
        return WeightBytes(frozen=stats.num_frozen * full, trainable_elem=full, frozen_elem=full)
    dtype = adapter.dtype if adapter.dtype != Dtype.AUTO else (Dtype.BF16 if mode == TraceMode.HALF else Dtype.FP32)
    trainable = 4 if dtype == Dtype.FP32 else 2
    if adapter.quantize:
        rest = stats.num_frozen - stats.quantized_numel
        return WeightBytes(frozen=stats.quantized_bytes + 4 * rest, trainable_elem=trainable, frozen_elem=4)
    base = 4 if mode == TraceMode.FP32 else 2
    return WeightBytes(frozen=stats.num_frozen * base, trainable_elem=trainable, frozen_elem=base)


def rule_of_thumb_split(stats: ParamStats, adapter: AdapterSpec | None) -> tuple[int, int]:
    """(frozen bytes, parameters) the 16-bytes-per-parameter rule of thumb is applied to: (0, every parameter)
    under full fine-tuning; with LoRA the frozen base as it is held (``weight_bytes``: 2 bytes per parameter, about
    0.5 for a 4-bit base), which each strategy replicates or shards like the weights, and 16 bytes per trainable
    parameter, sharded as the strategy shards model states."""
    if adapter is None:
        return 0, stats.num_params
    return weight_bytes(stats, adapter, TraceMode.AUTOCAST).frozen, stats.num_trainable


# bitsandbytes' CPU path (bitsandbytes/backends/default/ops.py ``_gemm_4bit_default_impl`` ->
# ``_dequantize_4bit_compute``: int32 nibbles, the fp32 code lookup, the fp32 scaled copy, then ``F.linear``) holds
# about 26 bytes per weight element beyond the layer's output in forward and 20 in backward (measured here on a
# 688 x 256 ``Linear4bit``, nf4 with double quantization: 4,582,144 and 3,522,568 bytes).
CPU_DEQUANT_BYTES_PER_ELEMENT = {"forward": 26, "backward": 20}


def dequantized_weight_bytes(
    stats: ParamStats, adapter: AdapterSpec | None, device: Device = Device.CUDA, phase: str = "forward"
) -> int:
    """QLoRA's largest temporary beyond the trace: bitsandbytes' ``MatMul4Bit`` (and ``Linear8bitLt``'s
    dequantizing path) multiplies by a dequantized copy of the layer's weight, made in forward and again in
    backward and freed after the matmul. CUDA: one copy in ``adapter.compute_dtype`` (the dequantize kernel's
    output, then cuBLAS); CPU: ``CPU_DEQUANT_BYTES_PER_ELEMENT`` of the ``phase``. Of the largest quantized weight;
    0 without quantization (the trace already holds 16-bit weights' matmuls)."""
    if adapter is None or not adapter.quantize:
        return 0
    if device == Device.CPU:
        return stats.largest_quantized_numel * CPU_DEQUANT_BYTES_PER_ELEMENT[phase]
    return stats.largest_quantized_numel * (4 if adapter.compute_dtype == Dtype.FP32 else 2)


def optimizer_step_temp_bytes(optimizer: Optimizer, device: Device, largest_param_numel: int, elem_bytes: int) -> int:
    """Temporaries of ``optimizer.step()``.

    CUDA: generated scripts use ``fused=True`` Adam/AdamW (no per-tensor temporaries) and foreach
    SGD (in-place). CPU: torch picks the single-tensor Adam loop (``_default_to_fused_or_foreach``
    only picks foreach for CUDA tensors), whose ``denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)``
    holds two temporaries the size of the parameter tensor being updated (the sqrt and the
    quotient; measured: gpt2's 147 MiB embedding gives a 294 MiB step peak on CPU). bitsandbytes' optimizers on CPU
    (bitsandbytes 0.50 ``backends/cpu/ops.py``: ``_optimizer_update_8bit_blockwise_cpu`` dequantizes both 8-bit states
    to fp32, then ``g.float() * gnorm_scale``, ``p.data.float()`` (a copy for 16-bit parameters) and Adam's sqrt and
    quotient; the 32-bit update keeps fewer) hold, per element of the tensor being updated, 20 bytes (8-bit AdamW)
    or 12 (32-bit paged AdamW, Lion), 4 more for 16-bit parameters (measured here with the profiler on a 2**20-element
    tensor's second step, fp32 and bf16).
    """
    if device != Device.CPU:
        return 0
    if optimizer.is_adam:
        return 2 * largest_param_numel * elem_bytes
    if optimizer.is_torch or optimizer == Optimizer.ADAFACTOR:
        return 0
    per_element = 20 if optimizer in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT) else 12
    return (per_element + (4 if elem_bytes < 4 else 0)) * largest_param_numel


@dataclass(frozen=True)
class DeviceOverhead:
    """What nvidia-smi shows beyond the peak allocated. All zero for CPU runs."""

    cuda_context: int = 0
    communicator: int = 0
    fragmentation: int = 0

    @property
    def total(self) -> int:
        return self.cuda_context + self.communicator + self.fragmentation


def device_overhead(device: Device, peak_allocated: int, world_size: int) -> DeviceOverhead:
    """CUDA context, NCCL buffers and allocator fragmentation (see the constants' sources)."""
    if device != Device.CUDA:
        return DeviceOverhead()
    return DeviceOverhead(
        cuda_context=CUDA_CONTEXT_BYTES,
        communicator=NCCL_BUFFER_BYTES if world_size > 1 else 0,
        fragmentation=int(peak_allocated * FRAGMENTATION),
    )


def zero_paper_model_states(num_params: int, num_gpus: int, stage: int, k: int = 12) -> int:
    """Model-state bytes per GPU in the ZeRO paper's accounting (Rajbhandari et al. 2020, section 3.1
    and Figure 1): 2 (fp16 weights) + 2 (fp16 grads) + K (fp32 master, momentum, variance; K = 12)
    bytes per parameter; stage 0 = DDP, 1 = P_os, 2 = P_os+g, 3 = P_os+g+p.

    This is the paper's idealisation; the estimator models what DeepSpeed allocates (for example
    its fp32 gradient partition, 4 bytes more per parameter / N; DeepSpeed's own estimator uses
    2P + 18P/N for ZeRO-2).
    """
    p, n = num_params, num_gpus
    if stage == 0:
        return (4 + k) * p
    if stage == 1:
        return 4 * p + k * p // n
    if stage == 2:
        return 2 * p + (2 + k) * p // n
    if stage == 3:
        return (4 + k) * p // n
    raise ValueError(f"ZeRO stage must be 0-3, got {stage}")


@dataclass(frozen=True)
class StrategyMemory:
    """One strategy's per-GPU memory at one micro-batch."""

    peak: Breakdown
    overhead: DeviceOverhead
    host_bytes_per_node: int = 0
    model_state_bytes: int = 0  # weights + gradients + optimizer states held on the GPU, whatever the phase
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def device_total(self) -> int:
        return self.peak.total + self.overhead.total
