"""Hugging Face config.json files as data: read (1 MiB at most), parsed as JSON only (never eval),
validated, and turned into a ``ModelSpec`` with the sequence-length rules of its position embeddings.
Size fields the file lacks take the transformers config class's values (as transformers would), said in
a note. Remote code is never run: ``auto_map`` is ignored (with a note) when transformers ships the
model_type, and the config is refused when it does not; nothing is downloaded."""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AdvisorError, one_line
from ..locks import MODEL_BUILD_LOCK
from .limits import (
    FFN_KEYS,
    HEAD_KEYS,
    HIDDEN_KEYS,
    LAYER_KEYS,
    MAX_CONFIG_FILE_BYTES,
    POSITION_KEYS,
    as_int,
    check_config_size,
    config_get,
    short_value,
)
from .spec import ModelSpec

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_ROTARY = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gpt_neox",
    "mixtral",
    "phi",
    "phi3",
    "gemma",
    "gemma2",
    "falcon",
    "gptj",
    "qwen2_moe",
    "olmo",
    "starcoder2",
    "stablelm",
    "cohere",
    "deepseek_v3",
)
_RELATIVE = ("t5", "mt5", "umt5", "longt5")


def _position_kind(model_type: str, config: Mapping[str, object]) -> tuple[str | None, int | None]:
    """(kind of position embedding, the positions it covers or None) of a config: ``relative`` (T5's buckets),
    ``rotary`` or ``learned`` (a table of ``POSITION_KEYS``' size); (None, None) when the config says neither."""
    maximum = config_get(config, POSITION_KEYS)
    if model_type in _RELATIVE:
        return "relative", as_int(config.get("n_positions") or 512)
    if model_type in _ROTARY or "rope_theta" in config or "rotary_pct" in config:
        return "rotary", as_int(maximum) if maximum else None
    if maximum:
        return "learned", as_int(maximum)
    return None, None


def with_seq_len(spec: ModelSpec, seq_len: int | None) -> ModelSpec:
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
            raise AdvisorError(
                f"--seq-len {seq_len} is beyond {spec.name}'s {maximum} learned positions: "
                f"use --seq-len {maximum} or less"
            )
        warnings.append(
            f"--seq-len {seq_len} is beyond the {maximum} positions {spec.name} was configured for "
            f"({kind} positions still run, quality is not guaranteed)"
        )
    if seq_len > 2**20:
        raise AdvisorError(f"--seq-len {seq_len} is absurd (limit {2**20})")
    return replace(spec, seq_len=seq_len, max_positions=maximum, position_kind=kind, warnings=tuple(warnings))


def spec_from_hf_config(config: object, name: str, source: str, seq_len: int | None) -> ModelSpec:
    """Validate a Hugging Face config dict (as parsed JSON: any JSON value, refused unless an object) and wrap it
    in a ``ModelSpec``.

    Raises:
        AdvisorError: not an object, no/unknown ``model_type``, remote code requested, absurd sizes.
    """
    if not isinstance(config, dict):
        kind = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "true/false"}.get(
            type(config), "null"
        )
        raise AdvisorError(f"{source}: a config must be a JSON object ({{...}}), got {kind}")
    remote = "auto_map" in config or bool(config.get("trust_remote_code"))
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        if remote:
            raise AdvisorError(
                f'{source}: this config needs remote code (auto_map) and names no "model_type" '
                "transformers knows; advisor never runs remote code"
            )
        raise AdvisorError(f'{source}: the config has no "model_type" string: add one (e.g. "llama")')
    with MODEL_BUILD_LOCK:  # transformers' lazy module is not safe to import from several threads
        from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        if remote:
            raise AdvisorError(
                f"{source}: model_type {short_value(model_type)} needs remote code (auto_map) and the "
                "installed transformers does not know it; advisor never runs remote code: use a "
                "config of a model_type transformers ships"
            )
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3, cutoff=0.6)
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise AdvisorError(f"{source}: unknown model_type {model_type!r}{hint}: use a model_type transformers knows")
    check_config_size(config)
    clean = {
        k: v
        for k, v in config.items()
        if not k.startswith("_") and k not in ("architectures", "auto_map", "quantization_config", "trust_remote_code")
    }
    clean, notes = _with_class_defaults(clean, model_type, source)
    check_config_size(clean)  # the class defaults too are only sizes until checked
    warnings = _config_warnings(config, model_type) + notes
    if remote:
        warnings.append(
            f"auto_map (remote code) is ignored: transformers ships model_type {model_type!r}, "
            "so advisor builds its own class and never runs the repository's code"
        )
    spec = ModelSpec(
        name=name, family="transformer", source=source, model_type=model_type, config=clean, warnings=tuple(warnings)
    )
    head = _head_note(spec, config.get("architectures"))
    if head:
        spec = replace(spec, warnings=(*spec.warnings, head))
    return with_seq_len(spec, seq_len)


def _head_note(spec: ModelSpec, architectures: object) -> str | None:
    """The note that the config names another head of the same model_type (a classifier, say) than the class advisor
    sizes and its scripts train (``hf_model_class``: the language-model head, on token ids); None when it names
    that class, no class, or another model_type's (``_config_warnings`` says that)."""
    if not (isinstance(architectures, list) and architectures and isinstance(architectures[0], str)):
        return None
    named = architectures[0]
    if spec.model_type not in _architecture_owners(named) or _speech_decoder_only(spec.model_type or ""):
        return None  # another model_type's class, or a speech model (its own note)
    from .families.transformer import hf_config, hf_model_class

    try:
        built = hf_model_class(hf_config(spec)).__name__
    except AdvisorError:
        return None  # the build refuses the config in its own words later
    if built == named:
        return None
    return (
        f"architectures says {named[:60]}: advisor sizes and its scripts train {built}, the language-model head on "
        f"token ids; {named[:60]}'s own head and labels are not modelled or written (the body's memory and time are "
        "the same; fine-tune that head with your own script, or start from these and swap the class)"
    )


# The fields advisor reads to size a model (groups of synonyms: transformers' names differ by family).
# A group the config lacks takes the config class's value, under the class's own name for it.
_SIZE_FIELDS = (
    LAYER_KEYS,
    ("num_decoder_layers",),
    HIDDEN_KEYS,
    HEAD_KEYS,
    ("num_key_value_heads",),
    FFN_KEYS,
    ("vocab_size",),
    POSITION_KEYS,
    ("num_local_experts", "num_experts"),
    ("num_experts_per_tok",),
)


def _with_class_defaults(
    config: dict[str, object], model_type: str, source: str = "config.json"
) -> tuple[dict[str, object], list[str]]:
    """``config`` with every size field it lacks set to the value the transformers config class gives it
    (``AutoConfig.for_model``, so code that reads the dict sees what the built model has), and the
    note naming them (and ``source``, the file or "pasted config"). Values a class derives from another field
    (key/value heads = heads, decoder layers = encoder layers) are filled without a note. An encoder-decoder
    config without ``decoder_start_token_id`` (which transformers 5 configs no longer default) gets ``pad_token_id``,
    as T5 checkpoints set it and transformers' error message says.

    Raises:
        AdvisorError: transformers rejects the config.
    """
    with MODEL_BUILD_LOCK:
        from transformers import AutoConfig

        try:
            # A deep copy: transformers edits nested fields in place (rope_scaling gains rope_theta), and the
            # caller's dict may be a preset's, shared by every later plan.
            given = copy.deepcopy({k: v for k, v in config.items() if k != "model_type"})
            obj = AutoConfig.for_model(model_type, **given)
        except Exception as err:  # transformers validates fields with many exception types
            raise AdvisorError(f"transformers rejected the {model_type} config: {one_line(err)}: fix that field")
    values = obj.to_dict()
    out, defaulted = dict(config), []
    for group in _SIZE_FIELDS:
        if config_get(config, group) is not None:
            continue
        key = next((k for k in group if isinstance(values.get(k), int) and not isinstance(values[k], bool)), None)
        if key is None:
            continue
        out[key] = values[key]
        derived = (key == "num_key_value_heads" and values[key] == config_get(values, HEAD_KEYS)) or (
            key == "num_decoder_layers" and values[key] == config_get(values, LAYER_KEYS)
        )
        if not derived:
            defaulted.append(key)
    if (
        getattr(obj, "is_encoder_decoder", False)
        and getattr(obj, "decoder_start_token_id", None) is None
        and getattr(obj, "pad_token_id", None) is not None
    ):
        out["decoder_start_token_id"] = obj.pad_token_id
    notes = []
    tied = _forced_tie_note(config, obj)
    if tied:
        notes.append(tied)
    if defaulted:
        shown = ", ".join(f"{k}={out[k]}" for k in defaulted)
        file = os.path.basename(source) or source  # the file's name, not its folders
        notes.append(f"{file} lacks {', '.join(defaulted)}: using {type(obj).__name__}'s defaults ({shown})")
    return out, notes


def _forced_tie_note(config: Mapping[str, object], obj: PretrainedConfig) -> str | None:
    """A note when the config file says ``tie_word_embeddings: false`` and the installed transformers' config class
    ties the LM head to the input embedding anyway (``advisor.models.families.transformer.class_ties_head``: T5 /
    MT5 / umt5 / longt5 in transformers 5). advisor counts the head apart, as fine-tuning such a checkpoint holds it
    (``from_pretrained`` keeps a head the checkpoint stores apart: ``keep_head_apart``), and the emitted scripts build
    it apart too. None when the flag is honoured or not set to false."""
    if config.get("tie_word_embeddings") is not False or getattr(obj, "tie_word_embeddings", False) is not True:
        return None
    vocab = getattr(obj, "vocab_size", None)
    width = getattr(obj, "d_model", None) or getattr(obj, "hidden_size", None)
    extra = (
        f" ({int(vocab) * int(width):,} parameters, {int(vocab)} x {int(width)})"
        if isinstance(vocab, int) and isinstance(width, int)
        else ""
    )
    with MODEL_BUILD_LOCK:
        import transformers

    return (
        f"tie_word_embeddings is false: the LM head is counted apart from the input embedding{extra}, as "
        f"from_pretrained loads a checkpoint that stores its own head (T5 v1.1, flan-t5, mT5, T0, mT0); transformers "
        f"{transformers.__version__}'s {type(obj).__name__} would tie the two in a model built from the config alone, "
        "so the emitted script gives a fresh model its own head"
    )


def _config_warnings(config: Mapping[str, object], model_type: str) -> list[str]:
    """What in a config advisor reads past: ``quantization_config`` (the plan is for full-precision
    weights) and an ``architectures`` entry that belongs to another model_type (model_type wins)."""
    out = []
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        out.append(
            f"quantization_config ({str(method)[:20]}) is ignored: advisor sizes training with "
            "bf16/fp16/fp32 weights; 4/8-bit (QLoRA-style) training is not modelled"
        )
    speech = _speech_decoder_only(model_type)
    if speech:
        out.append(speech)
    arch = config.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        owners = _architecture_owners(arch[0])
        if owners and model_type not in owners:
            out.append(
                f"architectures says {arch[0][:60]} (a {' / '.join(sorted(owners)[:3])} model) but model_type "
                f"is {model_type!r}: advisor builds {model_type}; fix the config if that is wrong"
            )
    return out


def _speech_decoder_only(model_type: str) -> str | None:
    """The note that a speech model is planned as its text decoder alone: advisor trains transformers' causal-LM
    class (Whisper: WhisperForCausalLM) on token ids, without the audio encoder of the speech seq2seq class."""
    with MODEL_BUILD_LOCK:
        from transformers.models.auto import modeling_auto as ma
    speech = ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.get(model_type)
    causal = ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if not speech or not causal or model_type in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return None
    return (
        f"{model_type} is a speech model: advisor plans {causal}, its text decoder alone, on token ids; the "
        f"audio encoder of {speech} is not modelled"
    )


def _architecture_owners(class_name: str) -> set[str]:
    """The model_types whose transformers auto-mappings list ``class_name`` (several share classes)."""
    with MODEL_BUILD_LOCK:
        from transformers.models.auto import modeling_auto as ma
    owners = set()
    for attr in dir(ma):
        if attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES"):
            for model_type, names in getattr(ma, attr).items():
                if class_name == names or (isinstance(names, (list, tuple)) and class_name in names):
                    owners.add(model_type)
    return owners


def load_config_file(path: str) -> object:
    """Read and parse a config.json (at most 1 MiB): any JSON value (``spec_from_hf_config`` refuses all but an
    object).

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
        raise AdvisorError(
            f"cannot read config file {path!r} ({err.__class__.__name__}): check permissions and encoding"
        )
    return parse_config_text(text, path)


class _RepeatedKey(Exception):
    """A JSON object names a key twice (``json.loads`` keeps the last); its message is the key."""


def _no_repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads``'s ``object_pairs_hook``: the object as a dict, or ``_RepeatedKey`` for a key given twice (two
    ``model_type`` values would otherwise plan the second without a word)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


def _non_finite(value: object, path: str = "") -> str | None:
    """The path of the first NaN or infinite number in a parsed JSON value (``rope_scaling.factor``), or None.
    Python's json reads NaN and Infinity, standard JSON has neither, and no config field can use one (a NaN
    ``rms_norm_eps`` planned on, then broke the trace cache's JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "the document"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def parse_config_text(text: str, source: str = "pasted config") -> object:
    """Parse pasted/uploaded text as JSON only (never eval): any JSON value (``spec_from_hf_config`` refuses all but
    an object).

    Raises:
        AdvisorError: malformed JSON (with line and column).
    """
    if not text.strip():
        raise AdvisorError(f"{source} is empty: pass a model's config.json (a JSON object with its model_type)")
    try:
        doc = json.loads(text.removeprefix("\ufeff"), object_pairs_hook=_no_repeated_keys)
    except _RepeatedKey as err:
        raise AdvisorError(
            f"{source}: the key {short_value(str(err))} appears twice in one object (JSON would keep the last "
            "silently): remove one"
        )
    except json.JSONDecodeError as err:
        raise AdvisorError(f"{source}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}")
    except RecursionError:
        raise AdvisorError(f"{source}: JSON nested too deeply")
    except ValueError:  # e.g. an integer with more digits than Python converts by default
        raise AdvisorError(f"{source}: JSON holds a number too large to be a model size: fix the config")
    where = _non_finite(doc)
    if where is not None:
        raise AdvisorError(f"{source}: config field {where!r} is NaN or infinite: write a finite value")
    return doc
