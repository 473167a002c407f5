"""This machine's GPU, measured (``advisor calibrate``): the microbenchmarks' figures turned into the compute
model's constants (``advisor.timing.gpu_model.GpuModel``) and the fabric figures, each derivation below.

``_gpu_calibrate_worker.py`` measures (its shape lists say what); ``from_measurements`` turns its document into a
``GpuCalibration`` by arithmetic on it and the GPU's preset (the datasheet peaks, ``advisor.gpu_presets``):

* ``gemm``, per precision (bf16, fp16, fp32 without TF32, tf32): the best TFLOP/s among the sweep's large GEMMs
  (M, N and K all at least ``LARGE_GEMM_DIM``; 2 FLOPs per multiply-add) over the datasheet dense peak of that
  precision (``GpuPreset.peak_tflops``), capped at 1. A plan's precision picks one (``peak_precision``).
* ``conv``, per precision (bf16, fp16, tf32: fp32 tensors under cuDNN's default TF32): the best TFLOP/s of
  forward + backward (3 x the forward's FLOPs, as torch.utils.flop_counter counts the input and weight
  gradients) among ResNet-50's convolutions with at least ``LARGE_CONV_CHANNELS`` input channels, over the
  convolution peak (``conv_peak_precision``), capped at 1.
* ``attention``, per precision: the best TFLOP/s of fused SDPA forward + backward, not causal, at head dim 128
  (FLOPs as torch.utils.flop_counter counts them: 4 b h s^2 d forward, 2.5 x that backward) over the dense peak,
  capped at 1. Causal runs and head dim 64 are kept among the measured rates (``rates``).
* ``bandwidth`` and ``half_bandwidth_bytes``: a copy of S bytes moves n = 2 S (read + write). The compute model
  times n bytes as n / (HBM x bandwidth x n / (n + half)) = (n + half) / (HBM x bandwidth), a line in n, so the
  copy sweep (1 MiB .. 1 GiB) is fitted to t = a + n / B by least squares on relative error (weights 1 / t^2: a
  small copy counts as much as a large one; ``fit_line``); bandwidth = B / datasheet HBM (capped at 1) and
  half = a x B.
* ``dispatch_s``: eager PyTorch's CPU seconds per recorded op of a tiny block's forward + backward on the GPU.
* the error: every GEMM of the sweep timed by ``gemm_s`` with the derived constants, against its measured time,
  (predicted - measured) / measured, summarised as median |error|, lowest and highest (``gemm_error``).

The fabric figures are kept as measured: pinned host -> device and device -> host copies of 256 MiB (GB/s), and
with two or more GPUs the NCCL bus bandwidth of all-reduce, reduce-scatter and all-gather at the largest size
(nccl-tests' busbw: all-reduce 2(n-1)/n x S / t, reduce-scatter and all-gather (n-1)/n x S / t).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..choices import Device, Precision
from ..gpu_presets import GpuPreset
from .compute import conv_peak_precision, peak_precision, preset_for_gpu
from .gpu_model import SM_COUNT, GpuModel

FORMAT = 1  # bump when what is measured or derived changes: older stored calibrations then miss
LARGE_GEMM_DIM = 4096
LARGE_CONV_CHANNELS = 256
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}
GEMM_TILE = (128, 128)  # output tile of the residual rule (NVIDIA, "Matrix Multiplication Background", tiles)

# (m, n, k, element bytes, achieved FLOP/s, achieved bytes/s, SMs) -> seconds of one GEMM
GemmTime = Callable[[int, int, int, int, float, float, int], float]


def gemm_s(m: int, n: int, k: int, elsize: int, flops_per_s: float, bytes_per_s: float, sms: int) -> float:
    """Seconds of an M x N x K GEMM by the rule the calibration's residuals measure (NVIDIA, "Matrix
    Multiplication Background User's Guide": tile and wave quantization, arithmetic intensity): the output in
    ``GEMM_TILE`` tiles, ceil(M / 128) x ceil(N / 128), run in waves of one tile per SM, each wave as long as one
    whole tile's 2 x 128 x 128 x K FLOPs at the GPU's rate shared by its SMs; at least the time to read A and B
    and write C once at ``bytes_per_s``. The compute model's own GEMM rule (``advisor.timing.compute``) may be
    passed to ``from_measurements`` in its place."""
    tm, tn = GEMM_TILE
    waves = math.ceil(math.ceil(m / tm) * math.ceil(n / tn) / sms)
    compute = waves * 2.0 * tm * tn * k / (flops_per_s / sms)
    return max(compute, (m * k + k * n + m * n) * elsize / bytes_per_s)


def fit_line(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """(a, b) of t = a + b x fitted by least squares on relative error (weights 1 / t^2), a >= 0 (refitted
    through the origin when the free fit's intercept is negative).

    Raises:
        ValueError: fewer than two points, or every x the same.
    """
    if len(xs) < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs two points of different size")
    w = [1.0 / t**2 for t in ts]
    sw, sx, sy = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * t for wi, t in zip(w, ts))
    sxx, sxy = sum(wi * x * x for wi, x in zip(w, xs)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    a = (sy - b * sx) / sw
    if a < 0:
        return 0.0, sxy / sxx
    return a, b


@dataclass(frozen=True)
class GpuCalibration:
    """One GPU model's calibration (module docstring): shares of the datasheet peaks per precision, the memory
    and dispatch constants, the measured rates behind them (``rates``: TFLOP/s, GB/s, us, by name), the GEMM
    rule's error over the sweep and the worker's raw document (``measurements``)."""

    gpu: str  # the device's name, as torch.cuda reports it
    preset: str | None  # the advisor preset it maps to (``preset_for_gpu``); None: no datasheet peaks known
    memory_bytes: int
    sm_count: int
    gpu_count: int
    driver: str
    torch: str
    cuda: str
    measured_at: float  # time.time()
    measured_s: float  # wall seconds of the measurement
    gemm: dict[str, float]  # precision -> share of its dense peak
    conv: dict[str, float]
    attention: dict[str, float]
    bandwidth: float
    half_bandwidth_bytes: int
    dispatch_s: float
    rates: dict[str, float]
    gemm_error: dict[str, float]  # median_abs, low, high (relative), points
    measurements: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    @property
    def date(self) -> str:
        """The UTC date it was measured, YYYY-MM-DD."""
        return time.strftime("%Y-%m-%d", time.gmtime(self.measured_at))

    @property
    def source(self) -> str:
        """The time figures' source when a plan uses it: "calibrated on this machine, <date>" and what on."""
        return (
            f"calibrated on this machine, {self.date} ({self.gpu}, driver {self.driver}, torch {self.torch}; "
            f"advisor calibrate, GEMM rule within {100 * self.gemm_error.get('median_abs', 0.0):.0f}% median)"
        )

    def model(self, precision: Precision, preset: GpuPreset) -> GpuModel | None:
        """The ``GpuModel`` of a plan at ``precision`` on ``preset``: the shares of the peaks that precision runs
        at (``peak_precision``; convolutions ``conv_peak_precision``; attention at the matmul's, else the bf16
        share); None when the precision's GEMMs were not measured (bf16 on a GPU without it)."""
        key = peak_precision(precision, preset)
        gemm = self.gemm.get(key)
        if gemm is None:
            return None
        conv = self.conv.get(conv_peak_precision(precision, preset), self.conv.get(key, gemm))
        attention = self.attention.get(key, self.attention.get("bf16", gemm))
        return GpuModel(
            gemm=gemm,
            conv=conv,
            attention=attention,
            bandwidth=self.bandwidth,
            half_bandwidth_bytes=self.half_bandwidth_bytes,
            dispatch_s=self.dispatch_s,
            source=self.source,
        )

    def document(self) -> dict[str, object]:
        """What the cache stores: one JSON object, ``"device": "cuda"`` first, then every field by name."""
        return {"device": Device.CUDA, **{k: getattr(self, k) for k in self.__dataclass_fields__}}


def from_document(doc: object) -> GpuCalibration | None:
    """A stored calibration (``GpuCalibration.document``) read back; None for another shape (an older format)."""
    if not isinstance(doc, dict) or doc.get("device") != Device.CUDA:
        return None
    try:
        cal = GpuCalibration(**{k: doc[k] for k in GpuCalibration.__dataclass_fields__})
    except (KeyError, TypeError):
        return None
    numbers = (cal.bandwidth, cal.dispatch_s, cal.measured_at, *cal.gemm.values(), *cal.rates.values())
    if not all(isinstance(x, (int, float)) for x in numbers) or not isinstance(cal.gpu, str):
        return None
    return cal


def _rows(doc: dict[str, object], key: str) -> list[dict[str, object]]:
    rows = doc.get(key, [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"the GPU calibration's {key!r} is not a list of objects")
    return rows


def _num(row: dict[str, object], key: str) -> float:
    x = row.get(key)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise ValueError(f"the GPU calibration's {key!r} is not a number: {x!r}")
    return float(x)


def _text(doc: dict[str, object], key: str) -> str:
    x = doc.get(key)
    return x if isinstance(x, str) else "unknown"


def _share(rate_tflops: float, preset: GpuPreset | None, precision: str) -> float | None:
    peak = preset.peak_tflops(precision) if preset is not None else None
    return min(1.0, rate_tflops / peak) if peak else None


def from_measurements(doc: dict[str, object], now: float | None = None, predict: GemmTime = gemm_s) -> GpuCalibration:
    """The calibration of the worker's document ``doc`` (module docstring has every derivation); ``predict`` is
    the GEMM rule whose residuals are kept (``gemm_s``). Shares are left out where the preset has no such peak.

    Raises:
        ValueError: the document lacks a figure, or holds no GEMM or copy measurement.
    """
    name, memory = _text(doc, "gpu"), int(_num(doc, "memory_bytes"))
    preset = preset_for_gpu(name, memory)
    sms = int(_num(doc, "sm_count")) or (SM_COUNT.get(preset.name, 1) if preset else 1)
    rates: dict[str, float] = {}
    gemm: dict[str, float] = {}
    gemm_rows = _rows(doc, "gemm")
    for r in gemm_rows:
        m, n, k, p = int(_num(r, "m")), int(_num(r, "n")), int(_num(r, "k")), str(r.get("precision"))
        if min(m, n, k) >= LARGE_GEMM_DIM:
            tflops = 2.0 * m * n * k / _num(r, "seconds") / 1e12
            rates[f"gemm_{p}_tflops"] = max(rates.get(f"gemm_{p}_tflops", 0.0), tflops)
    for key, rate in list(rates.items()):
        p = key.split("_")[1]
        if (s := _share(rate, preset, p)) is not None:
            gemm[p] = s
    conv: dict[str, float] = {}
    for r in _rows(doc, "conv"):
        if _num(r, "c_in") >= LARGE_CONV_CHANNELS:
            p = str(r.get("precision"))
            tflops = _num(r, "flops") / _num(r, "seconds") / 1e12
            rates[f"conv_{p}_tflops"] = max(rates.get(f"conv_{p}_tflops", 0.0), tflops)
            if (s := _share(rates[f"conv_{p}_tflops"], preset, p)) is not None:
                conv[p] = s
    attention: dict[str, float] = {}
    for r in _rows(doc, "attention"):
        p, causal, d = str(r.get("precision")), bool(r.get("causal")), int(_num(r, "head_dim"))
        label = f"attention_{p}" + ("_causal" if causal else "") + ("" if d == 128 else f"_d{d}") + "_tflops"
        rates[label] = max(rates.get(label, 0.0), _num(r, "flops") / _num(r, "seconds") / 1e12)
        if not causal and d == 128 and (s := _share(rates[label], preset, p)) is not None:
            attention[p] = s
    copies = _rows(doc, "copy")
    moved = [2.0 * _num(r, "bytes") for r in copies]
    seconds = [_num(r, "seconds") for r in copies]
    a, b = fit_line(moved, seconds)
    fitted = 1.0 / b
    rates["copy_gbps"] = max(x / t for x, t in zip(moved, seconds)) / 1e9
    rates["copy_fit_gbps"] = fitted / 1e9
    bandwidth = min(1.0, fitted / (preset.hbm_gbps * 1e9)) if preset is not None and preset.hbm_gbps else 1.0
    rates["tiny_op_us"], rates["eager_op_us"] = 1e6 * _num(doc, "tiny_op_s"), 1e6 * _num(doc, "eager_op_s")
    rates["h2d_gbps"], rates["d2h_gbps"] = _num(doc, "h2d_gbps"), _num(doc, "d2h_gbps")
    rates.update(busbw(doc.get("collectives")))
    hbm = preset.hbm_gbps * 1e9 * bandwidth if preset is not None and preset.hbm_gbps else fitted
    errors = []
    for r in gemm_rows:
        p = str(r.get("precision"))
        if p not in gemm or preset is None:
            continue
        peak = preset.peak_tflops(p) or 0.0
        m, n, k = int(_num(r, "m")), int(_num(r, "n")), int(_num(r, "k"))
        t = predict(m, n, k, ELEMENT_BYTES.get(p, 4), peak * 1e12 * gemm[p], hbm, sms)
        errors.append((t - _num(r, "seconds")) / _num(r, "seconds"))
    return GpuCalibration(
        gpu=name,
        preset=preset.name if preset is not None else None,
        memory_bytes=memory,
        sm_count=sms,
        gpu_count=int(_num(doc, "gpu_count")),
        driver=_text(doc, "driver"),
        torch=_text(doc, "torch"),
        cuda=_text(doc, "cuda"),
        measured_at=time.time() if now is None else now,
        measured_s=_num(doc, "seconds"),
        gemm=gemm,
        conv=conv,
        attention=attention,
        bandwidth=bandwidth,
        half_bandwidth_bytes=round(a * fitted),
        dispatch_s=_num(doc, "eager_op_s"),
        rates=rates,
        gemm_error=summary(errors),
        measurements=doc,
    )


def summary(errors: Sequence[float]) -> dict[str, float]:
    """Relative errors as {median_abs, low, high, points} (all 0 for none)."""
    if not errors:
        return {"median_abs": 0.0, "low": 0.0, "high": 0.0, "points": 0.0}
    return {
        "median_abs": statistics.median(abs(e) for e in errors),
        "low": min(errors),
        "high": max(errors),
        "points": float(len(errors)),
    }


def busbw(collectives: object) -> dict[str, float]:
    """Bus bandwidths (GB/s) at the largest size measured, and the latency (us) of the smallest all-reduce, from
    the collectives worker's document ``{"world": n, name: [[bytes, seconds], ...]}`` (nccl-tests' busbw:
    all-reduce 2(n-1)/n x S / t, reduce-scatter and all-gather (n-1)/n x S / t); empty without one."""
    if not isinstance(collectives, dict) or not isinstance(world := collectives.get("world"), int) or world < 2:
        return {}
    out: dict[str, float] = {}
    for name, factor in (("all_reduce", 2 * (world - 1) / world), ("reduce_scatter", (world - 1) / world)):
        out.update(_busbw_of(collectives.get(name), name, factor))
    out.update(_busbw_of(collectives.get("all_gather"), "all_gather", (world - 1) / world))
    points = collectives.get("all_reduce")
    if isinstance(points, list) and points and isinstance(points[0], list) and len(points[0]) == 2:
        out["nccl_latency_us"] = 1e6 * float(points[0][1])
    return out


def _busbw_of(points: object, name: str, factor: float) -> dict[str, float]:
    if not isinstance(points, list) or not points:
        return {}
    size, seconds = max((float(p[0]), float(p[1])) for p in points if isinstance(p, list) and len(p) == 2)
    return {f"{name}_busbw_gbps": factor * size / seconds / 1e9}
