"""Transformer presets as data: each copies the fields of a public Hugging Face ``config.json``.

Only the fields that change the architecture's size are copied; everything else takes the
transformers config class default, which matches those configs. Names are lower-case; the Hugging
Face repo ids are accepted as aliases (case-insensitive).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransformerPreset:
    name: str
    model_type: str
    config: dict[str, object]
    source: str  # the Hugging Face config this copies
    aliases: tuple[str, ...] = field(default_factory=tuple)


def _hf(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


_LLAMA2 = dict(
    vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False
)
_LLAMA3 = dict(
    vocab_size=128256,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    hidden_act="silu",
    tie_word_embeddings=False,
)

_T5 = dict(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, n_positions=512)
# Llama 3.1 / 3.2 / 3.3 config.json, with its rope_scaling "llama3": it changes no size, but a script that builds the
# model from this config (no --init-from) gets Llama 3's rotary frequencies only with it. The factor is 8 for 3.1 and
# 3.3, 32 for the 3.2 models (their config.json files).
_LLAMA31 = dict(
    vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu"
)


def _llama3_rope(factor: float) -> dict[str, object]:
    return {
        "rope_scaling": {
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        }
    }


# Gemma 2 config.json: tied embeddings, logit soft-capping, local/global attention.
_GEMMA2 = dict(
    vocab_size=256000,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    hidden_activation="gelu_pytorch_tanh",
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    sliding_window=4096,
    tie_word_embeddings=True,
)
_QWEN25 = dict(rope_theta=1000000.0, hidden_act="silu", use_sliding_window=False)
_QWEN25_SMALL = dict(vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6, **_QWEN25)  # 0.5B-3B
_QWEN25_LARGE = dict(
    vocab_size=152064, tie_word_embeddings=False, max_position_embeddings=131072, rms_norm_eps=1e-5, **_QWEN25
)  # 14B-72B (7B: rms_norm_eps 1e-6, preset above)


def _qwen25(size: str, **config: object) -> TransformerPreset:
    repo = f"Qwen/Qwen2.5-{size}"
    return TransformerPreset(
        f"qwen2.5-{size.lower()}", "qwen2", config, _hf(repo), (repo.lower(), f"{repo.lower()}-instruct")
    )


TRANSFORMER_PRESETS: tuple[TransformerPreset, ...] = (
    TransformerPreset(
        "gpt2",
        "gpt2",
        dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024),
        _hf("openai-community/gpt2"),
        ("openai-community/gpt2",),
    ),
    TransformerPreset(
        "gpt2-medium",
        "gpt2",
        dict(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=1024),
        _hf("openai-community/gpt2-medium"),
        ("openai-community/gpt2-medium",),
    ),
    TransformerPreset(
        "gpt2-large",
        "gpt2",
        dict(n_embd=1280, n_layer=36, n_head=20, vocab_size=50257, n_positions=1024),
        _hf("openai-community/gpt2-large"),
        ("openai-community/gpt2-large",),
    ),
    TransformerPreset(
        "gpt2-xl",
        "gpt2",
        dict(n_embd=1600, n_layer=48, n_head=25, vocab_size=50257, n_positions=1024),
        _hf("openai-community/gpt2-xl"),
        ("openai-community/gpt2-xl",),
    ),
    TransformerPreset(
        "bert-base",
        "bert",
        dict(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            vocab_size=30522,
            max_position_embeddings=512,
            type_vocab_size=2,
        ),
        _hf("google-bert/bert-base-uncased"),
        ("google-bert/bert-base-uncased", "bert-base-uncased"),
    ),
    TransformerPreset(
        "bert-large",
        "bert",
        dict(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            vocab_size=30522,
            max_position_embeddings=512,
            type_vocab_size=2,
        ),
        _hf("google-bert/bert-large-uncased"),
        ("google-bert/bert-large-uncased", "bert-large-uncased"),
    ),
    TransformerPreset(
        "t5-base",
        "t5",
        dict(
            d_model=768,
            d_ff=3072,
            d_kv=64,
            num_heads=12,
            num_layers=12,
            num_decoder_layers=12,
            vocab_size=32128,
            feed_forward_proj="relu",
            **_T5,
        ),
        _hf("google-t5/t5-base"),
        ("google-t5/t5-base",),
    ),
    TransformerPreset(
        "t5-large",
        "t5",
        dict(
            d_model=1024,
            d_ff=4096,
            d_kv=64,
            num_heads=16,
            num_layers=24,
            num_decoder_layers=24,
            vocab_size=32128,
            feed_forward_proj="relu",
            **_T5,
        ),
        _hf("google-t5/t5-large"),
        ("google-t5/t5-large",),
    ),
    TransformerPreset(
        "t5-3b",
        "t5",
        dict(
            d_model=1024,
            d_ff=16384,
            d_kv=128,
            num_heads=32,
            num_layers=24,
            num_decoder_layers=24,
            vocab_size=32128,
            feed_forward_proj="relu",
            **_T5,
        ),
        _hf("google-t5/t5-3b"),
        ("google-t5/t5-3b",),
    ),
    TransformerPreset(
        "opt-1.3b",
        "opt",
        dict(
            hidden_size=2048,
            ffn_dim=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            vocab_size=50272,
            max_position_embeddings=2048,
            word_embed_proj_dim=2048,
            do_layer_norm_before=True,
        ),
        _hf("facebook/opt-1.3b"),
        ("facebook/opt-1.3b",),
    ),
    TransformerPreset(
        "pythia-2.8b",
        "gpt_neox",
        dict(
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=32,
            num_attention_heads=32,
            vocab_size=50304,
            max_position_embeddings=2048,
            rotary_pct=0.25,
            use_parallel_residual=True,
            tie_word_embeddings=False,
        ),
        _hf("EleutherAI/pythia-2.8b"),
        ("eleutherai/pythia-2.8b",),
    ),
    TransformerPreset(
        "llama-2-7b",
        "llama",
        dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            **_LLAMA2,
        ),
        _hf("meta-llama/Llama-2-7b-hf"),
        ("meta-llama/llama-2-7b-hf",),
    ),
    TransformerPreset(
        "llama-2-13b",
        "llama",
        dict(
            hidden_size=5120,
            intermediate_size=13824,
            num_hidden_layers=40,
            num_attention_heads=40,
            num_key_value_heads=40,
            **_LLAMA2,
        ),
        _hf("meta-llama/Llama-2-13b-hf"),
        ("meta-llama/llama-2-13b-hf",),
    ),
    TransformerPreset(
        "llama-2-70b",
        "llama",
        dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            **_LLAMA2,
        ),
        _hf("meta-llama/Llama-2-70b-hf"),
        ("meta-llama/llama-2-70b-hf",),
    ),
    TransformerPreset(
        "llama-3-8b",
        "llama",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            **_LLAMA3,
        ),
        _hf("meta-llama/Meta-Llama-3-8B"),
        ("meta-llama/meta-llama-3-8b",),
    ),
    TransformerPreset(
        "llama-3-70b",
        "llama",
        dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            **_LLAMA3,
        ),
        _hf("meta-llama/Meta-Llama-3-70B"),
        ("meta-llama/meta-llama-3-70b",),
    ),
    TransformerPreset(
        "mistral-7b",
        "mistral",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=32768,
            sliding_window=4096,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        ),
        _hf("mistralai/Mistral-7B-v0.1"),
        ("mistralai/mistral-7b-v0.1",),
    ),
    TransformerPreset(
        "qwen2.5-7b",
        "qwen2",
        dict(
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            vocab_size=152064,
            max_position_embeddings=131072,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            rms_norm_eps=1e-6,
        ),
        _hf("Qwen/Qwen2.5-7B"),
        ("qwen/qwen2.5-7b",),
    ),
    TransformerPreset(
        "tinyllama-1.1b",
        "llama",
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=22,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
        _hf("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"),
        ("tinyllama/tinyllama-1.1b-intermediate-step-1431k-3t",),
    ),
    TransformerPreset(
        "llama-3.1-8b",
        "llama",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            tie_word_embeddings=False,
            **_LLAMA31,
            **_llama3_rope(8.0),
        ),
        _hf("meta-llama/Llama-3.1-8B"),
        ("meta-llama/llama-3.1-8b", "meta-llama/meta-llama-3.1-8b", "meta-llama/llama-3.1-8b-instruct"),
    ),
    TransformerPreset(
        "llama-3.1-70b",
        "llama",
        dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            tie_word_embeddings=False,
            **_LLAMA31,
            **_llama3_rope(8.0),
        ),
        _hf("meta-llama/Llama-3.1-70B"),
        ("meta-llama/llama-3.1-70b", "meta-llama/meta-llama-3.1-70b", "meta-llama/llama-3.1-70b-instruct"),
    ),
    TransformerPreset(
        "llama-3.1-405b",
        "llama",
        dict(
            hidden_size=16384,
            intermediate_size=53248,
            num_hidden_layers=126,
            num_attention_heads=128,
            num_key_value_heads=8,
            tie_word_embeddings=False,
            **_LLAMA31,
            **_llama3_rope(8.0),
        ),
        _hf("meta-llama/Llama-3.1-405B"),
        ("meta-llama/llama-3.1-405b", "meta-llama/meta-llama-3.1-405b", "meta-llama/llama-3.1-405b-instruct"),
    ),
    TransformerPreset(
        "llama-3.2-1b",
        "llama",
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            tie_word_embeddings=True,
            **_LLAMA31,
            **_llama3_rope(32.0),
        ),
        _hf("meta-llama/Llama-3.2-1B"),
        ("meta-llama/llama-3.2-1b", "meta-llama/llama-3.2-1b-instruct"),
    ),
    TransformerPreset(
        "llama-3.2-3b",
        "llama",
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=28,
            num_attention_heads=24,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=True,
            **_LLAMA31,
            **_llama3_rope(32.0),
        ),
        _hf("meta-llama/Llama-3.2-3B"),
        ("meta-llama/llama-3.2-3b", "meta-llama/llama-3.2-3b-instruct"),
    ),
    TransformerPreset(
        "llama-3.3-70b",
        "llama",
        dict(
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=False,
            **_LLAMA31,
            **_llama3_rope(8.0),
        ),
        _hf("meta-llama/Llama-3.3-70B-Instruct"),
        ("meta-llama/llama-3.3-70b-instruct",),
    ),
    TransformerPreset(
        "gemma-2-2b",
        "gemma2",
        dict(
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            **_GEMMA2,
        ),
        _hf("google/gemma-2-2b"),
        ("google/gemma-2-2b", "google/gemma-2-2b-it"),
    ),
    TransformerPreset(
        "gemma-2-9b",
        "gemma2",
        dict(
            hidden_size=3584,
            intermediate_size=14336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            query_pre_attn_scalar=256,
            **_GEMMA2,
        ),
        _hf("google/gemma-2-9b"),
        ("google/gemma-2-9b", "google/gemma-2-9b-it"),
    ),
    TransformerPreset(
        "gemma-2-27b",
        "gemma2",
        dict(
            hidden_size=4608,
            intermediate_size=36864,
            num_hidden_layers=46,
            num_attention_heads=32,
            num_key_value_heads=16,
            head_dim=128,
            query_pre_attn_scalar=144,
            **_GEMMA2,
        ),
        _hf("google/gemma-2-27b"),
        ("google/gemma-2-27b", "google/gemma-2-27b-it"),
    ),
    TransformerPreset(
        "mixtral-8x7b",
        "mixtral",
        dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=32000,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-5,
            router_aux_loss_coef=0.02,
            sliding_window=None,
            tie_word_embeddings=False,
        ),
        _hf("mistralai/Mixtral-8x7B-v0.1"),
        ("mistralai/mixtral-8x7b-v0.1", "mistralai/mixtral-8x7b-instruct-v0.1"),
    ),
    TransformerPreset(
        "phi-3-mini-4k",
        "phi3",
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            vocab_size=32064,
            max_position_embeddings=4096,
            original_max_position_embeddings=4096,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            sliding_window=2047,
            pad_token_id=32000,
            tie_word_embeddings=False,
        ),
        _hf("microsoft/Phi-3-mini-4k-instruct"),
        ("microsoft/phi-3-mini-4k-instruct", "phi-3-mini"),
    ),
    _qwen25(
        "0.5B",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        **_QWEN25_SMALL,
    ),
    _qwen25(
        "1.5B",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        **_QWEN25_SMALL,
    ),
    _qwen25(
        "3B",
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        **_QWEN25_SMALL,
    ),
    _qwen25(
        "14B",
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
        **_QWEN25_LARGE,
    ),
    _qwen25(
        "32B",
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        **_QWEN25_LARGE,
    ),
    _qwen25(
        "72B",
        hidden_size=8192,
        intermediate_size=29568,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        **_QWEN25_LARGE,
    ),
)


def find_transformer_preset(name: str) -> TransformerPreset | None:
    """Preset by name or Hugging Face repo id, case-insensitively; ``None`` when unknown."""
    key = name.strip().lower()
    for preset in TRANSFORMER_PRESETS:
        if key == preset.name or key in preset.aliases:
            return preset
    return None
