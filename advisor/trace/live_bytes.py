"""The trace's dispatch mode: live bytes per storage, per-phase events, FLOPs and per-op costs.

Live bytes are tracked per storage with a ``TorchDispatchMode`` and weak references, the approach of
``torch.distributed._tools.mem_tracker.MemTracker`` (see ``advisor.trace`` for why not MemTracker itself).
After every op an event (live, forward-retained alive, gradients so far); FLOPs with
``torch.utils.flop_counter``'s per-op formulas (``flop_registry``), the experts' grouped matmul with
``advisor.trace.grouped_mm``; the shapes of GEMMs, convolutions and fused attention (``advisor.trace.shapes``);
oneDNN's CPU convolution scratch as a transient event (``advisor.trace.onednn``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ..timing.compute import ATTENTION, CONV, MEMORY, TRANSCENDENTAL
from .grouped_mm import _grouped_mm_flops, _grouped_mm_fp32
from .onednn import _conv_backward_scratch
from .op_costs import _NO_DATA_OPS, _TRANSCENDENTAL_OPS, _op_bytes
from .shapes import Shape, op_shape, records_without_flops, shaped_ops

if TYPE_CHECKING:
    import torch
    from torch._ops import OpOverload


class _LiveBytes:
    """TorchDispatchMode that tracks live storages created by ops, their total, and its peak.

    ``conv_scratch_threads`` > 0: after each ``aten.convolution_backward`` that oneDNN computes with its
    gemm kernel on this CPU, an extra event with that call's transient scratch (``cpu_conv_scratch_bytes``)
    on top of the live total with its outputs, then the usual event."""

    def __init__(self, exclude: list[torch.UntypedStorage], conv_scratch_threads: int = 0) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.flop_counter import flop_registry

        tracker = self
        conv_backward = torch.ops.aten.convolution_backward.default
        grouped_mm = getattr(torch.ops.aten, "_grouped_mm", None)  # mixture-of-experts (see _grouped_mm_fp32)
        grouped_mm = grouped_mm.default if grouped_mm is not None else None
        extra_flops = {grouped_mm._overloadpacket: _grouped_mm_flops} if grouped_mm is not None else {}
        aten = torch.ops.aten
        conv_ops = {aten.convolution.default, conv_backward}
        shaped = shaped_ops()  # overload packet -> its name, for the ops whose shapes the GPU model reads
        no_data = {getattr(aten, n) for n in _NO_DATA_OPS if hasattr(aten, n)}  # overload packets
        transcendental = {getattr(aten, n) for n in _TRANSCENDENTAL_OPS if hasattr(aten, n)}

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(
                self, func: OpOverload, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
            ) -> object:
                kwargs = kwargs or {}
                if func is grouped_mm and args[0].dtype == torch.float32 and args[1].dtype == torch.float32:
                    out = _grouped_mm_fp32(*args, **kwargs)
                else:
                    out = func(*args, **kwargs)
                scratch = (
                    _conv_backward_scratch(args, kwargs, tracker.conv_scratch_threads)
                    if tracker.conv_scratch_threads and func is conv_backward
                    else 0
                )
                tracker._on_output(out, scratch)
                formula = flop_registry.get(func._overloadpacket) or extra_flops.get(func._overloadpacket)
                flops = 0
                if formula is not None:  # called as FlopCounterMode._count_flops calls it
                    flops = int(formula(*args, **kwargs, out_val=out))
                    tracker.flops += flops
                kind = (
                    CONV if func in conv_ops else TRANSCENDENTAL if func._overloadpacket in transcendental else MEMORY
                )
                shape: Shape = ()
                name = shaped.get(func._overloadpacket)
                if name is not None and (flops or records_without_flops(name)):
                    kind, shape = op_shape(name, func is conv_backward or func in conv_ops, args, out, flops, kind)
                tracker.record_op(flops, _op_bytes(func, args, kwargs, out, no_data), kind, shape)
                return out

        self.mode = _Mode()
        self.conv_scratch_threads = int(conv_scratch_threads)
        self._exclude = {id(st) for st in exclude}
        self._keep_excluded = exclude  # keeps their ids stable
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self._retained: set[int] = set()
        self.cur = 0
        self.retained_cur = 0
        self.grads_cur = 0
        self.flops = 0
        self.attention_calls = 0
        self.events: list[tuple[int, int, int]] = []
        self.fwd_events: list[tuple[int, int, int]] = []
        # Per op (flops, bytes read + written[, kind[, *shape]]) for the time model (advisor.timing.compute,
        # advisor.trace.shapes), per phase as the events; FLOPs of activation checkpointing's recompute (> 0
        # depth: inside one).
        self.ops: list[tuple[int, ...]] = []
        self.fwd_ops: list[tuple[int, ...]] = []
        self.recompute_depth = 0
        self.recompute_flops = 0

    def record_op(self, flops: int, nbytes: int, kind: int = MEMORY, shape: Shape = ()) -> None:
        """One op's cost for the time model (``advisor.timing.compute``: kind ``MEMORY``, ``CONV``,
        ``TRANSCENDENTAL``, ``ATTENTION`` or ``GEMM``, and the shape ``advisor.trace.shapes`` records for GEMMs,
        convolutions and fused attention); ops that neither compute nor move data are not kept."""
        if self.recompute_depth:
            self.recompute_flops += flops
        if flops or nbytes:
            self.ops.append((flops, nbytes, kind, *shape) if kind or shape else (flops, nbytes))

    def _free(self, key: int) -> None:
        _, n = self._live.pop(key, (None, 0))
        self.cur -= n
        if key in self._retained:
            self._retained.discard(key)
            self.retained_cur -= n

    def _on_output(self, out: object, transient: int = 0) -> None:
        """Count the new storages of ``out`` and record an event; ``transient`` > 0: first an event with
        that many more bytes (a buffer the op allocated and freed inside itself)."""
        import torch
        from torch.utils._pytree import tree_leaves

        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = id(st)
            if key in self._live or key in self._exclude:
                continue
            n = st.nbytes()

            def dropped(_ref: object, k: int = key) -> None:
                self._free(k)

            self._live[key] = (weakref.ref(st, dropped), n)
            self.cur += n
        if transient:
            self.events.append((self.cur + transient, self.retained_cur, self.grads_cur))
        self.events.append((self.cur, self.retained_cur, self.grads_cur))

    def mark_forward_end(self) -> None:
        self._retained = set(self._live)
        self.retained_cur = self.cur
        self.fwd_events, self.events = self.events, [(self.cur, self.cur, 0)]
        self.fwd_ops, self.ops = self.ops, []

    def add_flops(self, n: int, nbytes: int = 0, shape: Shape = ()) -> None:
        """FLOPs of an op the dispatch mode does not see (the fused-attention stand-in), with its bytes and its
        shape (``advisor.trace.shapes.attention_shape``)."""
        self.flops += int(n)
        self.record_op(int(n), int(nbytes), ATTENTION, shape)

    def on_grad(self, param: torch.nn.Parameter) -> None:
        """A post-accumulate-grad hook: count ``param``'s gradient storage, just accumulated."""
        assert param.grad is not None, "a post-accumulate-grad hook runs once the gradient is there"
        self.grads_cur += param.grad.untyped_storage().nbytes()
