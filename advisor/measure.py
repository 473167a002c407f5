"""Measuring real peak memory on CPU, where there is no ``torch.cuda.max_memory_allocated``.

Method: ``torch.profiler.profile(profile_memory=True)`` records every CPU-allocator event with the
allocator's running "Total Allocated" (exported in the Chrome trace). The peak is the largest
running total; named ``record_function`` ranges give the total before, the peak inside and the
total after each range. The running total only counts allocations made after the profiler
started, so start the meter before the model is built (ENGINEERING_NOTES, checked on a 256 MiB
+ 128 MiB allocation in tests/test_measure.py).

Frees the profiler does not see: it records the allocator events of the profiled thread only, and gloo
frees some tensors on its worker threads (its reduce-scatter clones the input inside the op; measured
with FSDP2 on 2 ranks: about one such free in three goes unrecorded, so "Total Allocated" climbs while
RSS stays flat, -6% to -55% errors). The meter therefore rebuilds the running total from the events'
own sizes and addresses: an address allocated again without a recorded free was freed unseen; if it
was allocated inside a collective (a ``c10d::`` op), the free is put at the op's end (gloo frees what
it cloned when the op completes), otherwise at the reallocation. ``raw_peak_bytes`` keeps the
profiler's own figure, ``unseen_frees`` the count.

Generated scripts embed this class's source (``inspect.getsource``) so they stay import-free.
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


class _TraceEvent(TypedDict, total=False):
    name: str
    cat: str
    ts: float
    dur: float
    args: _EventArgs


class CpuPeakMeter:
    """Context manager: ``peak_bytes`` (int) after exit, and ``ranges[name] = (before, peak, after)``
    for every ``torch.profiler.record_function(name)`` range entered inside it (the last one wins)."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self.raw_peak_bytes = 0
        self.unseen_frees = 0
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
            (e["ts"], e["args"]["Total Allocated"], e["args"].get("Bytes"), e["args"].get("Addr"))
            for e in events
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0
        )
        self.raw_peak_bytes = max((t for _, t, _, _ in raw), default=0)
        mem = self._seen_totals(raw, events)
        self.peak_bytes = max((t for _, t in mem), default=0)
        self.final_bytes = mem[-1][1] if mem else 0
        for e in events:
            if e.get("cat") == "user_annotation" and "dur" in e:
                start, end = e["ts"], e["ts"] + e["dur"]
                before = [t for ts, t in mem if ts < start]
                inside = [t for ts, t in mem if start <= ts <= end]
                b = before[-1] if before else 0
                self.ranges[e["name"]] = (b, max(inside + [b]), inside[-1] if inside else b)

    def _seen_totals(
        self, raw: list[tuple[float, int, int | None, int | None]], events: list[_TraceEvent]
    ) -> list[tuple[float, int]]:
        """(time, running total) with the unseen frees put back (module docstring); the profiler's own totals
        when the events carry no sizes or addresses. ``raw``: (time, the profiler's running "Total Allocated", the
        event's bytes, its address) per allocator event."""
        import bisect

        sized = [(ts, total, size, addr) for ts, total, size, addr in raw if size is not None and addr is not None]
        if not raw or len(sized) < len(raw):
            return [(ts, total) for ts, total, _, _ in raw]
        ops = sorted(
            (e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("c10d::") and "dur" in e
        )
        starts = [s for s, _ in ops]
        deltas: list[tuple[float, int]] = []
        live: dict[int, tuple[float, int]] = {}
        unseen = 0
        for ts, _, size, addr in sized:
            if size > 0 and addr in live:  # reallocated without a recorded free
                was_ts, was_size = live.pop(addr)
                i = bisect.bisect_right(starts, was_ts) - 1
                inside = i >= 0 and ops[i][0] <= was_ts <= ops[i][1]
                deltas.append((ops[i][1] if inside else ts, -was_size))
                unseen += 1
            if size > 0:
                live[addr] = (ts, size)
            else:
                live.pop(addr, None)
            deltas.append((ts, size))
        for addr, (was_ts, was_size) in list(live.items()):  # never freed in sight: inside a collective, at its end
            i = bisect.bisect_right(starts, was_ts) - 1
            if i >= 0 and ops[i][0] <= was_ts <= ops[i][1]:
                deltas.append((ops[i][1], -was_size))
                unseen += 1
        self.unseen_frees = unseen
        total = sized[0][1] - sized[0][2]  # what was allocated before the first event
        out = []
        for ts, size in sorted(deltas, key=lambda d: (d[0], d[1] > 0)):
            total += size
            out.append((ts, total))
        return out
