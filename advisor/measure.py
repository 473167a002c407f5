"""Measuring real peak memory on CPU, where there is no ``torch.cuda.max_memory_allocated``.

Method: ``torch.profiler.profile(profile_memory=True)`` records every CPU-allocator event with the
allocator's running "Total Allocated" (exported in the Chrome trace). The peak is the largest
running total; named ``record_function`` ranges give the total before, the peak inside and the
total after each range. c10's ``ProfiledCPUMemoryReporter`` keeps that total for the whole process and
counts only allocations made while a profiler records memory, so in a fresh process it starts at zero;
after an earlier profiled measurement it still holds what that one left counted (tensors freed with no
profiler running are never taken off: a pytest worker read 1.6 GB there). Every figure is therefore
taken relative to the total before the meter's first event (``start_bytes``). Start the meter before
the model is built (ENGINEERING_NOTES, checked on a 256 MiB + 128 MiB allocation in tests/test_measure.py).

Frees the profiler does not see: it records the allocator events of the profiled thread only, and gloo
frees some tensors on its worker threads (its reduce-scatter clones the input inside the op; measured
with FSDP2 on 2 ranks: about one such free in three goes unrecorded, so "Total Allocated" climbs while
RSS stays flat, -6% to -55% errors). The meter therefore rebuilds the running total from the events'
own sizes and addresses: an address allocated again without a recorded free was freed unseen; if it
was allocated inside a collective (a ``c10d::`` op), the free is put at the op's end (gloo frees what
it cloned when the op completes), otherwise at the reallocation. Two rules place a free earlier, never
later than those:

- training repeats itself, so where the same allocation site (the named ranges open, the op, the size and the
  place in the innermost range) was seen freed by the profiled thread in another step, the unseen free comes as
  many of that thread's allocator events after the allocation as the seen one did (the median over the steps);
- otherwise, a buffer that is the profiled thread's last allocation before a collective starts, in the same
  named range, was made to be sent or received (FSDP2's all-gather output in ``FSDP::all_gather``): freed at the
  op's end. Outside a shared range the rule would free tensors kept for good (DeepSpeed ZeRO-2 all-gathers the
  updated weights right after AdamW made its states: -24 MiB on a resnet18 rank), so the receive buffers of
  ``set_model_state_dict``'s broadcast from rank 0 stay live when gloo drops them unseen.

How often a gloo worker drops a last reference depends on how busy the machine is: before these two rules the
resnet18 FSDP2 run on 2 ranks read 159 MiB alone and 159-195 MiB with three or four busy loops beside it; with
them, 159.10-160.65 MiB on 12 of those 14 traces and 170.56 and 172.60 MiB on two (broadcast buffers of the
model's initialisation, above; raw figures 241-400 MiB). DDP and ZeRO-2 traces of resnet18 read as before (246.01 MiB;
249.13 and 230.36 MiB). ``raw_peak_bytes`` keeps the profiler's
own figure, ``unseen_frees`` the count.

The measurement probe (``strategies/probe/_advisor_probe.py``) imports this class; nothing of it is copied into
the scripts a user keeps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import torch

# The fields of a Chrome-trace event the meter reads: an allocator event ("[memory]", its args the running total,
# the bytes (negative: a free), the address and the device type) or a range (its category, start and duration, us).
_EventArgs = TypedDict(
    "_EventArgs", {"Total Allocated": int, "Bytes": int, "Addr": int, "Device Type": int}, total=False
)


# One allocator event as the meter reads it: time (us), the profiler's running total, bytes (negative: a free),
# address and thread id.
_MemoryEvent = tuple[float, int, int | None, int | None, int | None]


class _TraceEvent(TypedDict, total=False):
    name: str
    cat: str
    tid: int
    ts: float
    dur: float
    args: _EventArgs


class CpuPeakMeter:
    """Context manager: ``peak_bytes`` (int) after exit, and ``ranges[name] = (before, peak, after)``
    for every ``torch.profiler.record_function(name)`` range entered inside it (the last one wins); bytes above
    ``start_bytes``, what the process-wide counter held before the first event (module docstring)."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self.raw_peak_bytes = 0
        self.unseen_frees = 0
        self.start_bytes = 0
        self.final_bytes = 0
        self.ranges: dict[str, tuple[int, int, int]] = {}
        self._prof: torch.profiler.profile | None = None

    def __enter__(self) -> CpuPeakMeter:  # quoted: a copy of this class's source needs no import for it
        import torch

        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import json
        import os
        import tempfile

        assert self._prof is not None, "CpuPeakMeter exits only after it entered"
        self._prof.__exit__(*exc)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                events: list[_TraceEvent] = json.load(f)["traceEvents"]
        finally:
            os.remove(path)
        raw = sorted(
            (e["ts"], e["args"]["Total Allocated"], e["args"].get("Bytes"), e["args"].get("Addr"), e.get("tid"))
            for e in events
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0
        )
        mem = self._seen_totals(raw, events)
        self.raw_peak_bytes = max((t - self.start_bytes for _, t, _, _, _ in raw), default=0)
        self.peak_bytes = max((t for _, t in mem), default=0)
        self.final_bytes = mem[-1][1] if mem else 0
        for e in events:
            if e.get("cat") == "user_annotation" and "dur" in e:
                start, end = e["ts"], e["ts"] + e["dur"]
                before = [t for ts, t in mem if ts < start]
                inside = [t for ts, t in mem if start <= ts <= end]
                b = before[-1] if before else 0
                self.ranges[e["name"]] = (b, max(inside + [b]), inside[-1] if inside else b)

    def _seen_totals(self, raw: list[_MemoryEvent], events: list[_TraceEvent]) -> list[tuple[float, int]]:
        """(time, running total) with the unseen frees put back (module docstring); the profiler's own totals
        when the events carry no sizes or addresses. ``raw``: (time, the profiler's running "Total Allocated", the
        event's bytes, its address, its thread) per allocator event, in time order."""
        import bisect
        from collections import Counter

        sized = [e for e in raw if e[2] is not None and e[3] is not None]
        if raw:
            self.start_bytes = raw[0][1] - (raw[0][2] or 0)
        if not raw or len(sized) < len(raw):
            return [(ts, total - self.start_bytes) for ts, total, _, _, _ in raw]
        ops = sorted(
            (e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("c10d::") and "dur" in e
        )
        starts = [s for s, _ in ops]

        def collective_end(ts: float) -> float | None:
            """The end of the collective running at ``ts`` (gloo frees what it allocated inside the op by then)."""
            i = bisect.bisect_right(starts, ts) - 1
            return ops[i][1] if i >= 0 and ops[i][0] <= ts <= ops[i][1] else None

        main = Counter(e[4] for e in sized).most_common(1)[0][0]  # the profiled thread: the training loop's
        main_ts = [e[0] for e in sized if e[4] == main]
        sites = self._allocation_sites(sized, events, main)
        lifetimes = self._seen_lifetimes(sized, sites, main)

        def learned_free(k: int) -> float | None:
            """Where allocation ``k`` of ``sized`` is freed, going by its site's lifetime seen in other steps."""
            span = lifetimes.get(sites[k]) if k in sites else None
            if span is None:
                return None
            i = bisect.bisect_left(main_ts, sized[k][0]) + span
            return main_ts[i] if i < len(main_ts) else None

        main_allocs = [e[0] for e in sized if e[4] == main and (e[2] or 0) > 0]
        named = sorted(
            (e["ts"], e["ts"] + e["dur"])
            for e in events
            if e.get("cat") == "user_annotation" and "dur" in e and e.get("tid") == main
        )

        def made_for_collective(k: int) -> float | None:
            """The end of the next collective where allocation ``k`` is the profiled thread's last before it starts
            and both lie in one named range (FSDP2's ``FSDP::all_gather``: the all-gather output), which gloo may
            release on its own thread once the op is done. Outside a shared range the last allocation before a
            collective is as often a tensor kept for good (DeepSpeed's all-gather after AdamW made its states)."""
            ts = sized[k][0]
            i = bisect.bisect_right(starts, ts)
            j = bisect.bisect_right(main_allocs, ts)
            if i == len(ops) or (j < len(main_allocs) and main_allocs[j] < ops[i][0]):
                return None
            inner = [r for r in named if r[0] <= ts and ops[i][1] <= r[1]]
            return ops[i][1] if inner else None

        def seen_or_sent(k: int) -> float | None:
            """Where an unseen free of allocation ``k`` goes by its own history: as seen in other steps, else at the
            end of the collective it was made for."""
            learned = learned_free(k)
            return learned if learned is not None else made_for_collective(k)

        deltas: list[tuple[float, int]] = []
        live: dict[int, tuple[int, int]] = {}  # address -> (index in sized, bytes)
        unseen = 0
        for k, (ts, _, size, addr, _) in enumerate(sized):
            assert size is not None and addr is not None  # sized holds only such events
            if size > 0 and addr in live:  # reallocated without a recorded free
                was, was_size = live.pop(addr)
                at = min(t for t in (ts, collective_end(sized[was][0]), seen_or_sent(was)) if t is not None)
                deltas.append((at, -was_size))
                unseen += 1
            if size > 0:
                live[addr] = (k, size)
            else:
                live.pop(addr, None)
            deltas.append((ts, size))
        for was, was_size in live.values():  # never freed in sight: as above
            found = [t for t in (collective_end(sized[was][0]), seen_or_sent(was)) if t is not None]
            if found:
                deltas.append((min(found), -was_size))
                unseen += 1
        self.unseen_frees = unseen
        total = 0  # relative to what the counter held before the first event (start_bytes)
        out = []
        for ts, size in sorted(deltas, key=lambda d: (d[0], d[1] > 0)):
            total += size
            out.append((ts, total))
        return out

    @staticmethod
    def _allocation_sites(
        sized: list[_MemoryEvent], events: list[_TraceEvent], main: int | None
    ) -> dict[int, tuple[str, str, int, int]]:
        """For each allocation of the profiled thread (its index in ``sized``): (the named ranges open on that
        thread, outermost first; the ops open, outermost first; the bytes; how many allocations of that size the
        innermost range's instance made up to it). The same site recurs in every training step; the enclosing ranges
        tell FSDP2's forward all-gather (freed at the next unit's copy-out) from its backward prefetch (freed at its
        own), and the ops a tensor made to be kept (AdamW's states, ``zeros_like`` > ``empty_like`` >
        ``empty_strided``) from a temporary of the same size in the same range."""
        spans = sorted(
            (e["ts"], e["ts"] + e["dur"], e["name"], e.get("cat") == "user_annotation")
            for e in events
            if e.get("cat") in ("user_annotation", "cpu_op") and "dur" in e and e.get("tid") == main
        )
        sites: dict[int, tuple[str, str, int, int]] = {}
        open_spans: list[int] = []  # indices in spans, in order of their start
        nth: dict[tuple[int, int], int] = {}
        r = 0
        for k, (ts, _, size, _, tid) in enumerate(sized):
            if tid != main or size is None:
                continue
            while r < len(spans) and spans[r][0] <= ts:
                open_spans.append(r)
                r += 1
            open_spans = [i for i in open_spans if spans[i][1] >= ts]
            if size <= 0:
                continue
            named = [i for i in open_spans if spans[i][3]]
            rng = named[-1] if named else -1
            ops = " > ".join(spans[i][2] for i in open_spans if not spans[i][3])
            nth[(rng, size)] = nth.get((rng, size), 0) + 1
            sites[k] = (" > ".join(spans[i][2] for i in named), ops, size, nth[(rng, size)])
        return sites

    @staticmethod
    def _seen_lifetimes(
        sized: list[_MemoryEvent], sites: dict[int, tuple[str, str, int, int]], main: int | None
    ) -> dict[tuple[str, str, int, int], int]:
        """Per allocation site: how many of the profiled thread's allocator events after the allocation its free
        came, where the profiled thread itself freed it (the median over the steps that show one)."""
        spans: dict[tuple[str, str, int, int], list[int]] = {}
        open_at: dict[int, tuple[int, int]] = {}  # address -> (index in sized, ordinal on the profiled thread)
        n = 0
        for k, (_, _, size, addr, tid) in enumerate(sized):
            if tid != main or size is None or addr is None:
                continue
            if size > 0:
                open_at[addr] = (k, n)
            elif addr in open_at:
                was, at = open_at.pop(addr)
                if was in sites:
                    spans.setdefault(sites[was], []).append(n - at)
            n += 1
        return {site: sorted(v)[len(v) // 2] for site, v in spans.items()}
