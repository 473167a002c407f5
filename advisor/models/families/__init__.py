"""Model families as units: ``family_of(spec)`` is the one place that picks behaviour by family."""

from __future__ import annotations

from ..spec import ModelSpec
from .base import ModelFamily
from .custom import CustomFamily
from .transformer import TransformerFamily, attention_implementation, hf_config, hf_model_class
from .vision import VisionFamily

FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (TransformerFamily(), VisionFamily(), CustomFamily())}


def family_of(spec: ModelSpec) -> ModelFamily:
    return FAMILIES[spec.family]


__all__ = ["FAMILIES", "ModelFamily", "attention_implementation", "family_of", "hf_config", "hf_model_class"]
