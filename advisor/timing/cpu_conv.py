"""A model's own convolutions, timed on this CPU, for the step time of a CPU verification.

One measured rate cannot time a CPU's convolutions: PyTorch picks the kernel by shape, batch and threads
(``ConvParams::use_mkldnn`` in aten/src/ATen/native/Convolution.cpp runs a 1x1, stride-1 fp32 convolution of fewer
than 16 samples on one thread with its own im2col + GEMM, ``slow_conv2d``, and the rest with oneDNN), and both
slow down several-fold on the small maps of a network's last stages. Measured here, one thread, fp32, forward +
backward: a 3x3 convolution of 64 channels on 8 x 64 x 16 x 16 at 123 / 167 GFLOP/s, one of 512 channels on a 2x2
map at 52 / 35; ``slow_conv2d``'s 1x1 convolutions 56-69 GFLOP/s on 8x8 and 16x16 maps, 8 / 4 on 2x2 ones (ResNet-50's
last stage at 64 px). The CPU calibration's one convolution (``advisor.timing.calibrate``: 3x3, 64 channels, 16x16)
timed ResNet-50 at 64 px, batch 8, 3x too fast (157 ms predicted, 467 ms measured on this machine).

So a CPU verification times each convolution of the traced step by that call measured on this CPU
(``measured_conv_s``: the call's shapes on random tensors, ``CPU_RANK_THREADS`` threads, the median of repeated
calls, in a worker process, ``_cpu_conv_worker.py``), at the run's micro-batch, each call cached on disk by this CPU,
its threads and the torch version (``NAMESPACE``); ``advisor.timing.compute.op_s`` uses them
(``Rates.conv_s``). One process measures while the others idle (a verification's ranks run theirs side by side:
convolutions are compute-bound, and each rank has its own core in the runs this serves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ..cache import DiskCache, NullCache, library_versions
from ..processes import MachineLock
from .calibrate import CONTENDED_SHARE, OtherCpu, cpu_model
from .compute import ConvKey, Op, ops_at

NAMESPACE = "cpu-conv"
FORMAT = 1  # bump when what is measured changes: older entries then miss
SECONDS_PER_CALL = 0.05  # each call repeated for about this long (at least 3 times) after a warm-up
TIMEOUT_S = 300.0
_WORKER = Path(__file__).with_name("_cpu_conv_worker.py")


def conv_calls(phases: Iterable[tuple[Sequence[Op], Sequence[Op]]], micro_batch: int, base_b: int) -> list[ConvKey]:
    """The distinct convolution calls of a traced step at ``micro_batch``, in order of first use. ``phases``: each
    phase's ops as traced at micro-batch ``base_b`` and ``base_b + 1``, taken at ``micro_batch`` as the step time
    takes them (``compute.ops_at``: the input's N of each call linear in the micro-batch)."""
    calls = (conv for o1, o2 in phases for *_, conv in ops_at(o1, o2, micro_batch, base_b) if conv is not None)
    return list(dict.fromkeys(calls))


def _cache_key(call: ConvKey, threads: int) -> dict[str, object]:
    return {
        "format": FORMAT,
        "cpu": cpu_model(),
        "threads": threads,
        "torch": library_versions()["torch"],
        "call": list(call),
    }


def measure(calls: Sequence[ConvKey], threads: int, seconds: float = SECONDS_PER_CALL) -> list[float]:
    """Seconds of each of ``calls`` on this CPU now (``_cpu_conv_worker.py``, one process of ``threads`` threads).

    Raises:
        RuntimeError: the worker failed or ran past ``TIMEOUT_S``.
    """
    request = json.dumps({"threads": threads, "seconds": seconds, "calls": [list(c) for c in calls]})
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    try:
        done = subprocess.run(
            [sys.executable, str(_WORKER)],
            input=request,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=dict(os.environ, **env),
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timing the model's convolutions ran past {TIMEOUT_S:.0f} s") from None
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("CONV ")), None)
    if done.returncode != 0 or line is None:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise RuntimeError(f"timing the model's convolutions failed: {last[0]}")
    seconds_each = json.loads(line.split(" ", 1)[1])
    if len(seconds_each) != len(calls):
        raise RuntimeError(f"timing the model's convolutions gave {len(seconds_each)} figures for {len(calls)} calls")
    return [float(s) for s in seconds_each]


def measured_conv_s(
    calls: Sequence[ConvKey],
    threads: int,
    cache: DiskCache | NullCache,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[tuple[tuple[ConvKey, float], ...], bool]:
    """((call, seconds) of each of ``calls`` on this CPU with ``threads`` threads, contended): from ``cache``, the
    rest measured now (``measure``, holding ``MachineLock`` so that no verification competes for the cores).
    Measurements taken while other processes kept the CPUs busy (more than ``CONTENDED_SHARE`` of them:
    ``contended`` True) are used once and not cached, as the calibration does. ``say`` hears what is measured.

    Raises:
        RuntimeError: the measurement failed.
        advisor.processes.VerifyBusy: a verification holds this machine's lock.
    """
    known: dict[ConvKey, float] = {}
    for call in calls:
        hit = cache.get(NAMESPACE, _cache_key(call, threads))
        if isinstance(hit, dict) and isinstance(hit.get("seconds"), (int, float)):
            known[call] = float(hit["seconds"])
    missing = [c for c in calls if c not in known]
    contended = False
    if missing:
        say(f"timing {len(missing)} of the model's convolution calls on this CPU for the step-time prediction")
        with MachineLock():
            others = OtherCpu()
            measured = measure(missing, threads)
            share = others.share()
        contended = share is not None and share > CONTENDED_SHARE
        for call, s in zip(missing, measured):
            known[call] = s
            if not contended:
                cache.put(NAMESPACE, _cache_key(call, threads), {"seconds": s})
    return tuple((c, known[c]) for c in calls), contended
