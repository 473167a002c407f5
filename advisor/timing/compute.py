"""Compute time of the traced forward + backward, op by op: a GPU's per-op model, a calibrated CPU's roofline.

Every op the meta trace dispatches is recorded as ``(flops, bytes[, kind[, *shape]])``: its FLOPs by
``torch.utils.flop_counter``'s formulas (2 per multiply-add; matmuls, convolutions, attention; 0 for every other op),
the bytes it reads and writes (its tensor inputs plus its tensor outputs; views, aliases and allocations move nothing
and count 0), its kind, and for GEMMs, convolutions and fused attention the shape their time depends on
(``advisor.timing.gpu_time``).

A GPU (``Rates.gpu`` set, ``gpu_rates``) is timed by ``advisor.timing.gpu_time``: each GEMM and convolution by its
own roofline with tile and wave quantization, fused attention by head dim and waves, memory-bound ops at the
achieved HBM bandwidth with a fixed time per kernel, and eager dispatch as a queue; the constants are the
generation's ``GpuModel`` (``advisor.timing.gpu_model.MODELS``; ``--mfu`` sets the GEMM, convolution and attention
shares, ``--bandwidth-efficiency`` the bandwidth share, each at most 1 of its datasheet value).

A calibrated CPU (``advisor.timing.calibrate``) is its own "GPU" with measured rates and no ``GpuModel``: one op
takes (roofline model, Williams, Waterman and Patterson, CACM 2009)

    t = max(flops / flop_rate, bytes / byte_rate) + op_overhead_s

with fused attention at its measured rate, transcendental element-wise ops (exp, log, sqrt, the activations and
softmax) bounded by the measured exp rate as well as by memory, and the eager overhead per op added to every op (a
CPU runs dispatch and kernels on the same cores, in series); a phase is the sum over its ops (``roofline_s``).

Which peak (``peak_precision``): bf16 / fp16 autocast and DeepSpeed's 16-bit modes run their matmuls in 16 bits
(the bf16 or fp16 tensor peak); pure bf16 the bf16 peak; fp32 the non-tensor FP32 peak: PyTorch does not use
TF32 for fp32 matmuls unless told (``torch.backends.cuda.matmul.allow_tf32`` defaults to False since PyTorch
1.12; PyTorch docs "TensorFloat-32 (TF32) on Ampere (and later) devices"), and the generated scripts
(strategies/templates) never enable it. cuDNN convolutions do use TF32 by default
(``torch.backends.cudnn.allow_tf32`` defaults to True), so fp32 convolutions get the TF32 peak where the GPU
has one (``conv_peak_precision``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..choices import Precision
from ..gpu_presets import GPU_PRESETS, GpuPreset
from .gpu_model import BORROWED, MODELS, SM_COUNT, GpuModel

TFLOP = 1e12
GB = 1e9

Op = tuple[int, ...]  # (flops, bytes read + written[, kind[, *shape]]) of one traced op; no kind: MEMORY
# Kinds of traced op (``advisor.trace``): which rate bounds its compute term.
MEMORY = 0  # every op without a kind of its own: bytes at memory bandwidth (FLOPs, if any, at the matmul peak)
CONV = 1  # convolutions: FLOPs at the convolution peak; shape: the bytes and tensors of cuDNN's layout transposes, then
# their implicit GEMMs (advisor.trace.shapes, advisor.timing.gpu_time)
TRANSCENDENTAL = 2  # exp/log/sqrt/activations/softmax: bytes at the transcendental rate where one is known (CPU)
ATTENTION = 3  # the fused SDPA kernel: FLOPs at the attention rate; shape: heads, lengths, head dim, kernel
GEMM = 4  # mm / addmm / bmm / baddbmm / _scaled_mm: FLOPs at the matmul peak; shape: (flops, M, N, K, batch, size)
NORM = 5  # batch norm in training: two passes on a GPU (statistics, then normalize); shape: the first pass's
# bytes (advisor.trace.shapes.norm_shape). A calibrated CPU times it as MEMORY (its bytes at memory bandwidth).

# A convolution's shape (advisor.trace.shapes.conv_params): after its 2 layout fields, the call itself in
# CONV_PARAM_FIELDS integers: input N, C, H, W; weight dims (4); stride (2), padding (2), dilation (2); groups,
# transposed, output padding (2); element size; and which call: 0 the forward, 8 + the backward's output mask (1
# grad_input, 2 grad_weight, 4 grad_bias). All 0 where the convolution is not a 2-D one. A calibrated CPU times a
# convolution by its measured seconds at this micro-batch (``Rates.conv_s``, ``advisor.timing.cpu_conv``), the
# GPU model by the implicit GEMMs after these fields.
CONV_LAYOUT_FIELDS = 2
CONV_PARAM_FIELDS = 20
ConvKey = tuple[int, ...]  # CONV_PARAM_FIELDS integers, the input's N the micro-batch's


@dataclass(frozen=True)
class Efficiency:
    """The share of the datasheet peak a GPU reaches: ``compute`` of the dense tensor (or FP32) peak on large GEMMs,
    ``bandwidth`` of the HBM bandwidth on large memory-bound ops (the JSON's ``compute_efficiency`` and
    ``bandwidth_efficiency``; a GPU's are its ``GpuModel``'s ``gemm`` and ``bandwidth``, a calibrated CPU's 1 and 1).
    ``source``: how they were found."""

    compute: float
    bandwidth: float
    source: str


# GPU generation of each preset (NVIDIA architecture whitepapers: GA100/GA102 Ampere, AD102/AD104 Ada, GH100 Hopper,
# GV100 Volta, TU102/TU104 Turing).
GENERATION = {
    "a100-40gb": "ampere",
    "a100-80gb": "ampere",
    "a10g-24gb": "ampere",
    "rtx3090": "ampere",
    "rtxa6000": "ampere",
    "a10-24gb": "ampere",
    "a100-pcie-40gb": "ampere",
    "rtx6000ada": "ada",
    "h100-pcie-80gb": "hopper",
    "l4-24gb": "ada",
    "rtx4090": "ada",
    "l40s-48gb": "ada",
    "h100-80gb": "hopper",
    "h200-141gb": "hopper",
    "v100-16gb": "volta",
    "v100-32gb": "volta",
    "t4-16gb": "turing",
    "titanrtx": "turing",
}
# Words in a detected GPU's name (torch.cuda.get_device_name, e.g. "NVIDIA A100-SXM4-80GB") -> preset family.
_NAME_WORDS = (
    ("h200", "h200"),
    ("h100 pcie", "h100-pcie"),
    ("h100", "h100"),
    ("a100 pcie", "a100-pcie"),
    ("a100", "a100"),
    ("a10g", "a10g"),
    ("a10", "a10-"),
    ("6000 ada", "rtx6000ada"),
    ("a6000", "rtxa6000"),
    ("l40s", "l40s"),
    ("l40", "l40s"),
    ("4090", "rtx4090"),
    ("3090", "rtx3090"),
    ("titan rtx", "titanrtx"),
    ("titanrtx", "titanrtx"),
    ("v100", "v100"),
    ("t4", "t4"),
    ("l4", "l4"),
)


def preset_for_gpu(name: str, memory_bytes: int | None = None) -> GpuPreset | None:
    """The preset of a GPU named ``name``: a preset name itself, or a detected device name mapped by its model
    number (the preset with the nearest memory among that model's); None for a GPU without a preset."""
    key = name.strip().lower()
    if key in GPU_PRESETS:
        return GPU_PRESETS[key]
    flat = key.replace("-", " ").replace("_", " ")
    for word, prefix in _NAME_WORDS:
        if word in flat or word in key:
            found = [p for k, p in GPU_PRESETS.items() if k.startswith(prefix)]
            if found:
                return min(found, key=lambda p: abs(p.memory_bytes - (memory_bytes or p.memory_bytes)))
    return None


def generation_of(preset: GpuPreset) -> str:
    """``preset``'s GPU generation (``GENERATION``; Ampere for a preset not listed)."""
    return GENERATION.get(preset.name.lower(), "ampere")


def model_for(preset: GpuPreset) -> GpuModel:
    """The default compute-model constants of ``preset``'s generation (``advisor.timing.gpu_model.MODELS``)."""
    return MODELS[generation_of(preset)]


def is_borrowed(model: GpuModel) -> bool:
    """Whether ``model``'s constants were borrowed from another generation (``gpu_model.BORROWED``)."""
    return model.source.startswith(BORROWED)


def peak_precision(precision: Precision, preset: GpuPreset) -> str:
    """The ``GpuPreset.peak_tflops`` key matmuls run at under a plan's ``precision`` (module docstring):
    bf16 -> bf16; fp16 -> fp16; pure-bf16 -> bf16; fp32 -> fp32 (no TF32 unless the script enables it)."""
    if precision in (Precision.BF16, Precision.PURE_BF16):
        return "bf16" if preset.tflops_bf16 is not None else "fp16"
    if precision == Precision.FP16:
        return "fp16"
    return "fp32"


def conv_peak_precision(precision: Precision, preset: GpuPreset) -> str:
    """As ``peak_precision`` for convolutions: fp32 convolutions use TF32 where the GPU has it (cuDNN's
    ``torch.backends.cudnn.allow_tf32`` defaults to True; PyTorch docs, TF32 section)."""
    if precision == Precision.FP32 and preset.tflops_tf32 is not None:
        return "tf32"
    return peak_precision(precision, preset)


@dataclass(frozen=True)
class Rates:
    """Achieved rates of one GPU or calibrated CPU: FLOP/s of a large matmul (``conv_flops_per_s`` for
    convolutions) and bytes/s of large memory traffic. ``gpu``: the GPU's compute-model constants (``gpu_rates``),
    which time each op by its shape (``advisor.timing.gpu_time``) with ``sm_count`` SMs and ``dispatch_s`` of CPU
    issue per op in a queue; None: the roofline of a calibrated CPU (``roofline_s``). ``attention_flops_per_s``:
    the fused attention kernel's rate (None: the matmul rate). The rest are a calibrated CPU's
    (``advisor.timing.calibrate``) and None / 0 on a GPU: ``transcendental_bytes_per_s`` (exp/log/sqrt/softmax
    element-wise ops; None: memory bandwidth alone bounds them), ``op_overhead_s`` (seconds each op costs on top of
    its work, in series: a CPU runs dispatch and kernels on the same cores), ``optimizer_bytes_per_s`` (the
    optimizer step's bytes, measured on a real step; None: ``bytes_per_s``); ``conv_s`` the seconds of the model's
    own convolutions measured on this CPU at the run's micro-batch (empty: convolutions at ``conv_flops_per_s``)."""

    flops_per_s: float
    conv_flops_per_s: float
    bytes_per_s: float
    attention_flops_per_s: float | None = None
    transcendental_bytes_per_s: float | None = None
    op_overhead_s: float = 0.0
    optimizer_bytes_per_s: float | None = None
    dispatch_s: float = 0.0
    gpu: GpuModel | None = None
    sm_count: int = 0
    # a calibrated CPU's measured convolutions: (ConvKey, seconds of that call), ``advisor.timing.cpu_conv``
    conv_s: tuple[tuple[ConvKey, float], ...] = ()


def rates(preset: GpuPreset, precision: Precision, compute_efficiency: float, bandwidth_efficiency: float) -> Rates:
    """Roofline ``Rates`` of ``preset`` at ``precision`` with the given efficiencies (datasheet peaks x efficiency),
    no ``GpuModel``: what a calibrated CPU's rates start from (``CpuCalibration.extend``)."""
    peak = preset.peak_tflops(peak_precision(precision, preset)) or preset.tflops_fp32 or 0.0
    conv = preset.peak_tflops(conv_peak_precision(precision, preset)) or peak
    return Rates(
        peak * TFLOP * compute_efficiency,
        conv * TFLOP * compute_efficiency,
        preset.hbm_gbps * GB * bandwidth_efficiency,
    )


def gpu_rates(preset: GpuPreset, precision: Precision, model: GpuModel) -> Rates:
    """``Rates`` of GPU ``preset`` at ``precision`` under ``model``: the matmul peak x ``gemm``, the convolution peak
    (``conv_peak_precision``) x ``conv``, the matmul peak x ``attention``, HBM x ``bandwidth``, the preset's SM count
    (``gpu_model.SM_COUNT``; 0 for a preset without one: no wave quantization) and ``model.dispatch_s``."""
    peak = preset.peak_tflops(peak_precision(precision, preset)) or preset.tflops_fp32 or 0.0
    conv = preset.peak_tflops(conv_peak_precision(precision, preset)) or peak
    return Rates(
        peak * TFLOP * model.gemm,
        conv * TFLOP * model.conv,
        preset.hbm_gbps * GB * model.bandwidth,
        attention_flops_per_s=peak * TFLOP * model.attention,
        dispatch_s=model.dispatch_s,
        gpu=model,
        sm_count=SM_COUNT.get(preset.name.lower(), 0),
    )


def aligned(o1: Sequence[Op], o2: Sequence[Op]) -> tuple[Sequence[Op], Sequence[Op]]:
    """The ops of two traces of one phase (at micro-batch ``BASE_B`` and ``BASE_B + 1``) paired one to one: when a
    few ops differ between them the shorter list is stretched proportionally (as the memory events are,
    ``advisor.trace.timeline._events_at``)."""
    n1, n2 = len(o1), len(o2)
    if n1 < n2:
        return [o1[i * n1 // n2] for i in range(n2)], o2
    if n2 < n1:
        return o1, [o2[i * n2 // n1] for i in range(n1)]
    return o1, o2


def conv_key(x: Op, y: Op, k: int) -> ConvKey | None:
    """The call of convolution op ``x`` (traced at the first micro-batch; ``y`` the same op one sample more) at ``k``
    micro-batches past the first: its CONV_PARAM_FIELDS with the input's N linear in the micro-batch, as the FLOPs
    are. None for another op, an older trace without them, or a convolution that is not a 2-D one (N 0)."""
    start, end = 3 + CONV_LAYOUT_FIELDS, 3 + CONV_LAYOUT_FIELDS + CONV_PARAM_FIELDS
    if len(x) < end or x[2] != CONV or not x[start]:
        return None
    params = list(x[start:end])
    grow = y[start] - x[start] if len(y) >= end and y[2] == CONV and y[start + 1 : end] == x[start + 1 : end] else 1
    params[0] = max(1, x[start] + k * grow)
    return tuple(int(v) for v in params)


def ops_at(o1: Sequence[Op], o2: Sequence[Op], b: int, base_b: int) -> list[tuple[float, float, int, ConvKey | None]]:
    """Each op at micro-batch ``b``, linear in b between the traces at ``base_b`` (``o1``) and ``base_b + 1``
    (``o2``), paired by ``aligned``, with a convolution's call at ``b`` (``conv_key``). Never negative."""
    o1, o2 = aligned(o1, o2)
    k = b - base_b
    return [
        (
            max(0.0, x[0] + k * (y[0] - x[0])),
            max(0.0, x[1] + k * (y[1] - x[1])),
            x[2] if len(x) > 2 else MEMORY,
            conv_key(x, y, k),
        )
        for x, y in zip(o1, o2)
    ]


@lru_cache(maxsize=16)
def _conv_table(conv_s: tuple[tuple[ConvKey, float], ...]) -> dict[ConvKey, float]:
    return dict(conv_s)


def op_s(flops: float, nbytes: float, kind: int, r: Rates, conv: ConvKey | None = None) -> float:
    """Seconds of one op of ``kind`` (module docstring): the larger of its compute time (FLOPs at the kind's rate;
    a transcendental op's bytes at the transcendental rate where one is known) and its memory time, plus the
    per-op overhead of a CPU (``Rates.op_overhead_s``; 0 on a GPU). A convolution whose call ``conv`` this CPU
    measured (``Rates.conv_s``): those seconds, dispatch included (a CPU picks its kernel by shape, batch and
    threads: PyTorch runs a 1x1 fp32 convolution of fewer than 16 samples on one thread without oneDNN, and both
    paths slow down several-fold on 2x2 maps; measured here, advisor.timing.cpu_conv)."""
    if conv is not None and r.conv_s:
        measured = _conv_table(r.conv_s).get(conv)
        if measured is not None:
            return measured
    rate = r.flops_per_s
    if kind == CONV:
        rate = r.conv_flops_per_s
    elif kind == ATTENTION and r.attention_flops_per_s:
        rate = r.attention_flops_per_s
    compute = flops / rate if rate else 0.0
    if kind == TRANSCENDENTAL and r.transcendental_bytes_per_s:
        compute = max(compute, nbytes / r.transcendental_bytes_per_s)
    return max(compute, nbytes / r.bytes_per_s if r.bytes_per_s else 0.0) + r.op_overhead_s


def roofline_work(o1: Sequence[Op], o2: Sequence[Op], b: int, base_b: int, r: Rates) -> tuple[float, int]:
    """One phase's ops at micro-batch ``b``: (seconds of work, each op the larger of its compute time and its
    memory time, summed; the number of ops). The dispatch floor (``floored_s``) applies to the whole phase after
    any extrapolation in depth: a floor applied per traced depth and then extrapolated would not be a floor."""
    ops = ops_at(o1, o2, b, base_b)
    return sum(op_s(flops, nbytes, kind, r, conv) for flops, nbytes, kind, conv in ops), len(ops)


def floored_s(work_s: float, ops: float, r: Rates) -> float:
    """A phase's seconds: its work, at least its ops x ``Rates.dispatch_s`` (a GPU waits for the CPU to queue
    kernels that finish faster than they are queued)."""
    return max(work_s, ops * r.dispatch_s)


def roofline_s(o1: Sequence[Op], o2: Sequence[Op], b: int, base_b: int, r: Rates) -> float:
    """Seconds for one phase's ops at micro-batch ``b`` (module docstring): ``roofline_work`` with the dispatch
    floor (``floored_s``)."""
    return floored_s(*roofline_work(o1, o2, b, base_b, r), r)


@dataclass(frozen=True)
class ComputeTime:
    """One micro-step's forward and backward on one GPU. ``flops`` all FLOPs run (recompute included),
    ``recompute_flops`` the part activation checkpointing recomputes (model FLOPs = flops - recompute_flops)."""

    fwd_s: float
    bwd_s: float
    flops: int
    recompute_flops: int
    bytes: int = 0
    # Deep stacks traced at one and two blocks: the repeated blocks at full depth and one block's forward and
    # backward seconds (what the two-block trace adds: ``ActivationProfile.compute_time``); the rest of each phase
    # is outside the blocks (embeddings, final norm, head, loss). 0: not split (a stack traced at its real depth).
    blocks: int = 0
    block_fwd_s: float = 0.0
    block_bwd_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def model_flops(self) -> int:
        return self.flops - self.recompute_flops


def unit_compute_s(c: ComputeTime, numels: list[int]) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of each unit of a micro-step, for units of ``numels`` parameters, the root
    (everything outside the repeated blocks: embeddings, final norm, head) first, then one per repeated block, as
    ``ParamStats.fsdp_units`` lists them. A deep stack's split (``ComputeTime.blocks``: one block's seconds from
    the one- and two-block traces) when it has one block per unit, the root the rest of each phase (its head and
    loss); otherwise each phase in proportion to the units' parameters (a simplification: a transformer's compute
    is mostly 2 x tokens x parameters of its linears, and the attention scores are left out of that share)."""
    blocks = len(numels) - 1
    if blocks >= 1 and c.blocks == blocks:
        bf, bb = c.block_fwd_s, c.block_bwd_s
        return [max(0.0, c.fwd_s - blocks * bf)] + [bf] * blocks, [max(0.0, c.bwd_s - blocks * bb)] + [bb] * blocks
    total = sum(numels)
    if total <= 0:
        share = [1 / max(1, len(numels))] * len(numels)
    else:
        share = [x / total for x in numels]
    return [c.fwd_s * x for x in share], [c.bwd_s * x for x in share]
