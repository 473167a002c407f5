"""A user's own model: ``--model-factory package.module:function`` returns an ``nn.Module`` taking float
inputs of ``--input-shape``; the loss is the mean square of its output (a stand-in of the right size)."""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING

from ...errors import AdvisorError
from ..spec import ModelSpec
from .base import ModelFamily

if TYPE_CHECKING:
    import torch

SAFE_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class CustomFamily(ModelFamily):
    name = "custom"
    default_micro_batch = 32

    def build(self, spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1) -> torch.nn.Module:
        import torch

        assert spec.factory is not None, "a custom spec names its factory (advisor.models.resolve)"
        module_name, fn_name = spec.factory.split(":")
        try:
            model = getattr(importlib.import_module(module_name), fn_name)()
        except AdvisorError:
            raise
        except (Exception, SystemExit) as err:  # the user's code may exit; that is still a failed factory
            hint = ""
            if isinstance(err, ModuleNotFoundError) and err.name and module_name.split(".")[0] == err.name:
                # The `advisor` command's own folder is first on sys.path, not the current one (python -m puts it).
                hint = f": put the folder holding {err.name} on PYTHONPATH (PYTHONPATH=. advisor ...) or install it"
            raise AdvisorError(
                f"--model-factory {spec.factory} failed: {err.__class__.__name__}: {str(err)[:200]}{hint}"
            )
        if not isinstance(model, torch.nn.Module):
            raise AdvisorError(f"--model-factory {spec.factory} returned {type(model).__name__}, not an nn.Module")
        return model

    def make_batch(
        self,
        spec: ModelSpec,
        micro_batch: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        import torch

        assert spec.input_shape is not None, "a custom spec has its input shape (advisor.models.resolve)"
        return {"x": torch.randn((micro_batch, *spec.input_shape), device=device, dtype=dtype)}

    def loss(self, spec: ModelSpec, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(batch["x"])
        out = out if not isinstance(out, (tuple, list)) else out[0]
        return out.float().pow(2).mean()

    def script_constants(self, spec: ModelSpec) -> dict[str, object]:
        if not SAFE_FACTORY.fullmatch(spec.factory or ""):
            raise AdvisorError(f"--model-factory {spec.factory!r} cannot go into a script")
        assert spec.input_shape is not None, "a custom spec has its input shape (advisor.models.resolve)"
        return {"MODEL_FACTORY": spec.factory, "INPUT_SHAPE": tuple(spec.input_shape)}
