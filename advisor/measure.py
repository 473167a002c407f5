"""Measuring real peak memory on CPU, where there is no ``torch.cuda.max_memory_allocated``.

Method: ``torch.profiler.profile(profile_memory=True)`` records every CPU-allocator event with the
allocator's running "Total Allocated" (exported in the Chrome trace). The peak is the largest
running total; named ``record_function`` ranges give the total before, the peak inside and the
total after each range. The running total only counts allocations made after the profiler
started, so start the meter before the model is built (ENGINEERING_NOTES, checked on a 256 MiB
+ 128 MiB allocation in tests/test_measure.py).

Generated scripts embed this class's source (``inspect.getsource``) so they stay import-free.
"""

from __future__ import annotations


class CpuPeakMeter:
    """Context manager: ``peak_bytes`` (int) after exit, and ``ranges[name] = (before, peak, after)``
    for every ``torch.profiler.record_function(name)`` range entered inside it (the last one wins)."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self.final_bytes = 0
        self.ranges: dict = {}
        self._prof = None

    def __enter__(self) -> "CpuPeakMeter":
        import torch

        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        import json
        import os
        import tempfile

        self._prof.__exit__(*exc)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self._prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        finally:
            os.remove(path)
        mem = sorted((e["ts"], e["args"]["Total Allocated"]) for e in events
                     if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0)
        self.peak_bytes = max((t for _, t in mem), default=0)
        self.final_bytes = mem[-1][1] if mem else 0
        for e in events:
            if e.get("cat") == "user_annotation" and "dur" in e:
                start, end = e["ts"], e["ts"] + e["dur"]
                before = [t for ts, t in mem if ts < start]
                inside = [t for ts, t in mem if start <= ts <= end]
                b = before[-1] if before else 0
                self.ranges[e["name"]] = (b, max(inside + [b]), inside[-1] if inside else b)
