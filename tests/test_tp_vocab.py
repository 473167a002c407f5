"""Tensor parallelism shards the vocabulary (issue 31): the input embedding, the LM head and its logits are divided
by the TP degree (Megatron-LM's vocab-parallel embedding and cross-entropy, Shoeybi et al. 2019, section 3;
torchtitan's Llama plan; ``strategies/templates/tp.py``), and the vocab-parallel collectives are timed."""

from __future__ import annotations

import pytest

from advisor.gpu_presets import get_gpu_preset
from advisor.plan import plan
from advisor.schema import plan_inputs
from advisor.timing.comm import Fabric

# BLOOM's width and vocabulary (published_runs.md O33: h 14336, 64 heads; BLOOM's 250,880-token vocabulary, tied
# embeddings) on a llama block, 6 layers: the embedding's pipeline stage of O33's 72 layers over PP 12.
H, FFN, LAYERS, VOCAB, T = 14336, 57344, 6, 250880, 8
BLOOM_STAGE = dict(
    model_type="llama",
    hidden_size=H,
    intermediate_size=FFN,
    num_hidden_layers=LAYERS,
    num_attention_heads=64,
    num_key_value_heads=64,
    vocab_size=VOCAB,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def bloom_tp8():
    return plan(
        plan_inputs(
            config_dict=BLOOM_STAGE,
            seq_len=2048,
            gpus=8,
            gpu="A100-80GB",
            detect_hardware=False,
            precision="bf16",
            micro_batch_size=1,
            global_batch_size=8,
            strategy="tp",
        )
    )


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_bloom_vocab_is_sharded_over_tp_ranks(bloom_tp8):
    """Per rank: each block's q/k/v/o (4 h^2) and gate/up/down (3 h ffn) over 8, its 2 norms whole, the tied
    embedding/head 250880 / 8 = 31360 rows of h, the final norm whole. Was: the 3.6B-parameter embedding whole on
    every rank, 6,063,052,800 per rank and 144.4 GiB per GPU (Megatron ran O33 on 80 GB cards)."""
    per_rank = LAYERS * (4 * H * H // T + 3 * H * FFN // T + 2 * H) + (VOCAB // T) * H + H
    assert per_rank == 2_916_014_080
    p = bloom_tp8
    assert p.profile.tp_stats(T).num_params == per_rank
    row = p.row("tp")
    peak = row.memory.peak
    # bf16 autocast + AdamW: fp32 weights 4 + fp32 gradients 4 + two fp32 moments 8 = 16 bytes per parameter
    assert peak.params == 4 * per_rank + p.profile.stats.buffer_bytes  # + the rotary inv_freq buffer
    assert peak.optimizer_states == 8 * per_rank
    assert peak.grads == 4 * per_rank and row.memory.model_state_bytes == 16 * per_rank + p.profile.stats.buffer_bytes
    assert row.memory.device_total < 80 * 10**9  # fits the A100-80GB it was run on


def test_tied_vocab_sharded_embedding_gradient_is_whole_at_the_end_of_backward(bloom_tp8):
    """torch's DTensor computes a row-sharded embedding's weight gradient whole (Replicate): with tied weights the
    rank holds one fp32 V x h gradient beside its sharded states for a moment (strategies/tp.py)."""
    row = bloom_tp8.row("tp")
    assert row.memory.model_state_bytes + VOCAB * H * 4 <= row.memory.peak.total


def test_vocab_parallel_collectives_are_timed(bloom_tp8):
    """Per micro-step: the tied embedding's output all-reduce and the head's input-gradient all-reduce, each of
    s x b x h bf16 activations, and the cross-entropy's 3 all-reduces of 4 bytes per token (Megatron-LM
    VocabParallelCrossEntropy: max, sum of exponentials, target logit)."""
    row = bloom_tp8.row("tp")
    ga = row.grad_accum_steps
    fabric = Fabric.from_preset(get_gpu_preset("A100-80GB"), T)
    by_what = {c.what.split(" (")[0]: c for c in row.time.collectives}
    embed = by_what["embedding output all-reduce"]
    head = by_what["LM head input-gradient all-reduce"]
    ce = by_what["vocab-parallel cross-entropy all-reduces"]
    assert embed.nbytes == head.nbytes == 2048 * 1 * H * 2 and embed.kind == head.kind == "all_reduce"
    assert ce.nbytes == 2048 * 4 and ce.calls == 3 * ga
    assert ce.seconds == pytest.approx(3 * ga * fabric.time_s("all_reduce", 2048 * 4), rel=1e-12)
    assert row.time.exposed_comm_s == pytest.approx(sum(c.seconds for c in row.time.collectives), rel=1e-12)
