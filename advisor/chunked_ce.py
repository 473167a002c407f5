"""Chunked cross-entropy that keeps only the 16-bit logits and each row's logsumexp for backward.

Eager chunking alone saves nothing: ``F.cross_entropy`` on each chunk keeps that chunk's fp32 log-softmax for
backward, so every chunk's survives to backward and the sum is the whole fp32 log-softmax again (torchtune's
``CEWithChunkedOutputLoss`` gets its saving from compiling the loss). The custom autograd functions here instead
upcast one chunk of rows to fp32 at a time and save only the 16-bit logits they were given, the labels and one fp32
logsumexp per row; backward recomputes the chunk's softmax in one fp32 chunk, turns it into its gradient in place
and returns it in the logits' dtype. ``ChunkCrossEntropy`` takes one chunk (the output head applied per chunk, as
torchtune's ``num_output_chunks`` models do: each chunk's gradient its own tensor); ``ChunkedCrossEntropy`` takes
the whole logits and fills one gradient tensor chunk by chunk.

Bytes (T rows, V classes, c chunks; ``advisor.memory_options.chunked_ce_bytes``): saved for backward T x V x 2 (the
logits) + T x 4 (logsumexp) + T x 8 (int64 labels); transient one fp32 chunk (T/c x V x 4) and its 16-bit cast.
Plain ``F.cross_entropy`` on ``logits.float()`` keeps T x V x 4 of log-softmax and at the start of backward holds
two more fp32 T x V tensors (``ce_plain_bytes``).

Generated scripts can carry this file's source beside their own ``import torch`` (it imports nothing else).
"""

from __future__ import annotations

from typing import Any

import torch

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index, which transformers' causal-LM loss uses


class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the rows of ``logits`` (T x V, any float dtype) whose label is not ``ignore_index``;
    the result is fp32, equal to ``F.cross_entropy(logits.float(), labels, ignore_index=...)``."""

    @staticmethod
    def forward(
        ctx: Any,  # torch.autograd.function.FunctionCtx, which carries the attributes set here
        logits: torch.Tensor,
        labels: torch.Tensor,
        chunks: int,
        ignore_index: int,
    ) -> torch.Tensor:
        rows = logits.shape[0]
        size = -(-rows // max(1, chunks))
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        valid = labels != ignore_index
        for start in range(0, rows, size):
            part = logits[start : start + size].float()  # the one fp32 chunk alive at a time
            lab = labels[start : start + size]
            ok = valid[start : start + size]
            chunk_lse = torch.logsumexp(part, dim=-1)
            lse[start : start + size] = chunk_lse
            picked = part.gather(1, lab.clamp(min=0).unsqueeze(1)).squeeze(1)
            total = total + torch.where(ok, chunk_lse - picked, 0.0).sum()
            del part
        count = valid.sum()
        ctx.chunks, ctx.ignore_index = chunks, ignore_index
        ctx.save_for_backward(logits, labels, lse, count)
        return total / count.clamp(min=1)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, labels, lse, count = ctx.saved_tensors
        rows = logits.shape[0]
        size = -(-rows // max(1, ctx.chunks))
        grad = torch.empty_like(logits)
        scale = grad_out / count.clamp(min=1)
        for start in range(0, rows, size):
            lab = labels[start : start + size]
            ok = (lab != ctx.ignore_index).unsqueeze(1)
            # softmax - one_hot(label), in place on the one fp32 chunk: d(lse - x_label)/dx
            part = logits[start : start + size].float().sub_(lse[start : start + size].unsqueeze(1)).exp_()
            part.scatter_add_(1, lab.clamp(min=0).unsqueeze(1), torch.full_like(part[:, :1], -1.0))
            grad[start : start + size] = part.mul_(ok).mul_(scale)  # in place: the chunk becomes its gradient
            del part
        return grad, None, None, None


class ChunkCrossEntropy(torch.autograd.Function):
    """One chunk of rows of a chunked loss: the sum over its rows whose label is not ``ignore_index`` of
    ``logsumexp(x) - x[label]``, divided by ``count`` (the valid rows of the whole batch). Saves the chunk's 16-bit
    logits, its labels and one fp32 logsumexp per row; backward returns the chunk's gradient in its dtype, so each
    chunk's gradient goes to its own output-head matmul and is freed with it (torchtune's ``num_output_chunks``
    models apply the head per chunk)."""

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, labels: torch.Tensor, count: torch.Tensor, ignore_index: int
    ) -> torch.Tensor:
        part = logits.float()
        lse = torch.logsumexp(part, dim=-1)
        ok = labels != ignore_index
        picked = part.gather(1, labels.clamp(min=0).unsqueeze(1)).squeeze(1)
        del part
        ctx.ignore_index = ignore_index
        ctx.save_for_backward(logits, labels, lse, count)
        return torch.where(ok, lse - picked, 0.0).sum() / count.clamp(min=1)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, labels, lse, count = ctx.saved_tensors
        ok = (labels != ctx.ignore_index).unsqueeze(1)
        part = logits.float().sub_(lse.unsqueeze(1)).exp_()  # softmax, in the one fp32 chunk
        part.scatter_add_(1, labels.clamp(min=0).unsqueeze(1), torch.full_like(part[:, :1], -1.0))
        return part.mul_(ok).mul_(grad_out / count.clamp(min=1)).to(logits.dtype), None, None, None


def chunked_cross_entropy(
    logits: torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...],
    labels: torch.Tensor,
    chunks: int = 8,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` against ``labels`` (rows flattened), equal to ``F.cross_entropy`` on the fp32
    logits. ``logits``: the whole (..., V) tensor, computed in ``chunks`` row chunks by ``ChunkedCrossEntropy``
    (its gradient is one tensor); or a list of row chunks of (..., V), each from its own output-head call, each a
    ``ChunkCrossEntropy`` (each gradient its own; what ``advisor.memory_options.chunked_ce_bytes`` sizes).
    ``chunks`` 8: torchtune's ``CEWithChunkedOutputLoss`` default. Raises ValueError on rows that do not match."""
    flat = labels.reshape(-1)
    if isinstance(logits, torch.Tensor):
        if logits.shape[:-1] != labels.shape:
            raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
        loss = ChunkedCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), flat, chunks, ignore_index)
        assert isinstance(loss, torch.Tensor)
        return loss
    parts = [c.reshape(-1, c.shape[-1]) for c in logits]
    if sum(p.shape[0] for p in parts) != flat.numel():
        raise ValueError(f"{sum(p.shape[0] for p in parts)} rows of logits for {flat.numel()} labels")
    count = (flat != ignore_index).sum()
    total: torch.Tensor | None = None
    start = 0
    for p in parts:
        one = ChunkCrossEntropy.apply(p, flat[start : start + p.shape[0]], count, ignore_index)
        assert isinstance(one, torch.Tensor)
        total = one if total is None else total + one
        start += p.shape[0]
    assert total is not None, "at least one chunk"
    return total
