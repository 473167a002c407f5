"""Compute time of the traced forward + backward: a roofline evaluated op by op.

Every op the meta trace dispatches is recorded as ``(flops, bytes)``: its FLOPs by ``torch.utils.flop_counter``'s
formulas (2 per multiply-add; matmuls, convolutions, attention; 0 for every other op) and the bytes it reads and
writes (its tensor inputs plus its tensor outputs; views, aliases and allocations move nothing and count 0).
One op takes (roofline model, Williams, Waterman and Patterson, CACM 2009)

    t = max(flops / (peak x compute_efficiency), bytes / (hbm_bandwidth x bandwidth_efficiency))

so matmuls, convolutions and attention run at the GPU's dense peak for the precision and memory-bound ops
(norms, softmax, elementwise, casts) at its memory bandwidth; a step is the sum over its ops (one stream, ops
in order: kernels of one step do not overlap), and at least the ops x eager PyTorch's CPU-side cost per op
(``GPU_DISPATCH_S``: the GPU runs ahead of the CPU only while kernels take longer than queueing them).

A calibrated CPU (``advisor.timing.calibrate``) is its own "GPU" with measured rates, and three more terms
(``Rates``): fused attention at its measured rate, transcendental element-wise ops (exp, log, sqrt, the
activations and softmax) bounded by the measured exp rate as well as by memory, and the eager overhead per
op added to every op (a CPU runs dispatch and kernels on the same cores, in series). The efficiencies are at most
two per GPU generation, fitted
to public measurements (``EFFICIENCY``; those rows and their residuals: ``bench/PUBLISHED.md``, ``python -m
bench.published``); ``--mfu`` sets the compute efficiency and ``--bandwidth-efficiency`` the other.

The bandwidth efficiency is the effective rate of the op-by-op byte count as a share of HBM bandwidth, and the
fit puts it above 1 (1.52 on Ampere): the published runs fuse what eager PyTorch runs op by op (torch.compile
in nanoGPT, Megatron-LM's fused kernels), and tensors that fit the L2 cache (40 MB on A100) are read back from
it rather than from HBM. Scripts that run eager (what ``--emit`` writes) can be slower on memory-bound models;
``--bandwidth-efficiency 0.8`` (elementwise kernels reach about 80% of HBM bandwidth) models an eager run.

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

from ..choices import Precision
from ..gpu_presets import GPU_PRESETS, GpuPreset

TFLOP = 1e12
GB = 1e9

Op = tuple[int, ...]  # (flops, bytes read + written[, kind]) of one traced op; no kind: MEMORY
# Kinds of traced op (``advisor.trace``): which rate bounds its compute term.
MEMORY = 0  # matmul-class ops (FLOPs at the matmul peak) and every other op (bytes at memory bandwidth)
CONV = 1  # convolutions: FLOPs at the convolution peak
TRANSCENDENTAL = 2  # exp/log/sqrt/activations/softmax: bytes at the transcendental rate where one is known (CPU)
ATTENTION = 3  # the fused SDPA kernel: FLOPs at the attention rate where one is known (CPU), else the matmul peak

# Eager PyTorch's CPU-side cost of one op on a GPU (Python, autograd, the dispatcher and cudaLaunchKernel):
# about 5-25 us per op (J. Lin, "From PyTorch op to kernel launch", gpu_kernel_serving lesson 18: Python ~1 us,
# pybind ~1, autograd 1-3, dispatcher 1-2, backend 1-5, cudaLaunchKernel 1-3; H. He, "Making Deep Learning Go
# Brrrr From First Principles", 2022, "Overhead"). 10 us, the middle of that range. The GPU runs its queue
# asynchronously, so this bounds a phase from below rather than adding to it (``roofline_s``): it shows only
# when the kernels are too small to keep the GPU busy (tiny models, tiny micro-batches).
GPU_DISPATCH_S = 10e-6
GPU_DISPATCH_SOURCE = (
    "10 us per op: eager PyTorch's CPU-side cost of one op (Python, autograd, dispatcher, "
    "cudaLaunchKernel: 5-25 us; horace.io/brrr_intro.html 'Overhead'; "
    "jiahuanglin.xyz gpu_kernel_serving lesson 18)"
)


@dataclass(frozen=True)
class Efficiency:
    """The share of the datasheet peak a generation reaches: ``compute`` of the dense tensor (or FP32) peak on
    matmul-class ops, ``bandwidth`` of the HBM bandwidth on memory-bound ops. ``source``: how it was found."""

    compute: float
    bandwidth: float
    source: str


# Fitted by grid search to the published runs below (their rows and residuals are in bench/PUBLISHED.md):
# Ampere to nanoGPT (8 x A100, 562 ms/step) and Megatron-LM's weak-scaling table (1B-8B, TP 1-8, 1076-1343 ms);
# Turing's compute efficiency to the transformers docs' DP-vs-DDP run (2 x TITAN RTX, fp32, 101.9 s / 200 steps),
# its bandwidth efficiency Ampere's (one measurement cannot fit two). Generations without a public measurement
# here borrow the nearest fitted one and say so.
_FIT = "fitted in bench/TIME.md (python -m bench.run --time)"
AMPERE = Efficiency(0.64, 1.52, f"{_FIT}: nanoGPT 124M on 8 x A100 and Megatron-LM 1B-8B on DGX A100")
TURING = Efficiency(
    0.51,
    AMPERE.bandwidth,
    f"{_FIT}: compute to transformers DP-vs-DDP (2 x TITAN RTX, fp32); bandwidth borrowed from Ampere",
)
EFFICIENCY: dict[str, Efficiency] = {
    "ampere": AMPERE,
    "turing": TURING,
    "hopper": Efficiency(AMPERE.compute, AMPERE.bandwidth, f"no public measurement fitted: Ampere's ({AMPERE.source})"),
    "ada": Efficiency(AMPERE.compute, AMPERE.bandwidth, f"no public measurement fitted: Ampere's ({AMPERE.source})"),
    "volta": Efficiency(TURING.compute, TURING.bandwidth, f"no public measurement fitted: Turing's ({TURING.source})"),
}
# How far a borrowing generation's throughput lands from published runs on it, as (worst slow, worst fast) ratios of
# predicted to measured tokens/s per GPU: Hopper against llm-foundry's FSDP runs on H100 80GB
# (../shared/anchors/published_runs.md F6 0.95 on 128 GPUs, F14 1.14, F20 0.85 on 16, F23 0.88, F24 0.81 on 16; bf16,
# AC off, the rows' micro- and global batches, ib-ndr between nodes; measured 2026-12-03 with the command in
# tests/test_step_time.py::test_h100_borrowed_error_band_holds_on_a_published_run). None: never checked.
BORROWED_BAND: dict[str, tuple[float, float, str]] = {
    "hopper": (0.81, 1.14, "5 published FSDP runs on H100 (llm-foundry; published_runs.md F6, F14, F20, F23, F24)"),
}
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


def efficiency_for(preset: GpuPreset) -> Efficiency:
    """The fitted efficiencies of ``preset``'s generation (``EFFICIENCY``)."""
    return EFFICIENCY[GENERATION.get(preset.name.lower(), "ampere")]


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
    """Achieved rates of one GPU: FLOP/s for matmul-class ops (``conv_flops_per_s`` for convolutions) and bytes/s
    for memory traffic. The rest are known for a calibrated CPU (``advisor.timing.calibrate``) and None / 0 on a
    GPU: ``attention_flops_per_s`` (the fused attention kernel; None: the matmul rate), ``transcendental_bytes_per_s``
    (exp/log/sqrt/softmax element-wise ops; None: memory bandwidth alone bounds them), ``op_overhead_s`` (seconds
    each op costs on top of its work, in series: a CPU runs dispatch and kernels on the same cores),
    ``optimizer_bytes_per_s`` (the optimizer step's bytes, measured on a real step; None: ``bytes_per_s``);
    ``dispatch_s``: the CPU-side cost per op that bounds a GPU phase from below (``GPU_DISPATCH_S``)."""

    flops_per_s: float
    conv_flops_per_s: float
    bytes_per_s: float
    attention_flops_per_s: float | None = None
    transcendental_bytes_per_s: float | None = None
    op_overhead_s: float = 0.0
    optimizer_bytes_per_s: float | None = None
    dispatch_s: float = 0.0


def rates(preset: GpuPreset, precision: Precision, compute_efficiency: float, bandwidth_efficiency: float) -> Rates:
    """``Rates`` of ``preset`` at ``precision`` with the given efficiencies (datasheet peaks x efficiency)."""
    peak = preset.peak_tflops(peak_precision(precision, preset)) or preset.tflops_fp32 or 0.0
    conv = preset.peak_tflops(conv_peak_precision(precision, preset)) or peak
    return Rates(
        peak * TFLOP * compute_efficiency,
        conv * TFLOP * compute_efficiency,
        preset.hbm_gbps * GB * bandwidth_efficiency,
        dispatch_s=GPU_DISPATCH_S,
    )


def _ops_at(o1: Sequence[Op], o2: Sequence[Op], b: int, base_b: int) -> list[tuple[float, float, int]]:
    """Each op at micro-batch ``b``, linear in b between the traces at ``base_b`` (``o1``) and ``base_b + 1``
    (``o2``); when a few ops differ between the two traces they are aligned proportionally (as the memory
    events are, ``advisor.trace._events_at``). Never negative."""
    if len(o1) != len(o2):
        n1, n2 = len(o1), len(o2)
        if n1 < n2:
            o1 = [o1[i * n1 // n2] for i in range(n2)]
        else:
            o2 = [o2[i * n2 // n1] for i in range(n1)]
    k = b - base_b
    return [
        (max(0.0, x[0] + k * (y[0] - x[0])), max(0.0, x[1] + k * (y[1] - x[1])), x[2] if len(x) > 2 else MEMORY)
        for x, y in zip(o1, o2)
    ]


def op_s(flops: float, nbytes: float, kind: int, r: Rates) -> float:
    """Seconds of one op of ``kind`` (module docstring): the larger of its compute time (FLOPs at the kind's rate;
    a transcendental op's bytes at the transcendental rate where one is known) and its memory time, plus the
    per-op overhead of a CPU (``Rates.op_overhead_s``; 0 on a GPU)."""
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
    ops = _ops_at(o1, o2, b, base_b)
    return sum(op_s(flops, nbytes, kind, r) for flops, nbytes, kind in ops), len(ops)


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

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s

    @property
    def model_flops(self) -> int:
        return self.flops - self.recompute_flops
