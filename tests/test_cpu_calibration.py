"""This machine's CPU calibration (advisor.timing.calibrate) and verify's measured step time (issue 13)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.cache import open_cache
from advisor.timing import calibrate
from advisor.timing.calibrate import CpuCalibration, cpu_calibration
from advisor.verify import VerifyResult, add_step_time, median_step_s, step_time_line

FAKE = CpuCalibration(
    ranks=2,
    threads=1,
    matmul_fp32_flops_per_s=50e9,
    matmul_bf16_flops_per_s=1e9,
    conv_fp32_flops_per_s=40e9,
    mem_bytes_per_s=20e9,
    dram_bytes_per_s=10e9,
    op_overhead_s=3e-6,
    exp_bytes_per_s=5e9,
    attention_fp32_flops_per_s=30e9,
    attention_bf16_flops_per_s=3e9,
    eager_op_s=15e-6,
    adamw_bytes_per_s=7e9,
    allreduce_busbw_gbps=1.0,
    reduce_scatter_busbw_gbps=0.3,
    all_gather_busbw_gbps=0.6,
    allreduce_latency_s=200e-6,
    cpu="test cpu",
    torch="0",
    measured_s=0.0,
)


@pytest.mark.slow  # about 12 s: measures this machine (two worker processes importing torch)
def test_calibration_is_positive_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("ADVISOR_VERIFY_LOCK", str(tmp_path / "lock"))  # measuring takes the machine lock
    monkeypatch.setattr(calibrate, "CONTENDED_TTL_S", float("inf"))  # reuse it even if the machine was busy
    cache = open_cache()  # the session's test cache: the DDP verify of test_scripts then finds it
    before = calibrate.MEASUREMENTS
    t0 = time.perf_counter()
    cal = cpu_calibration(2, 1, cache=cache, refresh=True)
    took = time.perf_counter() - t0
    assert calibrate.MEASUREMENTS == before + 1 and not cal.cached
    assert took < 30, took  # about 10 s on 2 cores, most of it the workers' import torch
    for figure in (
        cal.matmul_fp32_flops_per_s,
        cal.matmul_bf16_flops_per_s,
        cal.conv_fp32_flops_per_s,
        cal.mem_bytes_per_s,
        cal.dram_bytes_per_s,
        cal.op_overhead_s,
        cal.exp_bytes_per_s,
        cal.attention_fp32_flops_per_s,
        cal.attention_bf16_flops_per_s,
        cal.eager_op_s,
        cal.adamw_bytes_per_s,
        cal.allreduce_busbw_gbps,
        cal.reduce_scatter_busbw_gbps,
        cal.all_gather_busbw_gbps,
        cal.allreduce_latency_s,
    ):
        assert figure is not None and figure > 0
    assert cal.ranks == 2 and cal.threads == 1 and cal.torch
    again = cpu_calibration(2, 1, cache=cache)
    assert calibrate.MEASUREMENTS == before + 1 and again.cached  # read back, not measured again
    assert replace(again, cached=False) == cal
    preset = again.preset()
    assert preset.peak_tflops("fp32") == pytest.approx(cal.matmul_fp32_flops_per_s / 1e12)
    assert preset.allreduce_busbw_gbps(2, "nvlink") == pytest.approx(cal.allreduce_busbw_gbps)


def test_median_step_time_after_warmup_and_profiler():
    # 3 profiled steps (slow: the CPU profiler), then timing steps
    times = [2.0, 1.5, 1.4, 0.5, 0.7, 0.6, 0.9, 0.4]
    assert median_step_s(times, profiled_steps=3) == pytest.approx(0.6)
    assert median_step_s(times, profiled_steps=0) == pytest.approx(0.65)  # after the 2 warm-up steps
    assert median_step_s([1.0, 0.8, 0.3], profiled_steps=1) == pytest.approx(0.3)  # warm-up still skipped
    assert median_step_s([1.0, 0.8], profiled_steps=2) is None


def test_add_step_time_takes_the_slowest_rank():
    result = VerifyResult(strategy="ddp", device="cpu", world_size=2, steps=2, log_dir=".", predicted_step_s=0.5)
    result.per_rank = [{"rank": 0}, {"rank": 1}]
    report = {
        "per_rank": [
            {"rank": 0, "losses": [1.0, 0.9], "profiled_steps": 2, "step_times_s": [3.0, 2.0, 0.4, 0.5, 0.6]},
            {"rank": 1, "losses": [1.0, 0.9], "profiled_steps": 2, "step_times_s": [3.0, 2.0, 0.6, 0.7, 0.8]},
        ]
    }
    add_step_time(result, report)
    assert [r["measured_step_s"] for r in result.per_rank] == pytest.approx([0.5, 0.7])
    assert result.measured_step_s == pytest.approx(0.7)
    assert result.step_time_error == pytest.approx((0.5 - 0.7) / 0.7)
    line = step_time_line(result)
    assert "measured 700.0 ms" in line and "predicted 500.0 ms" in line and "-28.6%" in line
    assert {"measured_step_s", "predicted_step_s", "step_time_error"} <= set(result.to_dict())


def test_the_verify_line_counts_every_step_the_progress_lines_count():
    """The progress lines count the measured and the timed steps (step 1/11 .. 11/11); the summary said "6 steps"
    (a new user's find): it now gives both, the loss of the measured ones, and the JSON the timed count."""
    from advisor.cli import _verify_steps

    result = VerifyResult(strategy="ddp", device="cpu", world_size=2, steps=6, log_dir=".", timing_steps=5)
    result.losses = [7.6133, 7.6271]
    assert _verify_steps(result) == (
        "11 steps: 6 measured for memory (loss 7.613 -> 7.627), then 5 timed with the memory meter off"
    )
    assert result.to_dict()["timing_steps"] == 5
    assert _verify_steps(replace(result, timing_steps=0)) == "6 steps measured for memory (loss 7.613 -> 7.627)"


def test_small_peaks_are_shown_in_mib():
    """A tiny model's peaks read "measured 0.002 GiB, estimated 0.002 GiB, error -9.7%" (a new user's find): below
    1 GiB every rank is shown in MiB, one unit for all."""
    from advisor.cli import _peak_unit

    result = VerifyResult(strategy="ddp", device="cpu", world_size=2, steps=6, log_dir=".")
    result.per_rank = [
        {"rank": 0, "measured_peak_bytes": 2_300_000, "estimated_peak_bytes": 2_076_000},
        {"rank": 1, "measured_peak_bytes": 2_100_000, "estimated_peak_bytes": 2_076_000},
    ]  # type: ignore[typeddict-item]
    size = _peak_unit(result)
    assert (size(2_300_000), size(2_076_000)) == ("2.2 MiB", "2.0 MiB")
    result.per_rank[0]["measured_peak_bytes"] = 3 * 2**30
    assert _peak_unit(result)(2_076_000) == "0.002 GiB"


def test_calibrated_cpu_hardware_is_timed():
    """A CPU plan has no GPU preset to time it with; with a calibration it is timed by the measured rates."""
    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from advisor.verify_setup import run_hardware

    tiny = str(Path(__file__).resolve().parent / "data" / "small_llama.json")
    inputs = plan_inputs(
        config_path=tiny, seq_len=32, gpus=2, detect_hardware=False, precision="fp32", micro_batch_size=2
    )
    hw = run_hardware(2, "cpu", [])
    assert plan(inputs, device="cpu", hardware=hw).row("ddp").time is None
    slow = plan(inputs, device="cpu", hardware=replace(hw, calibration=FAKE)).row("ddp").time
    fast = (
        plan(
            inputs,
            device="cpu",
            hardware=replace(hw, calibration=replace(FAKE, matmul_fp32_flops_per_s=2 * FAKE.matmul_fp32_flops_per_s)),
        )
        .row("ddp")
        .time
    )
    assert slow.step_s > 0 and slow.comm_s > 0 and fast.compute_s < slow.compute_s
    assert slow.peak_flops_per_s == pytest.approx(FAKE.matmul_fp32_flops_per_s)
    # gloo's measured latency replaces NCCL's: one all-reduce of the first 1 MiB bucket at least pays it
    assert slow.comm_s >= FAKE.allreduce_latency_s


def test_calibrated_fabric_uses_gloos_own_collective_bandwidths():
    from advisor.timing.comm import Fabric

    f = FAKE.fabric(Fabric(gpus_per_node=2, intra_busbw_gbps=FAKE.allreduce_busbw_gbps))
    s = 2**30  # 1 GiB over 2 ranks: all-reduce 2(n-1)/n = 1 x S at 1 GB/s; reduce-scatter (n-1)/n at 0.3 GB/s
    assert f.time_s("all_reduce", s) == pytest.approx(FAKE.allreduce_latency_s + s / 1e9)
    assert f.time_s("reduce_scatter", s) == pytest.approx(FAKE.allreduce_latency_s + 0.5 * s / 0.3e9)
    assert f.time_s("all_gather", s) == pytest.approx(FAKE.allreduce_latency_s + 0.5 * s / 0.6e9)


def test_a_contended_calibration_is_measured_again_later(monkeypatch, tmp_path):
    from advisor.cache import DiskCache

    monkeypatch.setenv("ADVISOR_VERIFY_LOCK", str(tmp_path / "lock"))
    calls = []
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calls.append(a) or FAKE)
    cache = DiskCache(tmp_path / "cache")
    stale = replace(FAKE, contended=True, measured_at=time.time() - 2 * calibrate.CONTENDED_TTL_S)
    cache.put(calibrate.NAMESPACE, calibrate.cache_key(2, 1), stale.as_dict())
    assert cpu_calibration(2, 1, cache=cache) == FAKE and len(calls) == 1  # too old and contended: measured
    assert cpu_calibration(2, 1, cache=cache).cached and len(calls) == 1  # the new one is read back
    fresh = replace(FAKE, contended=True, measured_at=time.time())
    cache.put(calibrate.NAMESPACE, calibrate.cache_key(2, 1), fresh.as_dict())
    assert cpu_calibration(2, 1, cache=cache).contended and len(calls) == 1  # recent: reused
