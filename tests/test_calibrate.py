"""``advisor calibrate``: the GPU calibration's derivations on fake measurements (hand arithmetic), its store and
its use by later plans, the CPU path's file format and its use by CPU verification runs, ``--show`` and bad input.
The GPU worker cannot run here: it is imported and its shape lists checked."""

from __future__ import annotations

import json
import math
import os
import py_compile
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.cache import DiskCache, library_versions
from advisor.choices import Device, Precision
from advisor.cli import main
from advisor.gpu_presets import get_gpu_preset
from advisor.timing import _gpu_calibrate_worker as worker
from advisor.timing import calibrate, gpu_calibrate
from advisor.timing.gpu_calibration import busbw, fit_line, from_measurements, gemm_s

ROOT = Path(__file__).resolve().parents[1]
A100 = "NVIDIA A100-SXM4-80GB"
NOW = time.mktime((2026, 12, 3, 12, 0, 0, 0, 0, 0)) - time.timezone  # 2026-12-03 12:00 UTC


def fake_measurements(torch: str | None = None) -> dict[str, object]:
    """What the worker would print on an A100 80 GB SXM (312 TF bf16, 156 TF tf32, 19.5 TF fp32, 2039 GB/s), with
    round rates: bf16 GEMM 249.6 TF (0.8 of 312), fp32 15.6 TF (0.8 of 19.5), bf16 convolution 156 TF (0.5),
    tf32 convolution 78 TF (0.5 of 156), attention 187.2 TF (0.6), copies t = 5 us + bytes moved / 1.6 TB/s."""
    g8 = 2.0 * 8192**3
    return {
        "gpu": A100,
        "memory_bytes": 81920 * 2**20,
        "sm_count": 108,
        "capability": "8.0",
        "gpu_count": 1,
        "driver": "535.104.05",
        "torch": library_versions()["torch"] if torch is None else torch,
        "cuda": "12.2",
        "gemm": [
            {"precision": "bf16", "m": 8192, "n": 8192, "k": 8192, "seconds": g8 / 249.6e12},
            {"precision": "bf16", "m": 4096, "n": 4096, "k": 4096, "seconds": 2.0 * 4096**3 / 200e12},
            # small-K: not a large GEMM, so it does not set the share even at a "faster" rate
            {"precision": "bf16", "m": 8192, "n": 4096, "k": 16, "seconds": 2.0 * 8192 * 4096 * 16 / 300e12},
            {"precision": "fp32", "m": 8192, "n": 8192, "k": 8192, "seconds": g8 / 15.6e12},
        ],
        "conv": [
            {
                "precision": "bf16",
                "c_in": 512,
                "c_out": 512,
                "hw": 7,
                "kernel": 3,
                "stride": 1,
                "flops": 1e12,
                "seconds": 1e12 / 156e12,
            },
            # a small-channel convolution (below LARGE_CONV_CHANNELS) is measured but sets no share
            {
                "precision": "bf16",
                "c_in": 64,
                "c_out": 64,
                "hw": 56,
                "kernel": 3,
                "stride": 1,
                "flops": 1e12,
                "seconds": 1e12 / 300e12,
            },
            {
                "precision": "tf32",
                "c_in": 512,
                "c_out": 512,
                "hw": 7,
                "kernel": 3,
                "stride": 1,
                "flops": 1e12,
                "seconds": 1e12 / 78e12,
            },
        ],
        "attention": [
            {
                "precision": "bf16",
                "batch": 4,
                "heads": 16,
                "seq": 2048,
                "head_dim": 128,
                "causal": False,
                "flops": 1e12,
                "seconds": 1e12 / 187.2e12,
            },
            {
                "precision": "bf16",
                "batch": 4,
                "heads": 16,
                "seq": 2048,
                "head_dim": 128,
                "causal": True,
                "flops": 1e12,
                "seconds": 1e12 / 400e12,
            },
        ],
        "copy": [{"bytes": s, "seconds": 5e-6 + 2 * s / 1.6e12} for s in (2**20, 2**24, 2**30)],
        "tiny_op_s": 5e-6,
        "eager_op_s": 12e-6,
        "h2d_gbps": 24.0,
        "d2h_gbps": 25.0,
        "seconds": 60.0,
    }


def test_the_worker_imports_without_torch_and_sweeps_the_shapes_it_documents():
    py_compile.compile(str(Path(worker.__file__)), doraise=True)
    code = "import sys, advisor.timing._gpu_calibrate_worker; print('torch' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "False"  # importing it to read the shapes costs no torch import
    gemms = set(worker.GEMM_SHAPES)
    assert (4096, 4096, 4096) in gemms
    for d in (768, 1024, 2048, 4096, 8192):  # b*s x 4d x d (MLP up) and b*s x d x 4d (down)
        assert (8192, 4 * d, d) in gemms and (8192, d, 4 * d) in gemms
    assert min(k for _, _, k in gemms) == 16 and min(n for _, n, _ in gemms) == 16  # small-K and small-N cases
    assert len(worker.GEMM_SHAPES) == 17 and worker.GEMM_PRECISIONS == ("bf16", "fp16", "fp32", "tf32")
    # ResNet-50's stem and a 3x3 convolution of each stage (56, 28, 14, 7 px)
    assert (3, 64, 224, 7, 2) in worker.CONV_SHAPES
    assert {hw for _, _, hw, k, _ in worker.CONV_SHAPES if k == 3} == {56, 28, 14, 7}
    assert {d for *_, d, _ in worker.ATTENTION_SHAPES} == {64, 128}
    assert worker.COPY_BYTES[0] == 2**20 and worker.COPY_BYTES[-1] == 2**30 and len(worker.COPY_BYTES) == 6


def test_wave_quantization_of_the_residual_rule():
    # 108 output tiles of 128 x 128 fill an A100's 108 SMs once; 109 need a second wave: twice the time
    rate, no_memory = 312e12 * 0.8, 1e30
    one = gemm_s(128 * 108, 128, 4096, 2, rate, no_memory, 108)
    two = gemm_s(128 * 109, 128, 4096, 2, rate, no_memory, 108)
    assert two == pytest.approx(2 * one)
    assert one == pytest.approx(2.0 * 128 * 128 * 4096 / (rate / 108))  # one wave: one tile's FLOPs per SM
    # tile quantization (one SM, so no wave hides it): M = 129 computes two rows of tiles, as M = 256 does
    m128, m129, m256 = (gemm_s(m, 128, 4096, 2, rate, no_memory, 1) for m in (128, 129, 256))
    assert m129 == pytest.approx(m256) and m129 == pytest.approx(2 * m128)
    # small K is memory bound: reading A and B and writing C once at 1.6 TB/s
    t = gemm_s(8192, 8192, 16, 2, rate, 1.6e12, 108)
    assert t == pytest.approx((8192 * 16 + 16 * 8192 + 8192 * 8192) * 2 / 1.6e12)


def test_fit_line_on_relative_error():
    xs = [2.0**21, 2.0**25, 2.0**31]
    a, b = fit_line(xs, [5e-6 + x / 1.6e12 for x in xs])
    assert a == pytest.approx(5e-6) and 1 / b == pytest.approx(1.6e12)
    a, b = fit_line([1.0, 2.0], [1.0, 3.0])  # the free fit's intercept is -1: refitted through the origin
    assert a == 0.0 and b == pytest.approx((1 / 1 + 2 * 3 / 9) / (1 / 1 + 4 / 9))  # sum w x t / sum w x^2
    with pytest.raises(ValueError):
        fit_line([1.0, 1.0], [1.0, 2.0])


def test_measurements_become_the_compute_models_constants():
    cal = from_measurements(fake_measurements(), now=NOW)
    assert cal.preset == "A100-80GB" and cal.date == "2026-12-03" and cal.sm_count == 108
    assert cal.gemm == pytest.approx({"bf16": 0.8, "fp32": 0.8})  # 249.6 / 312, 15.6 / 19.5
    assert cal.conv == pytest.approx({"bf16": 0.5, "tf32": 0.5})  # 156 / 312, 78 / 156
    assert cal.attention == pytest.approx({"bf16": 0.6})  # 187.2 / 312; the causal run is a rate only
    assert cal.rates["attention_bf16_causal_tflops"] == pytest.approx(400.0)
    assert cal.rates["conv_bf16_tflops"] == pytest.approx(156.0)  # the small-channel 300 TF is left out
    assert cal.bandwidth == pytest.approx(1600 / 2039)  # the fitted 1.6 TB/s of the A100's 2039 GB/s
    assert cal.half_bandwidth_bytes == 8_000_000  # 5 us x 1.6 TB/s
    assert cal.dispatch_s == pytest.approx(12e-6)
    # the GEMM rule's residuals: 8192^3 in 128 x 128 tiles is 4096 tiles in ceil(4096 / 108) = 38 waves of 108,
    # 4104 tile-times for 4096 tiles' work: +8/4096 at the fitted share; 4096^3: 1024 tiles, 10 waves (1080)
    # at 249.6 TF vs measured 200 TF: 1080/1024 x 200/249.6 - 1; the small-K GEMM is memory bound at 1.6 TB/s
    big, mid = 8 / 4096, 1080 / 1024 * 200 / 249.6 - 1
    small_k_s = (8192 * 16 + 16 * 4096 + 8192 * 4096) * 2 / 1.6e12
    small = small_k_s / (2.0 * 8192 * 4096 * 16 / 300e12) - 1
    errors = sorted([big, mid, small, big])  # the fp32 8192^3 GEMM has the same quantization as bf16's
    assert cal.gemm_error["points"] == 4
    assert cal.gemm_error["low"] == pytest.approx(errors[0]) and cal.gemm_error["high"] == pytest.approx(errors[-1])
    assert cal.gemm_error["median_abs"] == pytest.approx(statistics.median(abs(e) for e in errors))
    a100 = get_gpu_preset("a100-80gb")
    bf16 = cal.model(Precision.BF16, a100)
    assert (bf16.gemm, bf16.conv, bf16.attention) == pytest.approx((0.8, 0.5, 0.6))
    assert bf16.source.startswith("calibrated on this machine, 2026-12-03 (NVIDIA A100-SXM4-80GB, driver 535.104.05")
    fp32 = cal.model(Precision.FP32, a100)
    assert (fp32.gemm, fp32.conv) == pytest.approx((0.8, 0.5))  # fp32 GEMMs at FP32's peak, convolutions at TF32's
    assert cal.model(Precision.FP16, a100) is None  # fp16 GEMMs were not measured
    assert every_share_at_most_one(cal)


def every_share_at_most_one(cal) -> bool:
    shares = [*cal.gemm.values(), *cal.conv.values(), *cal.attention.values(), cal.bandwidth]
    return all(0 < s <= 1 for s in shares)


def test_shares_are_capped_at_the_datasheet():
    doc = fake_measurements()
    doc["gemm"] = [{"precision": "bf16", "m": 8192, "n": 8192, "k": 8192, "seconds": 2.0 * 8192**3 / 400e12}]
    assert from_measurements(doc, now=NOW).gemm["bf16"] == 1.0  # 400 TF measured against 312 TF


def test_bus_bandwidths_as_nccl_tests_define_them():
    s = 2**29
    doc = {"world": 4, "all_reduce": [[8.0, 20e-6], [s, s / 100e9]], "reduce_scatter": [[s, s / 100e9]]}
    doc["all_gather"] = [[s, s / 80e9]]
    out = busbw(doc)
    assert out["all_reduce_busbw_gbps"] == pytest.approx(2 * 3 / 4 * 100)
    assert out["reduce_scatter_busbw_gbps"] == pytest.approx(3 / 4 * 100)
    assert out["all_gather_busbw_gbps"] == pytest.approx(3 / 4 * 80)
    assert out["nccl_latency_us"] == pytest.approx(20.0)
    assert busbw(None) == {} and busbw({"world": 1}) == {}


# The session cache's trace namespaces, which a test's own cache shares (advisor.profile's and advisor.trace's).
TRACE_NAMESPACES = ("activations", "facts", "param_stats")


@pytest.fixture
def own_calibrations(tmp_path, monkeypatch) -> DiskCache:
    """A cache of this test's own for calibrations (``ADVISOR_CACHE_DIR`` pointed at it) whose trace namespaces are
    the session cache's, linked: a fake calibration never reaches another test's plans (pytest-xdist's other worker
    plans from the same session cache at the same time), and the traces are not made again."""
    session = DiskCache().directory
    own = tmp_path / "cache"
    own.mkdir()
    for namespace in TRACE_NAMESPACES:
        (session / namespace).mkdir(parents=True, exist_ok=True)
        (own / namespace).symlink_to(session / namespace, target_is_directory=True)
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(own))
    return DiskCache()


@pytest.fixture
def stored_a100(own_calibrations):
    """A fake A100 calibration in the test's own cache (plans read the cache of ``cache_dir()``)."""
    cal = from_measurements(fake_measurements(), now=NOW)
    gpu_calibrate.store(cal, own_calibrations)
    return cal


def test_a_stored_calibration_is_found_for_its_gpu_and_torch_only(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path)
    gpu_calibrate.store(from_measurements(fake_measurements(), now=NOW), cache)
    assert gpu_calibrate.calibration_for("a100-80gb", 81920 * 2**20, cache) is not None  # the preset
    assert gpu_calibrate.calibration_for(A100, 81920 * 2**20, cache) is not None  # the detected name
    assert gpu_calibrate.calibration_for("NVIDIA A100 80GB PCIe", 81920 * 2**20, cache) is None  # another device
    assert gpu_calibrate.calibration_for("h100-80gb", 0, cache) is None
    assert gpu_calibrate.calibration_for("a100-80gb", 0, cache, torch="9.9.9") is None  # another torch
    monkeypatch.setattr(gpu_calibrate, "library_versions", lambda: {"torch": "9.9.9"})  # torch upgraded
    assert gpu_calibrate.calibration_for("a100-80gb", 81920 * 2**20, cache) is None
    # the newest of two measurements wins
    gpu_calibrate.store(replace(from_measurements(fake_measurements("9.9.9"), now=NOW), driver="550"), cache)
    gpu_calibrate.store(replace(from_measurements(fake_measurements("9.9.9"), now=NOW + 60), driver="560"), cache)
    assert gpu_calibrate.calibration_for("a100-80gb", 0, cache).driver == "560"


@pytest.mark.usefixtures("no_what_if_traces")
def test_plans_for_the_calibrated_gpu_say_so(stored_a100, capsys):
    assert main(["llama-2-7b", "--gpu", "a100-80gb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    source = doc["timing"]["source"]
    assert source.startswith("calibrated on this machine, 2026-12-03 (NVIDIA A100-SXM4-80GB") and "535.104.05" in source
    assert doc["hardware"]["sources"]["time_model"] == source
    assert main(["llama-2-7b", "--gpu", "h100-80gb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["timing"]["source"].startswith("preset H100-80GB: ") and "time_model" not in doc["hardware"]["sources"]
    assert main(["llama-2-7b", "--gpu", "a100-80gb"]) == 0
    assert "Time model: calibrated on this machine, 2026-12-03" in capsys.readouterr().out


@pytest.mark.usefixtures("no_what_if_traces")
def test_verify_predicts_with_the_preset_beside_the_calibration(stored_a100):
    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from advisor.verify import VerifyResult, preset_step_s, step_time_line

    inputs = plan_inputs(model="llama-2-7b", gpu="a100-80gb", gpus=8, micro_batch_size=1, detect_hardware=False)
    calibrated = plan(inputs)
    assert calibrated.hardware.gpu_model is not None
    preset = plan(replace(inputs, use_cache=False))  # --no-cache reads no calibration
    assert preset.hardware.gpu_model is None and preset_step_s(preset, "ddp") is None
    assert preset_step_s(calibrated, "ddp") == pytest.approx(preset.row("ddp").time.step_s)
    result = VerifyResult("ddp", Device.CUDA, 8, 6, ".", predicted_step_s=0.5, preset_step_s=0.4)
    result.measured_step_s, result.step_time_error = 0.7, (0.5 - 0.7) / 0.7
    result.time_source = calibrated.hardware.sources["time_model"]
    line = step_time_line(result)
    assert "predicted 500.0 ms (error -28.6%, preset constants 400.0 ms (error -42.9%)" in line
    assert "the prediction is calibrated on this machine, 2026-12-03" in line
    assert result.to_dict()["preset_step_time_error"] == pytest.approx(-0.3 / 0.7)


def test_calibrate_on_cpu_stores_the_document_the_next_verification_reads(tmp_path, monkeypatch, capsys):
    from advisor.verify_setup import calibrated, run_hardware
    from tests.test_cpu_calibration import FAKE

    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADVISOR_VERIFY_LOCK", str(tmp_path / "lock"))
    calls = []
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calls.append(a) or FAKE)
    assert main(["calibrate", "--device", "cpu", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert calls == [(2, 1, calibrate.SECONDS_PER_BENCHMARK)] and "2 rank(s): measured on this machine" in out
    cache = DiskCache()
    keys = gpu_calibrate.namespace_keys(cache, calibrate.NAMESPACE)
    assert keys == [calibrate.cache_key(2, 1)]  # keyed by the CPU model with its ISA flags, cores, ranks, torch
    doc = cache.get(calibrate.NAMESPACE, keys[0])
    assert doc["device"] == "cpu" and doc["isa"] == calibrate.isa_flags()
    assert {k: doc[k] for k in FAKE.as_dict()} == FAKE.as_dict()
    notes, said = [], []
    hw = calibrated(run_hardware(2, Device.CPU, []), Device.CPU, True, said.append, notes)
    assert hw.calibration is not None and hw.calibration.cached and len(calls) == 1 and not said
    assert hw.calibration.matmul_fp32_flops_per_s == FAKE.matmul_fp32_flops_per_s
    # the next CPU plan of a verification run is timed by it, and says so
    from advisor.document import timing_doc
    from advisor.plan import plan
    from advisor.schema import plan_inputs

    tiny = str(ROOT / "tests" / "data" / "small_llama.json")
    inputs = plan_inputs(config_path=tiny, seq_len=32, gpus=2, detect_hardware=False, precision="fp32")
    source = timing_doc(plan(inputs, device=Device.CPU, hardware=hw))["source"]
    assert source.startswith("measured on this machine's CPU, ") and "test cpu, 2 rank(s)" in source
    monkeypatch.setattr(calibrate, "library_versions", lambda: {"torch": "9.9.9"})  # torch upgraded: a miss
    assert calibrate.cached_calibration(2, 1, cache) is None


def test_a_calibration_with_collectives_times_the_link_of_that_many_gpus(stored_a100):
    from advisor.hardware import without_gpu_calibration
    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from advisor.verify import preset_step_s

    doc = fake_measurements()
    s = 2**29
    doc["gpu_count"] = 2
    doc["collectives"] = {"world": 2, "all_reduce": [[8.0, 20e-6], [s, s / 150e9]]}  # busbw 2(n-1)/n x 150 = 150
    two = replace(from_measurements(doc, now=NOW + 60), driver="550.54")  # newer than stored_a100's: plans use it
    gpu_calibrate.store(two, DiskCache())
    tiny = str(ROOT / "tests" / "data" / "small_llama.json")
    try:
        for gpus, busbw in ((2, 150.0), (4, None)):  # measured over 2 GPUs: not a 4-GPU node's ring
            inputs = plan_inputs(config_path=tiny, seq_len=32, gpus=gpus, gpu="a100-80gb", detect_hardware=False)
            hw = plan(inputs).hardware
            assert hw.gpu_model is not None and hw.link_busbw_gbps == (pytest.approx(busbw) if busbw else None)
        assert hw.sources.get("link_busbw_gbps") is None
        given = plan(replace(inputs, cluster=replace(inputs.cluster, gpus=2, link_bandwidth_gbps=50.0))).hardware
        assert given.link_busbw_gbps == 50.0  # --link-bandwidth wins
        two_gpus = plan(replace(inputs, cluster=replace(inputs.cluster, gpus=2)))
        assert two_gpus.hardware.sources["link_busbw_gbps"].startswith("NCCL all-reduce busbw measured")
        undone = without_gpu_calibration(two_gpus.hardware)
        assert undone.gpu_model is None and undone.link_busbw_gbps is None and "time_model" not in undone.sources
        assert without_gpu_calibration(given).link_busbw_gbps == 50.0  # the flag stays
        # what the preset predicts: the same plan read without any calibration (--no-cache), at the same micro-batch
        fixed = replace(inputs, cluster=replace(inputs.cluster, gpus=2))
        fixed = replace(fixed, training=replace(fixed.training, micro_batch_size=two_gpus.options.micro_batch_size))
        uncalibrated = plan(replace(fixed, use_cache=False))
        assert uncalibrated.hardware.gpu_model is None and uncalibrated.hardware.link_busbw_gbps is None
        assert preset_step_s(plan(fixed), "ddp") == pytest.approx(uncalibrated.row("ddp").time.step_s)
    finally:
        DiskCache().path_for(gpu_calibrate.NAMESPACE, gpu_calibrate.key(two.gpu, two.driver, two.torch)).unlink()


def test_a_gpu_verification_without_a_calibration_says_how_to_make_one(tmp_path, monkeypatch):
    from advisor.hardware import Hardware
    from advisor.verify_setup import calibrated

    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path))
    hw = Hardware(A100, 81920 * 2**20, 1, 1, "nvlink", None, 0.0, 0.0, None)
    notes: list[str] = []
    assert calibrated(hw, Device.CUDA, True, print, notes) is hw
    assert notes and "run 'advisor calibrate' once" in notes[0]
    gpu_calibrate.store(from_measurements(fake_measurements(), now=NOW), DiskCache())
    notes.clear()
    assert calibrated(hw, Device.CUDA, True, print, notes) is hw and notes == []  # plan() then reads it


def test_show_prints_the_stored_calibrations(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path))
    assert main(["calibrate", "--show"]) == 0
    assert "no calibrations stored" in capsys.readouterr().out
    gpu_calibrate.store(from_measurements(fake_measurements(), now=NOW), DiskCache())
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(A100))
    for cell in ("cuda", "2026-12-03", "535.104.05", "gemm bf16 0.80 fp32 0.80", "bf16 GEMM 250 TFLOP/s"):
        assert cell in row
    assert main(["calibrate", "--show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (gpu,) = doc["calibrations"]
    assert gpu["device"] == "cuda" and gpu["gpu"] == A100 and gpu["gemm"]["bf16"] == pytest.approx(0.8)
    assert math.isclose(gpu["half_bandwidth_bytes"], 8e6)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--ranks", "0"], "must be a positive integer"),
        (["--ranks", "9"], "at most 4 ranks"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
        (["--show", "--ranks", "3"], "measures nothing: drop --ranks"),
        (["--show", "--device", "cuda"], "measures nothing: drop --device"),
        (["--show", "--no-collectives"], "measures nothing: drop --no-collectives"),
        (["--device", "cpu", "--no-collectives"], "a CPU calibration has no collectives"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, words, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("advisor.calibrate_face._cuda_visible", lambda: False)
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


def test_no_writable_cache_dir_and_no_gpu_are_bad_input(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(blocker / "cache"))
    assert main(["calibrate", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"advisor: error: {blocker} is not a directory: nowhere to store the calibration; set " + (
        "ADVISOR_CACHE_DIR to a writable directory"
    )
    # A directory that passes os.access (root, a read-only or pseudo file system) but takes no file: found by
    # writing one before anything is measured, not after.
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("advisor.calibrate_face.unusable_reason", lambda d: None)

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("advisor.cache_face.tempfile.NamedTemporaryFile", refuse)
    assert main(["calibrate", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"advisor: error: {tmp_path / 'cache'} cannot be written (Permission denied): nowhere to store the "
        "calibration; set ADVISOR_CACHE_DIR to a writable directory"
    )
    monkeypatch.undo()
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("advisor.calibrate_face._cuda_visible", lambda: False)
    assert main(["calibrate", "--device", "cuda"]) == 2
    assert "no CUDA GPU is visible here" in capsys.readouterr().err


def test_a_busy_machine_keeps_the_idle_calibration(tmp_path, monkeypatch, capsys):
    """A CPU measurement that other processes disturbed (contended) does not replace one taken on an idle machine:
    the stored one is kept, and the face says so."""
    from tests.test_cpu_calibration import FAKE

    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ADVISOR_VERIFY_LOCK", str(tmp_path / "lock"))
    idle = replace(FAKE, measured_at=NOW)
    busy = replace(FAKE, matmul_fp32_flops_per_s=25e9, contended=True, measured_at=NOW + 60)
    # the last one stamped now: a contended calibration is reused for CONTENDED_TTL_S only, counted on the real clock
    measured = iter([idle, busy, replace(busy, measured_at=time.time())])
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: next(measured))
    assert main(["calibrate", "--device", "cpu", "--ranks", "2"]) == 0
    assert main(["calibrate", "--device", "cpu", "--ranks", "2"]) == 0
    out = capsys.readouterr().out
    assert "other processes were busy, so the calibration measured on an idle machine (2026-12-03) is kept" in out
    kept = calibrate.cached_calibration(2, 1, DiskCache())
    assert kept is not None and kept.matmul_fp32_flops_per_s == 50e9 and not kept.contended
    # with nothing idle stored, a busy measurement is stored (rough, and renewed after CONTENDED_TTL_S)
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "fresh"))
    assert main(["calibrate", "--device", "cpu", "--ranks", "2"]) == 0
    assert "(other processes were busy: rough)" in capsys.readouterr().out
    assert calibrate.cached_calibration(2, 1, DiskCache()).contended
