"""bench.published: the published GPU runs as typed rows, their predictions on three small rows, and the fitter
of the compute model's constants on a synthetic predictor whose constants are known."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from advisor.timing.gpu_model import GpuModel
from bench.published import error, evaluate, in_unit, stats
from bench.published_cases import REQUIRED, S_EPOCH, TOK_S_GPU, Case, cases
from bench.published_fit import FIELDS, Target, band, default_fields, fit_group, leave_one_source_out, summary
from bench.published_other import NOT_EXPRESSED

SMALL = ("F41", "F42", "F62")


def _case(row: str) -> Case:
    return next(c for c in cases() if c.row == row)


def test_small_rows_are_the_published_configurations() -> None:
    """Hand-checked against published_runs.md: F41 MPT-125m seq 2048, 8 x A100 80GB, mb 40, GA 2 (gbs 640),
    142,830 tok/s/GPU; F42 seq 512, mb 128, GA 2 (gbs 2048), 165,681; F62 8 x A100 40GB, MP PURE, mb 26, GA 3
    (gbs 624), 136,334. MPT-125m: L12 d768 h12."""
    want = {
        "F41": (2048, "A100-80GB", 40, 2, 640, "bf16", 142830),
        "F42": (512, "A100-80GB", 128, 2, 2048, "bf16", 165681),
        "F62": (2048, "A100-40GB", 26, 3, 624, "pure-bf16", 136334),
    }
    for row, (seq, gpu, mb, ga, gbs, precision, tok) in want.items():
        c = _case(row)
        assert (c.seq, c.gpu, c.micro_batch, c.grad_accum, c.gpus, c.published) == (seq, gpu, mb, ga, 8, tok)
        assert c.micro_batch * c.grad_accum * c.gpus == gbs and c.unit == TOK_S_GPU
        v = c.plan_values()
        assert (v["seq_len"], v["gpu"], v["gpus"], v["nodes"], v["micro_batch_size"]) == (seq, gpu, 8, 1, mb)
        assert v["precision"] == precision and v["activation_checkpointing"] is False and c.strategy == "fsdp2"
        cfg = v["config_dict"]
        assert isinstance(cfg, dict)
        assert (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_inner"]) == (12, 768, 12, 3072)
        assert (cfg["vocab_size"], cfg["n_positions"]) == (50368, seq)


def test_every_required_row_is_expressed_or_listed_with_a_reason() -> None:
    rows = [c.row for c in cases()]
    assert len(rows) == len(set(rows))
    expressed = {c.base_id for c in cases()}
    listed = {rid.split()[0] for rid, why in NOT_EXPRESSED if why}
    missing = [r for r in REQUIRED if r not in expressed and r not in listed]
    assert not missing
    assert "F25" in listed and "F25" not in expressed  # FP8
    for pp in ("O33", "O34"):  # BLOOM's ZeRO-1 x TP x PP
        assert any(rid == pp and "pipeline" in why for rid, why in NOT_EXPRESSED)
    # Megatron's pipeline rows on the estimate-only pipeline row, shown and not fitted, at the published batch: the
    # micro-batches per pipeline m of published_runs.md (O19 12, O20 28, O21 144, O22 280; O25/O26 mb 1 assumed)
    pp = {c.row: c for c in cases() if c.strategy == "pp"}
    order = ("O19", "O20", "O21", "O22", "O25", "O26")
    assert sorted(pp) == list(order) and not any(c.fitted for c in pp.values())
    assert [pp[r].grad_accum for r in order] == [12, 28, 144, 280, 16, 32]
    assert [pp[r].extra["pp_degree"] for r in order] == [2, 4, 16, 35, 4, 8]
    assert [pp[r].extra.get("pp_virtual_stages") for r in order] == [None, 3, 2, 3, None, None]
    # ResNet-50 from O73/O74's notes, 1 and 8 GPUs each, as Lambda's 80 GB config runs it: batch 1280 per GPU, the
    # default NCHW layout, SGD with momentum
    rn = [c for c in cases() if c.model == "resnet50"]
    assert sorted(c.row for c in rn) == ["O73-rn50-1", "O73-rn50-8", "O74-rn50-1", "O74-rn50-8"]
    assert all(c.micro_batch == 1280 and "NCHW" in c.note for c in rn)
    assert all(c.plan_values()["optimizer"] == "sgd-momentum" for c in rn)
    assert len([c for c in cases() if c.source == "LF"]) == 61


def test_figures_in_their_units() -> None:
    """One epoch of 1,000 samples at 10 per rank x 2 ranks per 2 s step: 50 steps, 100 s; published 50 s -> the
    prediction is half as fast: -50%. tokens/s/GPU: 40 x 2 x 8 x 2048 tokens per 1.0 s over 8 GPUs = 163,840."""
    epoch = Case("x", "HF", "gpt2", 12, "TITANRTX", 2, 1, None, "ddp", "fp32", False, 10, 1, 50.0, S_EPOCH, "",
                 samples=1000)  # fmt: skip
    assert in_unit(epoch, 2.0, 2) == pytest.approx(100.0)
    assert error(epoch, 100.0) == pytest.approx(-0.5)
    assert in_unit(_case("F41"), 1.0, 8) == pytest.approx(163840.0)
    assert error(_case("F41"), 163840.0) == pytest.approx(163840 / 142830 - 1)


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_bench_published_predicts_three_small_rows(monkeypatch: pytest.MonkeyPatch, no_what_if_traces: None) -> None:
    # The plans' offers of LoRA / QLoRA and checkpointed variants (where advisor finds nothing fits) are no part
    # of a row's figures and cost traces of their own: the suite does without them.
    monkeypatch.setattr("advisor.plan.alternatives", lambda *args, **kwargs: ())
    monkeypatch.setattr("advisor.plan.checkpointed", lambda *args, **kwargs: None)
    results = evaluate([_case(r) for r in SMALL], do_fit=False, log=False)
    assert not results.failed
    for r in results.rows:
        assert math.isfinite(r.predicted) and 0.5 < r.predicted / r.case.published < 2.0, (r.case.row, r.predicted)
        assert r.step.step_s == pytest.approx(r.step.compute_s + r.step.exposed_comm_s + r.step.optimizer_s)
    s = stats(results.rows)
    assert s.all["n"] == 3 and set(s.bands) == {"ampere/transformer"}


TRUE = GpuModel(0.7, 0.45, 0.55, 0.8, 2 << 20, 12e-6, "truth")
START = GpuModel(1.0, 1.0, 1.0, 1.0, 1 << 20, 10e-6, "start")


def _synthetic(seed: int, n: int) -> list[Callable[[GpuModel], float]]:
    """Stand-in predictors: a throughput 1 / (GEMM + conv + attention seconds at their shares, memory seconds at
    the bandwidth share slowed by small tensors, and ops x dispatch), with random work per row."""
    rng = random.Random(seed)
    out: list[Callable[[GpuModel], float]] = []
    for _ in range(n):
        a, c, d, b = (rng.uniform(0.0, 1.0) for _ in range(4))
        size, ops = 2 ** rng.uniform(16, 26), rng.uniform(0, 50000)

        def predict(m: GpuModel, a: float = a, c: float = c, d: float = d, b: float = b, s: float = size,
                    k: float = ops) -> float:  # fmt: skip
            bw = b / m.bandwidth * (1 + m.half_bandwidth_bytes / s)
            return 1.0 / (a / m.gemm + c / m.conv + d / m.attention + bw + k * m.dispatch_s)

        out.append(predict)
    return out


def test_the_fitter_recovers_known_constants() -> None:
    targets = [Target(f"r{i}", "g", f"s{i % 3}", p(TRUE), p) for i, p in enumerate(_synthetic(7, 24))]
    fit = fit_group(targets, START, FIELDS)
    assert fit.responsive and fit.rms_log_error < 0.01
    for name in ("gemm", "conv", "attention", "bandwidth", "half_bandwidth_bytes", "dispatch_s"):
        assert getattr(fit.model, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
    # cross-validation: each source's rows predicted by a fit on the other two sources, as good on exact data (from a
    # borrowed start, so that the folds fit the attention share too: default_fields)
    from advisor.timing.gpu_model import BORROWED

    held = leave_one_source_out(targets, {"g": replace(START, source=BORROWED + "Ampere's")})
    assert max(abs(held[t.key] / t.published - 1) for t in targets) < 0.05


def test_the_attention_share_stays_at_its_microbenchmark_unless_borrowed() -> None:
    from advisor.timing.gpu_model import BORROWED

    targets = [Target(f"r{i}", "g", f"s{i % 3}", p(TRUE), p) for i, p in enumerate(_synthetic(7, 24))]
    assert default_fields(START, 24) == ("gemm", "conv", "bandwidth", "half_bandwidth_bytes", "dispatch_s")
    assert default_fields(START, 9) == ("gemm",)
    held = fit_group(targets, START)
    assert held.model.attention == START.attention  # the microbenchmark's 1.0, not TRUE's
    borrowed = replace(START, source=BORROWED + "Ampere's")
    assert default_fields(borrowed, 24) == FIELDS
    assert fit_group(targets, borrowed).model.attention == pytest.approx(TRUE.attention, rel=0.05)


def test_a_predictor_that_ignores_the_constants_is_not_fitted() -> None:
    flat = [Target("a", "g", "s", 2.0, lambda m: 1.0), Target("b", "g", "s", 1.0, lambda m: 1.0)]
    fit = fit_group(flat, START)
    assert fit.model == START and not fit.responsive
    assert fit.rms_log_error == pytest.approx(math.sqrt(math.log(0.5) ** 2 / 2))


def test_band_and_summary_by_hand() -> None:
    """Residuals -0.1, -0.05, 0.05, 0.2, 0.3; 80% of 5 is 4 rows: windows [-0.1, 0.2] (0.3 wide) and
    [-0.05, 0.3] (0.35): the first. Summary: median |e| 0.1, worst 0.3."""
    assert band([0.2, -0.1, 0.3, 0.05, -0.05]) == (pytest.approx(-0.1), pytest.approx(0.2), 4)
    assert band([0.1, 0.2, 0.3]) == (0.0, pytest.approx(0.3), 3)  # widened to include 0
    s = summary([0.2, -0.1, 0.3, 0.05, -0.05])
    assert (s["n"], s["median"], s["worst"]) == (5, pytest.approx(0.1), pytest.approx(0.3))
    assert s["bias"] == pytest.approx(math.exp(sum(math.log1p(e) for e in (0.2, -0.1, 0.3, 0.05, -0.05)) / 5) - 1)


def test_source_overlap_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron's own overlap (bench.published.source_overlap) on a stand-in step: a 1 s TP all-reduce in 100 calls
    beside 4 s of compute, 400 MB of 4-byte gradients (100M parameters) on a fabric that all-reduces 1 GB/s (reduce-
    scatter and all-gather 2 GB/s), a last backward of 2 s and a forward of 0.05 s, an optimizer step of 0.16 s over
    DP 8."""
    from types import SimpleNamespace

    from advisor.timing.step import Collective, StepTime
    from bench.published import source_overlap
    from bench.published_case import OVERLAP_DDP, OVERLAP_MEGATRON_CORE

    fabric = SimpleNamespace(time_s=lambda kind, n: n / (1e9 if kind == "all_reduce" else 2e9))
    monkeypatch.setattr("strategies.base.timing_of", lambda ctx: object())
    monkeypatch.setattr("strategies.base.fabric_of", lambda *args, **kwargs: fabric)
    c = SimpleNamespace(fwd_s=0.05, bwd_s=2.0)
    row = SimpleNamespace(strategy=SimpleNamespace(compute_time=lambda ctx, t, deg: c), tp_degree=2, dp_size=8)
    ctx = SimpleNamespace(
        hardware=SimpleNamespace(gpus_per_node=8, num_nodes=2),
        profile=SimpleNamespace(tp_stats=lambda deg: SimpleNamespace(num_trainable=100_000_000)),
    )
    tp = Collective("activation all-reduce", "all_reduce", "tensor-parallel", 1 << 20, 100, 1.0, 1.0)
    dp = Collective("gradient all-reduce", "all_reduce", "data-parallel", 400_000_000, 50, 0.9, 0.9)
    t = StepTime(1, 1, 4.0, 1.9, 1.9, 0.16, 1, 1, 1.0, "none", (tp, dp))
    base = replace(_case("O23"), overlap=OVERLAP_DDP)
    # torch DDP: 400 MB in 25 MiB buckets, 15 full and one of 6,784,000 bytes; all but the last hide behind 2 s of
    # backward; the TP all-reduces all exposed; the optimizer unchanged.
    ddp = source_overlap(base, ctx, row, t)  # type: ignore[arg-type]
    assert ddp.exposed_comm_s == pytest.approx((400_000_000 - 15 * 25 * 2**20) / 1e9 + 1.0)
    assert ddp.optimizer_s == 0.16
    # Megatron-core: buckets of 40M parameters (160 MB: 160, 160, 80 MB); the reduce-scatter (0.2 s) beside the
    # backward exposes its last bucket (0.04 s); the all-gather (0.2 s in 3 buckets) beside a 0.05 s forward exposes
    # 0.2 - 0.05 x 2 / 3 (exposed_s); the TP calls hide behind 4 s of compute; the optimizer steps 1 / 8 of the states.
    core = source_overlap(replace(base, overlap=OVERLAP_MEGATRON_CORE), ctx, row, t)  # type: ignore[arg-type]
    assert core.exposed_comm_s == pytest.approx(0.04 + (0.2 - 0.05 * 2 / 3)) and core.optimizer_s == pytest.approx(0.02)
    assert core.step_s == pytest.approx(4.0 + core.exposed_comm_s + 0.02)
    with pytest.raises(ValueError, match="unknown overlap"):
        source_overlap(replace(base, overlap="nope"), ctx, row, t)  # type: ignore[arg-type]
