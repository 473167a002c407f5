"""Memory per pipeline stage (``advisor.stage_memory``, ``strategies.pipeline``) by hand arithmetic: a 4-block model
on PP 2, untied and tied (both copies counted), model states sharded by the data-parallel policy, activations times
the micro-batches in flight, the receive buffers, the most-loaded stage as the peak."""

from __future__ import annotations

from dataclasses import replace

import pytest

from advisor.choices import Attention, PipelineSchedule, TraceMode
from advisor.context import StrategyContext
from advisor.errors import AdvisorError
from advisor.hardware import resolve_hardware
from advisor.layout import Layout
from advisor.models import resolve_source
from advisor.plan import resolve_precision
from advisor.profile import build_profile
from advisor.schema import plan_inputs
from advisor.stage_memory import StageModel, StatePolicy, peak_stage, stage_memory
from strategies.pipeline import block_traces, stage_model, stages

ONE_F_ONE_B, GPIPE, INTERLEAVED = (
    PipelineSchedule.ONE_F_ONE_B,
    PipelineSchedule.GPIPE,
    PipelineSchedule.INTERLEAVED_1F1B,
)
DDP_AMP = StatePolicy.zero(0, 1, 4, 4, 8)  # fp32 weights and gradients under autocast, AdamW's two fp32 moments

# 4 blocks of 10 elements, an embedding of 8, a head of 9 (final norm 1 + LM head 8); per micro-batch a block retains
# 100 bytes, the head 50 beyond its blocks with 7 bytes of temporaries; p2p messages of 16 bytes.
TOY = StageModel(
    block_params=(10, 10, 10, 10),
    embed_params=8,
    head_params=9,
    block_activation_bytes=100,
    head_activation_bytes=50,
    head_temp_bytes=7,
)


def test_four_blocks_on_pp2_untied_by_hand():
    s0, s1 = stage_memory(TOY, (2, 2), DDP_AMP, ONE_F_ONE_B, micro_batches=4, p2p_message_bytes=16)
    # stage 0: 2 blocks + embedding = 28 elements x (4 + 4 + 8) bytes; 1F1B holds p = 2 micro-batches of its 2
    # blocks; it receives the gradient of each of the 4 micro-batches (16 bytes each), no activations
    assert (s0.blocks, s0.first, s0.last, s0.params_numel, s0.in_flight) == (2, True, False, 28, 2.0)
    assert (s0.params, s0.grads, s0.optimizer_states) == (112, 112, 224)
    assert (s0.activations, s0.buffers, s0.other) == (2 * 2 * 100, 4 * 16, 0)
    assert s0.total == 112 + 112 + 224 + 400 + 64 == 912
    # stage 1: 2 blocks + head = 29 elements; one micro-batch in flight of 2 blocks + the head's 50; the
    # activations of each micro-batch received; the head's temporaries
    assert (s1.params_numel, s1.in_flight, s1.params, s1.optimizer_states) == (29, 1.0, 116, 232)
    assert (s1.activations, s1.buffers, s1.other) == (250, 64, 7)
    assert s1.total == 116 + 116 + 232 + 250 + 64 + 7 == 785
    assert peak_stage([s0, s1]) is s0


def test_four_blocks_on_pp2_tied_both_copies_counted():
    # tied: the head's 9 hold the final norm (1) and the LM head's own copy of the embedding (8)
    tied = replace(TOY, tied_params=8)
    s0, s1 = stage_memory(tied, (2, 2), DDP_AMP, ONE_F_ONE_B, 4, 16)
    assert (s0.params_numel, s1.params_numel) == (28, 29)  # 8 on the first stage and 8 again on the last
    # on one stage the tied weight is one tensor: 40 + 8 + 9 - 8 = 49 elements, no buffers, one micro-batch in flight
    (only,) = stage_memory(tied, (4,), DDP_AMP, ONE_F_ONE_B, 4, 16)
    assert (only.params_numel, only.buffers, only.in_flight, only.activations) == (49, 0, 1.0, 450)
    (untied,) = stage_memory(TOY, (4,), DDP_AMP, ONE_F_ONE_B, 4, 16)
    assert untied.params_numel == 57


def test_policies_schedules_and_uneven_split():
    # ZeRO-1 over 2 ranks halves the optimizer states, ZeRO-3 everything (ceil per stage: 28 / 3 -> 10)
    z1 = stage_memory(TOY, (2, 2), StatePolicy.zero(1, 2, 4, 4, 8), ONE_F_ONE_B, 4, 16)[0]
    assert (z1.params, z1.grads, z1.optimizer_states) == (112, 112, 112)
    z3 = stage_memory(TOY, (2, 2), StatePolicy.zero(3, 3, 4, 4, 8), ONE_F_ONE_B, 4, 16)[0]
    assert (z3.params, z3.grads, z3.optimizer_states) == (40, 40, 80)
    # GPipe holds all 4 micro-batches on both stages
    g0, g1 = stage_memory(TOY, (2, 2), DDP_AMP, GPIPE, 4, 16)
    assert (g0.activations, g1.activations) == (4 * 200, 4 * 250)
    assert peak_stage([g0, g1]) is g1
    # interleaved, v 2: stage 0 holds (2 (2 - 0 - 1) + (2 - 1) 2 + 1) / 2 = 2.5 micro-batches; receive buffers per
    # chunk: stage 0 2 gradient + 1 activation chunks, stage 1 1 gradient + 2 activation chunks, 4 micro-batches each
    i0, i1 = stage_memory(TOY, (2, 2), DDP_AMP, INTERLEAVED, 4, 16, virtual=2)
    assert (i0.in_flight, i0.activations, i0.buffers) == (2.5, 500, 3 * 4 * 16)
    assert (i1.in_flight, i1.activations, i1.buffers) == (1.5, 375, 3 * 4 * 16)
    # 3 + 1 blocks would not come from Layout.stage_blocks; 5 blocks over 2 stages would: 3 and 2
    odd = replace(TOY, block_params=(10,) * 5)
    assert [s.blocks for s in stage_memory(odd, Layout(pp=2).stage_blocks(5), DDP_AMP, ONE_F_ONE_B, 4, 16)] == [3, 2]
    with pytest.raises(ValueError):
        stage_memory(TOY, (2, 1), DDP_AMP, ONE_F_ONE_B, 4, 16)
    with pytest.raises(ValueError):
        peak_stage([])


# A Llama of 4 blocks: h 64, 4 heads (no GQA), MLP 128, vocabulary 256.
H, FFN, V, L = 64, 128, 256, 4
TINY = dict(
    model_type="llama",
    hidden_size=H,
    intermediate_size=FFN,
    num_hidden_layers=L,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=V,
    max_position_embeddings=128,
)
BLOCK = 4 * H * H + 3 * H * FFN + 2 * H  # q, k, v, o; gate, up, down; two RMSNorms = 41,088


def _ctx(tied: bool, micro_batch: int = 2) -> StrategyContext:
    inputs = plan_inputs(
        config_dict={**TINY, "tie_word_embeddings": tied},
        seq_len=32,
        gpus=2,
        gpu="A100-80GB",
        detect_hardware=False,
        precision="bf16",
        micro_batch_size=micro_batch,
    )
    hw = resolve_hardware(inputs.cluster)
    opts, _ = resolve_precision(inputs.training, hw)
    profile = build_profile(resolve_source(inputs.source), Attention.FLASH, False)
    return StrategyContext(profile, hw, opts)


@pytest.fixture(scope="module")
def untied() -> StrategyContext:
    return _ctx(False)


@pytest.fixture(scope="module")
def tied() -> StrategyContext:
    return _ctx(True)


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_stage_parameters_of_a_four_block_llama(untied, tied):
    """The model's own counts (``ParamStats.fsdp_units``): per block 4 h^2 + 3 h ffn + 2 h; the first stage adds the
    V x h embedding, the last the final norm (h) and the V x h head, tied or not (tied: the head's own copy)."""
    assert BLOCK == 41_088
    for ctx in (untied, tied):
        m = stage_model(ctx)
        assert m.block_params == (BLOCK,) * 4
        assert (m.embed_params, m.head_params) == (V * H, V * H + H)
    assert stage_model(untied).tied_params == 0 and stage_model(tied).tied_params == V * H
    # the tied model has one V x h tensor fewer than the untied, and its two stages hold both copies
    assert untied.profile.stats.num_params - tied.profile.stats.num_params == V * H
    for ctx in (untied, tied):
        s0, s1 = stages(ctx, Layout(dp_shard=1, pp=2))
        assert (s0.params_numel, s1.params_numel) == (2 * BLOCK + V * H, 2 * BLOCK + V * H + H) == (98_560, 98_624)
        # bf16 autocast with AdamW: fp32 weights 4 + fp32 gradients 4 + two fp32 moments 8 bytes per element
        assert (s0.params, s0.grads, s0.optimizer_states) == (4 * 98_560, 4 * 98_560, 8 * 98_560)
        assert s1.model_states == 16 * 98_624
        # receive buffers: s x b x h of bf16 per micro-batch, 2 micro-batches (the default: the pipeline's degree)
        assert s0.buffers == s1.buffers == 2 * 32 * 2 * H * 2
    # one stage: the tied weight once, as model.parameters() counts it
    (whole,) = stages(tied, Layout(dp_shard=2), micro_batches=1)
    assert whole.params_numel == tied.profile.stats.num_params
    # FSDP2 / ZeRO-3 over 2 ranks on PP 2 x DP 2: every state halved
    s0, _ = stages(untied, Layout(dp_shard=2, pp=2), zero_stage=3)
    assert s0.params == 4 * 98_560 // 2


def test_block_activations_come_from_the_one_and_two_block_traces(untied):
    """A block's retained bytes are the two traces' difference; with what is left of the one-block trace they add
    up to the whole 4-block trace's activations (the blocks are identical)."""
    from advisor.trace import evaluate

    (a1, a2), (b1, b2) = block_traces(untied, TraceMode.AUTOCAST)
    one, two = evaluate(a1, a2, 2), evaluate(b1, b2, 2)
    m = stage_model(untied)
    assert m.block_activation_bytes == two.activations - one.activations > 0
    assert m.head_activation_bytes == one.activations - m.block_activation_bytes > 0
    whole = untied.profile.activations(TraceMode.AUTOCAST).at(2).activations
    assert m.head_activation_bytes + L * m.block_activation_bytes == pytest.approx(whole, rel=1e-3)
    # 1F1B on PP 2: the first stage holds 2 micro-batches of its 2 blocks, the last one of its 2 and the head
    s0, s1 = stages(untied, Layout(pp=2, dp_shard=1), micro_batches=4)
    assert s0.activations == 2 * 2 * m.block_activation_bytes
    assert s1.activations == 2 * m.block_activation_bytes + m.head_activation_bytes
    # and with 4 micro-batches each stage's largest fp32 weight gradient as it is made, before it is accumulated:
    # the embedding's and the head's, V x H = 256 x 64 elements (beside the blocks' largest, 64 x 128)
    assert (m.largest_embed_param, m.largest_head_param, m.largest_block_param) == (256 * 64, 256 * 64, 64 * 128)
    assert s1.other == m.head_temp_bytes + 4 * 256 * 64 and m.head_temp_bytes > 0 and s0.other == 4 * 256 * 64
    one_micro_batch = stages(untied, Layout(pp=2, dp_shard=1), micro_batches=1)
    assert (one_micro_batch[0].other, one_micro_batch[1].other) == (0, m.head_temp_bytes)


def test_a_layout_that_does_not_fit_the_model(untied):
    with pytest.raises(AdvisorError, match=r"pp\(8\) exceeds the model's 4 blocks"):
        stages(untied, Layout(pp=8))
    with pytest.raises(AdvisorError, match=r"tp\(8\) must divide the 4 attention heads"):
        stages(untied, Layout(tp=8))
