"""The meta trace: one forward + backward under ``FakeTensorMode``, no real memory allocated.

What it measures (bytes, beyond the parameters and buffers themselves):

* ``activations``: everything still alive at the end of the forward pass (the tensors autograd
  saved for backward, the batch, the loss): what a training step holds between forward and backward.
* ``peak``: the largest live total at any point of forward + backward, split at that moment into
  the forward-retained activations still alive, the parameter gradients accumulated so far, and
  the rest ("other": temporaries, logits, the recompute of one block under activation checkpointing).
* FLOPs with ``torch.utils.flop_counter``'s per-op formulas (``flop_registry``, 2 FLOPs per multiply-add),
  counted in the same pass.
* per op, its FLOPs and the bytes it reads and writes (``_op_bytes``), per phase (``Timeline.fwd_ops`` /
  ``bwd_ops``), and the FLOPs of activation checkpointing's recompute (``recompute_flops``): the inputs of the
  step-time roofline (``ActivationProfile.compute_time``, ``advisor.timing.compute``), linear in the
  micro-batch and extrapolated in depth like every other figure. No second trace. Cached entries made before
  these fields existed are recomputed: the cache key holds a hash of this file (``advisor.profile.code_hash``). Not ``FlopCounterMode`` itself: it keeps references to tensors (measured:
  +8% backward peak on gpt2) and sees nothing inside the fused-attention stand-in, which therefore
  counts itself with the library's ``sdpa_flop_count`` / ``sdpa_backward_flop_count``.

Live bytes are tracked per storage with a dispatch mode and weak references, the approach of
``torch.distributed._tools.mem_tracker.MemTracker``. We do not use MemTracker itself: it attributes
memory per module rather than per phase, has no notion of "retained at end of forward", and cannot
swap in the fused attention kernel's saved tensors (below), which changes the answer by 10-100x.

Attention: on ``meta``/fake tensors SDPA takes the math path and keeps the s x s scores. The trace
routes ``F.scaled_dot_product_attention`` through a ``torch.overrides.TorchFunctionMode``
(``_attention_mode_class``) to a stand-in that saves what the fused kernels save (q, k, v, output and
the fp32 log-sum-exp; FlashAttention-2 paper, Dao 2023, section 3.1) for ``flash``/``mem-efficient``,
or to the math path for ``math``: ``aten::_scaled_dot_product_attention_math`` called directly, with
the boolean-mask conversion and autocast casts that SDPA's own kernels do first, so the ops and saved
tensors are those of ``sdpa_kernel([SDPBackend.MATH])`` without setting its process-wide backend flags.
A torch-function mode rather than a ``TorchDispatchMode`` on ``aten._scaled_dot_product_flash_attention_for_cpu``:
the dispatch mode sits below autograd, so it cannot change what autograd saves (the real CPU kernel's
formula decides), flop_counter has no formula for the CPU kernel, and SDPA picks its backend in a
DispatchStub call no mode sees, so ``math`` would still need the global flags; the function mode
reproduces the previous figures exactly. Torch-function modes are
per thread, but torch neither keeps them inside a Python-level torch function it dispatches (so
``F.multi_head_attention_forward``, which calls SDPA, runs as a private copy bound to the stand-in)
nor carries them into backward (so checkpointed blocks recompute under a copy of the mode, passed as
checkpoint's ``context_fn``).

Mixture of experts: transformers' default ``grouped_mm`` experts path, whose shapes are those of balanced
top-k routing whatever the (fake) router picks; the dispatch mode runs its fp32 case, which FakeTensor's
meta kernel rejects, and counts its FLOPs, which flop_counter does not (see ``_grouped_mm_fp32``).

Construction (``build_for_trace``): on ``meta`` (torch's init functions do nothing there and
transformers skips weight initialisation, so nothing is patched), with floating tensors in the trace
dtype where the default dtype would apply (``BuildDtypeMode``: a per-thread stand-in for
``torch.set_default_dtype``; BatchNorm statistics bf16, rotary ``inv_freq`` fp32, as before), then
every parameter and buffer is re-created as a fake CPU tensor, shared ones staying shared.

Threads: nothing above touches process-wide state; ``advisor.locks.MODEL_BUILD_LOCK`` is held for
each whole trace all the same, because torch's autocast cache of weight casts is process-wide (see
``trace_step``). Plans from several threads give the plans made one after another
(``tests/test_concurrency.py``).

CPU convolution scratch (``cpu_conv_scratch_threads`` > 0; only for CPU verification estimates): on CPUs
without AVX-512, oneDNN computes some convolutions' weight gradient with its ``x64:gemm:jit`` kernel, whose
scratch buffer comes from the c10 allocator while ``aten::convolution_backward`` runs and is freed before
it returns, so no fake-tensor trace can see it. ``cpu_conv_scratch_bytes`` gives its size and the dispatch
mode adds it as a transient event right after that op (see the function for the rule and its sources).

Cost control: transformer stacks deeper than 4 blocks are traced at 1 and 2 blocks and extrapolated
linearly in depth (blocks are identical); every figure is
linear in the micro-batch (no op's memory depends on the batch otherwise), traced at 2 and 3.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import weakref
from dataclasses import dataclass, fields, replace
from typing import Any

from .checkpointing import enable_activation_checkpointing
from .errors import AdvisorError
from .locks import MODEL_BUILD_LOCK
from .models import ModelSpec, build_model, family_of, make_batch, training_loss
from .timing.compute import (ATTENTION, CONV, MEMORY, TRANSCENDENTAL, ComputeTime, Rates, floored_s,
                             roofline_work)

PRECISION_TRACE_MODES = ("fp32", "autocast", "half")
ATTENTION_KERNELS = ("flash", "mem-efficient", "math")
TRUNCATE_ABOVE_LAYERS = 4
# Traced micro-batch sizes are BASE_B and BASE_B + 1. Not 1: some models take other op paths at
# batch 1 (squeezes in nn.MultiheadAttention), which breaks the event-by-event alignment.
BASE_B = 2


@dataclass(frozen=True)
class StepTrace:
    """A traced fwd+bwd evaluated at one micro-batch size; bytes (ints), flops for the whole step.

    ``fwd_peak``: the peak inside forward (activations so far + temporaries such as fp32 logits).
    ``bwd_peak``: the peak inside backward, split into forward-retained activations still alive
    (``bwd_activations``), gradients accumulated so far (``bwd_grads``) and the rest (temporaries).
    ``bwd_net_peak``: the largest live total *minus* the gradients accumulated so far, at the event
    where that is largest, and the activations and gradients alive there (``bwd_net_activations``,
    ``bwd_net_grads``). This is the
    peak that matters when gradients live in preallocated buffers for the whole step (DDP's buckets):
    those are counted once, as resident, and the peak of everything else may come earlier in backward
    than the peak of the sum (resnet18: at layer4's first convolution, not at the end).
    """

    activations: int
    fwd_peak: int
    bwd_peak: int
    bwd_activations: int
    bwd_grads: int
    grads: int
    flops: int
    bwd_net_peak: int = 0
    bwd_net_activations: int = 0
    bwd_net_grads: int = 0  # gradients accumulated by that event (0: it precedes the first gradient)

    @property
    def peak(self) -> int:
        return max(self.fwd_peak, self.bwd_peak)

    @property
    def bwd_other(self) -> int:
        return self.bwd_peak - self.bwd_activations - self.bwd_grads

    def combine(self, other: "StepTrace", a: float, b: float) -> "StepTrace":
        """Element-wise ``a * self + b * other`` (linear extrapolation in depth), rounded to ints."""
        return StepTrace(**{f.name: int(round(a * getattr(self, f.name) + b * getattr(other, f.name)))
                            for f in fields(self)})


@dataclass(frozen=True)
class Timeline:
    """Raw trace: after every op, (live, forward-retained alive, grads so far), per phase."""

    fwd: tuple[tuple[int, int, int], ...]
    bwd: tuple[tuple[int, int, int], ...]
    activations: int
    grads: int
    flops: int
    attention_calls: int = 0  # calls of F.scaled_dot_product_attention (0: the model has no SDPA)
    # Per op, in order: (FLOPs, bytes read + written[, 1 for a convolution]) (``_op_bytes``), forward and
    # backward (with any recompute); the roofline of ``advisor.timing.compute`` evaluates them.
    fwd_ops: tuple[tuple[int, ...], ...] = ()
    bwd_ops: tuple[tuple[int, ...], ...] = ()
    recompute_flops: int = 0  # FLOPs of activation checkpointing's recompute (inside ``flops``)


Event = tuple[int, int, int]  # (live, forward-retained alive, gradients so far), bytes
# Bytes two events' differences may differ by and still count as the same (rounding of the micro-batch
# interpolation; real mismatches differ by whole tensors).
DEPTH_ALIGN_TOLERANCE = 4096


def _events_at(e1: tuple, e2: tuple, b: int) -> list[Event]:
    """One phase's events at micro-batch ``b``, each linear in b between the traces at ``BASE_B``
    (``e1``) and ``BASE_B + 1`` (``e2``); when a few ops differ between the sizes the events are
    aligned proportionally."""
    if len(e1) != len(e2):
        n1, n2 = len(e1), len(e2)
        if n1 < n2:
            e1 = tuple(e1[i * n1 // n2] for i in range(n2))
        else:
            e2 = tuple(e2[i * n2 // n1] for i in range(n1))
    return [tuple(int(x[i] + (b - BASE_B) * (y[i] - x[i])) for i in range(3)) for x, y in zip(e1, e2)]


def _peaks(events: list[Event]) -> tuple[Event, Event]:
    """(live, retained, grads) at the event with the largest live total, and at the event with the
    largest live total minus gradients; zeros for an empty phase."""
    if not events:
        return (0, 0, 0), (0, 0, 0)
    return max(events, key=lambda e: e[0]), max(events, key=lambda e: e[0] - e[2])


def _phase_peaks(e1: tuple, e2: tuple, b: int) -> tuple[Event, Event]:
    """Peaks over the events of one phase at micro-batch ``b`` (``_events_at``, ``_peaks``)."""
    return _peaks(_events_at(e1, e2, b))


def _deep_events(one: list[Event], two: list[Event], extra: float) -> list[Event]:
    """The events of a phase at full depth from the same phase traced with one block (``one``) and two
    (``two``); ``extra`` = full depth - 1 (blocks added beyond the first).

    The two-block trace is the one-block trace with one more block's events inserted. Aligned from
    the start, the events up to the end of the first block processed correspond (backward: the same
    gradients exist so far; the second block only adds its retained activations), and each
    extrapolates linearly: the first block of a deep stack. Aligned from the end, the last block and
    what follows correspond (backward: the same retained activations are left; the second block only
    adds its gradients): the last block of the stack. A block in between lies between the two, linearly
    in its position, so its events never exceed the larger of the two ends. Forward mirrors this with
    retained activations. Where neither alignment holds (an event the one-block trace cannot place),
    the event is aligned proportionally. Every component is kept within [0, live]."""
    if not one or not two:
        return list(one)
    n1, n2 = len(one), len(two)

    def grow(a: Event, b: Event) -> Event:
        live, kept, grads = (max(0, int(round(a[i] + extra * (b[i] - a[i])))) for i in range(3))
        kept, grads = min(kept, live), min(grads, live)
        return live, kept, min(grads, live - kept)

    # The inserted block changes every event after it by the same amount: from the start, the
    # difference the first events show (backward: its retained activations; forward: nothing); from
    # the end, the difference the last events show (backward: its gradients; forward: its retained
    # activations). Each alignment holds while the difference stays the same.
    def diff(a: Event, b: Event) -> Event:
        return b[0] - a[0], b[1] - a[1], b[2] - a[2]

    def same(x: Event, y: Event) -> bool:
        return all(abs(u - v) <= DEPTH_ALIGN_TOLERANCE for u, v in zip(x, y))

    first, last = diff(one[0], two[0]), diff(one[-1], two[-1])
    head = 0
    while head < n1 and same(diff(one[head], two[head]), first):
        head += 1
    tail = 0
    while tail < n1 - head and same(diff(one[n1 - 1 - tail], two[n2 - 1 - tail]), last):
        tail += 1
    out = [grow(one[i], two[i]) for i in range(head)]
    for i in range(head, n1 - tail):  # neither alignment holds: proportional
        out.append(grow(one[i], two[min(n2 - 1, i * n2 // n1)]))
    out += [grow(one[n1 - tail + j], two[n2 - tail + j]) for j in range(tail)]
    return out


def evaluate(t1: Timeline, t2: Timeline, b: int) -> StepTrace:
    """The step at micro-batch ``b`` from traces at ``BASE_B`` (``t1``) and ``BASE_B + 1`` (``t2``)."""
    fwd, _ = _phase_peaks(t1.fwd, t2.fwd, b)
    bwd, net = _phase_peaks(t1.bwd, t2.bwd, b)
    lin = lambda x, y: int(x + (b - BASE_B) * (y - x))  # noqa: E731
    return StepTrace(activations=lin(t1.activations, t2.activations), fwd_peak=fwd[0], bwd_peak=bwd[0],
                     bwd_activations=bwd[1], bwd_grads=bwd[2], grads=lin(t1.grads, t2.grads),
                     flops=lin(t1.flops, t2.flops), bwd_net_peak=net[0] - net[2], bwd_net_activations=net[1],
                     bwd_net_grads=net[2])


@dataclass(frozen=True)
class ActivationProfile:
    """Traces at micro-batch 2 and 3, per traced depth; ``at(b)`` evaluates any micro-batch.

    For deep stacks ``depths`` is ((1, t1, t2), (2, t1, t2)) and the figures are extrapolated
    linearly to ``full_depth``; otherwise a single entry at the real depth.
    """

    depths: tuple[tuple[int, Timeline, Timeline], ...]
    full_depth: int
    attention: str  # kernel assumed: flash | mem-efficient | math | eager (model's own)
    checkpointed_blocks: int

    def at(self, micro_batch: int) -> StepTrace:
        """The step at ``micro_batch`` (memoised per profile: the planner's micro-batch searches ask for
        the same sizes many times, and each evaluation walks every traced event).

        Raises:
            ValueError: micro_batch < 1.
        """
        if micro_batch < 1:
            raise ValueError("micro_batch must be >= 1")
        memo = self.__dict__.get("_memo")
        if memo is None:  # not a dataclass field: stays out of equality, repr and the cache's JSON
            memo = {}
            object.__setattr__(self, "_memo", memo)
        if micro_batch not in memo:
            memo[micro_batch] = self._evaluate(micro_batch)
        return memo[micro_batch]

    def _evaluate(self, micro_batch: int) -> StepTrace:
        if len(self.depths) == 1:
            _, t1, t2 = self.depths[0]
            return evaluate(t1, t2, micro_batch)
        (d1, a1, a2), (d2, b1, b2) = self.depths
        one, two = evaluate(a1, a2, micro_batch), evaluate(b1, b2, micro_batch)
        extra = (self.full_depth - d1) / (d2 - d1)
        totals = one.combine(two, 1.0 - extra, extra)
        # The peaks and their split come from the full-depth event sequence, not from combining the two
        # traces' peaks: the peak can fall at a different event at each depth (start of backward at depth
        # 1, end at depth 2), and mixing the two splits gave negative activations (issue 12).
        fwd = _deep_events(_events_at(a1.fwd, a2.fwd, micro_batch), _events_at(b1.fwd, b2.fwd, micro_batch), extra)
        bwd = _deep_events(_events_at(a1.bwd, a2.bwd, micro_batch), _events_at(b1.bwd, b2.bwd, micro_batch), extra)
        f_gross, _ = _peaks(fwd)
        gross, net = _peaks(bwd)
        return replace(totals, fwd_peak=f_gross[0], bwd_peak=gross[0], bwd_activations=gross[1], bwd_grads=gross[2],
                       bwd_net_peak=net[0] - net[2], bwd_net_activations=net[1], bwd_net_grads=net[2])

    def compute_time(self, micro_batch: int, r: Rates) -> ComputeTime:
        """One micro-step's forward and backward at ``micro_batch`` on one GPU: the roofline over the traced
        ops (``advisor.timing.compute.roofline_s``), each op linear in the micro-batch between the two traced
        sizes; deep stacks extrapolated linearly in depth from the one- and two-block traces (the added block's
        ops are what the two totals differ by, as for the memory figures)."""
        if micro_batch < 1:
            raise ValueError("micro_batch must be >= 1")

        def one(t1: Timeline, t2: Timeline) -> tuple[float, ...]:
            lin = lambda x, y: x + (micro_batch - BASE_B) * (y - x)  # noqa: E731
            fwd, fwd_ops = roofline_work(t1.fwd_ops, t2.fwd_ops, micro_batch, BASE_B, r)
            bwd, bwd_ops = roofline_work(t1.bwd_ops, t2.bwd_ops, micro_batch, BASE_B, r)
            return (fwd, fwd_ops, bwd, bwd_ops, lin(t1.flops, t2.flops), lin(t1.recompute_flops, t2.recompute_flops))

        if len(self.depths) == 1:
            _, t1, t2 = self.depths[0]
            fwd, fwd_ops, bwd, bwd_ops, flops, rec = one(t1, t2)
        else:
            (d1, a1, a2), (d2, b1, b2) = self.depths
            x, y = one(a1, a2), one(b1, b2)
            extra = (self.full_depth - d1) / (d2 - d1)
            fwd, fwd_ops, bwd, bwd_ops, flops, rec = (max(0.0, (1 - extra) * u + extra * v) for u, v in zip(x, y))
        # The dispatch floor on the whole (extrapolated) phase (``advisor.timing.compute.floored_s``).
        fwd, bwd = floored_s(fwd, fwd_ops, r), floored_s(bwd, bwd_ops, r)
        return ComputeTime(fwd_s=fwd, bwd_s=bwd, flops=int(round(flops)), recompute_flops=int(round(rec)))

    @property
    def uses_sdpa(self) -> bool:
        """Whether the model calls ``F.scaled_dot_product_attention`` (so the kernel choice matters)."""
        return any(t.attention_calls for _, t, _ in self.depths)

    @property
    def flops_per_sample(self) -> int:
        """Forward + backward FLOPs per sample (2 per multiply-add; ``torch.utils.flop_counter``'s
        formulas), including the recompute under activation checkpointing and inside fused attention
        backward. Exactly linear in the micro-batch: the difference of two evaluations."""
        return self.at(2).flops - self.at(1).flops

    @property
    def activation_bytes_per_sample(self) -> int:
        return self.at(2).activations - self.at(1).activations



# ------------------------------------------------------------------ oneDNN's CPU convolution scratch
# oneDNN books every scratchpad entry with 128 bytes of alignment slack (``memory_tracking::registry_t::book``:
# capacity = size + default_alignment); PyTorch runs oneDNN with a user scratchpad that ideep allocates from
# the c10 CPU allocator, registry size and all.
_ONEDNN_SCRATCH_ALIGN = 128
_AVX2_F32_SIMD = 8  # simd_w of oneDNN's gemm convolution on AVX2: 32-byte vectors / 4-byte floats


def onednn_gemm_bwd_weights_machine() -> bool:
    """Whether this machine's PyTorch computes some fp32 convolution weight gradients with oneDNN's
    ``x64:gemm:jit`` kernel (and so books ``cpu_conv_scratch_bytes``): mkldnn available and enabled, and
    an x86 CPU with AVX2 but no AVX-512 (ATen's capability is "AVX2" and the CPU reports no AVX-512).
    With AVX-512 (or AMX) the ``jit:avx512_common`` kernel takes every such convolution; other ISAs
    (ARM, x86 without AVX2) take other kernels that were not measured: False for them."""
    import torch

    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        return False
    has_avx512 = getattr(torch.cpu, "_is_avx512_supported", None)
    return not (has_avx512 is not None and has_avx512())


def _onednn_avx2_bwd_weights_applies(ih: int, iw: int, kh: int, kw: int, oh: int, ow: int, stride, padding,
                                     dilation) -> bool:
    """oneDNN's ``jit_avx2_conv_bwd_weights_kernel_f32::init_conf`` accepts the shape (it is tried before
    the gemm kernel, ``cpu_convolution_list.cpp``): no dilation, ``kw < 14``, ``kh <= ih`` ([bwd_w:r2];
    [bwd_w:r1] ``kh <= t_pad + ih`` follows), ``t_pad < kh`` and every padding below the extended kernel.
    Channels need no multiple of 8 (plain-layout channels are padded to the 8-blocked layout)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ext_kh, ext_kw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    b_pad = max(0, (oh - 1) * sh + ext_kh - (ih + ph))
    r_pad = max(0, (ow - 1) * sw + ext_kw - (iw + pw))
    boundaries_ok = ph < ext_kh and b_pad < ext_kh and pw < ext_kw and r_pad < ext_kw
    params_ok = dh == 1 and dw == 1 and kw < 14 and kh <= ih and ph < kh
    return boundaries_ok and params_ok


def cpu_conv_scratch_bytes(input_shape, weight_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                           threads: int = 1) -> int:
    """Bytes that oneDNN's ``x64:gemm:jit`` weight-gradient kernel books from the c10 allocator for one
    2-D convolution (fp32, NCHW, groups 1, not transposed) on an AVX2 CPU without AVX-512, while
    ``aten::convolution_backward`` runs; 0 when another kernel computes it. ``threads``: the intra-op
    threads of the run (``torch.get_num_threads()``; 1 in ``--verify``'s ranks, OMP_NUM_THREADS=1).

    The rule, from oneDNN's sources (``src/cpu/gemm_convolution_utils.cpp``, ``init_conf``, branch
    ``!is_nspc && is_bwd_w``; checked with ONEDNN_VERBOSE on torch 2.14.1 / oneDNN 3.12, AMD EPYC AVX2):

    * the kernel runs when PyTorch uses mkldnn (fp32 and batch >= 2 for a kernel larger than 1x1,
      ``ConvParams::use_mkldnn``) and the jit:avx2 kernel declines (``_onednn_avx2_bwd_weights_applies``:
      in practice a kernel taller than its input, such as a 3x3 convolution on a 2x2 or 1x1 map);
    * threads: ``nthr = T`` with outer threading, which needs ``os / T < 256`` (os = OH * OW, integer
      division), batch != 1 and ``4 T W + 4 T IC KH KW 8 < limit``, where W is the weight in bytes
      (OC IC KH KW 4) and ``limit = min(1 GiB, 15 T (src + W + dst bytes))``; otherwise ``nthr = 1``;
    * ``book<float>(key_conv_wei_reduction, nthr * weights_d.size())``: size() is already bytes, so
      ``4 nthr W`` bytes (most of it never written), booked even when nthr is 1;
    * the im2col columns ``4 nthr IC KH KW OH OW`` bytes (0 for a 1x1 stride-1 kernel that keeps the map),
      with the os-block reduction oneDNN applies when they would pass the limit;
    * each booking plus 128 bytes of alignment; over the limit the kernel declines (the reference kernel
      then runs, with no scratch).

    So ``extra = nthr (4 W + 4 IC KH KW OH OW) + 256``. Measured (c10 allocator, profiler "Total
    Allocated"): one 512->512 3x3 convolution on a 2x2 map, batch 4: 37,822,720 B at T = 1 and
    75,645,184 B at T = 2, both exactly this.
    """
    threads = int(threads)
    if threads <= 0:
        return 0
    n, ic, ih, iw = (int(x) for x in input_shape)
    oc, _, kh, kw = (int(x) for x in weight_shape)
    (sh, sw), (ph, pw), (dh, dw) = (tuple(int(v) for v in x) for x in (stride, padding, dilation))
    oh = (ih + 2 * ph - ((kh - 1) * dh + 1)) // sh + 1
    ow = (iw + 2 * pw - ((kw - 1) * dw + 1)) // sw + 1
    if n < 2 or oh < 1 or ow < 1:  # batch 1: PyTorch takes slow_conv2d for small inputs, not oneDNN
        return 0
    if _onednn_avx2_bwd_weights_applies(ih, iw, kh, kw, oh, ow, (sh, sw), (ph, pw), (dh, dw)):
        return 0
    weights, ks, os_ = oc * ic * kh * kw * 4, kh * kw, oh * ow
    src, dst = n * ic * ih * iw * 4, n * oc * oh * ow * 4
    limit = min(1 << 30, 15 * threads * (src + weights + dst))
    thr_mem_estimate = 4 * threads * weights + 4 * threads * ic * ks * _AVX2_F32_SIMD
    nthr = threads if thr_mem_estimate < limit and os_ // threads < 256 else 1
    booked = 4 * nthr * weights + _ONEDNN_SCRATCH_ALIGN
    if booked > limit:
        return 0
    keeps_map = oh == ih and ow == iw and sh == 1 and sw == 1 and ks == 1
    im2col = 0 if keeps_map else ic * ks * os_  # elements per thread
    if im2col:
        available = limit - booked
        if available < 4 * nthr * im2col:  # oneDNN shrinks the os block to fit
            os_block = max(_AVX2_F32_SIMD, int(available // (4 * nthr * ic * ks) * 0.05))
            im2col = ic * ks * os_block
        booked += 4 * nthr * im2col + _ONEDNN_SCRATCH_ALIGN
    return booked if booked <= limit else 0


_CONV_BACKWARD_ARGS = ("grad_output", "input", "weight", "bias_sizes", "stride", "padding", "dilation",
                       "transposed", "output_padding", "groups", "output_mask")


def _conv_backward_scratch(args: tuple, kwargs: dict, threads: int) -> int:
    """``cpu_conv_scratch_bytes`` of one ``aten.convolution_backward`` call, 0 unless it is a case the
    rule covers: weight gradient wanted, fp32, 4-D NCHW (contiguous input and weight; channels-last goes
    oneDNN's nspc path, which books differently and was not measured), groups 1, not transposed."""
    import torch

    a = dict(zip(_CONV_BACKWARD_ARGS, args)) | kwargs
    inp, weight, mask = a["input"], a["weight"], a["output_mask"]
    if (a["transposed"] or a["groups"] != 1 or not mask[1] or inp.dim() != 4
            or inp.dtype != torch.float32 or weight.dtype != torch.float32
            or a["grad_output"].dtype != torch.float32
            or not inp.is_contiguous() or not weight.is_contiguous()):
        return 0
    return cpu_conv_scratch_bytes(tuple(inp.shape), tuple(weight.shape), a["stride"], a["padding"],
                                  a["dilation"], threads)


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
def _grouped_mm_fp32(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The output tensor of ``aten::_grouped_mm`` for fp32 operands, which FakeTensor's meta kernel rejects."""
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:  # (M, K_total) x (K_total, N), groups along K: one (M, N) result per group
        size = (offs.size(0), mat_a.size(0), mat_b.size(1))
    elif a2:  # (S, K) x (G, K, N) -> (S, N), groups along S
        size = (mat_a.size(0), mat_b.size(-1))
    elif b2:  # (G, M, K) x (K, N_total) -> (M, N_total), groups along N
        size = (mat_a.size(1), mat_b.size(1))
    else:  # (G, M, K) x (G, K, N): a batched matmul
        size = (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
    return mat_a.new_empty(size, dtype=out_dtype or mat_a.dtype)


def _grouped_mm_flops(mat_a, mat_b, *args, out_val=None, **kwargs) -> int:
    """FLOPs of one ``aten::_grouped_mm`` (2 per multiply-add, as flop_counter's ``mm``): each row of the jagged
    operand meets one group's matrix, so it is the matmul of the concatenated groups."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:  # jagged contraction (the experts' weight gradients)
        return 2 * mat_a.size(0) * mat_a.size(1) * mat_b.size(1)
    return 2 * out_val.numel() * mat_a.size(-1)


# ------------------------------------------------------------------ per-op costs for the roofline
# Ops that move no data: views and aliases share their input's storage; allocations only reserve memory.
_NO_DATA_OPS = ("detach", "alias", "lift_fresh", "_unsafe_view", "empty", "empty_like", "empty_strided",
                "new_empty", "new_empty_strided", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel",
                "sym_storage_offset", "resize_", "set_")

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
_TRANSCENDENTAL_OPS = ("exp", "exp_", "log", "log1p", "sqrt", "sqrt_", "rsqrt", "pow", "pow_", "silu",
                       "silu_backward", "gelu", "gelu_backward", "tanh", "tanh_backward", "sigmoid",
                       "sigmoid_backward", "erf", "erfinv", "sin", "cos", "_softmax", "_softmax_backward_data",
                       "_log_softmax", "_log_softmax_backward_data", "logsumexp", "reciprocal")


def _nbytes(*tensors) -> int:
    """Bytes of the elements a kernel touches in each tensor: ``numel x element size``, at most the storage
    (a broadcast with stride 0 reads its storage once)."""
    import torch

    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            total += min(t.numel() * t.element_size(), t.untyped_storage().nbytes())
    return total


def _op_bytes(func, args: tuple, kwargs: dict, out: Any, no_data: set) -> int:
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


class _LiveBytes:
    """TorchDispatchMode that tracks live storages created by ops, their total, and its peak.

    ``conv_scratch_threads`` > 0: after each ``aten.convolution_backward`` that oneDNN computes with its
    gemm kernel on this CPU, an extra event with that call's transient scratch (``cpu_conv_scratch_bytes``)
    on top of the live total with its outputs, then the usual event."""

    def __init__(self, exclude: list, conv_scratch_threads: int = 0) -> None:
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
        no_data = {getattr(aten, n) for n in _NO_DATA_OPS if hasattr(aten, n)}  # overload packets
        transcendental = {getattr(aten, n) for n in _TRANSCENDENTAL_OPS if hasattr(aten, n)}

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is grouped_mm and args[0].dtype == torch.float32 and args[1].dtype == torch.float32:
                    out = _grouped_mm_fp32(*args, **kwargs)
                else:
                    out = func(*args, **kwargs)
                scratch = (_conv_backward_scratch(args, kwargs, tracker.conv_scratch_threads)
                           if tracker.conv_scratch_threads and func is conv_backward else 0)
                tracker._on_output(out, scratch)
                formula = flop_registry.get(func._overloadpacket) or extra_flops.get(func._overloadpacket)
                flops = 0
                if formula is not None:  # called as FlopCounterMode._count_flops calls it
                    flops = int(formula(*args, **kwargs, out_val=out))
                    tracker.flops += flops
                kind = CONV if func in conv_ops else TRANSCENDENTAL if func._overloadpacket in transcendental else MEMORY
                tracker.record_op(flops, _op_bytes(func, args, kwargs, out, no_data), kind)
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
        # Per op (flops, bytes read + written[, 1 for a convolution]) for the roofline (advisor.timing.compute),
        # per phase as the events; FLOPs of activation checkpointing's recompute (> 0 depth: inside one).
        self.ops: list[tuple[int, ...]] = []
        self.fwd_ops: list[tuple[int, ...]] = []
        self.recompute_depth = 0
        self.recompute_flops = 0

    def record_op(self, flops: int, nbytes: int, kind: int = MEMORY) -> None:
        """One op's cost for the roofline (``advisor.timing.compute``: kind ``MEMORY``, ``CONV``,
        ``TRANSCENDENTAL`` or ``ATTENTION``); ops that neither compute nor move data are not kept."""
        if self.recompute_depth:
            self.recompute_flops += flops
        if flops or nbytes:
            self.ops.append((flops, nbytes, kind) if kind else (flops, nbytes))

    def _free(self, key: int) -> None:
        _, n = self._live.pop(key, (None, 0))
        self.cur -= n
        if key in self._retained:
            self._retained.discard(key)
            self.retained_cur -= n

    def _on_output(self, out: Any, transient: int = 0) -> None:
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
            self._live[key] = (weakref.ref(st, lambda _r, k=key: self._free(k)), n)
            self.cur += n
        if transient:
            self.events.append((self.cur + transient, self.retained_cur, self.grads_cur))
        self.events.append((self.cur, self.retained_cur, self.grads_cur))

    def mark_forward_end(self) -> None:
        self._retained = set(self._live)
        self.retained_cur = self.cur
        self.fwd_events, self.events = self.events, [(self.cur, self.cur, 0)]
        self.fwd_ops, self.ops = self.ops, []

    def add_flops(self, n: int, nbytes: int = 0) -> None:
        """FLOPs of an op the dispatch mode does not see (the fused-attention stand-in), with its bytes."""
        self.flops += int(n)
        self.record_op(int(n), int(nbytes), ATTENTION)

    def on_grad(self, param) -> None:
        self.grads_cur += param.grad.untyped_storage().nbytes()


_MISSING = object()


def _attention_output(q, v):
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
def _attention_mode_class() -> type:
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
        FLOPs with flop_counter's SDPA formulas (the backward recomputes the scores)."""

        @staticmethod
        def forward(ctx, q, k, v, add_flops):
            out = _attention_output(q, v)
            lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.add_flops = add_flops
            # Reads q, k, v; writes the output and the log-sum-exp (the s x s scores stay on chip).
            add_flops(sdpa_flop_count(q.shape, k.shape, v.shape), _nbytes(q, k, v, out, lse))
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            # Reads q, k, v, the output, its gradient and the log-sum-exp; writes dq, dk, dv.
            ctx.add_flops(sdpa_backward_flop_count(grad_out.shape, q.shape, k.shape, v.shape),
                          _nbytes(q, k, v, out, lse, grad_out) + _nbytes(q, k, v))
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

    def math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False):
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

            def cast(t):
                eligible = t is not None and t.is_floating_point() and t.dtype not in (low, torch.float64)
                return t.to(low) if eligible else t

            # Last argument first: the order in which the autocast kernel's casts run (C++ evaluates
            # the pack of casts right to left here), so the traced events come in the same order.
            attn_mask, value, key, query = cast(attn_mask), cast(value), cast(key), cast(query)
        with torch.autocast(device, enabled=False) if autocast else contextlib.nullcontext():
            if attn_mask is not None and attn_mask.dtype == torch.bool:
                attn_mask = torch.where(attn_mask, torch.scalar_tensor(0.0, dtype=query.dtype, device=attn_mask.device),
                                        torch.scalar_tensor(-math.inf, dtype=query.dtype, device=attn_mask.device))
            return math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale,
                             enable_gqa=enable_gqa)[0]

    class AttentionMode(TorchFunctionMode):
        """Routes ``F.scaled_dot_product_attention`` to the fused-kernel stand-in or the math path
        and counts the calls in ``counter.attention_calls`` (FLOPs of the stand-in go to
        ``counter.add_flops``; the math path's ops are counted by the dispatch mode).

        A mode sees a Python-level torch function (``F.multi_head_attention_forward``) as one call and
        runs it with the mode popped, so the SDPA call inside would escape: such functions (whose code
        calls the global ``scaled_dot_product_attention``) run as a private copy whose globals bind
        that name to ``self.attention``. Nothing shared is modified."""

        def __init__(self, kernel: str, counter: _LiveBytes) -> None:
            super().__init__()
            self.kernel = kernel
            self.counter = counter
            self._copies: dict = {}

        def fresh(self) -> AttentionMode:
            """A new mode with the same kernel and counter (for checkpoint recomputation): while it is active
            the counter knows that the ops it sees are recomputed (``_LiveBytes.recompute_flops``)."""
            mode = type(self)(self.kernel, self.counter)
            mode.recompute = True
            return mode

        recompute = False

        def __enter__(self):
            if self.recompute:
                self.counter.recompute_depth += 1
            return super().__enter__()

        def __exit__(self, *exc):
            if self.recompute:
                self.counter.recompute_depth -= 1
            return super().__exit__(*exc)

        def attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                      enable_gqa=False):
            self.counter.attention_calls += 1
            if self.kernel == "math":
                return math_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            return FusedAttention.apply(query, key, value, self.counter.add_flops)

        def _private_copy(self, func):
            copy = self._copies.get(func, _MISSING)
            if copy is _MISSING:
                copy = None
                if ("scaled_dot_product_attention" in func.__code__.co_names
                        and func.__globals__.get("scaled_dot_product_attention") is sdpa):
                    scope = dict(func.__globals__, scaled_dot_product_attention=self.attention)
                    copy = types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__,
                                              func.__closure__)
                    copy.__kwdefaults__ = func.__kwdefaults__
                self._copies[func] = copy
            return copy

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                return self.attention(*args, **kwargs)
            if type(func) is types.FunctionType:
                copy = self._private_copy(func)
                if copy is not None:
                    return copy(*args, **kwargs)
            return func(*args, **kwargs)

    return AttentionMode


def _recompute_context():
    """``context_fn`` for ``torch.utils.checkpoint``: torch does not carry torch-function modes into
    backward, so the recomputation of a checkpointed block runs under a fresh copy of the attention
    mode that was active when the block ran forward (this thread's; none outside a trace)."""
    from torch.overrides import _get_current_function_mode_stack

    cls = _attention_mode_class()
    active = [m for m in _get_current_function_mode_stack() if isinstance(m, cls)]
    return contextlib.nullcontext(), (active[-1].fresh() if active else contextlib.nullcontext())


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

        def __init__(self, dtype) -> None:
            super().__init__()
            self.dtype = dtype
            self.default = torch.get_default_dtype()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if (kwargs.get("dtype") is not None or "out" in kwargs
                    or getattr(func, "__name__", None) in explicit):
                return out
            for leaf in tree_leaves((args, kwargs)):
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                    return out
                if type(leaf).__module__ == "numpy":  # numpy data keeps numpy's dtype
                    return out
            return tree_map_only(torch.Tensor, lambda t: t.to(self.dtype) if t.dtype == self.default else t, out)

    return BuildDtypeMode


def _build_dtype(dtype):
    """Context: construction creates floating tensors in ``dtype`` where the default dtype would apply
    (``BuildDtypeMode``; thread-local, unlike ``torch.set_default_dtype``)."""
    import torch

    if dtype == torch.get_default_dtype():
        return contextlib.nullcontext()
    return _build_dtype_mode_class()(dtype)


def _materialize(model, device: str = "cpu") -> None:
    """Replace every parameter and buffer of ``model`` (built on ``meta``) by an uninitialised tensor of
    the same shape, strides, dtype and ``requires_grad`` on ``device``: fake tensors under
    ``FakeTensorMode``. Shared parameters and buffers stay shared (gpt2's ``lm_head.weight`` is
    ``transformer.wte.weight``), which ``Module.to_empty`` does not guarantee."""
    import torch

    made: dict[int, tuple] = {}  # id(old) -> (old, new); keeps old alive so ids are not reused

    def fresh(t, param: bool):
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
                module._parameters[name] = fresh(p, True)
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = fresh(b, False)


def build_for_trace(spec: ModelSpec, *, dtype, fake, layers: int | None = None, tp_degree: int = 1,
                    checkpointing: bool = False, half: bool = False) -> tuple[Any, int]:
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
                from .models.adapters import cast_for_trace

                cast_for_trace(model, spec.adapter, half=half)
        with fake:
            _materialize(model, "cpu")
            model.train()
            blocks = (enable_activation_checkpointing(model, checkpoint_kwargs={"context_fn": _recompute_context})
                      if checkpointing else 0)
    return model, blocks


def _attn_label(model, kernel: str) -> str:
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", "sdpa") if config is not None else "sdpa"
    return kernel if impl == "sdpa" else "eager (the model's own attention keeps the s x s scores)"


def trace_step(spec: ModelSpec, micro_batch: int, mode: str, attention: str, checkpointing: bool,
               layers: int | None = None, tp_degree: int = 1,
               cpu_conv_scratch_threads: int = 0) -> tuple[Timeline, str, int]:
    """Trace one fwd+bwd of ``spec`` at ``micro_batch`` under fake tensors.

    Args:
        mode: "fp32" (fp32 weights), "autocast" (fp32 weights, bf16 autocast: DDP/TP mixed precision)
            or "half" (bf16 weights: DeepSpeed's bf16/fp16 modes and pure bf16).
        attention: one of ``ATTENTION_KERNELS``.
        layers: build only this many blocks (per stack) instead of the config's.
        tp_degree: build one tensor-parallel rank's shard (heads and MLP width divided).
        cpu_conv_scratch_threads: > 0: add oneDNN's transient weight-gradient scratch of the convolutions
            it computes with its gemm kernel, for runs with that many intra-op threads
            (``cpu_conv_scratch_bytes``; CPU estimates on CPUs without AVX-512 only). 0: none.

    Returns:
        (trace, attention kernel label, number of checkpointed blocks).

    Raises:
        AdvisorError: the model cannot run a step under fake tensors (e.g. data-dependent shapes).
    """
    # The whole trace holds the lock: torch's autocast keeps its cache of weight casts in one
    # process-wide map and clears it whenever any thread leaves its outermost autocast region (also the
    # one checkpoint recomputation enters, autocast on or off), which frees and re-casts another trace's
    # cached weights mid-step (measured: 10 of 24 autocast/checkpointed traces differed run from 24
    # threads at once). Tracing is pure Python under the GIL, so parallel traces were not faster anyway.
    with MODEL_BUILD_LOCK:
        return _trace_step(spec, micro_batch, mode, attention, checkpointing, layers, tp_degree,
                           cpu_conv_scratch_threads)


def _trace_step(spec: ModelSpec, micro_batch: int, mode: str, attention: str, checkpointing: bool,
                layers: int | None, tp_degree: int, cpu_conv_scratch_threads: int = 0) -> tuple[Timeline, str, int]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    # FakeTensorMode logs a full traceback for an op that fails on shapes; the user gets our one line.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    dtype = torch.bfloat16 if mode == "half" else torch.float32
    # LoRA under autocast holds its frozen base in 16 bits (``from_pretrained(..., dtype=...)``); the adapters follow
    # ``advisor.models.adapters.cast_for_trace``.
    build_dtype = torch.bfloat16 if mode == "autocast" and spec.adapter is not None else dtype
    model, blocks = build_for_trace(spec, dtype=build_dtype, fake=fake, layers=layers, tp_degree=tp_degree,
                                    checkpointing=checkpointing, half=mode == "half")
    exclude = [t.untyped_storage() for t in list(model.parameters()) + list(model.buffers())]
    tracker = _LiveBytes(exclude, cpu_conv_scratch_threads)
    hooks = [p.register_post_accumulate_grad_hook(tracker.on_grad) for p in model.parameters() if p.requires_grad]
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext())
    try:
        with fake, _attention_mode_class()(attention, tracker), tracker.mode:
            batch = make_batch(spec, micro_batch, dtype=dtype)
            with autocast:
                loss = training_loss(spec, model, batch)
            tracker.mark_forward_end()
            activations = tracker.cur
            loss.backward()
    except AdvisorError:
        raise
    except Exception as err:
        hint = (": check --input-shape" if spec.family == "custom" else "")
        raise AdvisorError(f"could not trace a training step of {spec.name} under fake tensors "
                           f"({err.__class__.__name__}: {str(err).splitlines()[0][:160]}){hint}")
    finally:
        for h in hooks:
            h.remove()
    grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters() if p.grad is not None)
    trace = Timeline(fwd=tuple(tracker.fwd_events), bwd=tuple(tracker.events), activations=activations,
                     grads=grads, flops=tracker.flops, attention_calls=tracker.attention_calls,
                     fwd_ops=tuple(tracker.fwd_ops), bwd_ops=tuple(tracker.ops),
                     recompute_flops=tracker.recompute_flops)
    return trace, _attn_label(model, attention), blocks


def profile_activations(spec: ModelSpec, mode: str, attention: str, checkpointing: bool,
                        tp_degree: int = 1, cpu_conv_scratch_threads: int = 0) -> ActivationProfile:
    """Trace at micro-batch 2 and 3 (and, for transformer stacks deeper than 4 blocks, at 1 and 2
    blocks per stack, extrapolated linearly to the real depth). See the module docstring.
    ``cpu_conv_scratch_threads``: as ``trace_step`` (the scratch does not grow with the batch, so it is
    the same at every micro-batch >= 2; at 1 it is extrapolated although PyTorch then skips oneDNN).

    Raises:
        AdvisorError: as ``trace_step``.
    """
    per_stack, stacks = family_of(spec).block_stacks(spec)  # (0, 1): no block stack to truncate
    traced = (1, 2) if per_stack > TRUNCATE_ABOVE_LAYERS else (None,)
    entries, label, blocks = [], "", 0
    for d in traced:
        t1, label, blocks = trace_step(spec, BASE_B, mode, attention, checkpointing, layers=d, tp_degree=tp_degree,
                                       cpu_conv_scratch_threads=cpu_conv_scratch_threads)
        t2, _, _ = trace_step(spec, BASE_B + 1, mode, attention, checkpointing, layers=d, tp_degree=tp_degree,
                              cpu_conv_scratch_threads=cpu_conv_scratch_threads)
        entries.append((d or per_stack, t1, t2))
    if per_stack:
        blocks = family_of(spec).num_blocks(spec) if checkpointing else 0
    return ActivationProfile(depths=tuple(entries), full_depth=per_stack, attention=label, checkpointed_blocks=blocks)
