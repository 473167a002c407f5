"""The GPU compute model's constants: the fitted ones of each GPU generation (``GpuModel``) and the datasheet
streaming-multiprocessor counts that wave quantization divides by (``SM_COUNT``).

The functions that turn a traced op's shape into seconds live in ``advisor.timing.compute``; the fit of the
constants and its residuals in bench/PUBLISHED.md (``python -m bench.published``).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """

    gemm: float
    conv: float
    attention: float
    bandwidth: float
    half_bandwidth_bytes: int
    dispatch_s: float
    source: str


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
