"""Mixture of experts in the trace: the fp32 output and the FLOPs of ``aten::_grouped_mm``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# ------------------------------------------------------------------ mixture-of-experts: grouped matmul
# transformers 5.x runs the experts of every ``@use_experts_implementation`` class (Mixtral, Qwen2/3-MoE,
# DeepSeek-V3, OLMoE, GPT-OSS, ...) with ``experts_implementation="grouped_mm"`` unless told otherwise
# (``PreTrainedModel.get_correct_experts_implementation``: None -> "grouped_mm"; ``integrations/moe.py``
# ``grouped_mm_experts_forward``), and the trace keeps that default: it is what training on a GPU runs, and
# its shapes do not depend on the routing. The S = tokens x top-k (token, expert) pairs are sorted by expert
# and multiplied in one ``aten::_grouped_mm`` per projection, with jagged groups given by offsets, so every
# tensor it makes or saves has S rows however the router splits them: exactly the balanced top-k routing
# (each expert tokens x k / n rows), which is what fake tensors, whose router scores are no data, must
# assume. The alternatives were rejected: "eager" loops over the experts that received tokens
# (``nonzero``/``where``: data-dependent shapes, which fake tensors cannot run), and "batched_mm" gathers one
# copy of its expert's weights per pair (an S x 2I x H tensor: the inference path for a few tokens, not
# what training allocates).
#
# Two things stop torch's own machinery from following it, and the trace supplies both:
# * FakeTensor's meta kernel for ``_grouped_mm`` (``torch/_meta_registrations.py``,
#   ``_meta_grouped_mm_common``) accepts bf16/fp16 only ("Expected mat_a to be BFloat16 or supported Float16
#   matrix, got torch.float32"), while the real CPU and CUDA kernels also take fp32
#   (``aten/src/ATen/native/GroupedMMUtils.h``, ``_grouped_mm_validate_inputs``; fp32 runs
#   ``_grouped_mm_fallback``, one ``mm_out`` per group into the preallocated output, no other storage). fp32
#   experts are what fp32 training and fp32-master-weight autocast run (transformers casts the input to the
#   weight dtype, and grouped_mm is not an autocast op), so Mixtral could not be traced in fp32 or bf16-autocast.
#   ``_grouped_mm_fp32`` makes the output the real kernel makes (shape rule of torch's
#   ``_create_grouped_mm_output_tensor``), inside the trace's own dispatch mode.
# * ``torch.utils.flop_counter`` has no formula for ``_grouped_mm`` (the experts' FLOPs counted 0):
#   ``_grouped_mm_flops``.
def _grouped_mm_fp32(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The output tensor of ``aten::_grouped_mm`` for fp32 operands, which FakeTensor's meta kernel rejects."""
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    size: tuple[int, ...]
    if a2 and b2:  # (M, K_total) x (K_total, N), groups along K: one (M, N) result per group
        assert offs is not None, "aten::_grouped_mm with groups along K takes their offsets"
        size = (offs.size(0), mat_a.size(0), mat_b.size(1))
    elif a2:  # (S, K) x (G, K, N) -> (S, N), groups along S
        size = (mat_a.size(0), mat_b.size(-1))
    elif b2:  # (G, M, K) x (K, N_total) -> (M, N_total), groups along N
        size = (mat_a.size(1), mat_b.size(1))
    else:  # (G, M, K) x (G, K, N): a batched matmul
        size = (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
    return mat_a.new_empty(size, dtype=out_dtype or mat_a.dtype)


def _grouped_mm_flops(
    mat_a: torch.Tensor, mat_b: torch.Tensor, *args: object, out_val: torch.Tensor | None = None, **kwargs: object
) -> int:
    """FLOPs of one ``aten::_grouped_mm`` (2 per multiply-add, as flop_counter's ``mm``): each row of the jagged
    operand meets one group's matrix, so it is the matmul of the concatenated groups."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:  # jagged contraction (the experts' weight gradients)
        return 2 * mat_a.size(0) * mat_a.size(1) * mat_b.size(1)
    assert out_val is not None, "torch.utils.flop_counter passes the op's output as out_val"
    return 2 * out_val.numel() * mat_a.size(-1)
