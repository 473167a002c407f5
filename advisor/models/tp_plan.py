"""Which models tensor parallelism shards here: those whose transformers config class carries a tensor-parallel plan
(``base_model_tp_plan``: module name patterns -> style; 166 config classes in transformers 5.25) that advisor can
size and the generated script can apply.

The rule, one place: a causal LM (advisor's TP scripts train with the vocab-parallel causal loss), not a mixture of
experts (the plans shard the attention only, or name fused expert styles that need their own sharding), whose
base plan uses only the ``colwise`` and ``rowwise`` styles (``torch.distributed.tensor.parallel``'s
``ColwiseParallel`` / ``RowwiseParallel``, Megatron-LM's column- and row-parallel linears, Shoeybi et al. 2019,
section 3) on the decoder blocks (``layers.*.``) and shards both the attention and the MLP (a row-wise projection
in each: the per-rank sizing divides the heads, the key/value heads and the MLP width by the TP degree,
``advisor.models.families.transformer.hf_config``). Other styles (``colwise_gather_output``,
``rowwise_split_input``, ``embedding_rowwise``, ``replicated_with_grad_allreduce``, the MoE and MLA styles) are
named in the refusal. 43 model types pass in transformers 5.25 (llama, mistral, qwen2, gemma, gemma2, starcoder2,
phi, olmo, cohere, granite, ...); the base plan only, so ``LlamaForCausalLM._tp_plan``'s ``lm_head`` entry is the
script's own vocab-parallel head.
"""

from __future__ import annotations

from functools import cache

# The pipeline script's stage module (strategies/templates/pp.py) rebuilds a Llama-style decoder by its attribute
# names (model.embed_tokens, model.layers, model.norm, model.rotary_emb, lm_head) and calls its blocks as Llama's:
# families with another structure (gemma's embedding scale, phi's final_layernorm) would run wrongly or not at all.
PP_MODEL_TYPES = ("llama", "mistral", "qwen2")

# The styles the sizing and the script map (torch's ParallelStyle of the same name).
STYLES = ("colwise", "rowwise")
# Config fields that mark a mixture of experts (transformers' names across families).
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@cache
def _plan_of(model_type: str) -> tuple[tuple[str, str], ...] | None:
    """transformers' base plan of ``model_type``'s config class, as (pattern, style) pairs; None: no such class or
    no plan. Cached per model type (read-only afterwards)."""
    from transformers import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        return None
    plan = getattr(cls, "base_model_tp_plan", None)
    return tuple(sorted(plan.items())) if plan else None


@cache
def _causal(model_type: str) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def tp_plan_blocker(model_type: str | None, config: dict[str, object] | None) -> str | None:
    """Why tensor parallelism cannot shard this model here (module docstring), in one phrase; None: it can.
    ``config``: the model's config dict (for the expert count)."""
    name = model_type or "this model"
    if not model_type or not _causal(model_type):
        return f"{name} is not a causal language model transformers' tensor-parallel plans are applied to here"
    plan = _plan_of(model_type)
    if plan is None:
        return f"{name}'s config class has no tensor-parallel plan in transformers (base_model_tp_plan)"
    if any((config or {}).get(key) for key in _EXPERT_KEYS):
        return f"{name} is a mixture of experts: its experts need their own sharding"
    other = sorted({style for _, style in plan if style not in STYLES})
    if other:
        return f"{name}'s tensor-parallel plan uses styles advisor does not map: {', '.join(other)}"
    outside = sorted(p for p, _ in plan if not p.startswith("layers.*."))
    if outside:
        return f"{name}'s tensor-parallel plan shards modules outside the decoder blocks: {', '.join(outside)}"
    rowwise = [p for p, style in plan if style == "rowwise"]
    if not any(".mlp." in p for p in rowwise) or all(".mlp." in p for p in rowwise):
        return f"{name}'s tensor-parallel plan does not shard both the attention and the MLP"
    return None


@cache
def _ties_by_default(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return bool(getattr(CONFIG_MAPPING[model_type](), "tie_word_embeddings", False))


def ties_embeddings(model_type: str | None, config: dict[str, object] | None) -> bool:
    """Whether the LM head shares the input embedding's weight: the config's ``tie_word_embeddings``, else its
    class's default (False for llama/mistral/qwen2, True for gemma, gemma2 and starcoder2)."""
    given = (config or {}).get("tie_word_embeddings")
    if given is not None:
        return bool(given)
    return bool(model_type) and _causal(model_type or "") and _ties_by_default(model_type or "")
