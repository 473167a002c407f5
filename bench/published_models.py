"""The model configs the published runs are planned with (bench/published_cases.py): the nearest architecture
advisor builds for each source's model, and the FLOP formulas that turn a source's TFLOP/s figure into tokens per
second. Each function says what it approximates."""

from __future__ import annotations

MPT_VOCAB = 50368  # llm-foundry's MPT configs: vocab_size 50368 (the GPT-NeoX-20B tokenizer padded to a multiple of 64)


def mpt_config(layers: int, hidden: int, heads: int, seq: int) -> dict[str, object]:
    """An MPT model of llm-foundry's benchmark table as a GPT-2 architecture (transformers' ``gpt2``): the same
    layers, width, heads, a 4x GELU MLP, MPT's vocabulary (50,368) and tied embeddings, and a learned position
    table of ``seq`` rows. The table's parameter counts grow with the sequence length by seq x d (MPT-7b: 6.65B at
    1k, 6.92B at 64k), so its benchmark configs use learned positions, as GPT-2 does.

    Approximation: MPT has no biases and LayerNorm without bias; GPT-2 has biases (about 9 d per layer, under
    0.01% of the FLOPs) and a final LayerNorm of the same shape."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "n_inner": 4 * hidden,
        "n_positions": seq,
        "vocab_size": MPT_VOCAB,
        "activation_function": "gelu",
        "tie_word_embeddings": True,
    }


def megatron_config(hidden: int, heads: int, layers: int, vocab: int, seq: int) -> dict[str, object]:
    """A Megatron-LM GPT as a Llama-architecture block of the same shape: the same hidden size, heads, layers,
    vocabulary and tied embeddings, and an MLP of the same FLOPs (GPT's 2 x h x 4h = Llama's 3 x h x I with
    I = 8h/3, rounded down to a multiple of 8 so that every TP degree up to 8 divides it). advisor's
    tensor-parallel plan exists for Llama-family blocks only; norms (RMSNorm vs LayerNorm) and positions (rotary
    vs learned) differ slightly."""
    inter = (8 * hidden // 3) // 8 * 8
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": seq,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-5,
    }


# What Megatron-LM fuses by default (megatron/training/arguments.py: --no-masked-softmax-fusion, --no-bias-gelu-fusion,
# --no-bias-dropout-fusion turn them off; the kernels in megatron/core/fusions/, the layer norm apex's / Transformer
# Engine's fused kernel): the rows are timed with fused element-wise stretches (Case.fused).
MEGATRON_FUSED = (
    "Megatron-LM's default fused kernels: scale-mask-softmax, bias-GeLU, bias-dropout-add, layer norm "
    "(megatron/core/fusions/, on unless --no-*-fusion)"
)
# Not applied to nanoGPT's torch.compile row: timed with fused stretches it comes out 47% faster than published (the
# stretch rule's largest-op bytes miss the extra passes of its fp32 cross-entropy and reductions), eager -14%.


# microsoft/deberta-v2-xlarge's config.json (the -mnli checkpoint shares it): 24 layers, hidden 1536, 24 heads,
# intermediate 6144, vocab 128100, relative attention over 256 log buckets, no absolute positions.
DEBERTA_V2_XLARGE: dict[str, object] = {
    "model_type": "deberta-v2",
    "architectures": ["DebertaV2ForSequenceClassification"],
    "hidden_size": 1536,
    "num_hidden_layers": 24,
    "num_attention_heads": 24,
    "intermediate_size": 6144,
    "vocab_size": 128100,
    "max_position_embeddings": 512,
    "relative_attention": True,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "max_relative_positions": -1,
    "type_vocab_size": 0,
    "hidden_act": "gelu",
}


def megatron_hfu_flops_per_token(layers: int, hidden: int, seq: int, vocab: int) -> float:
    """FLOPs per token that Megatron-LM's 2021 paper counts with full activation recompute (Narayanan et al.,
    SC21, eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16 l h) per batch of B sequences of s tokens): its TFLOP/s figures
    are hardware FLOPs (recompute counted), so tokens/s/GPU = TFLOP/s / this."""
    return 96 * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def megatron_model_flops_per_token(layers: int, hidden: int, seq: int, vocab: int) -> float:
    """FLOPs per token of Megatron-core's ``num_floating_point_operations`` (megatron/training/training.py) for a
    GPT with full multi-head attention and a 4h non-gated MLP: 12 B s l h^2 (2 + s / h + 4 + V / 2lh) =
    72 B s l h^2 (1 + s / 6h + V / 12 l h), recompute not counted (its MFU table's TFLOP/s)."""
    return 72 * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))
