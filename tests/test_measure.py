"""The CPU meter's running total rebuilt from the profiler's allocator events (advisor/measure.py): frees the
profiler did not record (gloo dropped the last reference on its own thread) put back where the training code let
go of the buffer. Hand-made traces, each with the figure the rules give and the one the reallocation alone gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from advisor.measure import CpuPeakMeter

MAIN = 1  # the profiled thread's id
ROOT = Path(__file__).resolve().parents[1]


def _trace(allocs: list[tuple[float, int, int]], spans: list[tuple[str, str, float, float]]) -> tuple[list, list]:
    """(raw allocator events as the meter reads them, Chrome-trace events) from (time, bytes, address) and
    (category, name, start, end) on the profiled thread. The running total counts only these events, as the
    profiler's does."""
    raw, events, total = [], [], 0
    for ts, size, addr in allocs:
        total += size
        raw.append((ts, total, size, addr, MAIN))
        args = {"Total Allocated": total, "Bytes": size, "Addr": addr, "Device Type": 0}
        events.append({"name": "[memory]", "ts": ts, "tid": MAIN, "args": args})
    events += [{"cat": c, "name": n, "ts": s, "dur": e - s, "tid": MAIN} for c, n, s, e in spans]
    return raw, events


def _peak(raw: list, events: list) -> tuple[int, int]:
    meter = CpuPeakMeter()
    totals = meter._seen_totals(raw, events)
    return max(t for _, t in totals), meter.unseen_frees


def test_free_seen_in_another_step_is_put_where_that_step_had_it():
    # step 1 frees its 100-byte buffer itself, three events after making it; step 2's copy of it is freed unseen
    # (its address comes round again only at t=70). The 300-byte tensor of t=50 is the step's largest.
    allocs = [
        (0, 1000, 10),  # model states, kept
        (11, 100, 20),
        (12, 5, 21),
        (13, -5, 21),
        (14, -100, 20),  # seen: 3 events after its allocation
        (41, 100, 30),
        (42, 5, 31),
        (43, -5, 31),
        (50, 300, 40),
        (51, -300, 40),
        (70, 100, 30),  # address 30 again: its free went unseen
        (71, -100, 30),
    ]
    spans = [("user_annotation", "step", 10, 30), ("user_annotation", "step", 40, 60)]
    raw, events = _trace(allocs, spans)
    assert _peak(raw, events) == (1000 + 300, 1)  # at the reallocation it would read 1000 + 100 + 300
    # in another range the site differs: nothing learned, the free stays at the reallocation
    other = [("user_annotation", "step", 10, 30), ("user_annotation", "other", 40, 60)]
    assert _peak(*_trace(allocs, other)) == (1000 + 100 + 300, 1)


def test_buffer_made_for_a_collective_is_freed_at_its_end():
    # FSDP2's all-gather output: the last allocation before the collective, in the same named range; never freed in
    # sight, it is freed when the op ends. The model states made before it stay.
    allocs = [(0, 1000, 10), (5, 200, 11), (10, 300, 12)]
    spans = [("user_annotation", "FSDP::all_gather (layers.0)", 4, 9), ("cpu_op", "c10d::_allgather_base_", 6, 8)]
    assert _peak(*_trace(allocs, spans)) == (1000 + 300, 1)
    # a temporary made (and freed) between the buffer and the op: the buffer is not the op's, and stays
    allocs_between = [(0, 1000, 10), (5, 200, 11), (5.5, 1, 13), (5.7, -1, 13), (10, 300, 12)]
    assert _peak(*_trace(allocs_between, spans)) == (1000 + 200 + 300, 0)
    # no range shared with the op: DeepSpeed all-gathers the weights right after AdamW made its states, which stay
    after_step = [("user_annotation", "Optimizer.step#AdamW.step", 4, 5.5), ("cpu_op", "c10d::_allgather_base_", 6, 8)]
    assert _peak(*_trace(allocs, after_step)) == (1000 + 200 + 300, 0)


def test_kept_tensor_is_not_freed_by_a_temporary_of_the_same_site():
    # AdamW's states (zeros_like, kept) and a later step's temporaries of the same size in the same range: the op
    # tells them apart, so the temporaries' lifetime is not lent to the states.
    allocs = [(1, 100, 10), (2, 5, 11), (21, 100, 20), (22, -100, 20), (30, 400, 30)]
    spans = [
        ("user_annotation", "Optimizer.step", 0, 3),
        ("cpu_op", "aten::zeros_like", 0.5, 1.5),
        ("user_annotation", "Optimizer.step", 20, 23),
        ("cpu_op", "aten::add", 20.5, 22.5),
    ]
    assert _peak(*_trace(allocs, spans)) == (100 + 5 + 400, 0)


_REAL = """
import torch
from advisor.measure import CpuPeakMeter
with CpuPeakMeter() as meter:
    with torch.profiler.record_function("pair"):
        a = torch.ones(2**26)  # 256 MiB of fp32
        b = torch.ones(2**25)  # 128 MiB
        del a, b
before, peak, after = meter.ranges["pair"]
print(peak - before, after - before, meter.unseen_frees)
"""


def test_meter_reads_a_real_pair_of_tensors():
    """A real 256 MiB + 128 MiB pair made inside the meter: the range's peak holds both, both frees are seen. In a
    process of its own: a test worker's threads left by other tests would allocate inside the profile too."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _REAL], env=env, capture_output=True, text=True, check=True).stdout
    held, left, unseen = map(int, out.split())
    assert held == 384 * 2**20 and left == 0 and unseen == 0


_TWICE = """
import torch
from advisor.measure import CpuPeakMeter
with CpuPeakMeter():
    a = torch.ones(2**24)  # 64 MiB counted by the process-wide total, then freed with no profiler running
del a
with CpuPeakMeter() as meter:
    b = torch.ones(2**20)  # 4 MiB
    del b
print(meter.peak_bytes, meter.raw_peak_bytes, meter.start_bytes)
"""


def test_a_second_meter_in_one_process_counts_only_its_own():
    """c10 never takes a tensor freed outside a profile off its CPU total, so a second meter starts above zero
    (a pytest worker read 1.6 GB for a 0.5 MB loss): its figures are relative to that start."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _TWICE], env=env, capture_output=True, text=True, check=True).stdout
    peak, raw, start = map(int, out.split())
    assert (peak, raw, start) == (4 * 2**20, 4 * 2**20, 64 * 2**20)
