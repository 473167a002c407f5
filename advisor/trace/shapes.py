"""The shapes the GPU time model needs, per traced op: each GEMM's (M, N, K, batch) and element size, convolutions
as their implicit GEMMs, and fused attention's heads, lengths and head dim (``advisor.timing.gpu_time``).

A GEMM's shape is recorded as ``(flops, M, N, K, batch, element size)``; an op of several GEMMs (a convolution's
backward: dgrad and wgrad) records one such group per GEMM, its FLOPs split between them as
``torch.utils.flop_counter`` counts each gradient (equal halves for an ungrouped convolution). Convolutions as
implicit GEMMs (NVIDIA, "Convolutional Layers User's Guide", convolution algorithms): forward M = N x H_out x W_out,
N = C_out / groups, K = C_in / groups x kh x kw, one GEMM per group; backward data M = N x H_in x W_in,
N = C_in / groups, K = C_out / groups x kh x kw; backward filter M = C_out / groups, N = C_in / groups x kh x kw,
K = N x H_out x W_out.

A convolution's shape starts with the bytes and the number of tensors of the layout transposes cuDNN runs around it
(``layout_transposes``), then the call itself (``conv_params``: what a calibrated CPU measures it by), then its GEMM
groups. A batch norm in training records the bytes of its statistics pass
(``norm_shape``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..timing.compute import ATTENTION, CONV, CONV_PARAM_FIELDS, GEMM, NORM
from ..timing.gpu_time import CUDNN, FLASH, MEM_EFFICIENT

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch
    from torch._ops import OpOverloadPacket

Shape = tuple[int, ...]


def _dims(t: object) -> tuple[int, ...]:
    import torch

    return tuple(int(d) for d in t.shape) if isinstance(t, torch.Tensor) else ()


def _size(t: object) -> int:
    import torch

    return int(t.element_size()) if isinstance(t, torch.Tensor) else 0


def matmul_shape(name: str, args: Sequence[object], flops: int) -> Shape:
    """``(flops, M, N, K, batch, element size)`` of ``aten.<name>`` (mm, addmm, bmm, baddbmm, _scaled_mm) called
    with ``args``; () when the operands are not the matrices expected."""
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    da, db = _dims(a), _dims(b)
    if len(da) == 2 and len(db) == 2:
        return (flops, da[0], db[1], da[1], 1, _size(a))
    if len(da) == 3 and len(db) == 3:
        return (flops, da[1], db[2], da[2], da[0], _size(a))
    return ()


def _gemms(flops: int, gemms: list[tuple[int, int, int, int]], elsize: int, weights: list[int] | None = None) -> Shape:
    """Groups of ``(flops, M, N, K, batch, elsize)``, ``flops`` split in proportion to ``weights`` (default: each
    GEMM's M N K batch; the last takes the rounding)."""
    weights = weights or [m * n * k * g for m, n, k, g in gemms]
    total = sum(weights)
    out: list[int] = []
    left = flops
    for i, ((m, n, k, g), w) in enumerate(zip(gemms, weights)):
        share = left if i == len(gemms) - 1 else (flops * w // total if total else 0)
        left -= share
        out += [share, m, n, k, g, elsize]
    return tuple(out)


def _bytes(t: object) -> int:
    import torch

    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0


def _channels_last(t: object) -> bool:
    """Whether ``t`` is laid out channels-last (NHWC / NDHWC) and not also plain contiguous."""
    import torch

    if not isinstance(t, torch.Tensor) or t.dim() not in (4, 5):
        return False
    fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
    return t.is_contiguous(memory_format=fmt) and not t.is_contiguous()


def layout_transposes(x: object, w: object, groups: int, calls: Sequence[Sequence[object]]) -> tuple[int, int]:
    """(bytes, tensors) of the layout transposes cuDNN runs around a convolution whose input is ``x`` and weight
    ``w``: each of ``calls`` (one per GEMM: its two operands and its result, as tensors) transposes its three tensors
    between NCHW and NHWC, each read and written once (2 x its bytes), when the convolution is a 16-bit one in the
    NCHW layout (PyTorch's default, contiguous) and ungrouped; (0, 0) otherwise.

    Tensor cores run convolutions in NHWC: "every time a convolution operation is called ... the cuDNN library
    performs a transpose to convert the tensor into NHWC format", before the convolution and back after it
    (MosaicML Composer, "Channels Last" method card, from NVIDIA's "Convolutional Layers User's Guide", tensor
    layouts; it measures about 30% on ResNet-50 training on V100 and A100). Measured beside it: ResNet-50 AMP
    training on a V100 at batch 128, 110.9 ms per step in NHWC against 152.2 ms in NCHW (sandeepkumar-skb/
    pytorch_experiments, torchvision_exp/README.md). fp32 (TF32) and grouped convolutions: none counted (no
    measurement here says what cuDNN runs there)."""
    if groups != 1 or _size(x) != 2 or _channels_last(x) or _channels_last(w) or len(_dims(x)) not in (4, 5):
        return 0, 0
    return sum(2 * _bytes(t) for call in calls for t in call), 3 * len(calls)


def _pair(v: object) -> tuple[int, int]:
    """A 2-D convolution's stride / padding / dilation argument as two ints (an int or a list of one or two)."""
    items: list[object] = list(v) if isinstance(v, (list, tuple)) else [v]
    ints = [int(x) for x in items if isinstance(x, (int, float, bool))] or [0]  # (SymInts: traced as ints)
    return (ints[0], ints[-1])


def conv_params(x: object, w: object, rest: Sequence[object], call: int) -> Shape:
    """The call a calibrated CPU times a convolution by (``advisor.timing.compute.CONV_PARAM_FIELDS``): input N, C,
    H, W; the weight's four dims; stride, padding and dilation (two each); groups, transposed, output padding (two);
    element size; ``call`` (0 the forward, 8 + the backward's output mask). ``rest``: ``aten.convolution``'s
    arguments from ``stride`` on (stride, padding, dilation, transposed, output_padding, groups). All 0 but for a
    2-D convolution (4-D input and weight)."""
    dx, dw = _dims(x), _dims(w)
    if len(dx) != 4 or len(dw) != 4:
        return (0,) * CONV_PARAM_FIELDS
    stride, padding, dilation, transposed, output_padding, groups = rest[:6]
    return (
        *dx,
        *dw,
        *_pair(stride),
        *_pair(padding),
        *_pair(dilation),
        max(1, int(groups)),  # type: ignore[call-overload]
        int(bool(transposed)),
        *_pair(output_padding),
        _size(x),
        int(call),
    )


def conv_shape(args: Sequence[object], out: object, flops: int) -> Shape:
    """``(layout bytes, layout tensors, *GEMM)``: the layout transposes (``layout_transposes``: input, weight and
    output) and the implicit GEMM of ``aten.convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups)`` (module docstring; a transposed convolution's GEMM runs over its input's positions)."""
    x, w = _dims(args[0]), _dims(args[1])
    y = _dims(out)
    if len(x) < 3 or len(w) < 3 or len(y) < 3:
        return ()
    transposed, groups = bool(args[6]), max(1, int(args[8]))  # type: ignore[call-overload]
    kernel = math.prod(w[2:])
    layout = layout_transposes(args[0], args[1], groups, [(args[0], args[1], out)])
    if transposed:  # weight (C_in, C_out / groups, k...)
        gemm = (x[0] * math.prod(x[2:]), w[1], w[0] // groups * kernel, groups)
    else:
        gemm = (y[0] * math.prod(y[2:]), w[0] // groups, w[1] * kernel, groups)
    return (*layout, *conv_params(args[0], args[1], args[3:9], 0), *_gemms(flops, [gemm], _size(args[0])))


def conv_backward_shape(args: Sequence[object], flops: int) -> Shape:
    """``(layout bytes, layout tensors, *GEMMs)``: the dgrad and wgrad GEMMs of ``aten.convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
    output_mask)``, only those its output mask asks for, ``flops`` split between them (module docstring), after the
    layout transposes of each (``layout_transposes``: dgrad grad_output, weight and grad_input; wgrad input,
    grad_output and grad_weight, cuDNN's two calls transposing each its own)."""
    dy, x, w = _dims(args[0]), _dims(args[1]), _dims(args[2])
    if len(dy) < 3 or len(x) < 3 or len(w) < 3:
        return ()
    transposed, groups = bool(args[7]), max(1, int(args[9]))  # type: ignore[call-overload]
    mask = args[10]
    kernel = math.prod(w[2:])
    # Channels of the input and the output per group; a transposed weight is (C_in, C_out / groups, k...), and its
    # forward ran over the input's positions (as flop_counter counts it), so its wgrad sums over them.
    if transposed:
        c_in, c_out, summed = w[0] // groups, w[1], x
    else:
        c_in, c_out, summed = w[1], w[0] // groups, dy
    # FLOPs of each gradient as torch.utils.flop_counter's conv_backward_flop counts it (grad_input: the
    # convolution of grad_output with the weight; grad_weight: of the input with grad_output), the split's weights.
    positions = math.prod(x[2:]) if transposed else math.prod(dy[2:])
    gemms, weights, calls = [], [], []
    grad_out, inp, weight = args[0], args[1], args[2]
    if mask[0]:  # type: ignore[index]
        gemms.append((x[0] * math.prod(x[2:]), c_in, c_out * kernel, groups))
        weights.append(dy[0] * math.prod(w) * positions)
        calls.append((grad_out, weight, inp))  # grad_input has the input's shape
    if mask[1]:  # type: ignore[index]
        gemms.append((w[0] // groups, w[1] * kernel, summed[0] * math.prod(summed[2:]), groups))
        weights.append((dy[1] if transposed else x[1]) * dy[0] * (x[1] if transposed else dy[1]) * positions * kernel)
        calls.append((inp, grad_out, weight))  # grad_weight has the weight's shape
    if not gemms:
        return ()
    layout = layout_transposes(inp, weight, groups, calls)
    call = 8 + sum(bit for bit, on in zip((1, 2, 4), mask) if on)  # type: ignore[call-overload]
    params = conv_params(inp, weight, [*args[4:7], args[7], args[8], args[9]], call)
    return (*layout, *params, *_gemms(flops, gemms, _size(args[0]), weights))


# Batch norm ops whose training form runs two passes over the activation (``norm_shape``): forwards, backwards.
_NORM_FORWARDS = (
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional",
    "_batch_norm_with_update",
)
_NORM_BACKWARDS = ("native_batch_norm_backward", "batch_norm_backward")
_NORMS = _NORM_FORWARDS + _NORM_BACKWARDS


def norm_shape(name: str, args: Sequence[object]) -> Shape:
    """``(bytes of the statistics pass,)`` of a batch norm ``aten.<name>`` in training; () in evaluation (its first
    bool argument, ``training`` / ``train`` / ``update``, False) or for other arguments.

    Training needs the batch's mean and variance before it can normalize, so the GPU runs two kernels over the
    activation: forward, the statistics (reads the input), then the normalization (reads it again, writes the
    output: the op's recorded bytes); backward, the reduction of grad_output and grad_output x (x - mean) (reads
    both), then the element-wise input gradient (reads both again, writes it). PyTorch's CUDA kernels
    (aten/src/ATen/native/cuda/Normalization.cuh: batch_norm_collect_statistics, then batch_norm_elemt; backward
    batch_norm_backward_reduce, then batch_norm_backward_elemt) and cuDNN's CUDNN_BATCHNORM_SPATIAL, which PyTorch
    takes for NCHW tensors (aten/src/ATen/native/cudnn/BatchNorm.cpp, getCudnnBatchNormMode: the persistent kernel
    only for channels-last); W. Jung et al., "Restructuring Batch Normalization to Accelerate CNN Training" (2018):
    the mini-batch statistics make BN main-memory bound."""
    import torch

    training = next((a for a in args if isinstance(a, bool)), True)
    if not training or not args or not isinstance(args[0], torch.Tensor):
        return ()
    if name in _NORM_FORWARDS:
        return (_bytes(args[0]),)
    if len(args) < 2 or not isinstance(args[1], torch.Tensor):
        return ()
    return (_bytes(args[0]) + _bytes(args[1]),)  # grad_output and the input


_KERNELS = {"flash": FLASH, "efficient": MEM_EFFICIENT, "cudnn": CUDNN}


def attention_shape(q: torch.Tensor, k: torch.Tensor, kernel: int, backward: bool) -> Shape:
    """``(batch x heads, q length, kv length, head dim, kernel, backward)`` of a fused attention call on ``q`` and
    ``k`` laid out (..., heads, length, head dim) as ``F.scaled_dot_product_attention`` takes them."""
    dq, dk = _dims(q), _dims(k)
    if len(dq) < 2 or len(dk) < 2:
        return ()
    return (math.prod(dq[:-2]), dq[-2], dk[-2], dq[-1], kernel, int(backward))


def aten_attention_shape(name: str, args: Sequence[object]) -> Shape:
    """``attention_shape`` of an ATen fused-attention op (``_scaled_dot_product_{flash,efficient,cudnn}_attention``
    and their ``_backward``s, whose query, key follow the gradient in the backward's arguments); () for others."""
    kernel = next((code for word, code in _KERNELS.items() if word in name), None)
    if kernel is None:
        return ()
    backward = name.endswith("_backward")
    q, k = (args[1], args[2]) if backward else (args[0], args[1])
    import torch

    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        return ()
    return attention_shape(q, k, kernel, backward)


_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm")
_ATTENTIONS = tuple(
    f"_scaled_dot_product_{k}_attention{b}" for k in ("flash", "efficient", "cudnn") for b in ("", "_backward")
)


def shaped_ops() -> dict[OpOverloadPacket, str]:
    """The ATen overload packets whose shapes ``op_shape`` records (the GEMMs, the convolution and its backward, the
    fused attention ops), each to its name; those this torch lacks are left out."""
    import torch

    aten = torch.ops.aten
    names = (*_MATMULS, "convolution", "convolution_backward", *_ATTENTIONS, *_NORMS)
    return {getattr(aten, n): n for n in names if hasattr(aten, n)}


def records_without_flops(name: str) -> bool:
    """Whether ``op_shape`` records a shape for ``aten.<name>`` when it ran no FLOPs (the batch norms)."""
    return name in _NORMS


def op_shape(name: str, conv: bool, args: Sequence[object], out: object, flops: int, kind: int) -> tuple[int, Shape]:
    """(kind, shape) of a call of ``aten.<name>`` (one of ``shaped_ops``) that ran ``flops``: GEMM for the matmuls,
    CONV for the convolution and its backward (``conv``: the overload is one the trace times as a convolution),
    ATTENTION for the fused attention ops, NORM for a batch norm in training; ``kind`` and () where the arguments
    are not of the shapes expected."""
    try:
        if name in _NORMS:
            shape = norm_shape(name, args)
            return (NORM, shape) if shape else (kind, ())
        if name in _MATMULS:
            shape = matmul_shape(name, args, flops)
            return (GEMM, shape) if shape else (kind, ())
        if name == "convolution" and conv:
            return CONV, conv_shape(args, out, flops)
        if name == "convolution_backward" and conv:
            return CONV, conv_backward_shape(args, flops)
        shape = aten_attention_shape(name, args)
        return (ATTENTION, shape) if shape else (kind, ())
    except (IndexError, TypeError, ValueError):
        return kind, ()
