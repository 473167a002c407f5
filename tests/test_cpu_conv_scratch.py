"""oneDNN's CPU convolution weight-gradient scratch (``advisor.trace.cpu_conv_scratch_bytes``).

On CPUs without AVX-512, oneDNN computes the weight gradient of a convolution whose kernel is taller than
its input (resnet's layer4 at 64 px: 3x3 on 2x2 maps) with its ``x64:gemm:jit`` kernel, which books
threads x (4 x weight bytes + im2col columns) from the c10 allocator while ``aten::convolution_backward``
runs. CPU verification estimates model it when ``Hardware.cpu_conv_scratch_threads`` > 0; GPU plans never.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from advisor.trace import cpu_conv_scratch_bytes, onednn_gemm_bwd_weights_machine

NEEDS_GEMM_KERNEL = pytest.mark.skipif(
    not onednn_gemm_bwd_weights_machine(),
    reason="needs oneDNN's gemm weight-gradient kernel: an AVX2 CPU without AVX-512/AMX and mkldnn enabled "
    f"(here: capability {torch.backends.cpu.get_cpu_capability()}, "
    f"mkldnn {torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled})",
)


def conv512():
    """Model factory: one 512 -> 512 3x3 convolution (input 512 x 2 x 2 in the tests below)."""
    return torch.nn.Conv2d(512, 512, 3, padding=1)


def test_formula_by_hand():
    w = 512 * 512 * 3 * 3 * 4  # weight bytes: 9,437,184
    cols = 4 * 512 * 3 * 3 * 2 * 2  # im2col columns of one image per thread: 73,728
    align = 2 * 128  # two scratchpad bookings, 128 bytes of alignment slack each
    shape, weight = (4, 512, 2, 2), (512, 512, 3, 3)
    assert cpu_conv_scratch_bytes(shape, weight, (1, 1), (1, 1), (1, 1), threads=1) == 4 * w + cols + align
    assert cpu_conv_scratch_bytes(shape, weight, (1, 1), (1, 1), (1, 1), threads=2) == 2 * (4 * w + cols) + align
    assert 2 * (4 * w + cols) + align == 75_645_184  # measured on AMD EPYC (AVX2), torch 2.14.1, 2 threads
    # The jit:avx2 kernel takes a 3x3 on a 3x3 map (kh <= ih), and batch 1 does not reach oneDNN.
    assert cpu_conv_scratch_bytes((4, 512, 3, 3), weight, (1, 1), (1, 1), (1, 1), threads=2) == 0
    assert cpu_conv_scratch_bytes((1, 512, 2, 2), weight, (1, 1), (1, 1), (1, 1), threads=2) == 0
    assert cpu_conv_scratch_bytes(shape, weight, (1, 1), (1, 1), (1, 1), threads=0) == 0
    # Outer threading needs OH * OW / T < 256: a (5, 1) kernel on a 3 x 600 map runs 1 thread at T = 2.
    w, cols = 16 * 16 * 5 * 4, 4 * 16 * 5 * 3 * 600
    assert (
        cpu_conv_scratch_bytes((2, 16, 3, 600), (16, 16, 5, 1), (1, 1), (2, 0), (1, 1), threads=2)
        == 4 * w + cols + align
    )


def _measure_cpu_step(spec, micro_batch: int) -> int:
    """Backward peak of the 2nd of two real fp32 AdamW steps, relative to the total just before its
    forward (tests/test_core.py's measurement)."""
    from tests.test_core import _measure_cpu_step as measure

    return measure(spec, micro_batch)[1]


@NEEDS_GEMM_KERNEL
def test_single_conv_matches_real_cpu_backward():
    from advisor.models import resolve_model
    from advisor.trace import profile_activations

    spec = resolve_model(None, factory="tests.test_cpu_conv_scratch:conv512", input_shape=(512, 2, 2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured = _measure_cpu_step(spec, 4)
    finally:
        torch.set_num_threads(threads)
    est = profile_activations(spec, "fp32", "flash", False, cpu_conv_scratch_threads=1).at(4).bwd_peak
    plain = profile_activations(spec, "fp32", "flash", False).at(4).bwd_peak
    assert est - plain == 37_822_720  # the scratch, on top of everything the trace saw
    assert est == pytest.approx(measured, rel=0.02)


@NEEDS_GEMM_KERNEL
def test_resnet18_64px_step_matches_real_cpu_backward():
    """layer4's 3x3 convolutions see 2x2 maps at 64 px: without the scratch the trace is about half the
    real backward peak (58 vs 120 MB at 2 threads)."""
    from advisor.models import resolve_model
    from advisor.trace import profile_activations

    spec = resolve_model("resnet18", image_size=64)
    threads = torch.get_num_threads()
    measured = _measure_cpu_step(spec, 8)
    est = profile_activations(spec, "fp32", "flash", False, cpu_conv_scratch_threads=threads).at(8)
    assert est.bwd_peak == pytest.approx(measured, rel=0.05)


def _resnet18_inputs(**kw):
    from advisor.schema import plan_inputs

    return plan_inputs(
        model="resnet18", image_size=64, optimizer="sgd-momentum", micro_batch_size=8, detect_hardware=False, **kw
    )


def test_gpu_plan_ignores_the_field():
    from advisor.document import plan_to_dict
    from advisor.hardware import resolve_hardware
    from advisor.plan import plan

    inputs = _resnet18_inputs(gpu="RTX4090", gpus=2, host_mem_gib=64)
    hw = resolve_hardware(inputs.cluster)
    assert hw.cpu_conv_scratch_threads == 0
    base = plan(inputs, hardware=hw)
    other = plan(inputs, hardware=replace(hw, cpu_conv_scratch_threads=4))
    assert other.profile.cpu_conv_scratch_threads == 0
    assert plan_to_dict(other) == plan_to_dict(base)


def test_cpu_plan_adds_the_scratch_and_keys_every_cache(monkeypatch, tmp_path):
    """A CPU estimate with the field set gains one 512->512 convolution's scratch (only one is alive at a
    time); the in-process and the disk trace caches both keep the two apart."""
    from advisor import profile
    from advisor.hardware import HOST_DETECTED, Hardware
    from advisor.plan import plan

    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    hw = Hardware(
        gpu_name="CPU",
        gpu_memory_bytes=2**34,
        gpus_per_node=1,
        num_nodes=1,
        interconnect="nvlink",
        network=None,
        bf16_tflops=0.0,
        link_gbps=0.0,
        host_mem_bytes=2**34,
        host_mem_state=HOST_DETECTED,
    )
    inputs = _resnet18_inputs(precision="fp32")
    peaks = []
    for threads in (0, 1, 0):
        profile.clear_trace_cache()  # a new process: only the disk remembers
        p = plan(inputs, device="cpu", hardware=replace(hw, cpu_conv_scratch_threads=threads))
        assert p.profile.cpu_conv_scratch_threads == threads
        peaks.append(p.row("ddp").memory.peak.total)
    assert peaks[1] - peaks[0] == 37_822_720 and peaks[2] == peaks[0]
    profile.clear_trace_cache()
