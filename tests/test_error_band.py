"""Error bands on every time and memory figure: the band arithmetic (advisor/timing/error_band.py), the table's
entries against the files they are built from, and the band in the plan's JSON and text."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.choices import Device
from advisor.cli import main
from advisor.document import plan_to_dict
from advisor.hardware import resolve_hardware
from advisor.plan import plan
from advisor.schema import plan_inputs
from advisor.text_report import render_text
from advisor.timing.error_band import (
    MEMORY_BAND,
    PUBLISHED_LOSO_BANDS,
    TIME_BANDS,
    ErrorBand,
    TimeKey,
    band_from_errors,
    band_from_ratios,
    bench_case_errors,
    memory_band,
    time_key,
    workload_of,
)
from advisor.timing.gpu_model import GpuModel

ROOT = Path(__file__).resolve().parents[1]


def test_band_spans_the_rows_and_the_estimate() -> None:
    # 5 rows: floor(5 / 10) = 0 left out on either side, so the band is the whole range: 0.8 - 1 .. 1.3 - 1.
    b = band_from_ratios([1.1, 0.8, 1.3, 1.0, 0.9], "five")
    assert (b.low, b.high) == pytest.approx((-0.2, 0.3))
    # 10 rows: the lowest (0.5) and highest (2.0) are left out; 0.9 .. 1.2 remain: 8 of 10 = 80% inside.
    ten = [0.5, 0.9, 0.95, 1.0, 1.0, 1.05, 1.1, 1.15, 1.2, 2.0]
    b = band_from_ratios(ten, "ten")
    assert (b.low, b.high) == pytest.approx((-0.1, 0.2))
    assert sum(1 + b.low <= r <= 1 + b.high for r in ten) / len(ten) >= 0.8
    # all rows above the estimate: the band still holds the estimate itself (low 0).
    assert band_from_ratios([2.0, 3.0], "cnn").low == 0.0
    with pytest.raises(ValueError):
        band_from_ratios([], "none")
    with pytest.raises(ValueError):
        band_from_errors([-1.0], "estimate of zero")


def test_errors_turn_into_truth_over_estimate() -> None:
    # An estimate 20% below the truth (error -0.2) means truth = estimate / 0.8 = 1.25 x estimate: +25%.
    # One 25% above (error +0.25) means truth = 0.8 x estimate: -20%.
    b = band_from_errors([-0.2, 0.25], "two")
    assert (b.low, b.high) == pytest.approx((-0.2, 0.25))
    assert b.bounds(10.0) == pytest.approx((8.0, 12.5))


def test_band_text() -> None:
    assert ErrorBand(-0.15, 0.15, "x").text() == "typically within +-15%"
    assert ErrorBand(-0.19, 0.14, "x").text() == "typically within -19%/+14%"
    assert ErrorBand(-0.0167, 0.0152, "x").text() == "typically within -1.7%/+1.5%"
    assert ErrorBand(0.0, 2.2159, "x").text() == "typically within 0%/+222%"


def test_a_band_says_how_many_rows_stand_behind_it() -> None:
    """A band from fewer than FEW_ROWS rows reads as a rough guide (2 of 2 inside says nothing of the next run); one
    from more says its coverage; every reading says which way + points."""
    assert band_from_ratios([1.2, 1.5], "two").rows == 2
    assert band_from_ratios([1.2, 1.5], "two").reading() == (
        "only 2 runs behind it: a rough guide; + is slower than estimated"
    )
    many = band_from_ratios([1.0 + i / 100 for i in range(51)], "many")
    assert many.rows == 51
    assert many.reading("more memory") == "80% of 51 runs fell inside; + is more memory than estimated"
    assert ErrorBand(-0.1, 0.1, "uncounted").reading() == "+ is slower than estimated"
    assert TIME_BANDS[TimeKey("gpu", "ampere", "cnn")].rows == PUBLISHED_LOSO_BANDS[("ampere", "cnn")][2]
    assert MEMORY_BAND.rows == 78 and memory_band(Device.CUDA).rows == 78


def test_gpu_bands_are_bench_published_md_residual_bands() -> None:
    """The GPU bands are the leave-one-source-out table bench/PUBLISHED.md prints (python -m bench.published), row
    by row, and each is the entry its key gives."""
    text = (ROOT / "bench" / "PUBLISHED.md").read_text()
    table = {
        (g, w): (float(lo) / 100, float(hi) / 100, int(n), int(k))
        for g, w, n, lo, hi, k in re.findall(
            r"^\| ([a-z]+)/([a-z]+) \| (\d+) \| ([+-][\d.]+)% \| ([+-][\d.]+)% \| (\d+) \|$", text, re.M
        )
    }
    assert set(table) == set(PUBLISHED_LOSO_BANDS)
    for key, (lo, hi, n, k) in table.items():
        want = PUBLISHED_LOSO_BANDS[key]
        assert (want[0], want[1]) == pytest.approx((lo, hi), abs=6e-4) and want[2:] == (n, k), key
        band = TIME_BANDS[TimeKey("gpu", key[0], key[1])]  # type: ignore[arg-type]
        assert (band.low, band.high) == (want[0], want[1])
    # a generation without published CNN runs gets the widest CNN band
    pooled = TIME_BANDS[TimeKey("gpu", None, "cnn")]
    assert pooled.high == max(v[1] for (_, w), v in PUBLISHED_LOSO_BANDS.items() if w == "cnn")


def test_memory_and_cpu_bands_match_bench_results() -> None:
    """MEMORY_BAND and the CPU verification band are bench/results.json's per-case errors through
    band_from_errors: a rerun of the benchmark that moves them fails here until they are pasted in again."""
    memory, step = bench_case_errors(json.loads((ROOT / "bench" / "results.json").read_text()))
    assert len(memory) == 78 and len(step) == 71  # RESULTS.md: 78 cases, 71 with at most 25% of the CPUs taken
    m, s = band_from_errors(memory, "m"), band_from_errors(step, "s")
    assert (MEMORY_BAND.low, MEMORY_BAND.high) == pytest.approx((m.low, m.high), abs=1e-4)
    cpu = TIME_BANDS[TimeKey("cpu")]
    assert (cpu.low, cpu.high) == pytest.approx((s.low, s.high), abs=1e-4)
    assert str(len(memory)) in MEMORY_BAND.based_on and str(len(step)) in cpu.based_on


def test_every_band_holds_its_estimate() -> None:
    for key, band in TIME_BANDS.items():
        assert band.low <= 0 <= band.high, key
        assert band.based_on, key


@pytest.mark.parametrize(
    ("family", "name", "workload"),
    [
        ("transformer", "llama-2-7b", "transformer"),
        ("vision", "vit_b_16", "transformer"),
        ("vision", "resnet50", "cnn"),
        ("custom", "mypkg:build", "cnn"),
    ],
)
def test_workload_of(family: str, name: str, workload: str) -> None:
    assert workload_of(family, name) == workload


def _gpu_model(source: str) -> GpuModel:
    return GpuModel(0.7, 0.6, 0.5, 0.8, 1 << 20, 8e-6, source)


def test_time_key_by_generation_workload_calibration_and_device() -> None:
    gib80 = 80 * 2**30
    assert time_key(Device.CUDA, "A100-80GB", gib80, "transformer", "gpt2") == TimeKey("gpu", "ampere", "transformer")
    assert time_key(Device.CUDA, "NVIDIA H100 80GB HBM3", gib80, "transformer", "gpt2") == TimeKey(
        "gpu", "hopper", "transformer"
    )
    assert time_key(Device.CUDA, "A100-80GB", gib80, "vision", "resnet50") == TimeKey("gpu", "ampere", "cnn")
    assert time_key(Device.CUDA, "RTX4090", 24 * 2**30, "vision", "resnet50") == TimeKey("gpu", None, "cnn")
    calibrated = _gpu_model("calibrated on this machine, 2026-12-03")
    assert time_key(Device.CUDA, "H100-80GB", gib80, "transformer", "gpt2", calibrated) == TimeKey("calibrated")
    trial = _gpu_model("a fit's trial values")
    assert time_key(Device.CUDA, "H100-80GB", gib80, "transformer", "gpt2", trial).path == "gpu"
    assert time_key(Device.CPU, "cpu", None, "transformer", "gpt2") == TimeKey("cpu")
    assert memory_band(Device.CPU) == MEMORY_BAND
    assert (memory_band(Device.CUDA).low, memory_band(Device.CUDA).high) == (MEMORY_BAND.low, MEMORY_BAND.high)


def test_json_has_a_time_and_memory_band_on_every_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llama-2-7b", "--gpus", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = [s for s in doc["strategies"] if s["applicable"]]
    assert sum(s["time"] is not None for s in rows) >= 5
    fitted = TIME_BANDS[TimeKey("gpu", "ampere", "transformer")]  # the default preset is an A100
    offload = TIME_BANDS[TimeKey("offload")]
    assert (offload.low, offload.high) == pytest.approx((0.0, 4.199))  # OFFLOAD_SHOWN_RATIOS: O54 2K's 5.199
    assert sum(s["name"].endswith("_offload") for s in rows) >= 2
    for s in rows:
        band = s["time"]["error_band"]
        assert band["low"] <= 0 < band["high"], s["name"]
        assert band == (offload if s["name"].endswith("_offload") else fitted).as_dict(), s["name"]
        mem = s["memory_error_band"]
        assert mem["low"] < 0 < mem["high"] and "CPU runs" in mem["based_on"]


def _small_plan(gpu: str, hardware_source: str | None = None):
    inputs = plan_inputs(detect_hardware=False, model="gpt2", seq_len=128, gpus=2, gpu=gpu, micro_batch_size=2)
    if hardware_source is None:
        return plan(inputs)
    hw = replace(resolve_hardware(inputs.cluster), gpu_model=_gpu_model(hardware_source))
    return plan(inputs, hardware=hw)


def test_borrowed_and_calibrated_gpus_get_their_bands() -> None:
    borrowed = plan_to_dict(_small_plan("H100-80GB"))
    want = TIME_BANDS[TimeKey("gpu", "hopper", "transformer")].as_dict()
    on_gpu = [s for s in borrowed["strategies"] if s.get("time") and not s["name"].endswith("_offload")]
    assert on_gpu and all(s["time"]["error_band"] == want for s in on_gpu)
    assert (want["low"], want["high"]) == PUBLISHED_LOSO_BANDS["hopper", "transformer"][:2]
    calibrated = plan_to_dict(_small_plan("H100-80GB", "calibrated on this machine, 2026-12-03"))
    want = TIME_BANDS[TimeKey("calibrated")].as_dict()
    on_gpu = [s for s in calibrated["strategies"] if s.get("time") and not s["name"].endswith("_offload")]
    assert on_gpu and all(s["time"]["error_band"] == want for s in on_gpu)
    assert "calibrated" in str(want["based_on"])


def test_text_gives_the_chosen_rows_bands() -> None:
    p = _small_plan("A100-80GB")
    text = render_text(p)
    rec = p.recommendation.strategy
    band = TIME_BANDS[TimeKey("gpu", "ampere", "transformer")]
    step = next(line for line in text.splitlines() if line.startswith(f"{rec}: ") and "per step" in line)
    assert band.text() == "typically within -17%/+8.0%" and band.text() in step  # PUBLISHED_LOSO_BANDS ampere
    mem = next(line for line in text.splitlines() if line.startswith(f"{rec}: peak allocated"))
    assert "typically within -1.6%/+3.3%" in mem
    # the table keeps its columns: no band in any table cell
    table = text.split("Step time of one optimizer step")[1].split("comm: all communication")[0]
    assert "typically" not in table


def test_train_time_line_carries_the_band() -> None:
    inputs = plan_inputs(
        detect_hardware=False,
        model="gpt2",
        seq_len=128,
        gpus=2,
        gpu="A100-80GB",
        micro_batch_size=2,
        train_tokens=10**9,
    )
    text = render_text(plan(inputs))
    line = next(line for line in text.splitlines() if ": train time " in line)
    assert line.endswith("typically within -17%/+8.0%")  # PUBLISHED_LOSO_BANDS ampere transformer


def test_a_step_mostly_waiting_on_the_network_says_the_band_may_not_hold() -> None:
    """The GPU bands come from runs in one node or over InfiniBand/RoCE: a step whose exposed communication is
    above COMM_BOUND_SHARE of it (gpt2 on 2 nodes over 1 Gb Ethernet) says its error can be wider; the same job in
    one node does not."""
    from advisor.text_report import COMM_BOUND_SHARE

    def lines(**cluster):
        inputs = plan_inputs(
            detect_hardware=False, model="gpt2", seq_len=128, gpu="A100-80GB", micro_batch_size=2, **cluster
        )
        p = plan(inputs)
        row = p.row(p.recommendation.strategy)
        share = row.time.exposed_comm_s / row.time.step_s
        return share, [line for line in render_text(p).splitlines() if "communication compute does not hide" in line]

    share, said = lines(gpus=8, nodes=2, network="1gbe")
    assert share > COMM_BOUND_SHARE and len(said) == 1 and f"{100 * share:.0f}% of this step" in said[0]
    share, said = lines(gpus=2)
    assert share < COMM_BOUND_SHARE and said == []
