"""The memory options applied to the plan's strategy rows (advisor.applied_options): each option's delta against the
plan without it on a small Llama, by hand arithmetic from the config (the same rules the ladder uses), the rows that
cannot take an option saying why in one line, and the ladder starting from the options the user passed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.plan import Plan, plan
from advisor.schema import plan_inputs

# 4 blocks (activation offload keeps two blocks' saved tensors on the GPU: it moves the other half), width 128,
# GQA 4 heads / 2 KV heads, gated MLP 256, an untied 4096-token vocabulary.
H, FFN, L, HEADS, KV_HEADS, V = 128, 256, 4, 4, 2, 4096
KV = H // HEADS * KV_HEADS  # 64
SEQ, MB = 128, 2
ROWS = SEQ * MB  # loss rows (tokens) per micro-step
CONFIG = {
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": FFN,
    "num_hidden_layers": L,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "vocab_size": V,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
# Parameters: embedding and LM head V x H each; per block q, o H x H, k, v H x KV, gate, up, down H x FFN, two norms.
PER_BLOCK = 2 * H * H + 2 * H * KV + 3 * H * FFN + 2 * H
PARAMS = 2 * V * H + L * PER_BLOCK + H  # + the final norm


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("applied") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def _plan(config: str, gpus: int = 1, **options: object) -> Plan:
    return plan(
        plan_inputs(
            config_path=config,
            seq_len=SEQ,
            micro_batch_size=MB,
            gpus=gpus,
            gpu="A100-80GB",
            detect_hardware=False,
            **options,
        )
    )


@pytest.fixture(scope="module")
def plain(config: str) -> Plan:
    return _plan(config)


@pytest.fixture(scope="module")
def full_ac(config: str) -> Plan:
    return _plan(config, activation_checkpointing=True)


def test_param_count_is_the_hand_count(plain: Plan) -> None:
    assert plain.profile.stats.num_trainable == PARAMS == 1_639_552


def test_chunked_cross_entropy_saves_the_fp32_logits(config: str, plain: Plan) -> None:
    p = _plan(config, chunked_cross_entropy=8)
    before, after = plain.row("single").memory, p.row("single").memory
    assert before is not None and after is not None
    # Plain: 12 bytes per logit at the backward peak (fp32 log-softmax kept, two fp32 gradients); chunked: the 16-bit
    # logits, each row's fp32 logsumexp and int64 label, and the largest moment's temporaries: here the loss's
    # backward, the logits' 16-bit gradient and one chunk's fp32 copy, more than the head's fp32 weight gradient
    # with the input gradient (V x H x 4 + ROWS x H x 2) and than the forward's chunk ((ROWS / 8) x V x 8).
    plain_loss = ROWS * V * 12
    loss_backward = ROWS * V * 2 + (ROWS // 8) * V * 4
    assert loss_backward > V * H * 4 + ROWS * H * 2 and loss_backward > (ROWS // 8) * V * 8
    chunked_loss = ROWS * (V * 2 + 12) + loss_backward
    assert before.peak.total - after.peak.total == plain_loss - chunked_loss == 7_861_248
    assert before.peak.activations - after.peak.activations == ROWS * V * 4 - ROWS * (V * 2 + 12)
    assert before.device_total - after.device_total == 7_861_248  # the same device overhead
    assert after.model_state_bytes == before.model_state_bytes
    # Chunking costs no time in this model; every applicable row took it.
    assert p.row("single").time.step_s == plain.row("single").time.step_s  # type: ignore[union-attr]
    assert any("--chunked-cross-entropy 8 applied" in n for n in after.notes)
    assert not any("memory-savings ladder" in w for w in p.warnings)


def test_optimizer_in_backward_holds_one_gradient(config: str, plain: Plan) -> None:
    p = _plan(config, optimizer_in_backward=True)
    before, after = plain.row("single").memory, p.row("single").memory
    assert before is not None and after is not None
    # Autocast bf16 keeps fp32 gradients (4 bytes): at the end of backward only the largest one (the untied LM
    # head's or the embedding's, V x H) is held instead of all of them.
    assert before.model_state_bytes - after.model_state_bytes == (PARAMS - V * H) * 4 == 4_461_056
    # The peak is at the start of backward, where no gradient exists yet: unchanged here.
    assert after.peak.total == before.peak.total and after.peak.grads == 0


def test_optimizer_in_backward_rows_that_cannot_take_it(config: str) -> None:
    p = _plan(config, gpus=2, optimizer_in_backward=True)
    reasons = {r.name: r.reason or "" for r in p.rows if not r.applicable}
    assert reasons["ddp"].startswith("--optimizer-in-backward: DDP all-reduces gradients")
    for name in ("zero1", "zero2", "zero3"):
        assert reasons[name].startswith("--optimizer-in-backward: DeepSpeed's engine runs the optimizer step")
    # One GPU reaches the global batch of two by accumulating two micro-steps: refused for that.
    assert reasons["single"].startswith("--optimizer-in-backward: 2 accumulation steps need the summed gradient")
    assert all("\n" not in r for r in reasons.values())
    assert p.row("fsdp2").applicable and p.recommendation.strategy in {"fsdp2", "fsdp2_noreshard"}


def test_activation_offload_moves_all_but_two_blocks(config: str, plain: Plan) -> None:
    p = _plan(config, activation_offload=True)
    before, after = plain.row("single"), p.row("single")
    assert before.memory is not None and after.memory is not None
    # What the blocks save (the activations less the loss's fp32 log-softmax) goes to the host but two blocks' worth.
    inside = before.memory.peak.activations - ROWS * V * 4
    offloaded = inside - 2 * inside // L
    assert before.memory.peak.activations - after.memory.peak.activations == offloaded
    # 4.9 MB each way over PCIe 4 (25 GB/s) hides under compute: the copies are communication, none exposed.
    assert before.time is not None and after.time is not None
    assert after.time.comm_s - before.time.comm_s == pytest.approx(2 * offloaded / 25e9)
    assert after.time.step_s == before.time.step_s
    assert any("pinned host memory" in n for n in after.memory.notes)


def test_selective_op_policy_is_full_checkpointing_plus_the_saved_outputs(
    config: str, plain: Plan, full_ac: Plan
) -> None:
    p = _plan(config, selective_checkpointing="op")
    ac, op, base = full_ac.row("single"), p.row("single"), plain.row("single")
    assert ac.memory is not None and op.memory is not None
    # Per block: q (H), v (KV), gate (FFN), down (H) matmul outputs and the attention output (H) in bf16, and the
    # attention's fp32 logsumexp per head.
    saved = L * ROWS * (2 * (3 * H + KV + FFN) + 4 * HEADS)
    assert op.memory.peak.activations - ac.memory.peak.activations == saved == 1_458_176
    # Time: the k, o and up projections recomputed (2 FLOPs per multiply-add), that share of full checkpointing's
    # recompute added to the plain step.
    assert ac.time is not None and op.time is not None and base.time is not None
    recomputed = L * 2 * ROWS * H * (KV + H + FFN)
    assert op.time.flops - base.time.flops == recomputed
    share = recomputed / (ac.time.flops - ac.time.model_flops)
    assert op.time.step_s == pytest.approx(base.time.step_s + share * (ac.time.step_s - base.time.step_s))


def test_selective_layer_policy_is_its_share_of_full_checkpointing(config: str, plain: Plan, full_ac: Plan) -> None:
    p = _plan(config, selective_checkpointing="layer", checkpoint_every=2)
    ac, half, base = full_ac.row("single"), p.row("single"), plain.row("single")
    assert ac.memory is not None and half.memory is not None and base.memory is not None
    # Every second block of 4 checkpointed: half of full checkpointing's saving and of its recompute.
    full_saving = base.memory.peak.activations - ac.memory.peak.activations
    assert base.memory.peak.activations - half.memory.peak.activations == full_saving // 2
    assert ac.time is not None and half.time is not None and base.time is not None
    assert half.time.step_s == pytest.approx((base.time.step_s + ac.time.step_s) / 2)


def test_the_training_line_names_the_checkpointing_policy(config: str, plain: Plan, full_ac: Plan) -> None:
    """The header's Training line says which checkpointing runs (it read "activation checkpointing off" under
    --selective-checkpointing)."""
    from advisor.text_report import render_text

    def line(p: Plan) -> str:
        return next(t for t in render_text(p).splitlines() if t.startswith("Training"))

    layer = _plan(config, selective_checkpointing="layer", checkpoint_every=2)
    assert "activation checkpointing selective (layer policy: one block in 2)," in line(layer)
    assert "activation checkpointing selective (op policy)," in line(_plan(config, selective_checkpointing="op"))
    assert "activation checkpointing on," in line(full_ac) and "activation checkpointing off," in line(plain)


def test_the_micro_batch_search_says_it_ran_without_the_options(config: str, plain: Plan) -> None:
    """The largest micro-batch is searched without the memory options: said where it is quoted (a row that fits
    with them read 'the largest micro-batch that fits is 0 per GPU')."""
    from advisor.text_report import render_text

    text = render_text(_plan(config, activation_offload=True))
    assert "max mb: searched without the memory options" in text
    assert "the largest micro-batch that fits without the memory options (the search does not apply them) is" in text
    assert "without the memory options" not in render_text(plain)


def test_selective_policies_leave_an_optimizer_step_peak_alone() -> None:
    """Where full checkpointing peaks at the optimizer step (weights, gradients, AdamW's states and its temporaries:
    no activations), neither policy adds to that moment: both peak there too (a 2-block Llama at 4 x 64 tokens in
    fp32; its run measures 39,871,720 bytes for all three). The op policy used to add its saved outputs to that
    moment (+7.3% over the run) and the layer policy to take its share of full checkpointing's saving from the
    plain backward alone (-7.5%: under the step)."""
    small = str(Path(__file__).parent / "data" / "small_llama.json")

    def single(**option: object):  # noqa: ANN202
        p = plan(
            plan_inputs(
                config_path=small,
                gpus=1,
                seq_len=64,
                micro_batch_size=4,
                precision="fp32",
                detect_hardware=False,
                **option,
            ),  # fmt: skip
            device="cpu",  # as verify plans its run (CPU ranks: no CUDA context, the CPU optimizer's temporaries)
        )
        assert p.row("single").memory is not None
        return p.row("single").memory.peak

    ac = single(activation_checkpointing=True)
    assert ac.phase == "optimizer step" and ac.activations == 0 and ac.total == 39_866_496
    for policy in ("op", "layer"):
        peak = single(selective_checkpointing=policy)
        assert (peak.phase, peak.total) == (ac.phase, ac.total), policy
    assert single().phase == "backward"  # the plain run peaks in backward: the policies save there


@pytest.mark.slow  # the ladder traces its LoRA and QLoRA rungs (about 20 s)
def test_ladder_starts_from_the_options_passed(config: str) -> None:
    p = _plan(config, chunked_cross_entropy=8, ladder=True)
    assert p.ladder is not None and p.ladder.strategy == "single"
    base = p.ladder.rungs[0]
    mem = p.row("single").memory
    assert mem is not None and base.key == "base" and base.peak_bytes == mem.peak.total
    assert "chunked_ce" not in [r.key for r in p.ladder.rungs]  # already on: not offered again


def test_an_option_no_row_takes_is_one_line(config: str) -> None:
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match=r"^no strategy takes these options \(--chunked-cross-entropy 8: ") as err:
        plan(plan_inputs(model="resnet18", gpus=1, gpu="A100-80GB", detect_hardware=False, chunked_cross_entropy=8))
    assert "\n" not in str(err.value)


def test_no_flag_no_note(plain: Plan) -> None:
    assert all(not any("applied (advisor.memory_options" in n for n in r.memory.notes) for r in plain.rows if r.memory)
    assert Path(plain.inputs.source.config_path or "").name == "config.json"  # the plan read the file
