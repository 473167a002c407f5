"""Per-op costs for the roofline: the bytes one op reads and writes, and which ops are transcendental.

The trace's dispatch mode (``advisor.trace.live_bytes``) records, per op, its FLOPs and ``_op_bytes``; the
roofline of ``advisor.timing.compute`` evaluates them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch._ops import OpOverload


# Ops that move no data: views and aliases share their input's storage; allocations only reserve memory.
_NO_DATA_OPS = (
    "detach",
    "alias",
    "lift_fresh",
    "_unsafe_view",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "_local_scalar_dense",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "resize_",
    "set_",
)

# Ops that read only the rows an index picks (the embedding lookup, the loss's gather of the target log-probs).
_GATHER_OPS = ("embedding", "nll_loss_forward", "nll_loss2d_forward", "gather", "index_select")
# Ops that write their output and read only what an index picks (the loss's gradient: its ``self`` input only
# gives the shape).
_SCATTER_OPS = ("nll_loss_backward", "nll_loss2d_backward")


# Element-wise ops that evaluate a transcendental function (exp, log, sqrt, the activations and softmax built on
# them) per element. A GPU runs them at memory bandwidth like any element-wise op; a CPU core's vector units
# compute them slower than its caches deliver the bytes (measured here: fp32 add 87 GB/s, sqrt 12.6, exp 5.6,
# silu 6.0 GB/s read + written, one thread, 1 MiB tensors), so on CPU they get their own measured rate
# (``advisor.timing.calibrate``).
_TRANSCENDENTAL_OPS = (
    "exp",
    "exp_",
    "log",
    "log1p",
    "sqrt",
    "sqrt_",
    "rsqrt",
    "pow",
    "pow_",
    "silu",
    "silu_backward",
    "gelu",
    "gelu_backward",
    "tanh",
    "tanh_backward",
    "sigmoid",
    "sigmoid_backward",
    "erf",
    "erfinv",
    "sin",
    "cos",
    "_softmax",
    "_softmax_backward_data",
    "_log_softmax",
    "_log_softmax_backward_data",
    "logsumexp",
    "reciprocal",
)


def _nbytes(*tensors: object) -> int:
    """Bytes of the elements a kernel touches in each tensor: ``numel x element size``, at most the storage
    (a broadcast with stride 0 reads its storage once)."""
    import torch

    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


def _op_bytes(
    func: OpOverload, args: tuple[object, ...], kwargs: dict[str, object], out: object, no_data: set[object]
) -> int:
    """Bytes one op reads and writes: its tensor inputs plus its tensor outputs (``_nbytes``); 0 for views
    (``OpOverload.is_view``), aliases and allocations (``_NO_DATA_OPS``). An in-place op reads and writes its
    operand, so counting it once as input and once as output is right."""
    import torch
    from torch.utils._pytree import tree_leaves

    if getattr(func, "is_view", False) or func._overloadpacket in no_data or func.namespace == "prim":
        return 0
    outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    if not outs:  # a query of metadata or of one element (``.item()``): no kernel streams memory
        return 0
    written = _nbytes(*outs)
    name = func.__name__.split(".")[0]
    if name in _GATHER_OPS or name in _SCATTER_OPS:
        indices = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and not t.is_floating_point()]
        # A gather reads as many elements as it writes; a scatter writes its output (zeros, then the picked rows).
        return (2 if name in _GATHER_OPS else 1) * written + _nbytes(*indices)
    return _nbytes(*tree_leaves((args, kwargs))) + written
