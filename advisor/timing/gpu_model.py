"""The GPU compute model's constants: the fitted ones of each GPU generation (``GpuModel``) and the datasheet
streaming-multiprocessor counts that wave quantization divides by (``SM_COUNT``).

The functions that turn a traced op's shape into seconds live in ``advisor.timing.compute``; the fit of the
constants and its residuals in bench/PUBLISHED.md (``python -m bench.published``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuModel:
    """The fitted constants of one GPU generation's compute model: at most six, each at most 1 of its datasheet
    value where it is a share of one.

    Attributes:
        gemm: share of the dense tensor (or FP32) peak that a large GEMM reaches once its output tiles fill
            every SM in whole waves (tile and wave quantization then lower it for other shapes).
        conv: share of the convolution peak that cuDNN's implicit GEMM reaches at large channel counts.
        attention: share of the dense peak the fused attention kernel reaches at head dim 128 and long
            sequences.
        bandwidth: share of the HBM bandwidth a large element-wise kernel reaches.
        half_bandwidth_bytes: bytes an element-wise kernel moves at half of its large-tensor bandwidth (small
            tensors do not fill the GPU: launch latency and the tail of the last wave).
        dispatch_s: eager PyTorch's CPU-side seconds to issue one op (Python, autograd, dispatcher,
            cudaLaunchKernel); a stretch of ops takes the larger of its GPU time and its issue time.
        source: where the constants come from (a fit in bench/PUBLISHED.md, a calibration on this machine).
        fused_elementwise: not a fitted constant but what the timed code runs: True where it fuses each stretch of
            memory-bound ops between two GEMM / attention kernels into one kernel (Megatron-LM's fused kernels,
            torch.compile's generated ones; ``advisor.timing.gpu_time.fused_times``); False, eager PyTorch's one
            kernel per op, for every plan of advisor's own scripts.
    """

    gemm: float
    conv: float
    attention: float
    bandwidth: float
    half_bandwidth_bytes: int
    dispatch_s: float
    source: str
    fused_elementwise: bool = False


# Streaming multiprocessors per GPU, the unit wave quantization counts thread blocks in (NVIDIA, "Matrix
# Multiplication Background User's Guide", wave quantization): the architecture whitepapers and datasheets.
SM_COUNT: dict[str, int] = {
    "a100-40gb": 108,  # NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs
    "a100-80gb": 108,
    "h100-80gb": 132,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper: SXM5 132 SMs (PCIe 114)
    "h200-141gb": 132,  # H200 is GH100 SXM: 132 SMs
    "v100-16gb": 80,  # NVIDIA Tesla V100 GPU Architecture whitepaper: 80 SMs
    "v100-32gb": 80,
    "a10g-24gb": 80,  # AWS G5 A10G: GA102, 10,240 CUDA cores = 80 SMs x 128 (the A10 has 72)
    "l4-24gb": 58,  # NVIDIA Ada whitepaper appendix: L4 AD104, 58 SMs
    "rtx3090": 82,  # NVIDIA Ampere GA102 whitepaper: RTX 3090 82 SMs
    "rtx4090": 128,  # NVIDIA Ada whitepaper: RTX 4090 128 SMs
    "t4-16gb": 40,  # NVIDIA Turing whitepaper: Tesla T4 40 SMs
    "rtxa6000": 84,  # NVIDIA RTX A6000 datasheet: 10,752 CUDA cores = 84 SMs x 128
    "l40s-48gb": 142,  # NVIDIA L40S datasheet: 18,176 CUDA cores = 142 SMs x 128
    "titanrtx": 72,  # NVIDIA Turing whitepaper: TITAN RTX TU102 72 SMs
    "a10-24gb": 72,  # NVIDIA A10 datasheet: GA102, 9,216 CUDA cores = 72 SMs x 128
    "a100-pcie-40gb": 108,  # NVIDIA A100 whitepaper: the PCIe card is the same GA100 configuration, 108 SMs
    "h100-pcie-80gb": 114,  # NVIDIA H100 whitepaper: H100 PCIe 114 SMs (14,592 FP32 cores = 114 x 128)
    "rtx6000ada": 142,  # NVIDIA Ada whitepaper appendix: RTX 6000 Ada AD102, 142 SMs (18,176 CUDA cores)
}


# Output-tile shapes (rows x columns of C per thread block) among cuBLAS's GEMM kernels (NVIDIA, "Matrix
# Multiplication Background User's Guide", tile quantization: 256x128, 128x256, 128x128, 128x64, 64x128, 64x64).
# The model picks, per GEMM, the tile that gives the smallest time, as cuBLAS's heuristic aims to.
TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
# One rule for what a smaller tile costs per SM: a tile of tm x tn reuses each loaded element of A and B tn and tm
# times, so its operand traffic per multiply-add is (tm + tn) / (tm x tn) (the guide's arithmetic intensity, applied
# to one thread block). Tiles reuse at least as much as 128 x 128 run at the full per-SM rate; smaller ones at their
# intensity relative to it: 128x64 and 64x128 at 2/3, 64x64 at 1/2.
REFERENCE_TILE = (128, 128)
# Split-K (``advisor.timing.gpu_time.split_k``): the least of K one slice keeps, 4 of the 32-wide k-steps of a
# tensor-core main loop (CUTLASS, "Efficient GEMM in CUDA": threadblock tiles step K in chunks of 32 for 16-bit
# operands); initial, a rule rather than a measurement.
SPLIT_K_MIN = 128
# Rows of queries one thread block of the fused attention kernels computes (FlashAttention-2, Dao 2023, section 3.3:
# blocks of 128 rows for head dims up to 128): the unit its waves over the SMs count.
ATTENTION_BLOCK_ROWS = 128
# The fused attention kernels' rate against head dim (FlashAttention-2 paper, Figure 4, forward + backward on an A100
# without a causal mask at 16K tokens, as read off the figure: 176 TFLOP/s at head dim 64, 203 at head dim 128).
# Head dim 128 and above: 1; 64: 176 / 203; linear in between; below 64 in proportion to the head dim.
HEAD_DIM_64_SHARE = 176 / 203
# A kernel's fixed time, launch to completion, that a memory-bound op pays beside its bytes (the time at which
# ``half_bandwidth_bytes`` is half of the large-tensor bandwidth): about 2 us (a short kernel launched back to back
# costs about 3 us on a V100: A. Gray, "Getting Started with CUDA Graphs", NVIDIA Developer blog, 2019; initial).
KERNEL_FIXED_S = 2e-6

_INITIAL = "initial, from published microbenchmarks (a fit in bench/ replaces them)"
_MAMF = "ml-engineering (S. Bekman) 'Maximum Achievable Matmul FLOPS' table, bf16 matmul"
_HBM = (
    "NVIDIA developer forum 'Trouble to reach peak bandwidth of A100' (2025): 1.80 of 2.04 TB/s on A100 80GB SXM, "
    "about 90% the most any kernel reaches"
)
_FA2 = "FlashAttention-2 paper (Dao 2023)"
# Eager PyTorch's CPU-side cost of one op on a GPU (Python, autograd, the dispatcher and cudaLaunchKernel): about
# 5-25 us per op (J. Lin, "From PyTorch op to kernel launch", gpu_kernel_serving lesson 18: Python ~1 us, pybind ~1,
# autograd 1-3, dispatcher 1-2, backend 1-5, cudaLaunchKernel 1-3; H. He, "Making Deep Learning Go Brrrr From First
# Principles", 2022, "Overhead"). 10 us, the middle of that range.
DISPATCH_S = 10e-6


def _half_bandwidth(hbm_gbps: float, bandwidth: float) -> int:
    """Bytes a memory-bound kernel moves in ``KERNEL_FIXED_S`` at ``bandwidth`` x ``hbm_gbps`` (GB/s): the size at
    which the fixed time halves its rate."""
    return int(KERNEL_FIXED_S * hbm_gbps * 1e9 * bandwidth)


AMPERE = GpuModel(
    gemm=267.9 / 312,  # MAMF A100 SXM 267.9 of 312 TFLOP/s (85.9%)
    conv=267.9 / 312,  # cuDNN runs large-channel convolutions as implicit GEMMs on the same tensor cores
    attention=0.65,  # FA2: forward up to 73% of A100 peak, backward up to 63%; fwd + bwd (1 : 2.5 FLOPs) about 65%
    bandwidth=0.88,  # 1.80 / 2.04 TB/s
    half_bandwidth_bytes=_half_bandwidth(2039.0, 0.88),  # A100 80GB
    dispatch_s=DISPATCH_S,
    source=f"{_INITIAL}: GEMM {_MAMF} (A100 SXM 85.9%); convolution the GEMM share; attention {_FA2}, A100 "
    f"forward 73% / backward 63% of peak; bandwidth {_HBM}; {KERNEL_FIXED_S * 1e6:.0f} us fixed time per kernel; "
    f"{DISPATCH_S * 1e6:.0f} us dispatch per op",
)
HOPPER = GpuModel(
    gemm=792.1 / 989,  # MAMF H100 SXM 792.1 of 989 TFLOP/s (80.1%)
    conv=792.1 / 989,
    attention=335 / 989,  # FA2 on H100 without TMA / wgmma: up to 335 TFLOP/s (paper, section 4.1)
    bandwidth=0.90,
    half_bandwidth_bytes=_half_bandwidth(3350.0, 0.90),  # H100 SXM
    dispatch_s=DISPATCH_S,
    source=f"{_INITIAL}: GEMM {_MAMF} (H100 SXM 80.1%); convolution the GEMM share; attention {_FA2}, up to "
    f"335 TFLOP/s on H100; bandwidth about 90% ({_HBM}); {KERNEL_FIXED_S * 1e6:.0f} us fixed time per kernel; "
    f"{DISPATCH_S * 1e6:.0f} us dispatch per op",
)


def _borrowed(hbm_gbps: float) -> GpuModel:
    """Ampere's shares for a generation no microbenchmark here covers, with its own fixed-time bytes
    (``hbm_gbps``: its typical card's HBM bandwidth)."""
    return GpuModel(
        AMPERE.gemm,
        AMPERE.conv,
        AMPERE.attention,
        AMPERE.bandwidth,
        _half_bandwidth(hbm_gbps, AMPERE.bandwidth),
        DISPATCH_S,
        f"{BORROWED}Ampere's ({AMPERE.source})",
    )


# The words a borrowed model's source starts with (``advisor.explain`` warns about such generations).
BORROWED = "no microbenchmark of this generation cited, borrowed: "
# The microbenchmarked (or borrowed) constants of each generation: where the fit starts and what it leaves alone.
INITIAL: dict[str, GpuModel] = {
    "ampere": AMPERE,
    "hopper": HOPPER,
    "ada": _borrowed(1008.0),  # RTX 4090
    "volta": _borrowed(900.0),  # V100
    "turing": _borrowed(672.0),  # TITAN RTX
}
_FITTED = "fitted in bench/PUBLISHED.md (python -m bench.published --fit, 2026-12-03)"


def _fitted(generation: str, rows: int, rms: float, **constants: float) -> GpuModel:
    """``INITIAL[generation]`` with the ``constants`` the published-run fit moved (bench/published_fit.py: every
    constant for 10 rows or more, the GEMM share alone below), and a source saying so; a generation that fitted
    its GEMM share alone keeps the borrowed prefix on its source (its other constants are still borrowed)."""
    start = INITIAL[generation]
    fitted = replace(start, **constants)  # type: ignore[arg-type]
    fit = f"{_FITTED} to {rows} published runs, rms log throughput error {rms:.3f}"
    if start.source.startswith(BORROWED) and len(constants) == 1:
        source = f"{BORROWED}Ampere's microbenchmarks, with the GEMM share {fit}"
    else:
        source = f"{fit}, starting from published microbenchmarks"
    return replace(fitted, half_bandwidth_bytes=int(fitted.half_bandwidth_bytes), source=source)


# The constants each GPU generation is timed with (``advisor.timing.compute.GENERATION`` maps presets to them):
# the fit to published runs (bench/PUBLISHED.md), each inside bench/published_fit.py's BOUNDS; the Megatron rows are
# timed with their fused kernels and their own overlap (bench/published_cases.py ``Case.fused``, ``Case.overlap``).
# Ampere's and Hopper's attention shares are not fitted but FlashAttention-2's measured rates (bench/published_fit.py
# HELD). Constants the fit pushed to a bound mark what the model lacks there rather than a measured rate: Ampere's and
# Hopper's dispatch (5 us, the lower bound), Ampere's convolution share (near 0.3, the lower bound), Hopper's
# convolution share (1.0) and half-bandwidth size (64 MiB), and Volta's GEMM, attention and bandwidth shares.
# ResNet-50's convolutions are now mostly memory-bound work (cuDNN's NCHW <-> NHWC transposes, small-channel GEMMs)
# and its batch norms two passes (advisor.trace.shapes), so the convolution share moves its time little: at the
# microbenchmarked shares (INITIAL: bandwidth 0.88, convolution 0.859) the model puts torchvision ResNet-50 AMP on a
# V100 at batch 128 at 144.8 ms (NCHW) and 102.3 ms (channels-last) per step against 152.2 and 110.9 measured
# (sandeepkumar-skb/pytorch_experiments torchvision_exp/README.md), and Lambda's A100 / H100 rows within 7% / 8% at a
# bandwidth share of 0.7; the one bandwidth share per generation fitted mostly to transformer rows is what the
# convolution share at its bound makes up for.
MODELS: dict[str, GpuModel] = {
    "ampere": _fitted(
        "ampere",
        53,
        0.132,
        gemm=0.707,
        conv=0.302,
        attention=0.650,
        bandwidth=0.839,
        half_bandwidth_bytes=29179327,
        dispatch_s=5.00e-06,
    ),
    "hopper": _fitted(
        "hopper",
        32,
        0.134,
        gemm=0.624,
        conv=1.000,
        attention=0.339,
        bandwidth=0.675,
        half_bandwidth_bytes=67108864,
        dispatch_s=5.00e-06,
    ),
    "ada": _fitted("ada", 3, 0.285, gemm=0.514),
    "volta": _fitted(
        "volta",
        14,
        0.168,
        gemm=1.000,
        conv=0.859,
        attention=0.250,
        bandwidth=0.600,
        half_bandwidth_bytes=50963231,
        dispatch_s=2.50e-05,
    ),
    "turing": _fitted("turing", 2, 0.096, gemm=0.601),
}


def with_flags(model: GpuModel, mfu: float | None, bandwidth: float | None) -> GpuModel:
    """``model`` with ``--mfu`` as its GEMM, convolution and attention shares and ``--bandwidth-efficiency`` as its
    bandwidth share (None: that flag was not given); the source says which flags replaced what."""
    if mfu is None and bandwidth is None:
        return model
    m = model
    if mfu is not None:
        m = replace(m, gemm=mfu, conv=mfu, attention=mfu)
    if bandwidth is not None:
        m = replace(m, bandwidth=bandwidth)
    given = ", ".join(f for f, v in (("--mfu", mfu), ("--bandwidth-efficiency", bandwidth)) if v is not None)
    return replace(m, source=f"flags {given} where given, else {model.source}")
