"""Model sources: torchvision names, transformer presets, a user's config.json, a user's factory.

``resolve_model`` turns what the user typed into a ``ModelSpec`` (pure data, JSON-able config);
``build_model`` builds a ``ModelSpec`` as an ``nn.Module`` on whatever device/mode is current
(the trace calls it under ``FakeTensorMode``; generated scripts rebuild the same model for real).
Configs are data: they are only ever parsed as JSON and passed to transformers' config classes;
``auto_map``/remote code is refused and nothing is downloaded.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .errors import AdvisorError
from .model_presets import TRANSFORMER_PRESETS, find_transformer_preset

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never contact a model hub

# Sanity limits checked by arithmetic on the config before anything is built.
MAX_LAYERS = 1_000  # the deepest public dense LMs have ~130 layers
MAX_HIDDEN = 65_536
MAX_VOCAB = 4_000_000
MAX_PARAMS = 10**13  # 10T parameters: far above any trainable dense model
MAX_CONFIG_FILE_BYTES = 2**20
MAX_IMAGE_SIZE = 8_192

# Architectures whose attention heads / MLP split cleanly with torch tensor parallel plans.
TP_MODEL_TYPES = ("llama", "mistral", "qwen2")
_ENCODER_ONLY = ("bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
                 "xlm-roberta", "camembert", "mpnet")
_ROTARY = ("llama", "mistral", "qwen2", "qwen3", "gpt_neox", "mixtral", "phi", "phi3", "gemma", "gemma2",
           "falcon", "gptj", "qwen2_moe", "olmo", "starcoder2", "stablelm", "cohere", "deepseek_v3")
_RELATIVE = ("t5", "mt5", "umt5", "longt5")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/\-]{0,127}$")


@dataclass(frozen=True)
class ModelSpec:
    """What to build. ``config`` is a plain JSON-able dict (transformers) or None (vision/custom)."""

    name: str
    family: str  # "vision" | "transformer" | "custom"
    source: str
    model_type: str | None = None  # HF model_type, or the torchvision builder name
    config: dict[str, Any] | None = None
    factory: str | None = None  # "package.module:function" for family == "custom"
    input_shape: tuple[int, ...] | None = None  # per-sample shape (vision/custom), e.g. (3, 224, 224)
    seq_len: int | None = None
    max_positions: int | None = None
    position_kind: str | None = None  # "learned" | "rotary" | "relative" | None
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_transformer(self) -> bool:
        return self.family == "transformer"

    @property
    def tp_capable(self) -> bool:
        return self.family == "transformer" and self.model_type in TP_MODEL_TYPES


# ----------------------------------------------------------------------------------------------
# config field access: transformers uses several names for the same quantity
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_FFN_KEYS = ("intermediate_size", "n_inner", "d_ff", "ffn_dim")
_POS_KEYS = ("max_position_embeddings", "n_positions")


def config_get(config: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    return default


def num_layers(config: dict[str, Any]) -> int:
    """Total transformer blocks (encoder + decoder for encoder-decoder models)."""
    n = int(config_get(config, _LAYER_KEYS, 0) or 0)
    if config.get("num_decoder_layers") is not None:
        n += int(config["num_decoder_layers"])
    return n


def _short(value: Any) -> str:
    """A value for an error message: never more than 40 characters (a 5000-digit integer cannot even
    be turned into a string by default)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a number with more than 30 digits"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _positive_int(config: dict[str, Any], key: str, limit: int) -> None:
    val = config.get(key)
    if val is None:
        return
    if isinstance(val, bool) or not isinstance(val, int):
        raise AdvisorError(f"config field {key!r} must be a positive integer, got {_short(val)}: fix the config")
    if val <= 0:
        raise AdvisorError(f"config field {key!r} must be a positive integer, got {_short(val)}: fix the config")
    if val > limit:
        raise AdvisorError(f"config field {key!r} = {_short(val)} is absurd (limit {limit}): check the config")


def check_config_size(config: dict[str, Any]) -> int:
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
    for key in _POS_KEYS:
        _positive_int(config, key, 2**24)
    _positive_int(config, "vocab_size", MAX_VOCAB)
    for key in ("num_local_experts", "num_experts"):
        _positive_int(config, key, 4096)
    layers = num_layers(config)
    if layers > MAX_LAYERS:
        raise AdvisorError(f"{layers} layers is absurd (limit {MAX_LAYERS}): check the config")
    hidden = int(config_get(config, _HIDDEN_KEYS, 0) or 0)
    ffn = int(config_get(config, _FFN_KEYS, 0) or 4 * hidden)
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 1)
    vocab = int(config.get("vocab_size") or 0)
    rough = layers * (4 * hidden * hidden + 3 * hidden * ffn * experts) + vocab * hidden
    if rough > MAX_PARAMS:
        raise AdvisorError(f"config implies about {rough:.2e} parameters (limit {MAX_PARAMS:.0e}): check the config")
    heads = config_get(config, _HEAD_KEYS)
    if heads and hidden and "head_dim" not in config and "d_kv" not in config and hidden % int(heads):
        raise AdvisorError(f"hidden size {hidden} is not divisible by {heads} attention heads: fix the config")
    return rough


# ----------------------------------------------------------------------------------------------
def _vision_names() -> list[str]:
    import torchvision.models as tvm

    return sorted(tvm.list_models(module=tvm))


def known_model_names() -> list[str]:
    """Every name ``resolve_model`` accepts without a file: presets, then torchvision classifiers."""
    return [p.name for p in TRANSFORMER_PRESETS] + _vision_names()


def _unknown_model(name: str) -> AdvisorError:
    names = known_model_names()
    close = difflib.get_close_matches(name.lower(), names, n=4, cutoff=0.5)
    hint = f"closest known names: {', '.join(close)}" if close else "run `python -m advisor --list-models`"
    return AdvisorError(f"unknown model {name!r}: {hint}; or pass --config config.json / --model-factory mod:fn")


def _position_kind(model_type: str, config: dict[str, Any]) -> tuple[str | None, int | None]:
    maximum = config_get(config, _POS_KEYS)
    if model_type in _RELATIVE:
        return "relative", int(config.get("n_positions") or 512)
    if model_type in _ROTARY or "rope_theta" in config or "rotary_pct" in config:
        return "rotary", int(maximum) if maximum else None
    if maximum:
        return "learned", int(maximum)
    return None, None


def _with_seq_len(spec: ModelSpec, seq_len: int | None) -> ModelSpec:
    """Apply the sequence-length default (min(model maximum, 2048)) and the position-limit rules.

    Raises:
        AdvisorError: seq_len beyond a learned position table, or not positive.
    """
    kind, maximum = _position_kind(spec.model_type or "", spec.config or {})
    warnings = list(spec.warnings)
    if seq_len is None:
        seq_len = min(maximum, 2048) if maximum else 512
    elif seq_len <= 0:
        raise AdvisorError(f"--seq-len must be a positive integer, got {seq_len}")
    elif maximum and seq_len > maximum:
        if kind == "learned":
            raise AdvisorError(f"--seq-len {seq_len} is beyond {spec.name}'s {maximum} learned positions: "
                               f"use --seq-len {maximum} or less")
        warnings.append(f"--seq-len {seq_len} is beyond the {maximum} positions {spec.name} was configured for "
                        f"({kind} positions still run, quality is not guaranteed)")
    if seq_len > 2**20:
        raise AdvisorError(f"--seq-len {seq_len} is absurd (limit {2**20})")
    return replace(spec, seq_len=seq_len, max_positions=maximum, position_kind=kind, warnings=tuple(warnings))


def spec_from_hf_config(config: dict[str, Any], name: str, source: str, seq_len: int | None) -> ModelSpec:
    """Validate a Hugging Face config dict (as parsed JSON) and wrap it in a ``ModelSpec``.

    Raises:
        AdvisorError: not an object, no/unknown ``model_type``, remote code requested, absurd sizes.
    """
    if not isinstance(config, dict):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false"}.get(
            type(config), "null")
        raise AdvisorError(f"{source}: a config must be a JSON object ({{...}}), got {kind}")
    if "auto_map" in config or config.get("trust_remote_code"):
        raise AdvisorError(f"{source}: this config needs remote code (auto_map), which advisor never runs: "
                           "use a config whose model_type transformers knows")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise AdvisorError(f"{source}: the config has no \"model_type\" string: add one (e.g. \"llama\")")
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3, cutoff=0.6)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise AdvisorError(f"{source}: unknown model_type {model_type!r}{hint}: use a model_type transformers knows")
    check_config_size(config)
    clean = {k: v for k, v in config.items()
             if not k.startswith("_") and k not in ("architectures", "auto_map", "quantization_config")}
    spec = ModelSpec(name=name, family="transformer", source=source, model_type=model_type, config=clean,
                     warnings=tuple(_config_warnings(config, model_type)))
    return _with_seq_len(spec, seq_len)


def _config_warnings(config: dict[str, Any], model_type: str) -> list[str]:
    """What in a config advisor reads past: ``quantization_config`` (the plan is for full-precision
    weights) and an ``architectures`` entry that belongs to another model_type (model_type wins)."""
    out = []
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        out.append(f"quantization_config ({str(method)[:20]}) is ignored: advisor sizes training with "
                   "bf16/fp16/fp32 weights; 4/8-bit (QLoRA-style) training is not modelled")
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        owners = _architecture_owners(arch[0])
        if owners and model_type not in owners:
            out.append(f"architectures says {arch[0][:60]} (a {' / '.join(sorted(owners)[:3])} model) but model_type "
                       f"is {model_type!r}: advisor builds {model_type}; fix the config if that is wrong")
    return out


def _architecture_owners(class_name: str) -> set[str]:
    """The model_types whose transformers auto-mappings list ``class_name`` (several share classes)."""
    from transformers.models.auto import modeling_auto as ma

    owners = set()
    for attr in dir(ma):
        if attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES"):
            for model_type, names in getattr(ma, attr).items():
                if class_name == names or (isinstance(names, (list, tuple)) and class_name in names):
                    owners.add(model_type)
    return owners


def load_config_file(path: str) -> dict[str, Any]:
    """Read and parse a config.json (at most 1 MiB).

    Raises:
        AdvisorError: missing, unreadable, too large, or not valid JSON.
    """
    p = Path(path)
    if not p.is_file():
        raise AdvisorError(f"config file {path!r} does not exist or is not a file: check the path")
    try:
        if p.stat().st_size > MAX_CONFIG_FILE_BYTES:
            raise AdvisorError(f"config file {path!r} is over 1 MiB: pass the model's config.json, not weights")
        text = p.read_text(encoding="utf-8-sig")  # tolerate a UTF-8 byte-order mark
    except (OSError, UnicodeDecodeError) as err:
        raise AdvisorError(f"cannot read config file {path!r} ({err.__class__.__name__}): check permissions and encoding")
    return parse_config_text(text, path)


def parse_config_text(text: str, source: str = "pasted config") -> dict[str, Any]:
    """Parse pasted/uploaded text as JSON only (never eval).

    Raises:
        AdvisorError: malformed JSON (with line and column).
    """
    try:
        return json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as err:
        raise AdvisorError(f"{source}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}")
    except RecursionError:
        raise AdvisorError(f"{source}: JSON nested too deeply")
    except ValueError:  # e.g. an integer with more digits than Python converts by default
        raise AdvisorError(f"{source}: JSON holds a number too large to be a model size: fix the config")


def resolve_model(name: str | None, *, config_path: str | None = None, config_dict: dict | None = None,
                  config_source: str | None = None,
                  factory: str | None = None, seq_len: int | None = None, image_size: int | None = None,
                  input_shape: tuple[int, ...] | None = None) -> ModelSpec:
    """Resolve the user's model choice into a ``ModelSpec``. Exactly one source is used, in this order:
    ``factory``, ``config_dict``, ``config_path``, ``name``.

    Raises:
        AdvisorError: unknown names (with the closest known names), bad files, bad sizes.
    """
    if factory:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", factory):
            raise AdvisorError(f"--model-factory {factory!r} must look like package.module:function")
        shape = input_shape or (3, image_size or 224, image_size or 224)
        return ModelSpec(name=factory, family="custom", source=f"factory {factory}", factory=factory,
                         input_shape=tuple(shape))
    if name and (config_dict is not None or config_path):
        raise AdvisorError(f"give a model name ({name!r}) or a config file, not both")
    if config_dict is not None:
        label = name or (str(config_dict.get("model_type", "config")) if isinstance(config_dict, dict) else "config")
        return spec_from_hf_config(config_dict, label, config_source or "pasted config", seq_len)
    if config_path:
        cfg = load_config_file(config_path)
        label = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(config_path).stem)[:64] or "config"
        return spec_from_hf_config(cfg, label, config_path, seq_len)
    if not name:
        raise AdvisorError("no model given: pass a name (e.g. resnet50, gpt2, llama-2-7b) or --config config.json")
    if not _NAME_RE.fullmatch(name):
        raise AdvisorError(f"model name {_short(name)} has characters a model name cannot have (or is over 128 "
                           "characters): use a name like resnet50")
    preset = find_transformer_preset(name)
    if preset is not None:
        spec = ModelSpec(name=preset.name, family="transformer", source=preset.source,
                         model_type=preset.model_type, config=dict(model_type=preset.model_type, **preset.config))
        return _with_seq_len(spec, seq_len)
    if name.lower() in _vision_names():
        size = 224 if image_size is None else image_size
        if not 16 <= size <= MAX_IMAGE_SIZE:
            raise AdvisorError(f"--image-size must be between 16 and {MAX_IMAGE_SIZE}, got {size}")
        return ModelSpec(name=name.lower(), family="vision", source="torchvision.models (weights=None)",
                         model_type=name.lower(), input_shape=(3, size, size))
    raise _unknown_model(name)


# ----------------------------------------------------------------------------------------------
# building
def hf_config(spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1, attn_impl: str = "sdpa"):
    """The transformers config object for ``spec``, optionally truncated to ``layers`` blocks (per
    stack) and/or reshaped to one tensor-parallel rank's shard (heads, kv heads and MLP width / tp)."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # advisor prints its own warnings; transformers' notices are noise here
    cfg_dict = copy.deepcopy(spec.config or {})
    model_type = cfg_dict.pop("model_type")
    if layers is not None:
        for key in _LAYER_KEYS + ("num_decoder_layers",):
            if key in cfg_dict:
                cfg_dict[key] = layers
    if tp_degree > 1:
        heads = int(cfg_dict["num_attention_heads"])
        kv = int(cfg_dict.get("num_key_value_heads") or heads)
        cfg_dict.setdefault("head_dim", int(cfg_dict["hidden_size"]) // heads)
        cfg_dict["num_attention_heads"] = heads // tp_degree
        cfg_dict["num_key_value_heads"] = kv // tp_degree
        cfg_dict["intermediate_size"] = int(cfg_dict["intermediate_size"]) // tp_degree
    try:
        config = AutoConfig.for_model(model_type, **cfg_dict)
    except Exception as err:  # transformers validates fields with many exception types
        raise AdvisorError(f"transformers rejected the {model_type} config: {str(err).splitlines()[0][:200]}")
    config._attn_implementation = attn_impl
    return config


def _hf_model_class(config):
    import transformers
    from transformers.models.auto import modeling_auto as ma

    model_type = config.model_type
    if getattr(config, "is_encoder_decoder", False) and model_type in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return getattr(transformers, ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES[model_type])
    if model_type in _ENCODER_ONLY and model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return getattr(transformers, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES[model_type])
    for mapping in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
                    ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES):
        if model_type in mapping:
            name = mapping[model_type]
            return getattr(transformers, name if isinstance(name, str) else name[0])
    raise AdvisorError(f"model_type {model_type!r} has no causal-LM, masked-LM or seq2seq head in transformers: "
                       "advisor cannot make a training step for it")


def build_model(spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1, attn_impl: str = "sdpa"):
    """Build ``spec`` as an ``nn.Module`` under the current device / fake-tensor mode.

    Raises:
        AdvisorError: the factory or transformers fails to build the model.
    """
    import torch

    if spec.family == "vision":
        import torchvision.models as tvm

        kwargs = {"image_size": spec.input_shape[-1]} if spec.model_type.startswith("vit_") else {}
        try:
            return tvm.get_model(spec.model_type, weights=None, **kwargs)
        except Exception as err:  # torchvision asserts on sizes (e.g. ViT patch divisibility)
            raise AdvisorError(f"torchvision cannot build {spec.model_type} at --image-size "
                               f"{spec.input_shape[-1]} ({err.__class__.__name__}: {str(err)[:120]}): "
                               "choose another image size")
    if spec.family == "custom":
        module_name, fn_name = spec.factory.split(":")
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
            model = fn()
        except AdvisorError:
            raise
        except (Exception, SystemExit) as err:  # the user's code may exit; that is still a failed factory
            raise AdvisorError(f"--model-factory {spec.factory} failed: {err.__class__.__name__}: {str(err)[:200]}")
        if not isinstance(model, torch.nn.Module):
            raise AdvisorError(f"--model-factory {spec.factory} returned {type(model).__name__}, not an nn.Module")
        return model
    config = hf_config(spec, layers=layers, tp_degree=tp_degree, attn_impl=attn_impl)
    cls = _hf_model_class(config)
    if attn_impl == "sdpa" and not getattr(cls, "_supports_sdpa", False):
        config._attn_implementation = "eager"
    try:
        return cls(config)
    except AdvisorError:
        raise
    except Exception as err:
        raise AdvisorError(f"transformers could not build {spec.name}: {err.__class__.__name__}: "
                           f"{str(err).splitlines()[0][:200]}")


def make_batch(spec: ModelSpec, micro_batch: int, device=None, dtype=None) -> dict[str, Any]:
    """Synthetic inputs of the right shape: token ids + labels (transformers) or images + labels."""
    import torch

    if spec.family == "transformer":
        vocab = int((spec.config or {}).get("vocab_size") or 32000)
        ids = torch.randint(0, vocab, (micro_batch, spec.seq_len), device=device)
        return {"input_ids": ids, "labels": ids}
    x = torch.randn((micro_batch, *spec.input_shape), device=device, dtype=dtype)
    if spec.family == "vision":
        return {"x": x, "target": torch.randint(0, 1000, (micro_batch,), device=device)}
    return {"x": x}


def training_loss(spec: ModelSpec, model, batch: dict[str, Any]):
    """Forward pass and loss, the same way generated scripts compute it."""
    import torch.nn.functional as F

    if spec.family == "transformer":
        return model(**batch).loss
    out = model(batch["x"])
    if spec.family == "vision":
        return F.cross_entropy(out, batch["target"])
    out = out if not isinstance(out, (tuple, list)) else out[0]
    return out.float().pow(2).mean()
