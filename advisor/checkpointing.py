"""Activation checkpointing applied the same way in the trace and in generated scripts.

Transformers models use their own ``gradient_checkpointing_enable`` (non-reentrant). Other models
(torchvision, custom) get torch's ``checkpoint_wrapper`` around each block of every run of
repeated blocks (the elements of an ``nn.Sequential``/``nn.ModuleList`` whose children are all of
one class): ResNet bottlenecks, ViT encoder blocks, ConvNeXt blocks. Generated scripts carry a
copy of ``repeated_blocks`` (they must not import this package); a test keeps the two in sync.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# Generated scripts carry these two functions' source (``inspect.getsource``) beside their own ``import torch``, so
# the annotations name only ``torch`` and builtins.
def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Outermost modules that sit in a run of >= 2 same-class siblings inside a Sequential/ModuleList."""
    from torch import nn

    chosen: list[torch.nn.Module] = []
    taken: set[int] = set()
    for module in model.modules():
        if id(module) in taken or not isinstance(module, (nn.Sequential, nn.ModuleList)):
            continue
        kids = list(module.children())
        if len(kids) >= 2 and len({type(k) for k in kids}) == 1 and any(True for _ in kids[0].parameters()):
            for kid in kids:
                chosen.append(kid)
                taken.update(id(m) for m in kid.modules())
    return chosen


def enable_activation_checkpointing(
    model: torch.nn.Module, checkpoint_kwargs: dict[str, object] | None = None, every: int = 1
) -> int:
    """Turn on activation checkpointing; return how many blocks are checkpointed (0: not supported).

    ``checkpoint_kwargs``: extra keyword arguments for ``torch.utils.checkpoint.checkpoint`` (always
    non-reentrant); the trace passes a ``context_fn`` so that recomputation in backward sees the same
    attention stand-in as the forward did, and generated scripts with selective checkpointing's op policy
    theirs (``advisor.selective_ac.op_context_fn``). ``every``: checkpoint only every ``every``-th block, counting
    from 1 in module order (torchtitan's layer policy, ``_apply_layer_sac``); the others keep their activations.
    """
    kwargs: dict[str, object] = {**(checkpoint_kwargs or {}), "use_reentrant": False}
    if hasattr(model, "gradient_checkpointing_enable") and getattr(model, "supports_gradient_checkpointing", False):
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            # transformers < 5; nn.Module's __getattr__ types the method as Tensor | Module.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        # Each decoder layer checks its own flag when called (transformers' GradientCheckpointingLayer); the base
        # model holding the layers carries the flag too, but checkpoints nothing itself: innermost flags only.
        flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
        layers = [
            m for m in flagged if not any(getattr(c, "gradient_checkpointing", False) for c in list(m.modules())[1:])
        ]
        for i, layer in enumerate(layers):
            setattr(layer, "gradient_checkpointing", (i + 1) % every == 0)  # noqa: B010 (an nn.Module attribute)
        return sum(1 for m in layers if m.gradient_checkpointing) if layers else 1
    from functools import partial

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    blocks = {id(b) for i, b in enumerate(repeated_blocks(model)) if (i + 1) % every == 0}
    if not blocks:
        return 0
    kwargs.pop("use_reentrant")  # CheckpointImpl.NO_REENTRANT sets it
    apply_activation_checkpointing(
        model,
        # kwargs: torch.utils.checkpoint.checkpoint's keyword arguments (here only context_fn), passed through.
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT, **kwargs),  # type: ignore[arg-type]
        check_fn=lambda m: id(m) in blocks,
    )
    return len(blocks)
