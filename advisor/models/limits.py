"""Sanity limits checked by arithmetic on a config before anything is built, and config field access
(transformers uses several names for the same quantity)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import SupportsInt

from ..errors import AdvisorError

# Sanity limits checked by arithmetic on the config before anything is built.
MAX_LAYERS = 1_000  # the deepest public dense LMs have ~130 layers
MAX_HIDDEN = 65_536
MAX_VOCAB = 4_000_000
MAX_PARAMS = 10**13  # 10T parameters: far above any trainable dense model
MAX_CONFIG_FILE_BYTES = 2**20
MAX_IMAGE_SIZE = 8_192

# config field access: transformers uses several names for the same quantity
LAYER_KEYS = _LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
HIDDEN_KEYS = _HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
HEAD_KEYS = _HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
FFN_KEYS = _FFN_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim")
# A decoder's own limit: Whisper and Speech2Text name their text decoder's learned table max_target_positions
# (448 for Whisper; WhisperForCausalLM is that decoder), LED its decoder's max_decoder_position_embeddings.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_target_positions", "max_decoder_position_embeddings")


def config_get(config: Mapping[str, object], keys: tuple[str, ...], default: object = None) -> object:
    """The value of the first of ``keys`` that ``config`` sets (not None), else ``default``."""
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return default


def as_int(value: object) -> int:
    """``int(value)`` for a value read from a JSON document (a config field): an int, a float (truncated) or a
    numeric string.

    Raises:
        TypeError: a value ``int()`` does not take (None, a list, a dict), with ``int()``'s own message.
        ValueError: a string that is no integer.
    """
    if isinstance(value, (str, SupportsInt)):
        return int(value)
    raise TypeError(
        f"int() argument must be a string, a bytes-like object or a real number, not '{type(value).__name__}'"
    )


def num_layers(config: Mapping[str, object]) -> int:
    """Total transformer blocks (encoder + decoder for encoder-decoder models)."""
    n = as_int(config_get(config, _LAYER_KEYS, 0) or 0)
    if config.get("num_decoder_layers") is not None:
        n += as_int(config["num_decoder_layers"])
    return n


_LAYOUT_KEYS = ("num_attention_heads", "num_key_value_heads", "num_hidden_layers")


def layout_dims(config: Mapping[str, object]) -> tuple[int | None, int | None, int | None]:
    """(attention heads, key/value heads, decoder blocks) of a transformers config, each None where the config
    lacks it: what ``advisor.layout.Layout.validate`` checks the degrees against."""
    return tuple(  # type: ignore[return-value]
        as_int(config.get(key) or 0) or None
        for key in ("num_attention_heads", "num_key_value_heads", "num_hidden_layers")
    )


def short_value(value: object) -> str:
    """A value for an error message: never more than 40 characters (a 5000-digit integer cannot even
    be turned into a string by default)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a number with more than 30 digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive_int(config: Mapping[str, object], key: str, limit: int) -> None:
    val = config.get(key)
    if val is None:
        return
    if isinstance(val, bool) or not isinstance(val, int):
        raise AdvisorError(f"config field {key!r} must be a positive integer, got {short_value(val)}: fix the config")
    if val <= 0:
        raise AdvisorError(f"config field {key!r} must be a positive integer, got {short_value(val)}: fix the config")
    if val > limit:
        raise AdvisorError(f"config field {key!r} = {short_value(val)} is absurd (limit {limit}): check the config")


def check_config_size(config: Mapping[str, object]) -> int:
    """Refuse absurd configs by arithmetic before anything is built; return a rough parameter count.

    Rough count (dense decoder, Kaplan et al. 2020 eq. 2.1 style): layers x (4 h^2 + 3 h ffn) + vocab x h.

    Raises:
        AdvisorError: a size field is not a positive integer or is beyond the sanity limits.
    """
    for key in _LAYER_KEYS + ("num_decoder_layers",):
        _positive_int(config, key, MAX_LAYERS)
    for key in _HIDDEN_KEYS:
        _positive_int(config, key, MAX_HIDDEN)
    for key in _FFN_KEYS:
        _positive_int(config, key, 16 * MAX_HIDDEN)
    for key in _HEAD_KEYS + ("num_key_value_heads",):
        _positive_int(config, key, MAX_HIDDEN)
    for key in POSITION_KEYS:
        _positive_int(config, key, 2**24)
    _positive_int(config, "vocab_size", MAX_VOCAB)
    for key in ("num_local_experts", "num_experts"):
        _positive_int(config, key, 4096)
    layers = num_layers(config)
    if layers > MAX_LAYERS:
        raise AdvisorError(f"{layers} layers is absurd (limit {MAX_LAYERS}): check the config")
    hidden = as_int(config_get(config, _HIDDEN_KEYS, 0) or 0)
    ffn = as_int(config_get(config, _FFN_KEYS, 0) or 4 * hidden)
    experts = as_int(config.get("num_local_experts") or config.get("num_experts") or 1)
    vocab = as_int(config.get("vocab_size") or 0)
    rough = layers * (4 * hidden * hidden + 3 * hidden * ffn * experts) + vocab * hidden
    if rough > MAX_PARAMS:
        raise AdvisorError(f"config implies about {rough:.2e} parameters (limit {MAX_PARAMS:.0e}): check the config")
    heads = config_get(config, _HEAD_KEYS)
    if heads and hidden and "head_dim" not in config and "d_kv" not in config and hidden % as_int(heads):
        raise AdvisorError(f"hidden size {hidden} is not divisible by {heads} attention heads: fix the config")
    routed = config.get("num_experts_per_tok")
    if isinstance(routed, int) and not isinstance(routed, bool) and experts > 1 and routed > experts:
        # each token picks its top-k experts (torch.topk over the router's logits): k above the experts cannot run
        raise AdvisorError(
            f"config field 'num_experts_per_tok' is {routed}, more than the {experts} experts: fix the config"
        )
    kv = config.get("num_key_value_heads")
    if heads and kv and as_int(heads) % as_int(kv):
        # grouped-query attention repeats each key/value head over heads / kv query heads (transformers' repeat_kv)
        raise AdvisorError(f"{heads} attention heads are not divisible by {kv} key/value heads: fix the config")
    return rough
