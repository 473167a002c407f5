"""What the user typed -> ``ModelSpec``: a factory, a pasted or file config, a transformer preset (or
its Hugging Face repo id) or a torchvision classifier name, with the closest names when unknown."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from ..errors import AdvisorError
from ..model_presets import TRANSFORMER_PRESETS, find_transformer_preset
from ..schema import ModelSource
from .configs import load_config_file, spec_from_hf_config, with_seq_len
from .limits import MAX_IMAGE_SIZE, short_value
from .spec import ModelSpec

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/\-]{0,127}$")


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


def resolve_model(
    name: str | None,
    *,
    config_path: str | None = None,
    config_dict: dict[str, object] | None = None,
    config_source: str | None = None,
    factory: str | None = None,
    seq_len: int | None = None,
    image_size: int | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> ModelSpec:
    """Resolve the user's model choice into a ``ModelSpec``. Exactly one source is used, in this order:
    ``factory``, ``config_dict``, ``config_path``, ``name``.

    Raises:
        AdvisorError: unknown names (with the closest known names), bad files, bad sizes.
    """
    if factory and (name or config_dict is not None or config_path):
        other = f"model {name!r}" if name else "a config"
        raise AdvisorError(
            f"give --model-factory or {other}, not both: the factory is your code and is only "
            "imported when it is the one source"
        )
    if factory:
        if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", factory):
            raise AdvisorError(f"--model-factory {factory!r} must look like package.module:function")
        shape = input_shape or (3, image_size or 224, image_size or 224)
        return ModelSpec(
            name=factory, family="custom", source=f"factory {factory}", factory=factory, input_shape=tuple(shape)
        )
    if name and (config_dict is not None or config_path):
        raise AdvisorError(f"give a model name ({name!r}) or a config file, not both")
    if config_dict is not None:
        label = name or (str(config_dict.get("model_type", "config")) if isinstance(config_dict, dict) else "config")
        return spec_from_hf_config(config_dict, label, config_source or "pasted config", seq_len)
    if config_path == "":
        raise AdvisorError("--config is empty: give the path of a config.json")
    if config_path:
        cfg = load_config_file(config_path)
        label = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(config_path).stem)[:64] or "config"
        return spec_from_hf_config(cfg, label, config_path, seq_len)
    if not name:
        raise AdvisorError("no model given: pass a name (e.g. resnet50, gpt2, llama-2-7b) or --config config.json")
    if not _NAME_RE.fullmatch(name):
        if name.endswith(".json") or "/" in name:
            raise AdvisorError(
                f"model name {short_value(name)} looks like a path: pass a config file as --config "
                "PATH (a directory's config.json)"
            )
        raise AdvisorError(
            f"model name {short_value(name)} has characters a model name cannot have (or is over 128 "
            "characters): use a name like resnet50"
        )
    preset = find_transformer_preset(name)
    if preset is not None:
        spec = ModelSpec(
            name=preset.name,
            family="transformer",
            source=preset.source,
            model_type=preset.model_type,
            config=dict(model_type=preset.model_type, **preset.config),
        )
        return with_seq_len(spec, seq_len)
    if name.lower() in _vision_names():
        size = 224 if image_size is None else image_size
        if not 16 <= size <= MAX_IMAGE_SIZE:
            raise AdvisorError(f"--image-size must be between 16 and {MAX_IMAGE_SIZE}, got {size}")
        return ModelSpec(
            name=name.lower(),
            family="vision",
            source="torchvision.models (weights=None)",
            model_type=name.lower(),
            input_shape=(3, size, size),
        )
    raise _unknown_model(name)


def resolve_source(source: ModelSource) -> ModelSpec:
    """``resolve_model`` for a schema ``ModelSource``, with the shape flags checked against the family.

    Raises:
        AdvisorError: as ``resolve_model``; ``--seq-len`` for a vision model or ``--image-size`` for a
            transformer.
    """
    spec = resolve_model(
        source.model,
        config_path=source.config_path,
        config_dict=source.config_dict,
        config_source=source.config_source,
        factory=source.model_factory,
        seq_len=source.seq_len,
        image_size=source.image_size,
        input_shape=source.input_shape,
    )
    if source.seq_len is not None and not spec.is_transformer:
        raise AdvisorError(f"--seq-len applies to transformer models; {spec.name} takes --image-size")
    if source.image_size is not None and spec.is_transformer:
        raise AdvisorError(f"--image-size applies to vision models; {spec.name} takes --seq-len")
    return spec
