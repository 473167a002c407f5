"""The pipeline row (``strategies/pp.py``): only when ``--pp-degree`` (``--pp``) pins it, sized per stage (the
most-loaded stage is the peak, every stage listed), timed as 1F1B with its bubble; PP x DP has a script (a choice
of the recommender), PP x TP and fp16 rows are estimate-only (never recommended, never emitted). The script's runs:
tests/test_pp_scripts.py."""

from __future__ import annotations

import json

import pytest

from advisor.cli import main
from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies import strategy_names
from strategies.base import timing_of
from strategies.pipeline import block_compute, stages
from strategies.pp import PP_FP16_BLOCKER, PP_TP_BLOCKER, PP_ZERO1_BLOCKER

H, FFN, V = 64, 128, 256
TINY = dict(
    model_type="llama",
    hidden_size=H,
    intermediate_size=FFN,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=V,
    max_position_embeddings=128,
)
ASK = dict(
    config_dict=TINY,
    seq_len=32,
    gpus=4,
    gpu="A100-80GB",
    detect_hardware=False,
    precision="bf16",
    micro_batch_size=2,
    global_batch_size=16,
)


@pytest.fixture(scope="module")
def pinned():
    return plan(plan_inputs(**ASK, pp_degree=2))


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_no_pin_no_row():
    p = plan(plan_inputs(**ASK))
    assert [r.name for r in p.rows] == list(strategy_names())
    assert "pp" not in strategy_names() and "pp_zero1" not in strategy_names()  # not --strategy choices either


def test_the_pinned_row_is_sized_per_stage(pinned):
    row = pinned.row("pp")
    assert row.applicable and (row.dp_size, row.tp_degree) == (2, 1)
    # 16 samples over micro-batch 2 x 2 replicas: 4 micro-batches per step through the pipeline
    assert row.grad_accum_steps == 4
    s0, s1 = stages(pinned.context(), row.strategy.layout(pinned.context()), micro_batches=4)
    peak = row.memory.peak
    # stage 0 (2 blocks + embedding) is the most loaded: 2 micro-batches in flight; the replicas average the 4
    # micro-batches' accumulated gradients by hand (one fp32 copy, no DDP buckets); from the second micro-batch on
    # the embedding's fp32 gradient (V x H, its largest weight) is made before it is added into .grad
    assert s0.total > s1.total
    assert (peak.params, peak.optimizer_states, peak.activations, peak.buffers, peak.other) == (
        s0.params,
        s0.optimizer_states,
        s0.activations,
        s0.buffers,
        s0.other,
    )
    assert peak.grads == s0.grads == 4 * s0.params_numel
    assert s0.other == 4 * V * H and s1.other > 4 * V * H  # the last stage: the head's and the logits' temporaries
    assert peak.phase.startswith("forward (stage 0 of 2")
    notes = row.memory.notes
    assert len(notes) == 2 and notes[0].startswith("stage 0: 2 blocks + embedding")
    assert notes[1].startswith("stage 1: 2 blocks + head")


def test_the_pinned_row_is_timed_as_1f1b(pinned):
    ctx, row = pinned.context(), pinned.row("pp")
    t = row.time
    block, rest = block_compute(ctx, timing_of(ctx).rates, 1, 2)
    # the slowest stage is the last (its 2 blocks and the head); ideal 4 (t_f + t_b), bubble (2 - 1) / 4 of it
    f, b = 2 * block.fwd_s + rest.fwd_s, 2 * block.bwd_s + rest.bwd_s
    assert t.compute_s == pytest.approx(4 * (f + b) * (1 + 1 / 4))
    assert any("pipeline bubble 25.0%" in n for n in t.notes)
    kinds = {c.group: c for c in t.collectives}
    # 2 sends per micro-batch (hidden states forward, their gradient backward) of s x b x h bf16, 2 on the path
    p2p = kinds["pipeline-parallel"]
    assert (p2p.nbytes, p2p.calls) == (32 * 2 * H * 2, 8)
    assert p2p.exposed_s == pytest.approx(p2p.seconds / 4)
    assert "data-parallel" in kinds


def test_interleaved_and_gpipe_schedules(pinned):
    """Interleaved 1F1B with 2 chunks per rank: the bubble (p - 1) / (v m) = 1 / 8, the critical path crosses
    2 (p v - 1) = 6 boundaries, each of the 4 micro-batches goes through 2 chunks (16 sends); GPipe holds all 4
    micro-batches on the first stage."""
    ctx = pinned.context()
    block, rest = block_compute(ctx, timing_of(ctx).rates, 1, 2)
    f, b = 2 * block.fwd_s + rest.fwd_s, 2 * block.bwd_s + rest.bwd_s  # the last rank: chunks 1 and 3 + the head
    inter = plan(plan_inputs(**ASK, pp_degree=2, pp_schedule="interleaved-1f1b"))
    row = inter.row("pp")
    assert row.time.compute_s == pytest.approx(4 * (f + b) * (1 + 1 / 8))
    assert any("bubble 12.5%" in n for n in row.time.notes)
    p2p = next(c for c in row.time.collectives if c.group == "pipeline-parallel")
    assert p2p.calls == 16 and p2p.exposed_s == pytest.approx(6 * p2p.seconds / 16)
    s0 = stages(inter.context(), row.strategy.layout(inter.context()), inter.options.pp_schedule, 0, 4, virtual=2)[0]
    # (2 (2 - 0 - 1) + (2 - 1) 2 + 1) / 2 = 2.5 micro-batches of the rank's 2 blocks in flight
    assert s0.in_flight == 2.5 and row.memory.peak.activations == s0.activations
    gpipe = plan(plan_inputs(**ASK, pp_degree=2, pp_schedule="gpipe")).row("pp")
    assert "gpipe: 4 micro-batches in flight" in gpipe.memory.peak.phase


def test_pp_x_tp_and_fp16_rows_are_estimate_only(pinned):
    """PP x DP has a script, so it is among the recommender's choices; PP x TP and fp16 rows are sized and timed,
    never recommended (``advisor.candidates.eligible``), and say why."""
    assert pinned.row("pp").estimate_only is None
    for extra, why in ((dict(tp_degree=2), PP_TP_BLOCKER), (dict(precision="fp16"), PP_FP16_BLOCKER)):
        p = plan(plan_inputs(**{**ASK, **extra}, pp_degree=2))
        row = p.row("pp")
        assert row.applicable and row.memory is not None and row.time is not None
        assert row.estimate_only == why and p.recommendation.strategy != "pp"


def test_cli_short_and_long_spellings(tmp_path, capsys):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    base = ["--config", str(cfg), "--seq-len", "32", "--gpus", "4", "--gpu", "A100-80GB", "--micro-batch-size", "2"]
    docs = []
    for spelling in ("--pp", "--pp-degree"):
        assert main([*base, "--global-batch-size", "16", spelling, "2", "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["strategies"] == docs[1]["strategies"]
    row = next(r for r in docs[0]["strategies"] if r["name"] == "pp")
    assert "estimate_only" not in row and len(row["memory_notes"]) == 2
    zero1 = next(r for r in docs[0]["strategies"] if r["name"] == "pp_zero1")
    assert zero1["estimate_only"] == PP_ZERO1_BLOCKER and len(zero1["memory_notes"]) == 2
    others = [r for r in docs[0]["strategies"] if r["name"] not in ("pp", "pp_zero1")]
    assert others and all("estimate_only" not in r and "memory_notes" not in r for r in others)
    assert main([*base, "--pp", "2"]) == 0
    text = capsys.readouterr().out
    assert "pp: stage 0: 2 blocks + embedding" in text and "pp: stage 1: 2 blocks + head" in text


def test_pp_x_zero1_shards_the_optimizer_states_over_the_replicas(pinned):
    """Megatron-LM's distributed optimizer on the pipeline: each of the 2 replicas of a stage keeps half of the
    stage's AdamW states (2 fp32 moments, P_os), weights and gradients whole; its gradients are reduce-scattered and
    the updated weights all-gathered (the all-reduce's bytes), and it steps half of the stage; never recommended,
    never emitted."""
    ddp, zero1 = pinned.row("pp"), pinned.row("pp_zero1")
    assert zero1.applicable and zero1.estimate_only == PP_ZERO1_BLOCKER
    assert pinned.recommendation.strategy != "pp_zero1"
    ctx = pinned.context()
    s0 = stages(ctx, ddp.strategy.layout(ctx), micro_batches=4)[0]
    z0 = stages(ctx, zero1.strategy.layout(ctx), zero_stage=1, micro_batches=4)[0]
    assert s0.optimizer_states == 2 * 4 * s0.params_numel  # AdamW's two fp32 moments, whole on each replica
    assert z0.optimizer_states == -(-2 * 4 * s0.params_numel // 2)  # half of them (ceil per stage)
    a, b = ddp.memory.peak, zero1.memory.peak
    assert (b.params, b.grads, b.activations, b.buffers) == (a.params, a.grads, a.activations, a.buffers)
    assert a.total - b.total == s0.optimizer_states - z0.optimizer_states
    kinds = [c.kind for c in zero1.time.collectives if c.group == "data-parallel"]
    assert kinds == ["reduce_scatter", "all_gather"]
    assert [c.kind for c in ddp.time.collectives if c.group == "data-parallel"] == ["all_reduce"]
    assert zero1.time.optimizer_s == pytest.approx(ddp.time.optimizer_s / 2, rel=0.01)
    assert zero1.time.compute_s == ddp.time.compute_s


def test_an_estimate_only_row_is_refused_in_one_line_before_the_plan(tmp_path, capsys):
    """--emit or --verify of an estimate-only row: one line saying why there is no script, before pages of a plan
    (a new user read the whole plan, ~5 s, before --verify refused), never a torchrun line; nothing written."""
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    argv = ["--config", str(cfg), "--seq-len", "32", "--gpus", "4", "--gpu", "A100-80GB", "--pp", "2"]
    for flags, verb in ((["--emit", str(tmp_path / "out")], "emit"), (["--verify"], "verify")):
        assert main([*argv, "--strategy", "pp_zero1", *flags]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines() == [f"advisor: error: cannot {verb} pp_zero1: {PP_ZERO1_BLOCKER}"]
    assert not (tmp_path / "out").exists()


def test_verifying_an_estimate_only_row_refuses_before_calibrating(tmp_path, monkeypatch):
    """--verify --strategy pp_zero1 said why there is no script only after calibrating this machine's CPU (about 10
    s): the refusal now comes first, and nothing is written."""
    from advisor import verify_setup
    from advisor.errors import AdvisorError
    from advisor.verify import verify

    def calibrated(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("calibrated before refusing")

    monkeypatch.setattr(verify_setup, "calibrated", calibrated)
    inputs = plan_inputs(config_dict=TINY, seq_len=32, gpus=4, gpu="A100-80GB", pp_degree=2, detect_hardware=False)
    with pytest.raises(AdvisorError) as err:
        verify(inputs, "pp_zero1", steps=1, out_dir=str(tmp_path / "run"))
    assert str(err.value) == f"cannot verify pp_zero1: {PP_ZERO1_BLOCKER}"
    assert not (tmp_path / "run").exists()


def test_pp_x_zero1_is_na_with_one_replica_per_stage():
    """PP 2 x TP 2 on 4 GPUs leaves 1 data-parallel rank per stage: ZeRO-1 has nothing to shard (it would repeat the
    pp row), so it is n/a with the reason while the pp row, which the user pinned, plans."""
    p = plan(plan_inputs(**ASK, pp_degree=2, tp_degree=2))
    assert p.row("pp").applicable
    zero1 = p.row("pp_zero1")
    assert not zero1.applicable and "no replica to shard the optimizer states over" in zero1.reason


def test_a_slower_pipeline_row_names_its_bubble(pinned):
    """A new user read "PP x DDP would take 1.88x longer per step (... compute 1.66 s vs 875 ms: autocast over fp32
    weights vs a 16-bit module)": the pipeline's bubble, inside its compute time, went unsaid. The reason now gives the
    bubble's seconds first: the row's own (``StepTime.bubble_s``: its idle slots, (p - 1) / m of the ideal compute)."""
    from advisor.explain import _why_slower
    from advisor.units import fmt_s

    t = pinned.row("pp").time
    assert t.bubble_s > 0 and t.compute_s > t.bubble_s
    assert all(r.time is None or r.time.bubble_s == 0 for r in pinned.rows if r.name not in ("pp", "pp_zero1"))
    ddp = pinned.row("ddp")
    assert t.compute_s > ddp.time.compute_s  # the bubble makes the compute longer
    why = _why_slower(pinned.row("pp"), ddp, pinned.options.precision)
    assert why.startswith(f"compute {fmt_s(t.compute_s)} vs {fmt_s(ddp.time.compute_s)} per step: "), why
    assert f": {fmt_s(t.bubble_s)} of it the pipeline's bubble (stages idle as it fills and drains)" in why, why
