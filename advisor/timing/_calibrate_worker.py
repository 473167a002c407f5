"""One rank of advisor's CPU calibration (``advisor.timing.calibrate``): run as a script, imports torch only.

argv: seconds per benchmark (float). Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (gloo when
WORLD_SIZE > 1), CALIBRATE_THREADS (torch intra-op threads). Every rank runs each benchmark at the same time as
the others (a barrier before each), as the ranks of a verification run share the cores, caches and memory.
Rank 0 prints one line ``CALIBRATION <json>``: each rank's figures, in rank order.
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

seconds = float(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(int(os.environ.get("CALIBRATE_THREADS", "1")))
if world > 1:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))


def sync() -> None:
    if world > 1:
        dist.barrier()


def rate(fn, work: float, duration: float) -> float:
    """``work`` units per call of ``fn`` -> units per second, over about ``duration`` seconds after a warm-up call,
    every rank at once."""
    fn()
    sync()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= duration:
            return n * work / elapsed


out = {"rank": rank, "threads": torch.get_num_threads()}
# Matmul FLOP/s (2 per multiply-add, as torch.utils.flop_counter counts them): fp32 at 512^3; bf16 at 256^3 (on
# CPUs without native bf16 it is emulated, ~100x slower: a smaller product keeps the run short).
for name, dtype, n in (("fp32", torch.float32, 512), ("bf16", torch.bfloat16, 256)):
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    c = torch.empty(n, n, dtype=dtype)
    out[f"matmul_{name}_flops_per_s"] = rate(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), 2.0 * n**3, seconds)
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
    out[f"add_{name}_bytes_per_s"] = rate(lambda a=a, b=b, c=c: torch.add(a, b, out=c), 3.0 * a.nbytes, seconds / 2)
# Per-op overhead: an out-of-place add of 8 elements is all dispatch (torch's eager per-op cost).
x = torch.ones(8)
out["tiny_op_s"] = 1.0 / rate(lambda: x + x, 1.0, seconds / 4)
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
    everyone = [None] * world
    dist.all_gather_object(everyone, out)
    dist.destroy_process_group()
else:
    everyone = [out]
if rank == 0:
    print("CALIBRATION " + json.dumps(everyone), flush=True)
