"""advisor's GPU calibration (``advisor calibrate`` on a machine with CUDA GPUs), run as a script on the visible
device 0; imports torch only when run, so importing this module (to read its shape lists) costs nothing.

``python _gpu_calibrate_worker.py bench SECONDS``: the microbenchmarks, each timed with CUDA events as the best of
``ROUNDS`` rounds of about SECONDS each after a warm-up call; prints one line ``GPU_CALIBRATION <json>``.
``torchrun --nproc_per_node=N _gpu_calibrate_worker.py collectives SECONDS``: NCCL all-reduce, reduce-scatter and
all-gather over ``COLLECTIVE_BYTES``; rank 0 prints one line ``GPU_COLLECTIVES <json>``.

What each figure is and how ``advisor.timing.gpu_calibration`` turns it into the compute model's constants is
written there; the document printed here is its input (``measurements`` in the stored calibration).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

ROUNDS = 2
# GEMMs (M, N, K): the transformer's: a square 4096^3 and 8192^3 product, and for model widths d 768..8192 at
# b*s = 8192 tokens the MLP's up projection (M = b*s, N = 4d, K = d) and down projection (N = d, K = 4d); then
# small-N and small-K cases (a LoRA rank of 16, a 128-wide head slice, a short batch of 128 rows) and a GPT-2
# LM head (vocabulary 50304, padded as nanoGPT pads it).
WIDTHS = (768, 1024, 2048, 4096, 8192)
TOKENS = 8192
GEMM_SHAPES: tuple[tuple[int, int, int], ...] = (
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    *((TOKENS, 4 * d, d) for d in WIDTHS),
    *((TOKENS, d, 4 * d) for d in WIDTHS),
    (TOKENS, 16, 4096),
    (TOKENS, 4096, 16),
    (TOKENS, 4096, 128),
    (128, 4096, 4096),
    (TOKENS, 50304, 768),
)
GEMM_PRECISIONS = ("bf16", "fp16", "fp32", "tf32")  # fp32: torch.backends.cuda.matmul.allow_tf32 False
# ResNet-50's convolutions at batch 128 (torchvision resnet50, 224 px): (C_in, C_out, H = W of the input, kernel,
# stride): the 7x7 stem, then per stage its 1x1 reduce, 3x3 and 1x1 expand convolutions.
CONV_BATCH = 128
CONV_SHAPES: tuple[tuple[int, int, int, int, int], ...] = (
    (3, 64, 224, 7, 2),
    (256, 64, 56, 1, 1),
    (64, 64, 56, 3, 1),
    (64, 256, 56, 1, 1),
    (128, 128, 28, 3, 1),
    (512, 128, 28, 1, 1),
    (256, 256, 14, 3, 1),
    (1024, 256, 14, 1, 1),
    (512, 512, 7, 3, 1),
    (2048, 512, 7, 1, 1),
)
CONV_PRECISIONS = ("bf16", "fp16", "tf32")  # tf32: fp32 tensors, cuDNN's default allow_tf32 True
# Fused SDPA forward + backward (batch, heads, sequence, head dim, causal), 16-bit; fp32 on the first one only.
ATTENTION_SHAPES: tuple[tuple[int, int, int, int, bool], ...] = (
    (4, 16, 2048, 128, False),
    (2, 16, 4096, 128, False),
    (4, 32, 2048, 64, False),
    (2, 32, 4096, 64, False),
    (4, 16, 2048, 128, True),
    (4, 32, 2048, 64, True),
)
ATTENTION_PRECISIONS = ("bf16", "fp16")
COPY_BYTES = tuple(2**20 * 4**i for i in range(6))  # 1 MiB .. 1 GiB, the tensor copied (read + written: 2x)
PCIE_BYTES = 256 * 2**20
COLLECTIVE_BYTES = (8, 2**20, 2**26, 2**29)  # 8 B for the latency, then 1 MiB, 64 MiB, 512 MiB
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "tf32": "float32"}


def _timer(seconds: float) -> Callable[[Callable[[], object]], float]:
    """A function timing ``fn`` on the GPU: seconds per call, the best of ``ROUNDS`` rounds of about ``seconds``
    (CUDA events around back-to-back calls; the best, since noise only slows a benchmark down)."""
    import torch

    def timed(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        calls = max(1, min(1000, int(seconds / max(time.perf_counter() - t0, 1e-6))))
        best = float("inf")
        for _ in range(ROUNDS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3 / calls)
        return best

    return timed


def _driver() -> str:
    """The NVIDIA driver's version: NVML (nvidia-ml-py), else nvidia-smi, else "unknown"."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _eager_op_s(timed_cpu: Callable[[Callable[[], object]], float]) -> float:
    """Eager PyTorch's seconds per recorded op of a tiny block's forward + backward on the GPU (kernels that do
    almost nothing: the CPU's issue rate), over the ops that read or write data, as the trace records them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    dev = torch.device("cuda")
    block = torch.nn.Sequential(
        torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 16)
    ).to(dev)
    xin = torch.randn(4, 16, device=dev)
    moves_nothing = {"detach", "alias", "view", "_unsafe_view", "t", "transpose", "expand", "empty", "empty_like"}
    moves_nothing |= {"empty_strided", "new_empty", "as_strided", "reshape", "permute", "unsqueeze", "squeeze"}

    def step() -> None:
        y = xin
        for _ in range(4):
            y = y + block(y)
        y.sum().backward()

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(
            self, func: Callable[..., object], types: object, args: tuple[object, ...] = (), kwargs: object = None
        ) -> object:
            out = func(*args, **(kwargs if isinstance(kwargs, dict) else {}))
            name = getattr(func, "__name__", "").split(".")[0]
            if not getattr(func, "is_view", False) and name not in moves_nothing:
                Count.n += 1
            return out

    with Count():
        step()
    return timed_cpu(step) / max(1, Count.n)


def _cpu_timer(seconds: float) -> Callable[[Callable[[], object]], float]:
    """Wall seconds per call including a final synchronize: what the CPU spends issuing ``fn``."""
    import torch

    def timed(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(ROUNDS):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                fn()
                n += 1
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / n)
        return best

    return timed


def _gemms(timed: Callable[[Callable[[], object]], float], skip: set[str]) -> list[dict[str, object]]:
    """Seconds of each ``GEMM_SHAPES`` product (A @ B) per precision of ``GEMM_PRECISIONS`` not in ``skip``."""
    import torch

    out: list[dict[str, object]] = []
    for p in GEMM_PRECISIONS:
        if p in skip:
            continue
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        dtype = getattr(torch, DTYPES[p])
        for m, n, k in GEMM_SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)

            def product(a: torch.Tensor = a, b: torch.Tensor = b) -> torch.Tensor:
                return a @ b

            out.append({"precision": p, "m": m, "n": n, "k": k, "seconds": timed(product)})
            del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def _convs(timed: Callable[[Callable[[], object]], float], skip: set[str]) -> list[dict[str, object]]:
    """Seconds of forward + backward (input and weight gradients) of each ``CONV_SHAPES`` convolution at
    ``CONV_BATCH``, channels-last, per precision of ``CONV_PRECISIONS`` not in ``skip``, with its FLOPs."""
    import torch
    import torch.nn.functional as F

    out: list[dict[str, object]] = []
    for p in CONV_PRECISIONS:
        if p in skip:
            continue
        dtype = getattr(torch, DTYPES[p])
        for c_in, c_out, hw, kernel, stride in CONV_SHAPES:
            x = torch.randn(CONV_BATCH, c_in, hw, hw, device="cuda", dtype=dtype)
            w = torch.randn(c_out, c_in, kernel, kernel, device="cuda", dtype=dtype)
            x = x.to(memory_format=torch.channels_last).requires_grad_(True)
            w = w.to(memory_format=torch.channels_last).requires_grad_(True)
            out_hw = (hw + 2 * (kernel // 2) - kernel) // stride + 1
            grad = torch.ones(CONV_BATCH, c_out, out_hw, out_hw, device="cuda", dtype=dtype)

            def conv(x: torch.Tensor = x, w: torch.Tensor = w, g: torch.Tensor = grad, s: int = stride) -> None:
                F.conv2d(x, w, stride=s, padding=w.shape[-1] // 2).backward(g)

            forward = 2.0 * CONV_BATCH * out_hw * out_hw * c_out * c_in * kernel * kernel
            shape = {"c_in": c_in, "c_out": c_out, "hw": hw, "kernel": kernel, "stride": stride}
            out.append({"precision": p, **shape, "flops": 3 * forward, "seconds": timed(conv)})
            del x, w, grad
    return out


def _attention(timed: Callable[[Callable[[], object]], float], skip: set[str]) -> list[dict[str, object]]:
    """Seconds of fused SDPA forward + backward of each ``ATTENTION_SHAPES`` case per 16-bit precision, and of the
    first in fp32, with its FLOPs as torch.utils.flop_counter counts them (4 b h s^2 d forward, 2.5 x backward)."""
    import torch
    import torch.nn.functional as F

    out: list[dict[str, object]] = []
    cases = [(p, ATTENTION_SHAPES) for p in ATTENTION_PRECISIONS] + [("fp32", ATTENTION_SHAPES[:1])]
    for p, shapes in cases:
        if p in skip:
            continue
        dtype = getattr(torch, DTYPES[p])
        for batch, heads, seq, head_dim, causal in shapes:
            size = (batch, heads, seq, head_dim)
            q, k, v = (torch.randn(size, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
            g = torch.ones(size, device="cuda", dtype=dtype)

            def sdpa(
                q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, g: torch.Tensor = g, c: bool = causal
            ) -> None:
                F.scaled_dot_product_attention(q, k, v, is_causal=c).backward(g)

            shape = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim, "causal": causal}
            flops = 4.0 * batch * heads * seq * seq * head_dim * 3.5
            out.append({"precision": p, **shape, "flops": flops, "seconds": timed(sdpa)})
            del q, k, v, g
    return out


def _copies(timed: Callable[[Callable[[], object]], float]) -> list[dict[str, object]]:
    """Seconds of a device-to-device copy of each of ``COPY_BYTES`` (bytes moved: 2 x the size)."""
    import torch

    out: list[dict[str, object]] = []
    for size in COPY_BYTES:
        src = torch.empty(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty(size, dtype=torch.uint8, device="cuda")

        def copy(s: torch.Tensor = src, d: torch.Tensor = dst) -> torch.Tensor:
            return d.copy_(s)

        out.append({"bytes": size, "seconds": timed(copy)})
        del src, dst
    return out


def bench(seconds: float) -> dict[str, object]:
    """Every microbenchmark on device 0 (module docstring); the document ``gpu_calibration`` reads."""
    import torch

    t_start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    timed, timed_cpu = _timer(seconds), _cpu_timer(seconds)
    bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
    skip = {p for p, ok in (("bf16", bf16), ("tf32", props.major >= 8)) if not ok}
    doc: dict[str, object] = {
        "gpu": props.name,
        "memory_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
        "capability": f"{props.major}.{props.minor}",
        "gpu_count": torch.cuda.device_count(),
        "driver": _driver(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
    }
    # Clocks up before the first timed benchmark: half a second of large 16-bit products (a GPU idles at a fraction
    # of its boost clock and ramps up under load).
    spin = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    t_spin = time.perf_counter()
    while time.perf_counter() - t_spin < 0.5:
        spin @ spin
        torch.cuda.synchronize()
    del spin
    doc["gemm"] = _gemms(timed, skip)
    doc["conv"] = _convs(timed, skip)
    doc["attention"] = _attention(timed, skip)
    doc["copy"] = _copies(timed)
    tiny = torch.ones(8, device="cuda")
    doc["tiny_op_s"] = timed_cpu(lambda: tiny + tiny)
    doc["eager_op_s"] = _eager_op_s(timed_cpu)
    host = torch.empty(PCIE_BYTES, dtype=torch.uint8, pin_memory=True)
    device_buf = torch.empty(PCIE_BYTES, dtype=torch.uint8, device="cuda")
    doc["h2d_gbps"] = PCIE_BYTES / timed(lambda: device_buf.copy_(host, non_blocking=True)) / 1e9
    doc["d2h_gbps"] = PCIE_BYTES / timed(lambda: host.copy_(device_buf, non_blocking=True)) / 1e9
    doc["seconds"] = time.perf_counter() - t_start
    return doc


def collectives(seconds: float) -> dict[str, object] | None:
    """NCCL collectives across the torchrun ranks (one GPU each): seconds per call of each of
    ``COLLECTIVE_BYTES`` (the whole tensor: all-reduce's buffer, reduce-scatter's input, all-gather's output),
    the slowest rank's; returned on rank 0 only."""
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    timed = _timer(seconds)
    out: dict[str, list[list[float]]] = {"all_reduce": [], "reduce_scatter": [], "all_gather": []}
    for size in COLLECTIVE_BYTES:
        numel = max(world, size // 4 // world * world)
        full = torch.ones(numel, device="cuda")
        shard = torch.empty(numel // world, device="cuda")
        for name, fn in (
            ("all_reduce", lambda f=full: dist.all_reduce(f)),
            ("reduce_scatter", lambda f=full, s=shard: dist.reduce_scatter_tensor(s, f)),
            ("all_gather", lambda f=full, s=shard: dist.all_gather_into_tensor(f, s)),
        ):
            dist.barrier()
            t = torch.tensor([timed(fn)], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[name].append([float(numel * 4), float(t.item())])
    dist.destroy_process_group()
    return {"world": world, **out} if rank == 0 else None


if __name__ == "__main__":
    mode, budget = sys.argv[1], float(sys.argv[2])
    if mode == "bench":
        print("GPU_CALIBRATION " + json.dumps(bench(budget)), flush=True)
    else:
        result = collectives(budget)
        if result is not None:
            print("GPU_COLLECTIVES " + json.dumps(result), flush=True)
