"""The layout search (``--top N``, ``advisor.layout_search``): every candidate is what the strategy's own row gives
when its flags are pinned, fits, trains the one global batch; pinned degrees restrict it; the JSON and the table
carry it; models TP and PP cannot cut get data-parallel layouts only."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.layout_search import best_layout
from advisor.plan import plan
from advisor.schema import plan_inputs

TINY = dict(
    model_type="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=256,
    max_position_embeddings=128,
)
# 2 nodes of 4 GPUs: every layout of 8 GPUs validates for the tiny Llama (4 heads, 4 blocks).
ASK = dict(
    config_dict=TINY,
    seq_len=32,
    gpus=4,
    nodes=2,
    gpu="A100-80GB",
    detect_hardware=False,
    precision="bf16",
    micro_batch_size=None,
    global_batch_size=64,
    top=100,
)


@pytest.fixture(scope="module")
def searched():
    return plan(plan_inputs(**ASK))


def test_every_candidate_is_its_pinned_row(searched):
    found = searched.layouts
    assert found, "the tiny model fits every layout"
    layouts = {c.layout.label() for c in found}
    # TP inside a node (1, 2, 4), PP across (1, 2, 4: at most the 4 blocks), data parallel the rest
    assert {"dp 8", "dp 4 x tp 2", "dp 2 x tp 4", "dp 4 x pp 2", "dp 2 x tp 2 x pp 2", "tp 4 x pp 2"} <= layouts
    assert all(c.layout.pp <= 4 and c.layout.tp <= 4 and c.layout.world_size == 8 for c in found)
    rates = [c.samples_per_s for c in found]
    assert rates == sorted(rates, reverse=True)
    checked = 0
    for c in found:
        assert c.micro_batch_size * c.layout.dp * c.grad_accum_steps == c.global_batch_size == 64
        assert c.device_total <= searched.hardware.gpu_memory_bytes
        if c.layout.pp > 1:  # by hand: (p - 1) / m for 1F1B, (p - 1) / (v m) interleaved (v = 2 chunks per rank)
            v = 2 if c.schedule == "interleaved-1f1b" else 1
            assert c.bubble_fraction == (c.layout.pp - 1) / (v * c.grad_accum_steps)
            assert ("--pp-schedule interleaved-1f1b" in c.flags()) == (v == 2)
            assert len(c.stage_totals) == c.layout.pp and max(c.stage_totals) <= c.device_total
        if c.micro_batch_size in (1, 8) and (c.layout.pp > 1 or c.layout.tp > 1 or c.strategy == "zero3"):
            pinned = plan(
                plan_inputs(
                    **dict(ASK, top=None, micro_batch_size=c.micro_batch_size),
                    tp_degree=c.layout.tp if c.layout.tp > 1 else None,
                    pp_degree=c.layout.pp if c.layout.pp > 1 else None,
                    pp_schedule=c.schedule if c.layout.pp > 1 else None,
                    activation_checkpointing=c.activation_checkpointing,
                )
            )
            row = pinned.row(c.strategy)
            assert row.memory is not None and row.time is not None
            assert (row.memory.device_total, row.time.step_s) == (c.device_total, c.step_s), c
            assert row.grad_accum_steps == c.grad_accum_steps
            checked += 1
    assert checked >= 6
    # both schedules on a 2-stage layout of the 4 blocks (interleaved: 2 chunks of 1 block per rank)
    assert {c.schedule for c in found if c.layout.label() == "dp 4 x pp 2"} == {"1f1b", "interleaved-1f1b"}


def test_the_search_takes_the_least_model_parallel_within_the_tie_band(searched):
    best = best_layout(searched.layouts)
    assert best is not None and best.estimate_only is None
    runnable = [c for c in searched.layouts if c.estimate_only is None]
    assert best.samples_per_s * 1.1 >= max(c.samples_per_s for c in runnable)
    tied = [c for c in runnable if c.samples_per_s * 1.1 >= runnable[0].samples_per_s]
    assert (best.layout.pp, best.layout.tp) == min((c.layout.pp, c.layout.tp) for c in tied)
    # PP x TP has no script: sized and timed, never taken
    assert any(c.estimate_only for c in searched.layouts if c.layout.pp > 1 and c.layout.tp > 1)


def test_pinned_degrees_restrict_the_search():
    p = plan(plan_inputs(**dict(ASK, top=5), tp_degree=2))
    assert p.layouts and {c.layout.tp for c in p.layouts} == {2}
    one = plan(plan_inputs(**dict(ASK, top=5, micro_batch_size=2)))
    assert one.layouts and {c.micro_batch_size for c in one.layouts} == {2}


def test_a_model_tp_cannot_cut_gets_data_parallel_layouts_only():
    p = plan(plan_inputs(model="resnet18", gpus=4, nodes=2, gpu="A100-80GB", detect_hardware=False, top=3))
    assert p.layouts and all(c.layout.label() == "dp 8" for c in p.layouts)


def test_json_and_table(tmp_path, capsys):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    argv = ["--config", str(cfg), "--seq-len", "32", "--gpus", "4", "--nodes", "2", "--gpu", "A100-80GB"]
    argv += ["--precision", "bf16", "--global-batch-size", "64", "--top", "3"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    layouts = doc["layouts"]
    assert len(layouts) == 3 and all(d["global_batch_size"] == 64 for d in layouts)
    assert layouts[0]["step_s"] <= layouts[1]["step_s"] <= layouts[2]["step_s"]
    assert sum(d["best"] for d in layouts) <= 1
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "Layout search at global batch 64" in text and "\ntakes " in text
    # the flags plan the row as sized (the search's global batch); --emit with --strategy writes its script
    assert text.count("--global-batch-size 64") >= 3 and "writes its script" in text


def test_a_global_batch_of_the_pinned_data_parallel_size_plans():
    # Megatron-LM's rule: the global batch is a multiple of micro-batch x data-parallel size. 12 samples on 8 GPUs
    # at TP 2: 4 data-parallel ranks take 3 micro-batches each; the 8-rank rows cannot split 12 and say so.
    ask = dict(ASK, top=None, micro_batch_size=1, global_batch_size=12)
    p = plan(plan_inputs(**ask, tp_degree=2))
    tp = p.row("tp_dp")
    assert tp.applicable and (tp.dp_size, tp.grad_accum_steps, tp.global_batch_size) == (4, 3, 12)
    ddp = p.row("ddp")
    assert not ddp.applicable and "12 does not split over its 8 data-parallel ranks" in (ddp.reason or "")
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match="not a multiple of micro-batch 1 x 8 GPUs = 8"):
        plan(plan_inputs(**ask))
    with pytest.raises(AdvisorError, match=r"micro-batch 1 x 8 data-parallel ranks \(GPUs / tp x pp\) = 8"):
        plan(plan_inputs(**dict(ask, gpus=8, nodes=2, global_batch_size=12), tp_degree=2))


def test_pp_1_pins_no_pipeline_as_tp_1_pins_no_tp(searched):
    """--pp 1 is no pipeline, as --tp 1 is no TP: no pipeline row, and the search keeps to layouts without stages."""
    free = searched
    assert any(c.layout.pp > 1 for c in free.layouts)
    pinned = plan(plan_inputs(**ASK, pp_degree=1))
    assert pinned.layouts and all(c.layout.pp == 1 for c in pinned.layouts)
    assert {r.name for r in pinned.rows} == {r.name for r in free.rows}  # no pipeline row either
    assert [c.key for c in pinned.layouts] == [c.key for c in free.layouts if c.layout.pp == 1]


def test_nothing_fits_headline_points_to_the_search(searched):
    """When nothing fits at the planned settings but the search found layouts that do, the headline says what the
    search takes instead of reading as a dead end (a new user stopped at "nothing fits" above a fitting pick)."""
    from dataclasses import replace

    from advisor.text_report import render_text

    none = replace(searched, recommendation=replace(searched.recommendation, strategy=None))
    best = best_layout(searched.layouts, None)
    head = next(t for t in render_text(none).splitlines() if t.startswith("Recommendation:"))
    assert head == (
        "Recommendation: none - nothing fits this hardware at these settings; the layout search below finds "
        f"{len(searched.layouts)} that fit and takes {best.layout.label()} with {best.title} ({best.flags()})"
    )
    empty = replace(none, layouts=[])
    assert "Recommendation: none - nothing fits this hardware\n" in render_text(empty) + "\n"
