"""Selective activation checkpointing: torchtitan's two policies, as the trace and generated scripts apply them.

Op policy (torchtitan ``torchtitan/models/llama3/parallelize.py`` ``_op_sac_save_list`` and
``torchtitan/distributed/activation_checkpoint.py`` ``_apply_op_sac``, commit 114151ad4d3c^ of pytorch/torchtitan):
inside each checkpointed block, the outputs of the ops in ``SAVE_OPS`` are saved (``CheckpointPolicy.MUST_SAVE``)
except every second matmul (``MM_OPS``: counted in forward and in recompute separately, the 2nd, 4th, ... are
recomputed), and everything else is recomputed (``PREFER_RECOMPUTE``), through
``torch.utils.checkpoint.create_selective_checkpoint_contexts``. The list used here, exactly:

- torchtitan's: ``aten.mm``, ``aten.linear``, ``aten._scaled_dot_product_efficient_attention``,
  ``aten._scaled_dot_product_flash_attention``, ``aten._scaled_dot_product_cudnn_attention``,
  ``aten._scaled_dot_product_attention_math``, ``aten._scaled_dot_product_fused_attention_overrideable``,
  ``_c10d_functional.reduce_scatter_tensor``, ``aten.max`` (its ``flex_attention``, ``torch_attn._varlen_attn`` and
  ``inductor_compiled_code`` entries are left out: no eager CPU/CUDA run without those extensions dispatches them);
- added for CPU, which torchtitan's list lacks: ``aten.addmm`` (a CPU ``nn.Linear`` with bias dispatches it; counted
  as a matmul) and ``aten._scaled_dot_product_flash_attention_for_cpu`` (CPU's fused SDPA).

Layer policy (torchtitan ``_apply_layer_sac``, same commit): every ``every``-th block (the ``every``-th, 2x``every``-th,
... counting from 1) is checkpointed whole, the others keep all their activations.

Imports only torch: generated scripts can carry this file's source.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

# The names of the saved ops (OpOverload packets; ``save_ops`` resolves them to ``.default`` overloads present in
# this torch build, skipping any it lacks).
SAVE_OP_NAMES: tuple[str, ...] = (
    "aten.mm",
    "aten.linear",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_attention_math",
    "aten._scaled_dot_product_fused_attention_overrideable",
    "_c10d_functional.reduce_scatter_tensor",
    "aten.max",
    "aten.addmm",  # CPU addition
    "aten._scaled_dot_product_flash_attention_for_cpu",  # CPU addition
)
# The matmuls of which every second is recomputed (torchtitan: mm and linear; here addmm too, as on CPU).
MM_OP_NAMES: tuple[str, ...] = ("aten.mm", "aten.linear", "aten.addmm")


def _resolve(names: tuple[str, ...]) -> set[object]:
    ops: set[object] = set()
    for name in names:
        space, op = name.split(".", 1)
        packet = getattr(getattr(torch.ops, space), op, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None:
            ops.add(overload)
    return ops


def save_ops() -> set[object]:
    """``SAVE_OP_NAMES`` as this torch build's ``.default`` overloads."""
    return _resolve(SAVE_OP_NAMES)


def op_policy() -> Callable[..., object]:
    """A fresh policy function for ``create_selective_checkpoint_contexts`` (one per checkpoint call: it counts the
    matmuls of that block's forward and of its recompute, torchtitan's ``forward_mm_count``/``recompute_mm_count``)."""
    from torch.utils.checkpoint import CheckpointPolicy

    saved, mms = save_ops(), _resolve(MM_OP_NAMES)
    count = {"forward": 0, "recompute": 0}

    def policy(ctx: object, func: object, *args: object, **kwargs: object) -> object:
        mode = "recompute" if getattr(ctx, "is_recompute", False) else "forward"
        if func in mms:
            count[mode] += 1
        if func in saved and not (func in mms and count[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def op_context_fn() -> tuple[AbstractContextManager, AbstractContextManager]:
    """The ``context_fn`` of ``torch.utils.checkpoint.checkpoint`` for the op policy."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(op_policy())


def layer_policy_blocks(blocks: int, every: int) -> list[int]:
    """Indices (0-based) of the blocks the layer policy checkpoints whole: every ``every``-th counting from 1
    (torchtitan ``_apply_layer_sac``: ``_layer_sac_count % ac_freq == 0``). Raises ValueError for ``every`` < 1."""
    if every < 1:
        raise ValueError("every must be >= 1")
    return [i for i in range(blocks) if (i + 1) % every == 0]
