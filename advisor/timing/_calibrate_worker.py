"""One rank of advisor's CPU calibration (``advisor.timing.calibrate``): run as a script, imports torch only.

argv: seconds per benchmark (float). Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (gloo when
WORLD_SIZE > 1), CALIBRATE_THREADS (torch intra-op threads). Every rank runs each benchmark at the same time as
the others (a barrier before each), as the ranks of a verification run share the cores, caches and memory.
Rank 0 prints one line ``CALIBRATION <json>``: each rank's figures, in rank order.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch._ops import OpOverload

seconds = float(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(int(os.environ.get("CALIBRATE_THREADS", "1")))
if world > 1:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))


def sync() -> None:
    """Wait for every rank (nothing to wait for alone)."""
    if world > 1:
        dist.barrier()


def rate(fn: Callable[[], object], work: float, duration: float, rounds: int = 3) -> float:
    """``work`` units per call of ``fn`` -> units per second: the best of ``rounds`` rounds of about
    ``duration / rounds`` seconds each, after a warm-up call, every rank at once. The best round, because a
    short benchmark is only ever slowed by noise (another process, a frequency change), and one slow round
    would mislead every prediction made from the calibration."""
    fn()
    sync()
    best = 0.0
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= duration / rounds:
                break
        best = max(best, n * work / elapsed)
    return best


out: dict[str, float] = {"rank": rank, "threads": torch.get_num_threads()}
# Matmul FLOP/s (2 per multiply-add, as torch.utils.flop_counter counts them) as a linear layer trains: the
# forward x @ W^T, the input gradient g @ W and the weight gradient g^T @ x of F.linear on 512 x 512 (3 products).
# The three layouts run at different speeds where bf16 is emulated (no native bf16: x @ W^T about 8 GFLOP/s,
# g @ W about 1.2 here), so one layout alone would mislead by up to 8x.
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    n = 512
    xm = torch.randn(n, n, dtype=dtype, requires_grad=True)
    wm = torch.randn(n, n, dtype=dtype, requires_grad=True)
    gm = torch.ones(n, n, dtype=dtype)

    def linear_step(xm: torch.Tensor = xm, wm: torch.Tensor = wm, gm: torch.Tensor = gm) -> None:
        torch.nn.functional.linear(xm, wm).backward(gm)

    out[f"matmul_{name}_flops_per_s"] = rate(linear_step, 3 * 2.0 * n**3, seconds)
# Convolution FLOP/s, forward + backward (input and weight gradients: 3 x the forward's FLOPs, as
# torch.utils.flop_counter counts them): a 3x3, 64 -> 64 channel fp32 convolution on 16 x 64 x 16 x 16, a ResNet
# block's shape at the small image sizes CPU runs use (oneDNN runs it well below the matmul rate).
x = torch.randn(16, 64, 16, 16, requires_grad=True)
w = torch.randn(64, 64, 3, 3, requires_grad=True)
grad = torch.ones(16, 64, 16, 16)


def conv_step() -> None:
    torch.nn.functional.conv2d(x, w, padding=1).backward(grad)


out["conv_fp32_flops_per_s"] = rate(conv_step, 3 * 2.0 * 16 * 64 * 16 * 16 * 64 * 9, seconds)
# Memory bandwidth: c = a + b over fp32 tensors, bytes read + written (3 x the tensor), as the roofline counts an
# op's bytes. 4 MiB tensors: the size of a small model's activations, in the last-level cache; 64 MiB: DRAM.
for name, mib in (("cache", 4), ("dram", 64)):
    a, b = torch.ones(mib * 2**18), torch.ones(mib * 2**18)
    c = torch.empty_like(a)

    def add_step(a: torch.Tensor = a, b: torch.Tensor = b, c: torch.Tensor = c) -> torch.Tensor:
        return torch.add(a, b, out=c)

    out[f"add_{name}_bytes_per_s"] = rate(add_step, 3.0 * a.nbytes, seconds / 2)
# Per-op overhead: an out-of-place add of 8 elements is all dispatch (torch's eager per-op cost).
x = torch.ones(8)
out["tiny_op_s"] = 1.0 / rate(lambda: x + x, 1.0, seconds / 4)
# Transcendental element-wise ops: exp over 1 MiB of fp32, bytes read + written (a CPU's vector units compute exp,
# log, sqrt and the activations built on them slower than its caches deliver the bytes).
a = torch.rand(2**18)
c = torch.empty_like(a)
out["exp_bytes_per_s"] = rate(lambda: torch.exp(a, out=c), 2.0 * a.nbytes, seconds / 2)
# Fused attention FLOP/s, forward + backward, counted as torch.utils.flop_counter's SDPA formulas count them (the
# full s x s product, causal or not: 4 b h s^2 d forward, 2.5x that backward): causal self-attention of
# 2 x 8 heads x 256 tokens x 32 dims, a small decoder's shape.
# In fp32 and in bf16 (emulated on CPUs without native bf16).
attention_flops = 4.0 * 2 * 8 * 256 * 256 * 32 * 3.5
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    q, k, v = (torch.randn(2, 8, 256, 32, dtype=dtype, requires_grad=True) for _ in range(3))
    g = torch.ones(2, 8, 256, 32, dtype=dtype)

    def attention_step(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, g: torch.Tensor = g) -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

    out[f"attention_{name}_flops_per_s"] = rate(attention_step, attention_flops, seconds / 2)
# Eager overhead per op of a training step: forward + backward of a tiny transformer-like block (linear, layer
# norm, GELU, residual; 4 x 16 activations, so the kernels do almost nothing) over the ops that read or write
# data (what advisor's trace records; views and allocations are not counted but their cost is in the time).
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402 (after the rates above, which need no mode)

block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 16))
xin = torch.randn(4, 16)
_SKIP = {
    "detach",
    "alias",
    "view",
    "_unsafe_view",
    "t",
    "transpose",
    "expand",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "as_strided",
    "reshape",
    "permute",
    "unsqueeze",
    "squeeze",
}


def tiny_step() -> None:
    y = xin
    for _ in range(4):
        y = y + block(y)
    y.sum().backward()


class _Count(TorchDispatchMode):
    n = 0

    def __torch_dispatch__(
        self,
        func: OpOverload,
        types: tuple[type, ...],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False) and func.__name__.split(".")[0] not in _SKIP:
            _Count.n += 1
        return out


with _Count():
    tiny_step()
out["eager_op_s"] = 1.0 / rate(tiny_step, float(_Count.n), seconds / 2)
# The optimizer step as the scripts run it: torch.optim.AdamW (defaults; on CPU its per-tensor loop) over
# 16 fp32 tensors of 64 K elements, its bytes as the step model counts them (2 x 4 parameter + 4 gradient +
# 2 x 8 states = 28 per element).
params = [torch.nn.Parameter(torch.randn(2**16)) for _ in range(16)]
for p in params:
    p.grad = torch.randn_like(p)
adamw = torch.optim.AdamW(params)
out["adamw_bytes_per_s"] = rate(adamw.step, 28.0 * 16 * 2**16, seconds / 2)
if world > 1:
    # gloo all-reduce: back-to-back calls, seconds per call; a tiny buffer for the latency, 1 MiB and 16 MiB
    # for the bandwidth (torch.distributed.all_reduce of a float32 tensor, SUM).
    for label, numel, calls in (("8B", 2, 200), ("1MiB", 2**18, 20), ("16MiB", 2**22, 6)):
        t = torch.ones(numel)
        dist.all_reduce(t)
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t)
        out[f"allreduce_{label}_s"] = (time.perf_counter() - t0) / calls
    # gloo's reduce-scatter and all-gather are not an all-reduce's halves (gloo runs reduce-scatter about 3x slower
    # per byte than its all-reduce here): 16 MiB each, as FSDP2 and ZeRO call them.
    t = torch.ones(2**22)
    shard = torch.empty(2**22 // world)
    for label, fn in (
        ("reduce_scatter", lambda: dist.reduce_scatter_tensor(shard, t)),
        ("all_gather", lambda: dist.all_gather_into_tensor(t, shard)),
    ):
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(4):
            fn()
        out[f"{label}_16MiB_s"] = (time.perf_counter() - t0) / 4
    everyone: list[object] = [None] * world
    dist.all_gather_object(everyone, out)
    dist.destroy_process_group()
else:
    everyone = [out]
if rank == 0:
    print("CALIBRATION " + json.dumps(everyone), flush=True)
sys.stdout.flush()
# Skip the interpreter's teardown: once in a CI run a worker died there, after its work, with "terminate called
# without an active exception" (a C++ thread of torch's still joinable when its statics were destroyed), and the
# whole calibration failed on a measurement already made. Everything is written and the process group destroyed.
os._exit(0)
