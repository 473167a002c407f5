"""Hugging Face transformers built from their config (``AutoConfig.for_model`` + the model class for
causal LM, masked LM or seq2seq), token ids as inputs and labels, the model's own loss.

transformers patches ``torch.nn.init`` while it initialises weights and its lazy module is not safe to
import from several threads at once: every function here that touches transformers holds
``advisor.locks.MODEL_BUILD_LOCK`` (a re-entrant lock) for as long as it does.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from ...choices import Optimizer
from ...errors import AdvisorError, one_line
from ...locks import MODEL_BUILD_LOCK
from ..limits import as_int, num_layers
from ..spec import ModelSpec
from .base import ModelFamily

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

_ENCODER_ONLY = (
    "bert",
    "roberta",
    "distilbert",
    "albert",
    "electra",
    "deberta",
    "deberta-v2",
    "xlm-roberta",
    "camembert",
    "mpnet",
)
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")
DEFAULT_VOCAB = 32000  # when a config has no vocab_size (the Llama tokenizer's)


def hf_config(
    spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1, attn_impl: str = "sdpa"
) -> PretrainedConfig:
    """The transformers config object for ``spec``, optionally truncated to ``layers`` blocks (per
    stack) and/or reshaped to one tensor-parallel rank's shard (heads, kv heads and MLP width / tp, the vocabulary
    ceil(V / tp): the embedding and LM head are vocab-sharded too).

    Raises:
        AdvisorError: transformers rejects the config.
    """
    cfg_dict = copy.deepcopy(spec.config or {})
    model_type = cfg_dict.pop("model_type")
    assert isinstance(model_type, str), "a transformer spec's config names its model_type (advisor.models.configs)"
    with MODEL_BUILD_LOCK:
        config = _for_model(model_type, cfg_dict)
        if layers is not None or tp_degree > 1:
            # Sizes are read from the config object (a field the dict lacks has the class's default), then
            # the dict is rebuilt with the new sizes so that fields derived from them are derived again.
            full = config.to_dict()
            if layers is not None:
                for key in _LAYER_KEYS:
                    if key in cfg_dict or full.get(key) is not None:
                        cfg_dict[key] = layers
                layer_types = cfg_dict.get("layer_types")
                if isinstance(layer_types, list):  # one entry per layer (gemma2, qwen2, ...)
                    cfg_dict["layer_types"] = layer_types[:layers]
            if tp_degree > 1:
                heads = int(config.num_attention_heads)
                kv = int(getattr(config, "num_key_value_heads", None) or heads)
                cfg_dict["head_dim"] = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
                cfg_dict["num_attention_heads"] = heads // tp_degree
                cfg_dict["num_key_value_heads"] = kv // tp_degree
                cfg_dict["intermediate_size"] = int(config.intermediate_size) // tp_degree
                # The vocabulary too: the emitted plan (strategies/templates/tp.py) shards the LM head's
                # rows over the TP ranks for the vocab-parallel cross-entropy (loss_parallel; Megatron-LM's
                # VocabParallelEmbedding and vocab_parallel_cross_entropy) and the input embedding with it, so a
                # rank holds and computes logits for ceil(V / t) rows: DTensor's Shard(0) splits as torch.chunk
                # does, the first ranks taking the ceiling.
                cfg_dict["vocab_size"] = -(-int(config.vocab_size) // tp_degree)
            config = _for_model(model_type, cfg_dict)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        # transformers 5 configs have no default; T5 checkpoints (and transformers' own error) use pad_token_id
        config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0
    config._attn_implementation = attn_impl
    return config


def _for_model(model_type: str, cfg_dict: dict[str, object]) -> PretrainedConfig:
    """``AutoConfig.for_model`` (caller holds ``MODEL_BUILD_LOCK``).

    Raises:
        AdvisorError: transformers rejects the config.
    """
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(model_type, **cfg_dict)
    except Exception as err:  # transformers validates fields with many exception types
        raise AdvisorError(f"transformers rejected the {model_type} config: {str(err).splitlines()[0][:200]}")


def hf_model_class(config: PretrainedConfig) -> type[PreTrainedModel]:
    """The class advisor trains for ``config``: seq2seq LM for encoder-decoders, masked LM for
    encoder-only models, else causal LM (transformers' auto mappings).

    Raises:
        AdvisorError: the model_type has none of these heads.
    """
    with MODEL_BUILD_LOCK:
        import transformers
        from transformers.models.auto import modeling_auto as ma

        model_type = config.model_type
        seq2seq = ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
        if getattr(config, "is_encoder_decoder", False) and model_type in seq2seq:
            return getattr(transformers, seq2seq[model_type])
        if model_type in _ENCODER_ONLY and model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
            return getattr(transformers, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES[model_type])
        for mapping in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES, seq2seq):
            if model_type in mapping:
                name = mapping[model_type]
                return getattr(transformers, name if isinstance(name, str) else name[0])
    raise AdvisorError(
        f"model_type {model_type!r} has no causal-LM, masked-LM or seq2seq head in transformers: "
        "advisor cannot make a training step for it"
    )


def attention_implementation(cls: type, wanted: str = "sdpa") -> str:
    """``sdpa`` when the class supports PyTorch SDPA, else ``eager`` (its own attention)."""
    return wanted if wanted != "sdpa" or getattr(cls, "_supports_sdpa", False) else "eager"


def class_ties_head(spec: ModelSpec) -> bool:
    """True when ``spec``'s config file says ``tie_word_embeddings: false`` and the installed transformers' config
    class ties the LM head to the input embedding anyway: transformers 5's ``T5Config`` / ``MT5Config`` (and umt5,
    longt5) set ``tie_word_embeddings = True`` in ``__post_init__`` whatever the file says (false only turns off the
    decoder-output scaling, ``scale_decoder_outputs``; transformers PR #42815).

    Raises:
        AdvisorError: transformers rejects the config.
    """
    if (spec.config or {}).get("tie_word_embeddings") is not False:
        return False
    return getattr(hf_config(spec), "tie_word_embeddings", False) is True


def keep_head_apart(model: torch.nn.Module) -> None:
    """Give the LM head its own weight (a copy of the input embedding's; shapes (vocab, d_model)), as fine-tuning
    such a checkpoint holds it: ``from_pretrained`` does not tie a head the checkpoint stores with other values than
    the embedding ("both are present in the checkpoints with different values, so we will NOT tie them",
    transformers' ``PreTrainedModel.tie_weights`` path, checked with transformers 5.24 on a T5 v1.1-shaped
    checkpoint), so a T0 / mT0 / flan-t5 fine-tune holds vocab x d_model more parameters than ``cls(config)``
    builds. A no-op when the two are already apart."""
    import torch

    head, embedding = (getattr(model, f"get_{end}_embeddings")() for end in ("output", "input"))
    if head is not None and embedding is not None and head.weight is embedding.weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone())


def chunked_loss_blocker(spec: ModelSpec) -> str | None:
    """Why a generated script cannot compute ``spec``'s loss by chunked cross-entropy (None: it can). The script shifts
    the labels as a causal LM's loss does and computes the cross-entropy alone, so the class advisor trains
    (``hf_model_class``) must be a causal LM whose loss adds no router load-balancing term.

    Raises:
        AdvisorError: transformers rejects the config.
    """
    with MODEL_BUILD_LOCK:
        from transformers.models.auto import modeling_auto as ma

        config = hf_config(spec)
        cls = hf_model_class(config)
        causal = ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if cls.__name__ != causal:
        return f"{cls.__name__} is not a causal language model; the script shifts the labels as a causal LM's loss does"
    if getattr(config, "output_router_logits", False):
        return f"{spec.name}'s loss adds the routers' load-balancing loss, which the chunked loss leaves out"
    return None


class TransformerFamily(ModelFamily):
    name = "transformer"
    default_micro_batch = 1
    zero_init = True
    # transformers' from_pretrained builds the model on the meta device (``PreTrainedModel.get_init_context``) and
    # ``_load_pretrained_model`` materialises each parameter from the memory-mapped checkpoint (safetensors
    # ``safe_open`` slices, ``.bin`` with ``torch.load(mmap=True)``): one copy, no second full state_dict.
    pretrained_copies = 1

    def build(self, spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1) -> torch.nn.Module:
        with MODEL_BUILD_LOCK:
            config = hf_config(spec, layers=layers, tp_degree=tp_degree)
            cls = hf_model_class(config)
            config._attn_implementation = attention_implementation(cls)
            try:
                model = cls(config)
            except AdvisorError:
                raise
            except Exception as err:
                raise AdvisorError(
                    f"transformers could not build {spec.name}: {err.__class__.__name__}: {one_line(err)}: check "
                    "the config's fields"
                )
            if class_ties_head(spec):
                keep_head_apart(model)
            return model

    def make_batch(
        self,
        spec: ModelSpec,
        micro_batch: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        import torch

        assert spec.seq_len is not None, "a transformer spec has its sequence length (advisor.models.configs)"
        vocab = as_int((spec.config or {}).get("vocab_size") or DEFAULT_VOCAB)
        ids = torch.randint(0, vocab, (micro_batch, spec.seq_len), device=device)
        return {"input_ids": ids, "labels": ids}

    def loss(self, spec: ModelSpec, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return model(**batch).loss

    def block_stacks(self, spec: ModelSpec) -> tuple[int, int]:
        depth = num_layers(spec.config or {})
        stacks = 2 if (spec.config or {}).get("num_decoder_layers") else 1
        return depth // stacks, stacks

    def num_blocks(self, spec: ModelSpec) -> int:
        return num_layers(spec.config or {})

    def attention_dropout(self, spec: ModelSpec) -> float:
        config = hf_config(spec)
        for key in ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout"):
            value = getattr(config, key, None)
            if isinstance(value, (int, float)):
                return float(value)
        return 0.0

    def default_lr(self, spec: ModelSpec, optimizer: Optimizer, global_batch_size: int) -> tuple[float, str]:
        """Fine-tuning a pretrained transformer (what most users do): LoRA 2e-4 (QLoRA, Dettmers et al. 2023,
        appendix B: 2e-4 for 7B and 13B), full fine-tuning 2e-5 (BERT, Devlin et al. 2019, appendix A.3: 2e-5 to
        5e-5; Stanford Alpaca's full fine-tuning of LLaMA-7B: 2e-5); Lion a third of AdamW's (Chen et al. 2023,
        section 5: 3-10x smaller); Adafactor 1e-3 (T5 fine-tuning, Raffel et al. 2020, section 3.1.2).
        Training from scratch wants more (nanoGPT's GPT-2: 6e-4): pass --base-lr."""
        if optimizer.is_sgd:
            return super().default_lr(spec, optimizer, global_batch_size)
        if optimizer == Optimizer.ADAFACTOR:
            return 1e-3, "Adafactor at the T5 fine-tuning rate (Raffel et al. 2020)"
        lora = spec.adapter is not None
        lr, why = (
            (2e-4, "LoRA fine-tuning (QLoRA paper, appendix B)")
            if lora
            else (2e-5, "full fine-tuning of a pretrained transformer (BERT appendix A.3, Alpaca)")
        )
        if optimizer == Optimizer.LION:
            return lr / 3, why + ", divided by 3 for Lion (Chen et al. 2023)"
        return lr, why

    def script_variants(self, spec: ModelSpec) -> dict[str, str]:
        """``fresh_model``: ``untied`` where the config class ties a head the file keeps apart (``class_ties_head``),
        so a script's fresh model has the head the plan counts; else ``as_built``."""
        return {"fresh_model": "untied" if class_ties_head(spec) else "as_built"}

    def script_constants(self, spec: ModelSpec) -> dict[str, object]:
        cls = hf_model_class(hf_config(spec))
        config = dict(spec.config or {})
        return {
            "HF_CONFIG": config,
            "HF_MODEL_CLASS": cls.__name__,
            "ATTN_IMPLEMENTATION": attention_implementation(cls),
            "SEQ_LEN": spec.seq_len,
            "VOCAB_SIZE": as_int(config.get("vocab_size") or 0),
        }
