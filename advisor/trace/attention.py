"""Attention in the trace: the torch-function mode that routes ``F.scaled_dot_product_attention``.

On ``meta``/fake tensors SDPA takes the math path and keeps the s x s scores. ``_attention_mode_class``'s
mode sends each call to a stand-in that saves what the fused kernels save (q, k, v, output and the fp32
log-sum-exp; FlashAttention-2 paper, Dao 2023, section 3.1) for ``flash``/``mem-efficient``, or to the math
path for ``math``; ``_recompute_context`` carries it into checkpoint recomputation. See ``advisor.trace``
for why a torch-function mode.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import TYPE_CHECKING

from ..choices import Attention
from ..timing.gpu_time import FLASH
from .op_costs import _nbytes
from .shapes import attention_shape

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from typing import Protocol

    import torch

    from .live_bytes import _LiveBytes

    class _FusedCtx(Protocol):
        """The autograd context ``FusedAttention`` uses: what it saves, and the FLOP counter it keeps for backward."""

        add_flops: Callable[[int, int, tuple[int, ...]], None]
        kernel: int
        saved_tensors: tuple[torch.Tensor, ...]

        def save_for_backward(self, *tensors: torch.Tensor) -> None: ...

    class AttentionModeLike(Protocol):
        """The torch-function mode ``_attention_mode_class`` makes (its class is built when torch is imported)."""

        kernel: Attention
        counter: _LiveBytes
        recompute: bool

        def __init__(self, kernel: Attention, counter: _LiveBytes) -> None: ...

        def fresh(self) -> AttentionModeLike: ...

        def __enter__(self) -> AttentionModeLike: ...

        def __exit__(self, *exc: object) -> bool | None: ...


def _attention_output(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An uninitialised attention output, (..., L, Ev), laid out as the fused kernels lay theirs out: like the
    query (``alloc_with_matching_layout`` in ATen's ``native/transformers/sdp_utils.h``: ``empty_like(q)`` when
    the shapes agree, else the dimensions filled in the order of the query's strides, a stride of 0 last). The
    CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``) does the same: a query transposed from
    (B, S, H, D) gives an output that is (B, S, H, D) in memory, so the attention's transpose + reshape before
    its output projection is a view, not a copy (measured: strides (2048, 16, 64, 1) for B, S, H, D = 2, 32, 4,
    16). A contiguous output there made the trace copy it (transformers' ``.transpose(1, 2).contiguous()``) and
    keep both: the small Llama's single-process peak (tests/data/small_llama.json, seq 32, fp32) read +1.22% and
    +1.78% high at micro-batch 8 and 16, and reads -0.01% with the query's layout."""
    import torch

    shape = (*q.shape[:-1], v.shape[-1])
    if tuple(q.shape) == shape:
        return torch.empty_like(q)
    order = sorted(range(q.dim()), key=lambda d: q.stride(d) or sys.maxsize)  # stable: ties keep their order
    strides, step = [0] * q.dim(), 1
    for d in order:
        strides[d] = step
        step *= shape[d]
    return q.new_empty_strided(shape, strides)


@functools.cache
def _attention_mode_class() -> type[AttentionModeLike]:
    """The ``TorchFunctionMode`` that routes SDPA calls (made once: torch is imported lazily)."""
    import math
    import types

    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    sdpa = F.scaled_dot_product_attention
    math_sdpa = torch.ops.aten._scaled_dot_product_attention_math.default

    class FusedAttention(torch.autograd.Function):
        """Stand-in for a fused kernel: saves q, k, v, the output and the fp32 log-sum-exp; reports its
        FLOPs with flop_counter's SDPA formulas (the backward recomputes the scores) and its shape
        (``advisor.trace.shapes.attention_shape``: heads, lengths, head dim, the kernel's code)."""

        @staticmethod
        def forward(
            ctx: _FusedCtx,
            q: torch.Tensor,
            k: torch.Tensor,
            v: torch.Tensor,
            add_flops: Callable[[int, int, tuple[int, ...]], None],
            kernel: int,
        ) -> torch.Tensor:
            out = _attention_output(q, v)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.add_flops, ctx.kernel = add_flops, kernel
            # Reads q, k, v; writes the output and the log-sum-exp (the s x s scores stay on chip).
            add_flops(
                sdpa_flop_count(q.shape, k.shape, v.shape),
                _nbytes(q, k, v, out, lse),
                attention_shape(q, k, kernel, backward=False),
            )
            return out

        @staticmethod
        def backward(
            ctx: _FusedCtx, grad_out: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
            q, k, v, out, lse = ctx.saved_tensors
            # Reads q, k, v, the output, its gradient and the log-sum-exp; writes dq, dk, dv.
            ctx.add_flops(
                sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape),
                _nbytes(q, k, v, out, lse, grad_out) + _nbytes(q, k, v),
                attention_shape(q, k, ctx.kernel, backward=True),
            )
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None

    def math_attention(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """What ``F.scaled_dot_product_attention`` does when it picks the math backend, op for op:
        under autocast, its autocast kernel first casts the floating inputs (mask, value, key, query) to
        the autocast dtype and runs the rest with autocast off; a boolean mask becomes an additive one
        (``convert_boolean_attn_mask``: where(mask, 0, -inf) in the query's dtype); then the composite
        ``aten::_scaled_dot_product_attention_math`` (so the dispatch mode sees the same
        bmm/softmax/dropout ops, and autograd saves the same tensors, as under
        ``sdpa_kernel([SDPBackend.MATH])``; checked op by op on fake tensors, torch 2.14)."""
        device = query.device.type
        autocast = torch.is_autocast_enabled(device)
        if autocast:
            low = torch.get_autocast_dtype(device)

            def cast(t: torch.Tensor) -> torch.Tensor:
                eligible = t.is_floating_point() and t.dtype not in (low, torch.float64)
                return t.to(low) if eligible else t

            # Last argument first: the order in which the autocast kernel's casts run (C++ evaluates
            # the pack of casts right to left here), so the traced events come in the same order.
            attn_mask, value, key, query = (
                (cast(attn_mask) if attn_mask is not None else None),
                cast(value),
                cast(key),
                cast(query),
            )
        with torch.autocast(device, enabled=False) if autocast else contextlib.nullcontext():
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.where(
                    attn_mask,
                    torch.scalar_tensor(0.0, dtype=query.dtype, device=attn_mask.device),
                    torch.scalar_tensor(-math.inf, dtype=query.dtype, device=attn_mask.device),
                )
            return math_sdpa(
                query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
            )[0]

    class AttentionMode(TorchFunctionMode):
        """Routes ``F.scaled_dot_product_attention`` to the fused-kernel stand-in or the math path
        and counts the calls in ``counter.attention_calls`` (FLOPs of the stand-in go to
        ``counter.add_flops``; the math path's ops are counted by the dispatch mode).

        A mode sees a Python-level torch function (``F.multi_head_attention_forward``) as one call and
        runs it with the mode popped, so the SDPA call inside would escape: such functions (whose code
        calls the global ``scaled_dot_product_attention``) run as a private copy whose globals bind
        that name to ``self.attention``. Nothing shared is modified."""

        def __init__(self, kernel: Attention, counter: _LiveBytes) -> None:
            super().__init__()
            self.kernel = kernel
            self.counter = counter
            self._copies: dict[types.FunctionType, types.FunctionType | None] = {}

        def fresh(self) -> AttentionMode:
            """A new mode with the same kernel and counter (for checkpoint recomputation): while it is active
            the counter knows that the ops it sees are recomputed (``_LiveBytes.recompute_flops``)."""
            mode = type(self)(self.kernel, self.counter)
            mode.recompute = True
            return mode

        recompute = False

        def __enter__(self) -> AttentionMode:
            if self.recompute:
                self.counter.recompute_depth += 1
            return super().__enter__()

        def __exit__(self, *exc: object) -> bool | None:
            if self.recompute:
                self.counter.recompute_depth -= 1
            return super().__exit__(*exc)

        def attention(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attn_mask: torch.Tensor | None = None,
            dropout_p: float = 0.0,
            is_causal: bool = False,
            scale: float | None = None,
            enable_gqa: bool = False,
        ) -> torch.Tensor:
            self.counter.attention_calls += 1
            if self.kernel == Attention.MATH:
                return math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            # One stand-in for both fused kernels: the memory-efficient profile is the flash trace relabelled
            # (``advisor.profile._TRACED_AS``; its ``ActivationProfile.attention`` names the kernel), so the ops
            # record the flash kernel's code (``advisor.timing.gpu_time`` times both kernels alike).
            return FusedAttention.apply(query, key, value, self.counter.add_flops, FLASH)

        def _private_copy(self, func: types.FunctionType) -> types.FunctionType | None:
            if func in self._copies:
                return self._copies[func]
            copy = None
            if (
                "scaled_dot_product_attention" in func.__code__.co_names
                and func.__globals__.get("scaled_dot_product_attention") is sdpa
            ):
                scope = dict(func.__globals__, scaled_dot_product_attention=self.attention)
                copy = types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__, func.__closure__)
                copy.__kwdefaults__ = func.__kwdefaults__
            self._copies[func] = copy
            return copy

        def __torch_function__(
            self, func: Callable[..., object], types_: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
        ) -> object:
            kwargs = kwargs or {}
            if func is sdpa:
                return self.attention(*args, **kwargs)
            if type(func) is types.FunctionType:
                copy = self._private_copy(func)
                if copy is not None:
                    return copy(*args, **kwargs)
            return func(*args, **kwargs)

    return AttentionMode


def _recompute_context() -> tuple[AbstractContextManager, AbstractContextManager]:
    """``context_fn`` for ``torch.utils.checkpoint``: torch does not carry torch-function modes into
    backward, so the recomputation of a checkpointed block runs under a fresh copy of the attention
    mode that was active when the block ran forward (this thread's; none outside a trace)."""
    from torch.overrides import _get_current_function_mode_stack

    cls = _attention_mode_class()
    active = [m for m in _get_current_function_mode_stack() if isinstance(m, cls)]
    return contextlib.nullcontext(), (active[-1].fresh() if active else contextlib.nullcontext())
