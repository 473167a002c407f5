"""Construction for a trace: a model built on ``meta`` in the trace dtype, then re-created as fake tensors.

On ``meta`` torch's init functions do nothing and transformers skips weight initialisation, so nothing is
patched; floating tensors come out in the trace dtype where the default dtype would apply
(``BuildDtypeMode``: a per-thread stand-in for ``torch.set_default_dtype``); then every parameter and buffer
is re-created as a fake CPU tensor, shared ones staying shared (``_materialize``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, cast

from ..checkpointing import enable_activation_checkpointing
from ..locks import MODEL_BUILD_LOCK
from ..models import ModelSpec, build_model
from .attention import _recompute_context

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode


@functools.cache
def _build_dtype_mode_class() -> type:
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves, tree_map_only

    # Calls whose result dtype the caller chose even without a ``dtype=`` keyword.
    explicit = frozenset({"to", "type", "float", "double", "half", "bfloat16", "view", "view_as", "type_as"})

    class BuildDtypeMode(TorchFunctionMode):
        """What ``torch.set_default_dtype(dtype)`` does to the tensors a model's construction creates,
        on this thread only: a floating result in the process default dtype of a call that names no
        dtype and takes no floating tensor (a factory such as ``torch.empty(shape)``, ``torch.tensor(1.0)``,
        integer -> float promotion such as ``arange(n) / n``) is converted to ``dtype``; results that
        follow a floating input (``x * 2``) follow it, explicit dtypes (``.float()``, ``dtype=``) stay.
        So BatchNorm statistics become bf16 and rotary ``inv_freq`` (built with ``.float()``) stays fp32,
        as under the default dtype (checked on every torchvision classifier and transformer preset)."""

        def __init__(self, dtype: torch.dtype) -> None:
            super().__init__()
            self.dtype = dtype
            self.default = torch.get_default_dtype()

        def __torch_function__(
            self, func: Callable[..., object], types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
        ) -> object:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if kwargs.get("dtype") is not None or "out" in kwargs or getattr(func, "__name__", None) in explicit:
                return out
            for leaf in tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                    return out
                if type(leaf).__module__ == "numpy":  # numpy data keeps numpy's dtype
                    return out
            return tree_map_only(torch.Tensor, lambda t: t.to(self.dtype) if t.dtype == self.default else t, out)

    return BuildDtypeMode


def _build_dtype(dtype: torch.dtype) -> AbstractContextManager:
    """Context: construction creates floating tensors in ``dtype`` where the default dtype would apply
    (``BuildDtypeMode``; thread-local, unlike ``torch.set_default_dtype``)."""
    import torch

    if dtype == torch.get_default_dtype():
        return contextlib.nullcontext()
    return _build_dtype_mode_class()(dtype)


def _materialize(model: torch.nn.Module, device: str = "cpu") -> None:
    """Replace every parameter and buffer of ``model`` (built on ``meta``) by an uninitialised tensor of
    the same shape, strides, dtype and ``requires_grad`` on ``device``: fake tensors under
    ``FakeTensorMode``. Shared parameters and buffers stay shared (gpt2's ``lm_head.weight`` is
    ``transformer.wte.weight``), which ``Module.to_empty`` does not guarantee."""
    import torch

    # id(old) -> (old, new); keeps old alive so ids are not reused
    made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def fresh(t: torch.Tensor, param: bool) -> torch.Tensor:
        hit = made.get(id(t))
        if hit is None:
            new = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
            if param:
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            hit = made[id(t)] = (t, new)
        return hit[1]

    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                module._parameters[name] = cast("torch.nn.Parameter", fresh(p, True))  # made as a Parameter
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fresh(b, False)


def build_for_trace(
    spec: ModelSpec,
    *,
    dtype: torch.dtype,
    fake: FakeTensorMode,
    layers: int | None = None,
    tp_degree: int = 1,
    checkpointing: bool = False,
    half: bool = False,
) -> tuple[torch.nn.Module, int]:
    """Build ``spec`` for a trace: on ``meta`` (no memory; transformers skips weight initialisation and
    torch's init functions are no-ops there) with floating tensors in ``dtype`` where the default dtype
    applies (``_build_dtype``), LoRA adapters in their dtype (``half``: the module is cast to 16 bits, as
    DeepSpeed's bf16/fp16 modes and pure bf16 do; ``advisor.models.adapters.cast_for_trace``), then as fake
    CPU tensors under ``fake``, in training mode, with
    activation checkpointing when asked. Holds ``MODEL_BUILD_LOCK`` throughout (``advisor.locks``).

    Returns:
        (model, number of checkpointed blocks).

    Raises:
        AdvisorError: the model cannot be built.
    """
    import torch

    with MODEL_BUILD_LOCK:
        with torch.device("meta"), _build_dtype(dtype):
            model = build_model(spec, layers=layers, tp_degree=tp_degree)
            if spec.adapter is not None:  # adapters and a quantized base in the dtypes the script holds them in
                from ..models.adapters import cast_for_trace

                cast_for_trace(model, spec.adapter, half=half)
        with fake:
            _materialize(model, "cpu")
            model.train()
            blocks = (
                enable_activation_checkpointing(model, checkpoint_kwargs={"context_fn": _recompute_context})
                if checkpointing
                else 0
            )
    return model, blocks
