"""How far to trust a step time or a memory figure: an error band, relative to the estimate, and the table of
bands the plan quotes (``TIME_BANDS``, ``MEMORY_BAND``).

A band ``ErrorBand(low, high, based_on)`` says that the true figure lay within ``[estimate x (1 + low),
estimate x (1 + high)]`` for at least 80% of the rows it was built from (``band_from_ratios``: the
``floor(n / 10)`` lowest and as many highest ratios are left out, the rest spanned, and the estimate itself
always inside, so ``low <= 0 <= high``). -0.15 means 15% below the estimate. A step time's band is also the
band of every figure proportional to it (train hours, GPU-hours, cost) and, inverted, of the throughput.

``TIME_BANDS`` is the one place the fitted bands live; ``time_band`` picks the entry for a plan by its keys
(``TimeKey``): the GPU generation fitted or borrowed, the workload (transformer or CNN), a GPU calibrated on
this machine, or the CPU verification path. ``memory_band`` is the per-GPU memory figure's. Each entry says
how it was produced in its ``based_on``; to replace one, paste the new band from its producer (for the GPU
keys: the leave-one-source-out residuals ``python -m bench.published`` prints) over the entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from ..choices import Device
from .compute import GENERATION, preset_for_gpu
from .gpu_model import GpuModel

COVERAGE = 0.8  # the share of the rows a band covers at least (band_from_ratios)
# Below this many rows a band is shown as a rough guide: with 2 or 3 rows, "80% inside" means every row inside,
# and the next run can fall anywhere.
FEW_ROWS = 10


@dataclass(frozen=True)
class ErrorBand:
    """The true figure lies in ``[estimate x (1 + low), estimate x (1 + high)]`` for at least 80% of the rows in
    ``based_on`` (fractions: -0.15 is 15% below the estimate; ``low <= 0 <= high``). ``rows``: how many rows it
    was built from (0: not counted)."""

    low: float
    high: float
    based_on: str
    rows: int = 0

    def as_dict(self) -> dict[str, object]:
        """The JSON document's ``error_band``: ``{"low": -0.15, "high": 0.12, "based_on": "..."}``."""
        return {"low": self.low, "high": self.high, "based_on": self.based_on}

    def bounds(self, estimate: float) -> tuple[float, float]:
        """The band around ``estimate`` in its own unit: ``(estimate x (1 + low), estimate x (1 + high))``."""
        return estimate * (1 + self.low), estimate * (1 + self.high)

    def text(self) -> str:
        """``typically within +-15%`` when both sides round alike, else ``typically within -19%/+14%`` (whole
        percents from 10% up, one decimal below; a side at 0 reads ``0%``: ``typically within 0%/+222%``)."""
        lo, hi = _pct(-self.low), _pct(self.high)
        if lo == hi:
            return f"typically within +-{hi}"
        return f"typically within {'-' + lo if self.low else '0%'}/{'+' + hi if self.high else '0%'}"

    def reading(self, slower: str = "slower") -> str:
        """How to read the band, for the line that quotes it: ``"80% of 51 runs fell inside; + is slower than
        estimated"``, or with fewer than ``FEW_ROWS`` rows ``"only 2 runs behind it: a rough guide; + is slower
        than estimated"``. ``slower``: what + means for this figure ("slower" for a time, "more" for memory)."""
        sign = f"+ is {slower} than estimated"
        if not self.rows:
            return sign
        if self.rows < FEW_ROWS:
            return f"only {self.rows} run{'s' if self.rows > 1 else ''} behind it: a rough guide; {sign}"
        return f"{COVERAGE:.0%} of {self.rows} runs fell inside; {sign}"


def _pct(x: float) -> str:
    x = abs(x)
    return f"{100 * x:.0f}%" if x >= 0.095 else f"{100 * x:.1f}%"


def band_from_ratios(ratios: Sequence[float], based_on: str) -> ErrorBand:
    """The band of ``ratios`` (true figure / estimate, one per row; > 0): sorted, the ``floor(n / 10)`` lowest and
    as many highest left out (so at least ``COVERAGE`` = 80% of the rows remain inside), the rest spanned,
    widened to hold 0 (the estimate itself). Raises ValueError on no rows or a ratio that is not positive."""
    if not ratios or any(not r > 0 or math.isinf(r) for r in ratios):
        raise ValueError(f"a band needs at least one positive, finite ratio: {list(ratios)}")
    rel = sorted(r - 1 for r in ratios)
    k = len(rel) // 10
    return ErrorBand(min(rel[k], 0.0), max(rel[-1 - k], 0.0), based_on, len(rel))


def band_from_errors(errors: Sequence[float], based_on: str) -> ErrorBand:
    """``band_from_ratios`` of signed errors ``(estimate - truth) / truth`` (bench/'s convention): truth / estimate
    = 1 / (1 + error). Raises ValueError as ``band_from_ratios`` does (an error of -1 or below included)."""
    if any(not e > -1 for e in errors):
        raise ValueError(f"an error (estimate - truth) / truth is above -1: {list(errors)}")
    return band_from_ratios([1 / (1 + e) for e in errors], based_on)


# --- the table -----------------------------------------------------------------------------------------------
# The leave-one-source-out residuals of the published-run fit (``python -m bench.published``, bench/PUBLISHED.md,
# 2026-12-07): each source's rows predicted by constants fitted without that source, truth time / predicted time - 1,
# pooled per GPU generation and workload; (low, high, rows, rows inside): the narrowest interval holding at least 80%
# of the rows, widened to hold 0 (bench/published_fit.py ``band``). Paste the new table from ``--fit``'s output.
PUBLISHED_LOSO_BANDS: Mapping[tuple[str, str], tuple[float, float, int, int]] = MappingProxyType(
    {
        ("ada", "transformer"): (0.000, 0.871, 3, 3),
        ("ampere", "cnn"): (0.000, 0.527, 2, 2),
        ("ampere", "transformer"): (-0.171, 0.080, 51, 41),
        ("hopper", "cnn"): (0.000, 0.409, 2, 2),
        ("hopper", "transformer"): (-0.223, 0.073, 30, 24),
        ("turing", "transformer"): (0.000, 0.386, 2, 2),
        ("volta", "transformer"): (-0.509, 0.541, 14, 12),
    }
)
_LOSO = "leave-one-source-out residuals of the published-run fit (bench/PUBLISHED.md)"
# The only published runs with CPU offload (bench/PUBLISHED.md, shown rows: whole-epoch wall times with start-up and
# evaluation, not fitted): truth time / predicted time of O54's FULL_SHARD + offload (min_num_params 1M and 2K),
# O55's FSDP + offload on 1 and 2 TITAN RTX, O58's ZeRO-3 + offload on 1 TITAN RTX (2026-12-03).
OFFLOAD_SHOWN_RATIOS = (4.533, 5.199, 4.347, 4.757, 3.276)

Path = Literal["gpu", "calibrated", "cpu", "offload"]
Workload = Literal["transformer", "cnn"]


@dataclass(frozen=True)
class TimeKey:
    """What a step-time band applies to. ``path``: "gpu" (a GPU timed with its generation's fitted constants),
    "calibrated" (a GPU timed with constants ``advisor calibrate`` measured on this machine) or "cpu" (a CPU
    verification run, timed with this machine's CPU calibration). ``generation``: on the "gpu" path, the GPU's
    generation (``advisor.timing.compute.GENERATION``: "ampere", "hopper", ...), None for the band of a generation
    without published rows of that workload (every generation's rows of it pooled); None on the other paths.
    ``workload``: the model's kind; None where one band serves both."""

    path: Path
    generation: str | None = None
    workload: Workload | None = None


def _pooled(workload: Workload) -> ErrorBand:
    """The band of a generation without published rows of ``workload``: the union of the generations' bands."""
    bands = [v for (_, w), v in PUBLISHED_LOSO_BANDS.items() if w == workload]
    rows = sum(b[2] for b in bands)
    return ErrorBand(
        min(b[0] for b in bands),
        max(b[1] for b in bands),
        f"no published {workload} run on this GPU generation: the widest of the others' bands, {_LOSO}, {rows} rows",
        rows,
    )


# The bands, by key. How each is produced (paste a new band over its entry; keep the based_on truthful):
# - gpu/<generation>/<workload>: ``PUBLISHED_LOSO_BANDS``; gpu/None/<workload>: their union (``_pooled``).
# - calibrated: residuals of ``advisor calibrate --verify`` runs (calibrated prediction vs measured step) on
#   GPUs; until a GPU run is measured (python -m bench.gpu), the pooled transformer band.
# - cpu: bench/results.json's step-time errors of the CPU verification runs (the cases measured while other
#   processes took at most 25% of the CPUs), through ``bench_case_errors`` and ``band_from_errors``.
TIME_BANDS: Mapping[TimeKey, ErrorBand] = MappingProxyType(
    {
        **{
            TimeKey("gpu", g, w): ErrorBand(lo, hi, f"{_LOSO}: {n} {g.capitalize()} {w} runs, {k} inside", n)  # type: ignore[arg-type]
            for (g, w), (lo, hi, n, k) in PUBLISHED_LOSO_BANDS.items()
        },
        TimeKey("gpu", None, "transformer"): _pooled("transformer"),
        TimeKey("gpu", None, "cnn"): _pooled("cnn"),
        TimeKey("calibrated"): ErrorBand(
            _pooled("transformer").low,
            _pooled("transformer").high,
            "calibrated on this machine; no calibrated GPU run measured yet, so the widest published-run band "
            f"({_LOSO})",
            _pooled("transformer").rows,
        ),
        TimeKey("offload"): band_from_ratios(
            OFFLOAD_SHOWN_RATIOS,
            "no steady-state offload run published; the 5 published epoch times of CPU-offload runs (O54, O55, O58 on "
            "TITAN RTX, start-up and evaluation included) took 3.3-5.2x the predicted time",
        ),
        TimeKey("cpu"): ErrorBand(
            -0.0464,
            0.6489,
            "71 CPU verification runs timed with this machine's CPU calibration (bench/RESULTS.md)",
            73,
        ),
    }
)

# bench/results.json's per-rank peak memory errors of all its completed cases (estimate vs the largest measured
# per-rank peak allocated, CPU runs over gloo), through ``bench_case_errors`` and ``band_from_errors``.
MEMORY_BAND = ErrorBand(-0.0162, 0.0326, "78 measured CPU runs, per-rank peak allocated (bench/RESULTS.md)", 78)
_GPU_MEMORY_NOTE = (
    "; no GPU run is measured yet (small fp32 and bf16 models on CPU ranks), and a GPU's device overhead (CUDA "
    "context, NCCL, fragmentation) is not measured there"
)

_VISION_TRANSFORMERS = ("vit", "swin", "maxvit")  # torchvision's transformer image models


def workload_of(family: str, model_name: str) -> Workload:
    """ "transformer" for the transformer family and torchvision's transformer image models (vit_*, swin_*,
    maxvit_*), "cnn" for the other vision models and for custom factories (the wider band: their kind is
    unknown). ``family``: ``ModelSpec.family``."""
    if family == "transformer":
        return "transformer"
    if family == "vision" and model_name.lower().startswith(_VISION_TRANSFORMERS):
        return "transformer"
    return "cnn"


def time_key(
    device: Device,
    gpu_name: str,
    gpu_memory_bytes: int | None,
    family: str,
    model_name: str,
    gpu_model: GpuModel | None = None,
    offload: bool = False,
) -> TimeKey:
    """The ``TIME_BANDS`` key of a plan's step times: "cpu" for a CPU verification estimate (``device`` CPU),
    "offload" for a strategy that keeps model states in host memory (``offload``: ``Strategy.offload``),
    "calibrated" when ``gpu_model``
    (``Hardware.gpu_model``) came from a calibration of this machine (its source says "calibrated"), else "gpu"
    with the GPU's generation (``GENERATION`` of its preset; None where no published run of that generation and
    workload was fitted, or the GPU has no preset) and the workload (``workload_of``)."""
    if device == Device.CPU:
        return TimeKey("cpu")
    if offload:
        return TimeKey("offload")
    if gpu_model is not None and "calibrated" in gpu_model.source.lower():
        return TimeKey("calibrated")
    preset = preset_for_gpu(gpu_name, gpu_memory_bytes)
    workload = workload_of(family, model_name)
    generation = GENERATION.get(preset.name.lower()) if preset is not None else None
    if generation is None or (generation, workload) not in PUBLISHED_LOSO_BANDS:
        return TimeKey("gpu", None, workload)
    return TimeKey("gpu", generation, workload)


def time_band(
    device: Device,
    gpu_name: str,
    gpu_memory_bytes: int | None,
    family: str,
    model_name: str,
    gpu_model: GpuModel | None = None,
    offload: bool = False,
) -> ErrorBand:
    """The error band of a plan's step times (and train hours, GPU-hours, cost): ``TIME_BANDS[time_key(...)]``.
    Arguments as ``time_key``'s (a ``StrategyContext``'s device, hardware and model spec)."""
    return TIME_BANDS[time_key(device, gpu_name, gpu_memory_bytes, family, model_name, gpu_model, offload)]


def memory_band(device: Device) -> ErrorBand:
    """The error band of a per-GPU memory estimate (``MEMORY_BAND``, measured on CPU ranks); on a GPU its
    ``based_on`` adds that the device overhead terms are not part of what was measured."""
    if device == Device.CPU:
        return MEMORY_BAND
    return ErrorBand(MEMORY_BAND.low, MEMORY_BAND.high, MEMORY_BAND.based_on + _GPU_MEMORY_NOTE, MEMORY_BAND.rows)


def bench_case_errors(results: Mapping[str, object], contended_share: float = 0.25) -> tuple[list[float], list[float]]:
    """The per-case errors ``MEMORY_BAND`` and the "cpu" time band are built from, out of bench/results.json's
    document (``python -m bench.run``): (memory errors of every completed case, step-time errors of the
    completed cases whose ``cpu_contention`` is at most ``contended_share``), each (estimate - measured) /
    measured. Raises ValueError when ``results`` has no list of cases."""
    cases = results.get("cases")
    if not isinstance(cases, list):
        raise ValueError("bench results without a list of cases")
    memory: list[float] = []
    step: list[float] = []
    for c in cases:
        if not isinstance(c, dict) or not c.get("ok"):
            continue
        errors = c.get("errors")
        ours = errors.get("ours") if isinstance(errors, dict) else None
        if isinstance(ours, float | int):
            memory.append(float(ours))
        st, load = c.get("step_time_error"), c.get("cpu_contention")
        if isinstance(st, float | int) and (not isinstance(load, float | int) or load <= contended_share):
            step.append(float(st))
    return memory, step
