"""The timeline of a traced step and the arithmetic of its peaks.

A ``Timeline`` is one trace's raw record: after every op, the live bytes, the forward-retained bytes still
alive and the gradients accumulated so far, per phase, with each op's FLOPs and bytes. ``evaluate`` turns
the traces at micro-batch ``BASE_B`` and ``BASE_B + 1`` into a ``StepTrace`` at any micro-batch (every
figure is linear in it); ``ActivationProfile`` holds the traces of one model, per traced depth, and
extrapolates deep stacks linearly in depth from their one- and two-block traces (``_deep_events``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..timing.compute import ComputeTime, Rates, floored_s, roofline_work
from ..timing.gpu_time import deep_queue_s, op_times, queue_s

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

    def combine(self, other: StepTrace, a: float, b: float) -> StepTrace:
        """Element-wise ``a * self + b * other`` (linear extrapolation in depth), rounded to ints."""
        return StepTrace(
            **{f.name: int(round(a * getattr(self, f.name) + b * getattr(other, f.name))) for f in fields(self)}
        )


@dataclass(frozen=True)
class Timeline:
    """Raw trace: after every op, (live, forward-retained alive, grads so far), per phase."""

    fwd: tuple[tuple[int, int, int], ...]
    bwd: tuple[tuple[int, int, int], ...]
    activations: int
    grads: int
    flops: int
    attention_calls: int = 0  # calls of F.scaled_dot_product_attention (0: the model has no SDPA)
    # Per op, in order: (FLOPs, bytes read + written[, kind[, *shape]]) (``_op_bytes``, ``advisor.trace.shapes``),
    # forward and backward (with any recompute); ``advisor.timing.compute`` and ``gpu_time`` time them.
    fwd_ops: tuple[tuple[int, ...], ...] = ()
    bwd_ops: tuple[tuple[int, ...], ...] = ()
    recompute_flops: int = 0  # FLOPs of activation checkpointing's recompute (inside ``flops``)


Event = tuple[int, int, int]  # (live, forward-retained alive, gradients so far), bytes
# Bytes two events' differences may differ by and still count as the same (rounding of the micro-batch
# interpolation; real mismatches differ by whole tensors).
DEPTH_ALIGN_TOLERANCE = 4096


def _events_at(e1: tuple[Event, ...], e2: tuple[Event, ...], b: int) -> list[Event]:
    """One phase's events at micro-batch ``b``, each linear in b between the traces at ``BASE_B``
    (``e1``) and ``BASE_B + 1`` (``e2``); when a few ops differ between the sizes the events are
    aligned proportionally."""
    if len(e1) != len(e2):
        n1, n2 = len(e1), len(e2)
        if n1 < n2:
            e1 = tuple(e1[i * n1 // n2] for i in range(n2))
        else:
            e2 = tuple(e2[i * n2 // n1] for i in range(n1))
    d = b - BASE_B
    return [
        (int(x[0] + d * (y[0] - x[0])), int(x[1] + d * (y[1] - x[1])), int(x[2] + d * (y[2] - x[2])))
        for x, y in zip(e1, e2)
    ]


def _peaks(events: list[Event]) -> tuple[Event, Event]:
    """(live, retained, grads) at the event with the largest live total, and at the event with the
    largest live total minus gradients; zeros for an empty phase."""
    if not events:
        return (0, 0, 0), (0, 0, 0)
    return max(events, key=lambda e: e[0]), max(events, key=lambda e: e[0] - e[2])


def _phase_peaks(e1: tuple[Event, ...], e2: tuple[Event, ...], b: int) -> tuple[Event, Event]:
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
    return StepTrace(
        activations=lin(t1.activations, t2.activations),
        fwd_peak=fwd[0],
        bwd_peak=bwd[0],
        bwd_activations=bwd[1],
        bwd_grads=bwd[2],
        grads=lin(t1.grads, t2.grads),
        flops=lin(t1.flops, t2.flops),
        bwd_net_peak=net[0] - net[2],
        bwd_net_activations=net[1],
        bwd_net_grads=net[2],
    )


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
        # 1, end at depth 2), and mixing the two splits gave negative activations.
        fwd = _deep_events(_events_at(a1.fwd, a2.fwd, micro_batch), _events_at(b1.fwd, b2.fwd, micro_batch), extra)
        bwd = _deep_events(_events_at(a1.bwd, a2.bwd, micro_batch), _events_at(b1.bwd, b2.bwd, micro_batch), extra)
        f_gross, _ = _peaks(fwd)
        gross, net = _peaks(bwd)
        return replace(
            totals,
            fwd_peak=f_gross[0],
            bwd_peak=gross[0],
            bwd_activations=gross[1],
            bwd_grads=gross[2],
            bwd_net_peak=net[0] - net[2],
            bwd_net_activations=net[1],
            bwd_net_grads=net[2],
        )

    def compute_time(self, micro_batch: int, r: Rates) -> ComputeTime:
        """One micro-step's forward and backward at ``micro_batch`` on one GPU, each op linear in the micro-batch
        between the two traced sizes; deep stacks extrapolated linearly in depth from the one- and two-block traces
        (the added block's ops are what the two totals differ by, as for the memory figures). Memoised per profile
        and ``r`` (a plan asks for the same micro-batches many times).

        A GPU (``r.gpu`` set): each phase's ops through the eager queue (``advisor.timing.gpu_time``), at full
        depth by repeating the block the two-block trace adds (``_gpu_phase``). A calibrated CPU: the roofline over
        the ops (``advisor.timing.compute.roofline_work``) with the dispatch floor on the whole extrapolated phase.

        Raises:
            ValueError: micro_batch < 1.
        """
        if micro_batch < 1:
            raise ValueError("micro_batch must be >= 1")
        memo = self.__dict__.get("_time_memo")
        if memo is None:  # not a dataclass field: stays out of equality, repr and the cache's JSON
            memo = {}
            object.__setattr__(self, "_time_memo", memo)
        key = (micro_batch, r)
        if key not in memo:
            memo[key] = self._compute_time(micro_batch, r)
        return memo[key]

    def _compute_time(self, micro_batch: int, r: Rates) -> ComputeTime:
        lin = lambda x, y: x + (micro_batch - BASE_B) * (y - x)  # noqa: E731
        flops = [(lin(t1.flops, t2.flops), lin(t1.recompute_flops, t2.recompute_flops)) for _, t1, t2 in self.depths]
        if len(self.depths) == 1:
            extra = 0.0
            total, rec = flops[0]
        else:
            (d1, _, _), (d2, _, _) = self.depths
            extra = (self.full_depth - d1) / (d2 - d1)
            total, rec = (max(0.0, (1 - extra) * u + extra * v) for u, v in zip(*flops))
        phase = self._gpu_phase if r.gpu is not None else self._roofline_phase
        (fwd, one_f), (bwd, one_b) = phase(micro_batch, r, "fwd_ops", extra), phase(micro_batch, r, "bwd_ops", extra)
        blocks, block_f, block_b = 0, 0.0, 0.0
        if len(self.depths) == 2 and self.full_depth > self.depths[0][0]:
            # One block's seconds: what the full depth adds to the one-block phase, per added block (the per-layer
            # overlap of ZeRO-3 and FSDP2, ``advisor.timing.step.prefetched_exposed_s``).
            added = self.full_depth - self.depths[0][0]
            blocks, block_f, block_b = self.full_depth, max(0.0, (fwd - one_f) / added), max(0.0, (bwd - one_b) / added)
        return ComputeTime(
            fwd_s=fwd,
            bwd_s=bwd,
            flops=int(round(total)),
            recompute_flops=int(round(rec)),
            blocks=blocks,
            block_fwd_s=block_f,
            block_bwd_s=block_b,
        )

    def _roofline_phase(self, micro_batch: int, r: Rates, phase: str, extra: float) -> tuple[float, float]:
        """A calibrated CPU's phase: the roofline work per traced depth, extrapolated linearly in depth, with the
        dispatch floor on the whole extrapolated phase (a floor applied per depth and extrapolated is not one).
        (seconds at full depth, seconds at the first traced depth)."""
        per = [
            roofline_work(getattr(t1, phase), getattr(t2, phase), micro_batch, BASE_B, r) for _, t1, t2 in self.depths
        ]
        if len(per) == 1:
            work, ops = per[0]
        else:
            work, ops = (max(0.0, (1 - extra) * u + extra * v) for u, v in zip(*per))
        return floored_s(work, ops, r), floored_s(*per[0], r)

    def _gpu_phase(self, micro_batch: int, r: Rates, phase: str, extra: float) -> tuple[float, float]:
        """A GPU's phase through the eager queue (``advisor.timing.gpu_time``): at full depth from the one- and
        two-block traces by repeating the added block's ops (``deep_queue_s``, exact); where the traces do not
        differ by one inserted stretch, each depth's queue extrapolated linearly, at least the extrapolated GPU
        work and issue time (both bound the full-depth queue from below). (seconds at full depth, seconds at the
        first traced depth)."""
        times = [op_times(getattr(t1, phase), getattr(t2, phase), micro_batch, BASE_B, r) for _, t1, t2 in self.depths]
        first = queue_s(times[0], r.dispatch_s)
        if len(times) == 1:
            return first, first
        one, two = times
        repeats = round(extra)
        if abs(extra - repeats) < 1e-9:
            exact = deep_queue_s(one, two, repeats, r.dispatch_s)
            if exact is not None:
                return exact, first
        ext = lambda u, v: max(0.0, (1 - extra) * u + extra * v)  # noqa: E731
        queued = ext(first, queue_s(two, r.dispatch_s))
        return max(queued, ext(sum(one), sum(two)), ext(len(one), len(two)) * r.dispatch_s), first

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
