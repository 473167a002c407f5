"""A CPU verification times the model's own convolutions as measured on this CPU (advisor.timing.cpu_conv): the
calls the trace records, their micro-batch, the seconds the roofline takes for them, the worker that measures them
and the cache that keeps them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.cache import DiskCache, NullCache
from advisor.plan import plan
from advisor.schema import plan_inputs
from advisor.timing import cpu_conv
from advisor.timing.compute import CONV, CONV_PARAM_FIELDS, MEMORY, Rates, roofline_work
from advisor.trace import BASE_B
from advisor.verify_setup import run_hardware
from tests.test_cpu_calibration import FAKE

CALL = (2, 16, 8, 8, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 4, 0)  # a 3x3 convolution, 16 -> 32 channels, N 2
RATES = Rates(flops_per_s=1e9, conv_flops_per_s=2e9, bytes_per_s=1e10, op_overhead_s=1e-5)


def _op(flops: int, call: tuple[int, ...]) -> tuple[int, ...]:
    """A traced convolution op: FLOPs, 0 bytes, CONV, no layout transposes, its call, one GEMM (unused on a CPU)."""
    return (flops, 0, CONV, 0, 0, *call, flops, 1, 1, 1, 1, 4)


def test_a_measured_call_replaces_the_roofline_of_that_convolution_only():
    """Hand arithmetic: traced at N 2 and 3, timed at micro-batch 5 (N 5). Without a measurement the convolution
    takes its FLOPs at the convolution rate plus the per-op overhead; measured, exactly its measured seconds (its
    dispatch included), and a memory op beside it is unchanged."""
    at2, at3 = (_op(4_000_000, CALL), (0, 1_000_000)), (_op(6_000_000, (3, *CALL[1:])), (0, 1_000_000))
    roofline, ops = roofline_work(at2, at3, 5, BASE_B, RATES)
    conv_s = 10_000_000 / 2e9 + 1e-5  # FLOPs at micro-batch 5: 4M + 3 x 2M
    memory_s = 1_000_000 / 1e10 + 1e-5
    assert ops == 2 and roofline == pytest.approx(conv_s + memory_s)
    key = (5, *CALL[1:])
    measured = replace(RATES, conv_s=((key, 0.25),))
    assert roofline_work(at2, at3, 5, BASE_B, measured)[0] == pytest.approx(0.25 + memory_s)
    other = replace(RATES, conv_s=(((4, *CALL[1:]), 0.25),))  # another micro-batch's call: the roofline again
    assert roofline_work(at2, at3, 5, BASE_B, other)[0] == pytest.approx(roofline)
    assert cpu_conv.conv_calls([(at2, at3)], 5, BASE_B) == [key]
    # an op without the call's fields (an older trace), or not a 2-D convolution (N 0): no key, the roofline
    bare = ((4_000_000, 0, CONV), (6_000_000, 0, CONV))
    zeros = (_op(4_000_000, (0,) * CONV_PARAM_FIELDS), _op(6_000_000, (0,) * CONV_PARAM_FIELDS))
    assert cpu_conv.conv_calls([([bare[0]], [bare[1]]), ([zeros[0]], [zeros[1]])], 5, BASE_B) == []
    assert MEMORY == 0


def test_the_traced_calls_are_the_models_convolutions_at_the_run_micro_batch():
    """resnet18 at 32 px, micro-batch 4: the forward calls are exactly the convolutions torch runs (hooked on a real
    forward: input, weight, stride, padding, dilation, groups), N 4; each has a backward call, the first layer's
    with the weight's gradient only (the images need none: mask 2), the others with both (mask 1 + 2)."""
    import torch
    import torchvision

    inputs = plan_inputs(model="resnet18", image_size=32, micro_batch_size=4, gpus=1, precision="fp32")
    p = plan(inputs, device="cpu", hardware=replace(run_hardware(1, "cpu", []), calibration=FAKE))
    steps = p.profile.activations(p.row("single").strategy.trace_mode(p.options.precision))
    phases = [(getattr(t1, ph), getattr(t2, ph)) for _, t1, t2 in steps.depths for ph in ("fwd_ops", "bwd_ops")]
    calls = cpu_conv.conv_calls(phases, 4, BASE_B)

    seen: list[tuple[int, ...]] = []

    def hook(m: torch.nn.Conv2d, args: tuple[torch.Tensor, ...], _out: object) -> None:
        seen.append(
            (*args[0].shape, *m.weight.shape, *m.stride, *m.padding, *m.dilation, m.groups, 0, 0, 0, 4, 0)  # type: ignore[misc]
        )

    model = torchvision.models.resnet18()
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.randn(4, 3, 32, 32))
    forward = [c for c in calls if c[-1] == 0]
    assert forward == list(dict.fromkeys(seen)) and all(c[0] == 4 for c in calls)
    backward = {c[:-1]: c[-1] for c in calls if c[-1] >= 8}
    assert set(backward) == {c[:-1] for c in forward}
    first = seen[0][:-1]
    assert backward.pop(first) == 8 + 2 and set(backward.values()) == {8 + 1 + 2}


def test_the_worker_times_each_call_and_the_cache_keeps_them(tmp_path, monkeypatch):
    """Two small calls, forward and backward (mask 3), on random tensors here: positive seconds, one per call; a
    second ask is answered from the cache without measuring; --no-cache measures again and stores nothing."""
    calls = [CALL, (*CALL[:-1], 8 + 1 + 2)]
    cache = DiskCache(tmp_path / "cache")
    table, contended = cpu_conv.measured_conv_s(calls, 1, cache)
    assert [c for c, _ in table] == calls and all(s > 0 for _, s in table)

    def no_measuring(*_a: object, **_k: object) -> list[float]:
        raise AssertionError("measured again")

    monkeypatch.setattr(cpu_conv, "measure", no_measuring)
    if not contended:  # (a measurement beside other load is used once, not cached)
        assert cpu_conv.measured_conv_s(calls, 1, cache)[0] == table
    monkeypatch.setattr(cpu_conv, "measure", lambda missing, threads: [0.5] * len(missing))
    assert cpu_conv.measured_conv_s(calls, 1, NullCache())[0] == ((calls[0], 0.5), (calls[1], 0.5))


def test_a_verification_plan_times_its_convolutions_by_them(monkeypatch):
    """verify_plan on CPU: the row's compute time with every call measured at 1 s holds one second per convolution
    op of the step (resnet18: 20 convolutions, each with its backward), where the calibration's rate alone times it
    in well under a second."""
    from advisor import verify_setup

    asked: list[int] = []

    def measured(calls, threads, cache, say=lambda _m: None):  # type: ignore[no-untyped-def]
        asked.append(len(calls))
        return tuple((c, 1.0) for c in calls), False

    monkeypatch.setattr(cpu_conv, "measured_conv_s", measured)
    monkeypatch.setattr(verify_setup, "calibrated", lambda hw, *_a: replace(hw, calibration=FAKE))
    inputs = plan_inputs(model="resnet18", image_size=32, micro_batch_size=4, gpus=1, precision="fp32")
    name, p, hw, _notes = verify_setup.verify_plan(inputs, "single", "cpu")
    assert asked and hw.calibration is not None and len(hw.calibration.conv_s) == asked[0]
    assert p.row(name).time.compute_s >= 2 * 20 * 1.0
    before = plan(replace(inputs, training=p.options), device="cpu", hardware=replace(hw, calibration=FAKE))
    assert before.row(name).time.compute_s < 1.0
