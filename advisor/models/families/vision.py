"""torchvision classifiers (``torchvision.models.get_model``, random weights), images + class labels."""

from __future__ import annotations

import re
import warnings
from typing import TYPE_CHECKING

from ...choices import Optimizer
from ...errors import AdvisorError
from ..spec import ModelSpec
from .base import ModelFamily

if TYPE_CHECKING:
    import torch

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
NUM_CLASSES = 1000  # torchvision's ImageNet heads


# Weight of an auxiliary classifier's loss (GoogLeNet, Inception v3 return them in training): GoogLeNet's (Szegedy et
# al. 2015, section 5: "the losses of the auxiliary classifiers were weighted by 0.3"), used for both.
AUX_LOSS_WEIGHT = 0.3


def classification_loss(out: object, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a torchvision classifier's output. In training GoogLeNet and Inception v3 return a named
    tuple (``GoogLeNetOutputs``, ``InceptionOutputs``): ``logits`` and their auxiliary classifiers' logits, whose
    losses add at ``AUX_LOSS_WEIGHT`` each (the generated scripts' ``compute_loss`` does the same)."""
    import torch
    import torch.nn.functional as F

    logits = getattr(out, "logits", out)
    assert isinstance(logits, torch.Tensor), "a torchvision classifier returns logits"
    loss = F.cross_entropy(logits, target)
    for name in ("aux_logits", "aux_logits1", "aux_logits2"):
        aux = getattr(out, name, None)
        if aux is not None:
            loss = loss + AUX_LOSS_WEIGHT * F.cross_entropy(aux, target)
    return loss


class VisionFamily(ModelFamily):
    name = "vision"
    default_micro_batch = 32

    def build(self, spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1) -> torch.nn.Module:
        import torchvision.models as tvm

        assert spec.model_type is not None and spec.input_shape is not None, (
            "a vision spec names its torchvision builder and input shape (advisor.models.resolve)"
        )
        kwargs = {"image_size": spec.input_shape[-1]} if spec.model_type.startswith("vit_") else {}
        try:
            with warnings.catch_warnings():
                # GoogLeNet and Inception v3 warn that their default initialisation will change (a FutureWarning
                # about torchvision, not about the user's input)
                warnings.simplefilter("ignore", FutureWarning)
                return tvm.get_model(spec.model_type, weights=None, **kwargs)
        except Exception as err:  # torchvision asserts on sizes (e.g. ViT patch divisibility)
            raise AdvisorError(
                f"torchvision cannot build {spec.model_type} at --image-size "
                f"{spec.input_shape[-1]} ({err.__class__.__name__}: {str(err)[:120]}): "
                "choose another image size"
            )

    def make_batch(
        self,
        spec: ModelSpec,
        micro_batch: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        import torch

        assert spec.input_shape is not None, "a vision spec has its input shape (advisor.models.resolve)"
        x = torch.randn((micro_batch, *spec.input_shape), device=device, dtype=dtype)
        return {"x": x, "target": torch.randint(0, NUM_CLASSES, (micro_batch,), device=device)}

    def loss(self, spec: ModelSpec, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return classification_loss(model(batch["x"]), batch["target"])

    def default_lr(self, spec: ModelSpec, optimizer: Optimizer, global_batch_size: int) -> tuple[float, str]:
        """SGD 0.1 per 256 images (Goyal et al. 2017, section 2.1: ResNet-50 on ImageNet); AdamW 5e-4 per 512 images
        (DeiT, Touvron et al. 2021, section 6), both linearly scaled to the global batch size."""
        if optimizer.is_adam:
            return 5e-4 * global_batch_size / 512, "AdamW 5e-4 per 512 images, linearly scaled (DeiT)"
        return super().default_lr(spec, optimizer, global_batch_size)

    def script_constants(self, spec: ModelSpec) -> dict[str, object]:
        if not _SAFE_NAME.fullmatch(spec.model_type or ""):
            raise AdvisorError(f"model name {spec.model_type!r} cannot go into a script")
        assert spec.input_shape is not None, "a vision spec has its input shape (advisor.models.resolve)"
        return {"MODEL_NAME": spec.model_type, "INPUT_SHAPE": tuple(spec.input_shape), "NUM_CLASSES": NUM_CLASSES}
