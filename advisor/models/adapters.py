"""LoRA and QLoRA applied to a built model, the way the generated scripts do it: peft's ``get_peft_model``
with a ``LoraConfig`` (peft counts and places the adapters; advisor does not re-implement them), and for QLoRA
which weights transformers' bitsandbytes integration quantizes.

On the ``meta`` device (parameter counts, traces) nothing is quantized: the quantized weights stay 16-bit
placeholders whose bytes ``advisor.bnb_layout`` computes from bitsandbytes' layout (bitsandbytes cannot
quantize meta or fake tensors). Checked here: ``get_peft_model`` on a meta model reports the same counts as on
a real one (ENGINEERING_NOTES).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ..choices import Dtype
from ..errors import AdvisorError
from .spec import AdapterSpec

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig

# peft's PeftModel reads ``model.is_gradient_checkpointing`` (peft_model.py), a property transformers 5 deprecates with
# a FutureWarning on every LoRA build: noise for the user. One fixed filter added at import (a ``catch_warnings``
# block per call would swap the process-wide filter list under other threads).
warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str) -> torch.dtype:
    """``"bf16"`` -> ``torch.bfloat16`` (also ``fp32``, ``fp16``)."""
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def lora_config(adapter: AdapterSpec, task_type: str | None = None, fan_in_fan_out: bool = False) -> LoraConfig:
    """peft's ``LoraConfig`` for ``adapter`` (bias ``"none"``, peft's default: biases stay frozen);
    ``fan_in_fan_out`` for GPT-2's ``Conv1D`` layers, which store (in, out) weights."""
    from peft import LoraConfig

    targets: str | list[str] | None = None
    if adapter.targets == ("all-linear",):
        targets = "all-linear"
    elif adapter.targets:
        targets = list(adapter.targets)
    # peft annotates lora_alpha as int, but it is a float scale (updates are scaled by alpha / r) and peft's own
    # LoraLayer.update_layer computes with it as a number: a fractional alpha works.
    return LoraConfig(
        r=adapter.rank,
        lora_alpha=adapter.alpha,  # type: ignore[arg-type]
        lora_dropout=adapter.dropout,
        target_modules=targets,
        bias="none",
        task_type=task_type,
        fan_in_fan_out=fan_in_fan_out,
    )


def default_targets(model_type: str | None) -> tuple[str, ...]:
    """peft's default LoRA target modules for a transformers ``model_type``
    (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``, what ``LoraConfig(target_modules=None)`` uses), e.g.
    llama -> (q_proj, v_proj), gpt2 -> (c_attn); () when peft has none."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    return tuple(DEFAULTS.get(model_type or "", ()))


def apply_adapter(model: torch.nn.Module, adapter: AdapterSpec) -> torch.nn.Module:
    """``model`` frozen with LoRA adapters on ``adapter.targets`` (peft ``get_peft_model``; the adapters are
    fp32, peft's ``autocast_adapter_dtype=True``), as a ``PeftModel``.

    Raises:
        AdvisorError: peft cannot place adapters (no default targets for this architecture, a target that
            names no module, a module type LoRA does not support), in one line with what to give instead.
    """
    try:
        from peft import get_peft_model
    except ImportError:  # pragma: no cover - peft is a dependency
        raise AdvisorError("LoRA needs peft: pip install peft")
    try:
        with warnings.catch_warnings():
            # peft's all-linear on fused MoE experts names patterns that match no module (gate_up_proj): its
            # RuntimeWarning says so on every plan of such a model, about peft's own defaults
            warnings.filterwarnings("ignore", message="The following (rank|alpha)_pattern keys did not match")
            return get_peft_model(model, lora_config(adapter, fan_in_fan_out=_has_conv1d(model)))
    except (ValueError, TypeError, KeyError, RuntimeError) as err:
        first = " ".join(str(err).split())[:200] or err.__class__.__name__  # one line, module reprs included
        if "lora_dropout" in str(err):  # peft's ParamWrapper (MoE experts' fused weights) takes no dropout
            hint = "give --lora-dropout 0"
        elif not adapter.targets:
            hint = "give --lora-targets (module names such as q_proj,v_proj, or all-linear)"
        else:
            hint = "check --lora-targets against the model's module names"
        raise AdvisorError(f"peft could not add LoRA adapters ({first}): {hint}")


def _has_conv1d(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a GPT-2 ``Conv1D`` layer (weights stored (in, out): peft's ``fan_in_fan_out``)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(m, Conv1D) for m in model.modules())


def quantized_weights(model: torch.nn.Module) -> list[tuple[torch.Tensor, tuple[int, int]]]:
    """The frozen weights transformers' bitsandbytes integration quantizes (``replace_with_bnb_linear``): every
        ``nn.Linear`` and GPT-2 ``Conv1D`` except the output embedding (``get_keys_to_not_convert``: the LM head stays
        in 16 bits), adapters excluded (they are trainable), each with its (out_features, in_features): ``Conv1D``
    stores (in, out), and bitsandbytes quantizes the ``Linear`` that replaces it. Works on the base model and on its
    ``PeftModel``."""
    import torch.nn as nn

    try:
        from transformers.pytorch_utils import Conv1D

        kinds: tuple[type, ...] = (nn.Linear, Conv1D)
    except ImportError:  # pragma: no cover
        kinds = (nn.Linear,)
    get_out = getattr(model, "get_output_embeddings", None)
    out = get_out() if callable(get_out) else None
    skip = {id(p) for p in out.parameters()} if out is not None else set()
    found, seen = [], set()
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(m, kinds) and w is not None and not w.requires_grad and id(w) not in skip and id(w) not in seen:
            seen.add(id(w))
            rows, cols = (int(w.shape[1]), int(w.shape[0])) if not isinstance(m, nn.Linear) else tuple(w.shape)
            found.append((w, (int(rows), int(cols))))
    return found


def cast_for_trace(model: torch.nn.Module, adapter: AdapterSpec, half: bool) -> None:
    """Give ``model``'s (meta) parameters the dtypes the script holds them in, for a trace.

    LoRA: the frozen base in 16 bits (users load it with ``torch_dtype``; the trace built it in bf16), the
    adapters in ``adapter.dtype`` (``auto``: fp32, peft's upcast, or 16 bits where ``half``: DeepSpeed casts the
    whole module). QLoRA: the quantized weights compute in ``adapter.compute_dtype`` (their dequantized copy,
    what bitsandbytes' ``MatMul4Bit`` multiplies by), every other frozen
    parameter in fp32 (``prepare_model_for_kbit_training`` upcasts the non-quantized 16-bit parameters).
    Runs on ``meta`` before the trace materialises the model (``advisor.trace``)."""
    import torch

    quant = {id(w) for w, _ in quantized_weights(model)} if adapter.quantize else set()
    want = adapter.dtype if adapter.dtype != Dtype.AUTO else (Dtype.BF16 if half else Dtype.FP32)
    for p in model.parameters():
        if p.requires_grad:
            target = torch_dtype(want)
        elif adapter.quantize:
            target = torch_dtype(adapter.compute_dtype) if id(p) in quant else torch.float32
        else:
            continue
        if p.dtype != target and p.is_floating_point():
            p.data = p.data.to(target)
