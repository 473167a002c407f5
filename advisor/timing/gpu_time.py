"""Per-op GPU time from the shapes the trace records, and the eager queue that turns a phase's ops into seconds.

A GPU's ``Rates`` (``advisor.timing.compute.gpu_rates``) carry its ``GpuModel`` (``advisor.timing.gpu_model``) and
SM count; each traced op (``advisor.trace``: ``(flops, bytes, kind, *shape)``) is timed by its kind:

* GEMMs (``GEMM``: mm, addmm, bmm, baddbmm, _scaled_mm) and convolutions (``CONV``: the forward as its implicit
  GEMM, the backward as its dgrad and wgrad GEMMs, after the NCHW <-> NHWC transposes cuDNN runs around a 16-bit
  convolution in PyTorch's default layout, ``layout_s``) by their ``(flops, M, N, K, batch, element size)``: the GEMM's
  own roofline (NVIDIA, "Matrix Multiplication Background User's Guide": arithmetic intensity, tile quantization,
  wave quantization)::

      compute = flops / (rate x tile_eff x wave_eff x tile_rate)     rate = peak x gemm (or conv peak x conv)
      memory  = (M K + K N + M N) x batch x element size / (HBM x bandwidth)
      time    = max(compute, memory), the tile shape (``TILES``) that gives the smallest

  with ``tile_eff`` = M N / (ceil(M / tm) tm x ceil(N / tn) tn) (the useful share of the computed tiles),
  ``wave_eff`` = tiles x batch / (waves x SMs), waves = ceil(tiles x batch / SMs), ``tile_rate`` the per-SM rate
  of a smaller tile (``tile_rate``), and K split over more thread blocks where the output tiles cannot fill the SMs
  (``split_k``: a convolution's weight gradient, small outputs with a long reduction);
* fused attention (``ATTENTION``: the flash / memory-efficient / cuDNN kernels) by ``(batch x heads, q length, kv
  length, head dim, kernel, backward)``: FLOPs at peak x attention x the head-dim factor (``head_dim_factor``) x
  the wave efficiency of batch x heads x ceil(q length / 128) thread blocks over the SMs; at least its bytes at the
  achieved bandwidth. Math attention is bmm + softmax ops in the trace, timed by the GEMM and memory rules;
* a batch norm in training (``NORM``) as its two kernels, the statistics pass (its recorded bytes) and the
  normalization (the op's bytes), each as a memory-bound op;
* every other op by its bytes: bytes / (HBM x bandwidth x bytes / (bytes + half_bandwidth_bytes)), i.e. its bytes
  at the achieved bandwidth plus a fixed time per kernel (small tensors do not fill the GPU); an op with FLOPs but
  no shape (the experts' grouped matmul) by the plain roofline at its kind's rate.

Eager dispatch is a queue (CUDA runs kernels asynchronously): the CPU issues op i at (i + 1) x dispatch_s, the GPU
starts it once it is issued and the previous op has ended, and the phase ends with its last op (``phase_s``).

Code that fuses element-wise work (``GpuModel.fused_elementwise``: Megatron-LM's fused kernels, torch.compile) runs
each stretch of memory-bound ops between two GEMM / convolution / attention kernels as one kernel (``fused_times``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .compute import (
    ATTENTION,
    CONV,
    CONV_LAYOUT_FIELDS,
    CONV_PARAM_FIELDS,
    GEMM,
    MEMORY,
    NORM,
    TRANSCENDENTAL,
    Op,
    Rates,
    aligned,
)
from .gpu_model import ATTENTION_BLOCK_ROWS, HEAD_DIM_64_SHARE, REFERENCE_TILE, SPLIT_K_MIN, TILES

# Fields of one GEMM in a GEMM or convolution op's shape: (flops, M, N, K, batch, element size).
GEMM_FIELDS = 6
# A convolution's shape starts with its layout transposes' (bytes, tensors) and the call (compute.CONV_PARAM_FIELDS),
# then its GEMMs.
# A fused attention op's shape: (batch x heads, q length, kv length, head dim, kernel, backward 0/1).
ATTENTION_FIELDS = 6
FLASH, MEM_EFFICIENT, CUDNN = 0, 1, 2  # the ``kernel`` field


def _intensity(tm: int, tn: int) -> float:
    return tm * tn / (tm + tn)


def tile_rate(tm: int, tn: int) -> float:
    """The per-SM rate of a ``tm`` x ``tn`` output tile as a share of a large tile's (``gpu_model.REFERENCE_TILE``):
    its operand reuse tm tn / (tm + tn) against the reference tile's, at most 1 (128x64: 2/3, 64x64: 1/2)."""
    return min(1.0, _intensity(tm, tn) / _intensity(*REFERENCE_TILE))


_TILE_RATES = tuple((tm, tn, tile_rate(tm, tn)) for tm, tn in TILES)


def split_k(tiles: float, k: float, sms: int) -> int:
    """Slices of K a GEMM of ``tiles`` output tiles (batch included) runs in parallel: cuBLAS and cuDNN split the
    reduction when the output tiles cannot fill the SMs (CUTLASS, "Efficient GEMM in CUDA", parallelized reductions:
    split-K "partitions the K dimension ... to increase parallelism when M and N are small"). The rule: as many
    slices as fill one wave, ``sms`` // tiles, each keeping at least ``gpu_model.SPLIT_K_MIN`` of K; 1 when the
    tiles fill the SMs or K is short."""
    if sms <= 0 or tiles <= 0 or tiles >= sms:
        return 1
    return max(1, min(int(sms // tiles), int(k // SPLIT_K_MIN)))


def tile_wave_efficiency(
    m: float, n: float, batch: float, tm: int, tn: int, sms: int, slices: int = 1
) -> tuple[float, float]:
    """(tile_eff, wave_eff) of an ``m`` x ``n`` output (``batch`` of them, each tile's K in ``slices``) in ``tm`` x
    ``tn`` tiles on ``sms`` SMs (module docstring; NVIDIA's guide, tile and wave quantization). ``sms`` 0: no wave
    quantization (1.0)."""
    rows, cols = math.ceil(m / tm), math.ceil(n / tn)
    tiles = rows * cols
    if tiles == 0:
        return 1.0, 1.0
    tile_eff = m * n / (tiles * tm * tn)
    if sms <= 0:
        return tile_eff, 1.0
    blocks = tiles * batch * slices
    waves = math.ceil(blocks / sms)
    return tile_eff, blocks / (waves * sms)


def _gemm_s(
    flops: float, m: float, n: float, k: float, batch: float, elsize: float, rate: float, bytes_per_s: float, sms: int
) -> float:
    """The smallest over the tile shapes of max(math, HBM traffic) (module docstring), each tile with its split-K
    slices (``split_k``), whose fp32 partial results are written and read back once more; ``bytes_per_s`` 0: the
    math alone."""
    base = (m * k + k * n + m * n) * batch * elsize
    if flops <= 0 or rate <= 0:
        return base / bytes_per_s if bytes_per_s else 0.0
    best = math.inf
    for tm, tn, per_sm in _TILE_RATES:
        slices = split_k(math.ceil(m / tm) * math.ceil(n / tn) * batch, k, sms)
        tile_eff, wave_eff = tile_wave_efficiency(m, n, batch, tm, tn, sms, slices)
        t = flops / (rate * tile_eff * wave_eff * per_sm)
        if bytes_per_s:
            extra = 2 * slices * m * n * batch * 4 if slices > 1 else 0.0
            t = max(t, (base + extra) / bytes_per_s)
        best = min(best, t)
    return best


def gemm_compute_s(flops: float, m: float, n: float, k: float, batch: float, rate: float, sms: int) -> float:
    """Seconds of a GEMM's math at ``rate`` FLOP/s (a large GEMM's achieved rate): the smallest over the tile
    shapes of flops / (rate x tile_eff x wave_eff x tile_rate), with split-K where the tiles do not fill the SMs."""
    return _gemm_s(flops, m, n, k, batch, 0.0, rate, 0.0, sms)


def gemm_s(
    flops: float, m: float, n: float, k: float, batch: float, elsize: float, rate: float, bytes_per_s: float, sms: int
) -> float:
    """Seconds of one GEMM (module docstring): per tile shape the larger of its math (as ``gemm_compute_s``) and
    its operands and result once through HBM at ``bytes_per_s``, (M K + K N + M N) x batch x ``elsize`` bytes (plus
    split-K's fp32 partial results written and read), the tile shape that gives the smallest."""
    return _gemm_s(flops, m, n, k, batch, elsize, rate, bytes_per_s, sms)


def head_dim_factor(head_dim: float) -> float:
    """The fused attention kernels' rate at ``head_dim`` as a share of head dim 128's (FlashAttention-2 paper,
    Figure 4; ``gpu_model.HEAD_DIM_64_SHARE``): 1 from 128, linear down to the head-dim-64 share, below 64 in
    proportion to the head dim."""
    if head_dim >= 128:
        return 1.0
    if head_dim >= 64:
        return HEAD_DIM_64_SHARE + (1.0 - HEAD_DIM_64_SHARE) * (head_dim - 64) / 64
    return HEAD_DIM_64_SHARE * max(head_dim, 1.0) / 64


def attention_s(
    flops: float, nbytes: float, heads: float, q_len: float, head_dim: float, rate: float, bytes_per_s: float, sms: int
) -> float:
    """Seconds of one fused attention kernel (module docstring): FLOPs at ``rate`` (peak x attention) x the head-dim
    factor x the wave efficiency of ``heads`` (batch x heads) x ceil(q_len / 128) blocks on ``sms`` SMs; at least
    ``nbytes`` at ``bytes_per_s``."""
    compute = 0.0
    if flops > 0 and rate > 0:
        blocks = heads * math.ceil(q_len / ATTENTION_BLOCK_ROWS)
        wave_eff = blocks / (math.ceil(blocks / sms) * sms) if sms > 0 and blocks > 0 else 1.0
        compute = flops / (rate * head_dim_factor(head_dim) * wave_eff)
    return max(compute, nbytes / bytes_per_s if bytes_per_s else 0.0)


def memory_op_s(nbytes: float, bytes_per_s: float, half_bandwidth_bytes: float) -> float:
    """Seconds of a memory-bound op: ``nbytes`` / (``bytes_per_s`` x nbytes / (nbytes + half_bandwidth_bytes)),
    i.e. (nbytes + half_bandwidth_bytes) / bytes_per_s; 0 for an op that moves nothing."""
    if nbytes <= 0 or bytes_per_s <= 0:
        return 0.0
    return (nbytes + half_bandwidth_bytes) / bytes_per_s


def layout_s(nbytes: float, tensors: float, bytes_per_s: float, half_bandwidth_bytes: float) -> float:
    """Seconds of a convolution's layout transposes (``advisor.trace.shapes.layout_transposes``): ``tensors``
    memory-bound kernels moving ``nbytes`` in all, each at ``memory_op_s``'s rate, (nbytes + tensors x
    half_bandwidth_bytes) / bytes_per_s; 0 when there are none."""
    if nbytes <= 0 or tensors <= 0 or bytes_per_s <= 0:
        return 0.0
    return (nbytes + tensors * half_bandwidth_bytes) / bytes_per_s


def op_gpu_s(flops: float, nbytes: float, kind: int, shape: Sequence[float], r: Rates) -> float:
    """Seconds the GPU runs one op of ``kind`` with its recorded ``shape`` (module docstring).

    Raises:
        ValueError: ``r`` has no ``GpuModel`` (a calibrated CPU is timed by ``compute.op_s``).
    """
    gpu = r.gpu
    if gpu is None:
        raise ValueError("op_gpu_s needs a GPU's Rates (compute.gpu_rates)")
    bw = r.bytes_per_s
    if shape and (kind == GEMM or kind == CONV):
        rate = r.conv_flops_per_s if kind == CONV else r.flops_per_s
        total, start = 0.0, 0
        if kind == CONV:  # cuDNN's layout transposes first: memory-bound kernels, one per tensor
            # (then the call's own fields, CONV_PARAM_FIELDS, which a calibrated CPU times by; then the GEMMs)
            total = layout_s(shape[0], shape[1], bw, gpu.half_bandwidth_bytes)
            start = CONV_LAYOUT_FIELDS + CONV_PARAM_FIELDS
        for i in range(start, len(shape) - GEMM_FIELDS + 1, GEMM_FIELDS):
            f, m, n, k, batch, elsize = shape[i : i + GEMM_FIELDS]
            total += gemm_s(f, m, n, k, batch, elsize, rate, bw, r.sm_count)
        return total
    if shape and kind == NORM:  # two kernels: the statistics pass, then the normalization the op's bytes count
        return memory_op_s(shape[0], bw, gpu.half_bandwidth_bytes) + memory_op_s(nbytes, bw, gpu.half_bandwidth_bytes)
    if shape and kind == ATTENTION:
        heads, q_len, _kv_len, head_dim = shape[0], shape[1], shape[2], shape[3]
        rate = r.attention_flops_per_s or r.flops_per_s
        return attention_s(flops, nbytes, heads, q_len, head_dim, rate, bw, r.sm_count)
    if flops > 0:  # FLOPs without a shape: the plain roofline at the kind's rate
        rate = r.flops_per_s
        if kind == CONV:
            rate = r.conv_flops_per_s
        elif kind == ATTENTION and r.attention_flops_per_s:
            rate = r.attention_flops_per_s
        return max(flops / rate if rate else 0.0, nbytes / bw if bw else 0.0)
    return memory_op_s(nbytes, bw, gpu.half_bandwidth_bytes)


def _at(x: Op, y: Op, k: int) -> tuple[float, float, int, tuple[float, ...]]:
    """One op at ``k`` micro-batches past the first trace: FLOPs, bytes and every shape dimension linear in the
    micro-batch between ``x`` and ``y`` (as the FLOPs are); never negative. Ops whose shapes do not line up (a
    proportional alignment of traces with different op counts) keep ``x``'s shape."""
    kind = x[2] if len(x) > 2 else MEMORY
    flops = max(0.0, x[0] + k * (y[0] - x[0]))
    nbytes = max(0.0, x[1] + k * (y[1] - x[1]))
    if len(x) <= 3:
        return flops, nbytes, kind, ()
    if len(y) != len(x) or (y[2] if len(y) > 2 else MEMORY) != kind:
        return flops, nbytes, kind, tuple(float(v) for v in x[3:])
    return flops, nbytes, kind, tuple(max(0.0, a + k * (c - a)) for a, c in zip(x[3:], y[3:]))


# The kinds of op a fusing compiler folds into its neighbours' kernel (element-wise, reductions, normalizations):
# everything but the tensor-core kernels and the FLOP-bound ops without a shape.
FUSIBLE = (MEMORY, TRANSCENDENTAL, NORM)


def fused_times(times: Sequence[float], fusible: Sequence[bool]) -> list[float]:
    """The GPU seconds of a phase's kernels when each maximal stretch of consecutive ``fusible`` ops (``FUSIBLE``
    kinds) runs as one kernel, the other ops unchanged: a stretch takes the time of its slowest member. Source of the
    rule: a fused element-wise kernel reads the stretch's input and writes its output once and keeps the
    intermediates in registers (Megatron-LM megatron/core/fusions/: fused_bias_gelu, fused_bias_dropout,
    fused_softmax, fused_layer_norm; Transformer Engine's LayerNormLinear; PyTorch 2 paper, Ansel et al. 2024,
    section 4: TorchInductor's vertical fusion of pointwise and reduction ops), so it moves about the bytes of the
    stretch's largest op, whose traffic is its own input and output; a second input the stretch reads (a residual)
    is not counted. One kernel, so one dispatch, per stretch (``queue_s``)."""
    out: list[float] = []
    run = -1.0  # the open stretch's time so far; -1: none open
    for g, f in zip(times, fusible):
        if f:
            run = max(run, g)
            continue
        if run >= 0:
            out.append(run)
            run = -1.0
        out.append(g)
    if run >= 0:
        out.append(run)
    return out


def op_times(o1: Sequence[Op], o2: Sequence[Op], b: int, base_b: int, r: Rates) -> list[float]:
    """GPU seconds of each of one phase's kernels at micro-batch ``b`` (``op_gpu_s``), each op linear in b between
    the traces at ``base_b`` (``o1``) and ``base_b + 1`` (``o2``); aligned proportionally where their op counts
    differ (``advisor.timing.compute.aligned``). Under ``GpuModel.fused_elementwise`` each stretch of memory-bound
    ops is one kernel (``fused_times``): fewer entries than ops."""
    o1, o2 = aligned(o1, o2)
    k = b - base_b
    ops = [_at(x, y, k) for x, y in zip(o1, o2)]
    times = [op_gpu_s(*op, r) for op in ops]
    if r.gpu is None or not r.gpu.fused_elementwise:
        return times
    # A FUSIBLE op with FLOPs and no shape is a FLOP-bound op (the experts' grouped matmul): not fused.
    return fused_times(times, [op[2] in FUSIBLE and not (op[0] > 0 and not op[3]) for op in ops])


def queue_s(times: Sequence[float], dispatch_s: float) -> float:
    """When the last of ops taking ``times`` GPU seconds ends, eager: op i is issued at (i + 1) x ``dispatch_s``
    and starts at the later of that and the end of op i - 1 (module docstring)."""
    end = issued = 0.0
    for g in times:
        issued += dispatch_s
        end = (end if end > issued else issued) + g
    return end


def _segment(times: Sequence[float], dispatch_s: float) -> tuple[float, float]:
    """(S - D, C) of a stretch of ops in the queue: it turns a lag L of the GPU behind the CPU (end of the last op
    minus its issue time) into max(L + S - D, C), S its GPU seconds, D its issue seconds (max-plus algebra: the end
    of the last op is the larger of the previous end plus every op's time and, over its ops i, the issue of op i
    plus the time of op i and those after it)."""
    total = sum(times)
    best, issued, after = -math.inf, 0.0, total
    for g in times:
        issued += dispatch_s
        best = max(best, issued + after)
        after -= g
    d = dispatch_s * len(times)
    return total - d, best - d


def deep_queue_s(one: Sequence[float], two: Sequence[float], repeats: int, dispatch_s: float) -> float | None:
    """The queue (``queue_s``) of a phase at full depth from its op times traced with one block stretch (``one``)
    and with one more (``two``): ``two`` is ``one`` with the added stretch's ops inserted where the two agree from
    the start up to and from the end back to, and the full depth inserts it ``repeats`` times. Exact, without
    walking the repeats: each repeat maps the GPU's lag L to max(L + S - D, C) (``_segment``), so after k repeats
    the lag is max(L + k (S - D), C + max(0, (k - 1)(S - D))). None when ``two`` is not ``one`` with one stretch
    inserted (then the caller extrapolates linearly)."""
    n1, n2 = len(one), len(two)
    if n2 < n1 or repeats < 0:
        return None
    head = 0
    while head < n1 and one[head] == two[head]:
        head += 1
    tail = 0
    while tail < n1 and one[n1 - 1 - tail] == two[n2 - 1 - tail]:
        tail += 1
    if head + tail < n1:
        return None
    split = head  # in [n1 - tail, head]: any split there gives the same times
    inserted = two[split : split + n2 - n1]
    end = issued = 0.0
    for g in one[:split]:
        issued += dispatch_s
        end = max(end, issued) + g
    if repeats and inserted:
        delta, c = _segment(inserted, dispatch_s)
        lag = end - issued
        lag = max(lag + repeats * delta, c + max(0.0, (repeats - 1) * delta))
        issued += repeats * dispatch_s * len(inserted)
        end = issued + lag
    for g in one[split:]:
        issued += dispatch_s
        end = max(end, issued) + g
    return end


def phase_s(o1: Sequence[Op], o2: Sequence[Op], b: int, base_b: int, r: Rates) -> float:
    """Seconds of one phase's ops at micro-batch ``b`` through the eager queue: ``queue_s`` of ``op_times``."""
    return queue_s(op_times(o1, o2, b, base_b, r), r.dispatch_s)
