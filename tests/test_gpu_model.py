"""The per-op GPU time model (advisor.timing.gpu_time, advisor.timing.gpu_model) against hand arithmetic, and the
shapes the trace records for it (advisor.trace.shapes). Meta tensors and preset GPUs only: no launches, seconds."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.gpu_presets import get_gpu_preset
from advisor.timing.compute import ATTENTION, CONV, CONV_PARAM_FIELDS, GEMM, MEMORY, NORM, TRANSCENDENTAL, gpu_rates
from advisor.timing.gpu_model import AMPERE, MODELS, SM_COUNT, GpuModel
from advisor.timing.gpu_time import (
    FLASH,
    _at,
    attention_s,
    deep_queue_s,
    fused_times,
    gemm_compute_s,
    gemm_s,
    head_dim_factor,
    layout_s,
    memory_op_s,
    op_gpu_s,
    op_times,
    queue_s,
    split_k,
    tile_wave_efficiency,
)

ROOT = Path(__file__).resolve().parents[1]
SMALL = str(ROOT / "tests" / "data" / "small_llama.json")  # hidden 256, 2 layers, 8 heads (head dim 32), 4 kv heads
TINY = str(ROOT / "tests" / "data" / "tiny_llama.json")
A100 = get_gpu_preset("A100-80GB")
BF16 = gpu_rates(A100, "bf16", AMPERE)  # 312 TFLOP/s x 267.9 / 312, 2039 GB/s x 0.88, 108 SMs


def test_rates_carry_the_model_and_the_sm_count():
    assert BF16.gpu is AMPERE and BF16.sm_count == 108 == SM_COUNT["a100-80gb"]
    assert BF16.flops_per_s == pytest.approx(267.9e12) and BF16.bytes_per_s == pytest.approx(0.88 * 2039e9)
    assert BF16.attention_flops_per_s == pytest.approx(0.65 * 312e12) and BF16.dispatch_s == 10e-6
    for name, m in MODELS.items():  # every share at most 1 of its datasheet value
        assert all(0 < v <= 1 for v in (m.gemm, m.conv, m.attention, m.bandwidth)), name
        assert m.half_bandwidth_bytes > 0 and m.dispatch_s > 0 and m.source


def test_wave_quantization_108_vs_109_tiles_on_an_a100():
    """109 output tiles of 128 x 128 on 108 SMs need a second wave that runs one tile: about twice the time of 108
    tiles for 109/108 of the FLOPs. No other tile shape does better (256x128: 55 tiles, 109/110 useful, 55 of 108
    SMs busy, the same 109/216; 128x64 and 64x128: 218 tiles in 3 waves at 2/3 the per-SM rate)."""
    k = 8192
    m108, m109 = 128 * 108, 128 * 109
    f108, f109 = 2 * m108 * 128 * k, 2 * m109 * 128 * k
    assert tile_wave_efficiency(m108, 128, 1, 128, 128, 108) == (1.0, 1.0)
    assert tile_wave_efficiency(m109, 128, 1, 128, 128, 108) == (1.0, 109 / 216)
    t108 = gemm_compute_s(f108, m108, 128, k, 1, BF16.flops_per_s, 108)
    t109 = gemm_compute_s(f109, m109, 128, k, 1, BF16.flops_per_s, 108)
    assert t108 == pytest.approx(f108 / 267.9e12)
    assert t109 / t108 == pytest.approx(2.0)
    # The whole GEMM, at fp32 (19.5 TFLOP/s x 0.859: compute-bound at N = 128): the same 2x.
    fp32 = gpu_rates(A100, "fp32", AMPERE)
    ratio = gemm_s(f109, m109, 128, k, 1, 4, fp32.flops_per_s, fp32.bytes_per_s, 108) / gemm_s(
        f108, m108, 128, k, 1, 4, fp32.flops_per_s, fp32.bytes_per_s, 108
    )
    assert ratio == pytest.approx(2.0)


def test_tile_quantization_129_rows_compute_two_tiles_of_rows():
    """M = 129 rows in 128-row tiles computes 256 rows: 129/256 of the tiles' work is useful. With N filling 108
    tiles of columns, 128 rows run in one full wave and 129 rows in two (256x128 tiles: one wave at 129/256)."""
    n, k = 128 * 108, 8192
    assert tile_wave_efficiency(129, n, 1, 128, 128, 108) == (129 / 256, 1.0)
    f128, f129 = 2 * 128 * n * k, 2 * 129 * n * k
    t128 = gemm_compute_s(f128, 128, n, k, 1, BF16.flops_per_s, 108)
    t129 = gemm_compute_s(f129, 129, n, k, 1, BF16.flops_per_s, 108)
    assert t128 == pytest.approx(f128 / 267.9e12) and t129 / t128 == pytest.approx(2.0)


def test_a_small_k_gemm_is_memory_bound():
    """8192 x 8192 x 64 in bf16 on an A100: 8.59 GFLOP (32 us at 267.9 TFLOP/s) against 136.3 MB through HBM
    (76 us at 1794 GB/s): the memory term sets its time."""
    m = n = 8192
    k = 64
    flops = 2 * m * n * k
    memory = (m * k + k * n + m * n) * 2 / (0.88 * 2039e9)
    t = gemm_s(flops, m, n, k, 1, 2, BF16.flops_per_s, BF16.bytes_per_s, 108)
    assert t == pytest.approx(memory) and memory == pytest.approx(76.0e-6, rel=1e-2)
    assert gemm_compute_s(flops, m, n, k, 1, BF16.flops_per_s, 108) < t / 2


def test_split_k_fills_the_sms_when_the_output_is_one_tile():
    """A 128 x 128 output with K = 108 x 1024 (a weight gradient's shape: small output, long reduction) is one
    128 x 128 tile: cuBLAS splits K into 108 slices of 1024, one wave on 108 SMs, so its math runs at the
    large-GEMM rate (not 1/108 of it). Its fp32 partial outputs go through HBM twice more: with 108 slices
    2 x 108 x 128 x 128 x 4 bytes beside the operands' 2 x 128 x K x 2, 39.5 us; 64 x 64 tiles (4 tiles x 27 slices,
    half the per-SM rate: 26.9 us of math) move fewer partials, 33.5 us: the model takes the faster."""
    m = n = 128
    k = 108 * 1024
    assert split_k(1, k, 108) == 108 and split_k(4, k, 108) == 27 and split_k(108, k, 108) == 1
    assert split_k(1, 200, 108) == 1  # K too short to slice
    flops = 2 * m * n * k
    assert gemm_compute_s(flops, m, n, k, 1, BF16.flops_per_s, 108) == pytest.approx(flops / 267.9e12)
    bw = 0.88 * 2039e9
    operands = 2 * m * k * 2 + m * n * 2
    big, small = (operands + 2 * 108 * m * n * 4) / bw, (operands + 2 * 27 * m * n * 4) / bw
    assert big == pytest.approx(39.5e-6, rel=1e-2) and small == pytest.approx(33.5e-6, rel=1e-2)
    assert 2 * flops / 267.9e12 < small  # 64 x 64's math (half rate) hides behind its traffic
    assert gemm_s(flops, m, n, k, 1, 2, BF16.flops_per_s, BF16.bytes_per_s, 108) == pytest.approx(small)


def test_attention_by_head_dim_and_waves_and_memory_ops_by_size():
    assert head_dim_factor(128) == head_dim_factor(256) == 1.0
    assert head_dim_factor(64) == pytest.approx(176 / 203) and head_dim_factor(32) == pytest.approx(176 / 203 / 2)
    # 32 x 16 heads at 2048 queries: 512 x 16 = 8192 blocks of 128 queries, 76 waves on 108 SMs (8192 / 8208).
    flops = 4 * 32 * 16 * 2048 * 2048 * 128
    t = attention_s(flops, 0, 32 * 16, 2048, 128, BF16.attention_flops_per_s, BF16.bytes_per_s, 108)
    assert t == pytest.approx(flops / (0.65 * 312e12 * 8192 / 8208))
    # One head of 128 queries: one block on 108 SMs.
    assert attention_s(1e9, 0, 1, 128, 128, 1e12, 1e12, 108) == pytest.approx(1e9 / (1e12 / 108))
    # A memory-bound op: its bytes plus half_bandwidth_bytes at the achieved bandwidth (half the rate at that size).
    h = AMPERE.half_bandwidth_bytes
    assert memory_op_s(h, BF16.bytes_per_s, h) == pytest.approx(2 * h / (0.88 * 2039e9))
    assert memory_op_s(0, BF16.bytes_per_s, h) == 0.0


def test_the_eager_queue():
    d = 10e-6
    assert queue_s([1e-9] * 100, d) == pytest.approx(100 * d, rel=1e-3)  # tiny ops: the CPU's issue time
    assert queue_s([1.0, 1.0, 1.0], d) == pytest.approx(3.0 + d)  # big ops: their GPU time (after the first issue)
    # A big op lets the CPU run ahead: 10 tiny ops queued behind it cost nothing more than their own work.
    assert queue_s([1e-3] + [1e-9] * 10, d) == pytest.approx(d + 1e-3 + 10e-9)
    # Full depth from one and two blocks: the added block repeated, exactly as walking the whole queue.
    head, block, tail = [2e-5, 3e-6], [1e-6, 4e-5, 2e-6, 1e-6], [5e-5, 1e-6]
    one, two = head + block + tail, head + block + block + tail
    for repeats in (0, 1, 5, 40):
        full = head + block * (1 + repeats) + tail
        assert deep_queue_s(one, two, repeats, d) == pytest.approx(queue_s(full, d), rel=1e-12)
    assert deep_queue_s(one, [9.0] + two[1:], 3, d) is None  # not one block inserted: the caller extrapolates


def test_fused_stretches_run_as_one_kernel_each():
    # Stretches of fusible ops between two GEMMs: each one entry, its slowest member's time; GEMMs unchanged.
    times = [1.0, 2.0, 5.0, 3.0, 7.0, 4.0, 6.0]
    fusible = [True, True, False, True, False, True, True]
    assert fused_times(times, fusible) == [2.0, 5.0, 3.0, 7.0, 6.0]
    assert fused_times(times, [False] * 7) == times and fused_times([], []) == []
    # Through op_times: eager times each op; fused_elementwise merges the memory-bound ops between the GEMMs.
    mm = (2 * 64 * 64 * 64, 3 * 64 * 64 * 2, GEMM, 2 * 64 * 64 * 64, 64, 64, 64, 1, 2)
    add = (0, 3 * 2**20, MEMORY)  # an element-wise add of two 1 MiB tensors
    act = (0, 2 * 2**20, TRANSCENDENTAL)
    ops = [mm, add, act, add, mm, act]
    eager = op_times(ops, ops, 2, 2, BF16)
    fused = op_times(ops, ops, 2, 2, gpu_rates(A100, "bf16", replace(AMPERE, fused_elementwise=True)))
    assert len(eager) == 6 and fused == [eager[0], max(eager[1:4]), eager[4], eager[5]]
    h = AMPERE.half_bandwidth_bytes  # the add's time: (3 MiB + half-bandwidth bytes) at the achieved bandwidth
    assert fused[1] == pytest.approx((3 * 2**20 + h) / (0.88 * 2039e9))
    # An op with FLOPs and no shape (the experts' grouped matmul) is not fused.
    grouped = (10**9, 2**20, MEMORY)
    r = gpu_rates(A100, "bf16", replace(AMPERE, fused_elementwise=True))
    assert len(op_times([add, grouped, add], [add, grouped, add], 2, 2, r)) == 3
    assert len(op_times([add, add, add], [add, add, add], 2, 2, r)) == 1


def test_shape_dims_are_linear_in_the_micro_batch():
    # A GEMM traced at micro-batch 2 (M = 2 x 64) and 3 (M = 3 x 64), read at 5: M = 5 x 64, as its FLOPs.
    x = (2 * 128 * 96 * 256, 1000, GEMM, 2 * 128 * 96 * 256, 128, 96, 256, 1, 2)
    y = (2 * 192 * 96 * 256, 1400, GEMM, 2 * 192 * 96 * 256, 192, 96, 256, 1, 2)
    flops, nbytes, kind, shape = _at(x, y, 3)
    assert (flops, nbytes, kind) == (2 * 320 * 96 * 256, 2200, GEMM) and shape == (flops, 320, 96, 256, 1, 2)
    ((t,),) = [op_times([x], [y], 5, 2, BF16)]
    assert t == gemm_s(flops, 320, 96, 256, 1, 2, BF16.flops_per_s, BF16.bytes_per_s, 108)


def _traced(module, *inputs):
    """fwd + bwd of ``module`` on meta ``inputs`` under the trace's dispatch mode: (forward ops, backward ops)."""
    import torch

    from advisor.trace.live_bytes import _LiveBytes

    tracker = _LiveBytes([])
    with tracker.mode:
        out = module(*inputs)
        tracker.mark_forward_end()
        out.sum().backward()
    return tracker.fwd_ops, [op for op in tracker.ops if len(op) > 3 and op[2] in (GEMM, CONV)], torch


def test_a_resnet_conv_layer_records_its_implicit_gemms():
    """torchvision resnet18's layer2[0].conv1: 64 -> 128 channels, 3 x 3, stride 2, on 2 x 64 x 56 x 56 (out
    2 x 128 x 28 x 28). Forward M = 2 x 28 x 28, N = 128, K = 64 x 9; dgrad M = 2 x 56 x 56, N = 64, K = 128 x 9;
    wgrad M = 128, N = 64 x 9, K = 2 x 28 x 28; FLOPs 2 x 2 x 28 x 28 x 128 x 64 x 9 each (flop_counter's)."""
    import torch
    import torchvision

    conv = torchvision.models.resnet18().layer2[0].conv1.to("meta")
    x = torch.empty(2, 64, 56, 56, device="meta", requires_grad=True)
    fwd, bwd, _ = _traced(conv, x)
    flops = 2 * 2 * 28 * 28 * 128 * 64 * 9
    (f,) = [op for op in fwd if len(op) > 2 and op[2] == CONV]
    # The call (what a calibrated CPU measures): input, weight, stride 2, padding 1, dilation 1, groups 1, not
    # transposed, no output padding, 4-byte elements; then 0 (the forward) or 8 + the backward's output mask.
    call = (2, 64, 56, 56, 128, 64, 3, 3, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0, 4)
    # fp32: no layout transposes (0 bytes, 0 tensors), the call, then the GEMM.
    assert f[:3] == (flops, f[1], CONV) and f[3:] == (0, 0, *call, 0, flops, 2 * 28 * 28, 128, 64 * 9, 1, 4)
    (b,) = [op for op in bwd if op[2] == CONV]
    assert b[0] == 2 * flops
    assert b[3:] == (
        *(0, 0, *call, 8 + 1 + 2),  # grad_input and grad_weight, no bias
        *(flops, 2 * 56 * 56, 64, 128 * 9, 1, 4, flops, 128, 64 * 9, 2 * 28 * 28, 1, 4),
    )
    # The first layer's input needs no gradient: its backward records the wgrad GEMM alone.
    fwd, bwd, _ = _traced(conv, torch.empty(2, 64, 56, 56, device="meta"))
    (b,) = [op for op in bwd if op[2] == CONV]
    assert b[0] == flops and b[3:] == (0, 0, *call, 8 + 2, flops, 128, 64 * 9, 2 * 28 * 28, 1, 4)


def test_a_16_bit_nchw_conv_records_cudnns_layout_transposes():
    """The same layer in bf16, NCHW: cuDNN transposes each GEMM's two operands and its result to and from NHWC, each
    read and written once. Elements: input 2 x 64 x 56 x 56 = 401,408, weight 128 x 64 x 9 = 73,728, output
    2 x 128 x 28 x 28 = 200,704; forward 2 x 2 bytes x (401,408 + 73,728 + 200,704) = 2,703,360 bytes in 3 tensors;
    backward the same for dgrad (grad_output, weight, grad_input) and for wgrad (input, grad_output, grad_weight):
    5,406,720 bytes in 6. Channels-last and grouped convolutions record none."""
    import torch
    import torchvision

    conv = torchvision.models.resnet18().layer2[0].conv1.to("meta", torch.bfloat16)
    x = torch.empty(2, 64, 56, 56, device="meta", dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd, _ = _traced(conv, x)
    per_gemm = 2 * 2 * (401_408 + 73_728 + 200_704)
    (f,) = [op for op in fwd if len(op) > 2 and op[2] == CONV]
    assert f[3:5] == (per_gemm, 3) == (2_703_360, 3) and f[25:] == (f[0], 2 * 28 * 28, 128, 64 * 9, 1, 2)
    (b,) = [op for op in bwd if op[2] == CONV]
    assert b[3:5] == (2 * per_gemm, 6)
    last = conv.to(memory_format=torch.channels_last)
    fwd, bwd, _ = _traced(last, x.detach().to(memory_format=torch.channels_last).requires_grad_())
    assert [op[3:5] for op in fwd + bwd if len(op) > 2 and op[2] == CONV] == [(0, 0), (0, 0)]
    grouped = torch.nn.Conv2d(64, 64, 3, groups=4, device="meta", dtype=torch.bfloat16)
    fwd, bwd, _ = _traced(grouped, x)
    assert [op[3:5] for op in fwd + bwd if len(op) > 2 and op[2] == CONV] == [(0, 0), (0, 0)]


def test_layout_transposes_are_timed_as_memory_bound_kernels():
    """A CONV op's first two fields: its transposes' bytes at the achieved bandwidth plus one kernel's fixed time
    (half_bandwidth_bytes at that bandwidth) per tensor, before its GEMMs."""
    bw, h = BF16.bytes_per_s, AMPERE.half_bandwidth_bytes
    gemm = (2 * 4096 * 256 * 576, 4096, 256, 576, 1, 2)
    call = (0,) * CONV_PARAM_FIELDS  # the call's fields, which the GPU model skips
    alone = op_gpu_s(gemm[0], 0, CONV, (0, 0, *call, *gemm), BF16)
    assert alone == gemm_s(*gemm, BF16.conv_flops_per_s, bw, 108)
    assert layout_s(6e6, 3, bw, h) == pytest.approx((6e6 + 3 * h) / (0.88 * 2039e9))
    assert op_gpu_s(gemm[0], 0, CONV, (6e6, 3, *call, *gemm), BF16) == pytest.approx(alone + layout_s(6e6, 3, bw, h))


def test_batch_norm_in_training_records_its_statistics_pass():
    """BatchNorm2d(64) in training on 2 x 64 x 56 x 56 bf16 (802,816 bytes): forward NORM with the statistics
    pass's read of the input; backward the reduction's reads of grad_output and the input (1,605,632). Timed as two
    memory-bound kernels: that pass, then the op's own bytes. In evaluation: one pass, no shape."""
    import torch

    bn = torch.nn.BatchNorm2d(64, device="meta", dtype=torch.bfloat16)
    x = torch.empty(2, 64, 56, 56, device="meta", dtype=torch.bfloat16, requires_grad=True)
    from advisor.trace.live_bytes import _LiveBytes

    tracker = _LiveBytes([])
    with tracker.mode:
        out = bn(x)
        tracker.mark_forward_end()
        out.sum().backward()
    norms = [op for op in tracker.fwd_ops + tracker.ops if len(op) > 2 and op[2] == NORM]
    assert [op[3:] for op in norms] == [(802_816,), (1_605_632,)]
    fwd = norms[0]
    bw, h = BF16.bytes_per_s, AMPERE.half_bandwidth_bytes
    assert op_gpu_s(0, fwd[1], NORM, fwd[3:], BF16) == pytest.approx(
        memory_op_s(802_816, bw, h) + memory_op_s(fwd[1], bw, h)
    )
    bn.eval()
    tracker = _LiveBytes([])
    with tracker.mode:
        bn(x)
    assert not [op for op in tracker.ops if len(op) > 2 and op[2] == NORM]


def test_a_linear_layer_records_m_n_k():
    import torch

    b, s, d_in, d_out = 2, 5, 64, 96
    lin = torch.nn.Linear(d_in, d_out, device="meta", dtype=torch.bfloat16)
    fwd, bwd, _ = _traced(lin, torch.empty(b, s, d_in, device="meta", dtype=torch.bfloat16, requires_grad=True))
    (f,) = [op for op in fwd if len(op) > 2 and op[2] == GEMM]
    assert f[3:] == (2 * b * s * d_out * d_in, b * s, d_out, d_in, 1, 2)
    # Backward: grad_input = grad (b s x out) @ W (out x in); grad_weight = grad^T (out x b s) @ x (b s x in).
    assert sorted(op[4:8] for op in bwd) == sorted([(b * s, d_in, d_out, 1), (d_out, d_in, b * s, 1)])


def test_fused_attention_records_heads_lengths_and_head_dim():
    """The small Llama (8 heads of 32, GQA 4 kv heads repeated to 8 by SDPA's caller) at micro-batch 2 and seq 64:
    each forward call records batch x heads = 16, q and kv length 64, head dim 32, the flash kernel."""
    from advisor.models import resolve_source
    from advisor.schema import ModelSource
    from advisor.trace import trace_step

    spec = resolve_source(ModelSource(config_path=SMALL, seq_len=64))
    t, _, _ = trace_step(spec, 2, "bf16", "flash", False)
    fwd = [op for op in t.fwd_ops if len(op) > 2 and op[2] == ATTENTION]
    bwd = [op for op in t.bwd_ops if len(op) > 2 and op[2] == ATTENTION]
    assert len(fwd) == len(bwd) == 2  # one per layer
    assert {op[3:] for op in fwd} == {(16, 64, 64, 32, FLASH, 0)} and {op[3:] for op in bwd} == {
        (16, 64, 64, 32, FLASH, 1)
    }
    assert all(op[0] == 4 * 16 * 64 * 64 * 32 for op in fwd)  # flop_counter's SDPA forward: 4 b h s s d
    # The projections: M = micro-batch x seq = 128 rows, K = hidden 256.
    assert any(op[2] == GEMM and op[4:7] == (128, 256, 256) for op in t.fwd_ops if len(op) > 2)


def test_mfu_and_bandwidth_flags_set_the_model_and_a_given_model_is_used():
    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from strategies.base import timing_of

    base = dict(config_path=TINY, seq_len=64, gpus=1, gpu="A100-80GB", detect_hardware=False, micro_batch_size=2)
    t = timing_of(plan(plan_inputs(**base, mfu=0.5, bandwidth_efficiency=0.6)).context())
    m = t.gpu_model
    assert (m.gemm, m.conv, m.attention, m.bandwidth) == (0.5, 0.5, 0.5, 0.6) and m.source.startswith("flags")
    assert t.rates.flops_per_s == pytest.approx(0.5 * 312e12) and t.rates.bytes_per_s == pytest.approx(0.6 * 2039e9)
    assert (t.efficiency.compute, t.efficiency.bandwidth) == (0.5, 0.6)
    # A fit's trial constants (Hardware.gpu_model) time the cached profile again (the tiny model waits on the CPU's
    # 10 us per op; GEMMs at 0.1% of peak take longer than that).
    p = plan(plan_inputs(**base))
    ctx = p.context()
    row = p.row("single")
    slow = GpuModel(1e-3, 1e-3, 1e-3, AMPERE.bandwidth, AMPERE.half_bandwidth_bytes, AMPERE.dispatch_s, "trial")
    ctx2 = replace(ctx, hardware=replace(ctx.hardware, gpu_model=slow))
    assert timing_of(ctx2).gpu_model is slow
    assert row.strategy.step_time(ctx2, row).compute_s > row.time.compute_s
    assert math.isclose(row.strategy.step_time(ctx, row).step_s, row.time.step_s, rel_tol=1e-12)
