"""Model sources, split by job: ``spec`` (the ``ModelSpec`` data), ``limits`` (sanity limits and config
field access), ``configs`` (config.json as data), ``resolve`` (names -> specs) and ``families`` (the
transformer, vision and custom-factory units that build, batch, compute the loss and contribute their
script fragment). This module re-exports the public names and the three calls the trace makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .configs import load_config_file, parse_config_text, spec_from_hf_config
from .families import family_of, hf_config, hf_model_class
from .limits import MAX_CONFIG_FILE_BYTES, check_config_size, num_layers
from .resolve import known_model_names, resolve_model, resolve_source
from .spec import ADAPTER_DTYPES, QUANT_TYPES, RECIPE_LORA_RANK, AdapterSpec, ModelSpec, recipe_adapter, recipe_flags

if TYPE_CHECKING:
    import torch


def build_model(spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1) -> torch.nn.Module:
    """``family_of(spec).build(...)``: ``spec`` as an ``nn.Module`` under the current device/mode, with
    ``spec.adapter``'s LoRA adapters when set (``advisor.models.adapters``).

    Raises:
        AdvisorError: the model cannot be built.
    """
    model = family_of(spec).build(spec, layers=layers, tp_degree=tp_degree)
    if spec.adapter is not None:  # LoRA / QLoRA: the base frozen, peft's adapters trained
        from .adapters import apply_adapter

        model = apply_adapter(model, spec.adapter)
    return model


def make_batch(
    spec: ModelSpec, micro_batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Synthetic inputs of the right shape (``family_of(spec).make_batch``)."""
    return family_of(spec).make_batch(spec, micro_batch, device=device, dtype=dtype)


def training_loss(spec: ModelSpec, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Forward pass and loss as the generated scripts compute them (``family_of(spec).loss``)."""
    return family_of(spec).loss(spec, model, batch)


__all__ = [
    "ADAPTER_DTYPES",
    "MAX_CONFIG_FILE_BYTES",
    "QUANT_TYPES",
    "AdapterSpec",
    "RECIPE_LORA_RANK",
    "recipe_adapter",
    "recipe_flags",
    "ModelSpec",
    "build_model",
    "check_config_size",
    "family_of",
    "hf_config",
    "hf_model_class",
    "known_model_names",
    "load_config_file",
    "make_batch",
    "num_layers",
    "parse_config_text",
    "resolve_model",
    "resolve_source",
    "spec_from_hf_config",
    "training_loss",
]
