"""The fit of the GPU compute model's constants (``advisor.timing.gpu_model.GpuModel``) to published throughputs,
leave-one-source-out cross-validation, and the residual band that an error band on a time figure uses.

The fit works on ``Target`` rows: a published throughput and a function that predicts it from a ``GpuModel``
(bench/published.py re-evaluates a planned strategy's ``step_time`` with ``hardware.gpu_model`` replaced: no
re-planning, no re-tracing). Per GPU generation it minimises the mean squared log throughput error by a pattern search
in the logs of the constants (``fit_group``). The shares (gemm, conv, attention,
bandwidth) stay at most 1 of their datasheet value; the size and dispatch constants stay inside ``BOUNDS``. The
attention share stays at its microbenchmark where the generation has one (``HELD``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from advisor.timing.gpu_model import BORROWED, GpuModel

FIELDS = ("gemm", "conv", "attention", "bandwidth", "half_bandwidth_bytes", "dispatch_s")
# Bounds of each constant, the range its sources allow (a fit outside them would compensate for something the model
# lacks, as the old bandwidth efficiency of 1.52 did): large cuBLAS GEMMs reach 70-90% of the dense peak
# (ml-engineering's 'Maximum Achievable Matmul FLOPS' table: A100 SXM 85.9%, H100 SXM 80.1%), so at least half;
# convolutions at least 0.3 of it (cuDNN's implicit GEMM is slower at small channel counts); FlashAttention-2
# reaches 35-73% of peak (Dao 2023: 335 of 989 TFLOP/s on H100, 73% forward on A100), so 0.25-1; element-wise
# kernels 60-93% of HBM bandwidth (about 90% is the most any kernel reaches: NVIDIA developer forum 'Trouble to
# reach peak bandwidth of A100', 2025); a half-bandwidth size between 256 KiB and 64 MiB (a kernel's fixed 2-3 us
# at 1-5 TB/s); a per-op issue cost of 5-25 us (eager PyTorch, advisor.timing.gpu_model DISPATCH_S's sources).
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm": (0.5, 1.0),
    "conv": (0.3, 1.0),
    "attention": (0.25, 1.0),
    "bandwidth": (0.6, 0.93),
    "half_bandwidth_bytes": (2.0**18, 2.0**26),
    "dispatch_s": (5e-6, 25e-6),
}
# Constants held at the generation's microbenchmark (advisor.timing.gpu_model INITIAL) where it has one, fitted only
# where it is borrowed (Volta, which FlashAttention-2 does not run on): the attention share is FlashAttention-2's
# measured rate (Dao 2023: A100 forward 73% / backward 63% of peak, H100 335 TFLOP/s). Only rows that run a flash
# kernel read it (math attention, the Megatron-LM 2020/2021 rows' baddbmm + softmax + bmm, is timed by the GEMM and
# bandwidth rules), and on Ampere and Hopper nearly all of those are one source's (llm-foundry's): fitted, the share
# a leave-one-source-out fold without it learns comes from the few other flash rows (Lambda's BERT, nanoGPT) and
# absorbs what the model misses there (Ampere's went 0.72 -> 0.27 without llm-foundry, its rows then 18% too slow).
HELD = ("attention",)
# A group with fewer rows than this fits only its GEMM share (six constants on a handful of rows would fit noise);
# the other constants keep their microbenchmarked (or borrowed) values.
MIN_ROWS_ALL_FIELDS = 10
TOLERANCE = 1.003  # the search stops when its step is a factor this close to 1
MAX_EVALUATIONS = 3000  # loss evaluations per fit at most
COVER = 0.8  # the share of held-out rows an error band covers


@dataclass(frozen=True)
class Target:
    """One fitted row: ``published`` throughput, ``predict`` the same figure from a ``GpuModel``, its GPU
    ``group`` (generation) and ``source`` (the unit left out in cross-validation)."""

    key: str
    group: str
    source: str
    published: float
    predict: Callable[[GpuModel], float]


@dataclass(frozen=True)
class Fit:
    """A group's fitted constants, the root mean squared log error over its rows, the loss evaluations the
    search spent and whether the predictions depend on the constants at all (False: nothing to fit)."""

    model: GpuModel
    rms_log_error: float
    evaluations: int
    responsive: bool
    rows: int


def _loss(targets: Sequence[Target], model: GpuModel) -> float:
    """Mean squared log(predicted / published) over ``targets``; inf when a prediction is not positive."""
    total = 0.0
    for t in targets:
        p = t.predict(model)
        if not p > 0 or math.isinf(p):
            return math.inf
        total += math.log(p / t.published) ** 2
    return total / len(targets)


def _model(start: GpuModel, point: Sequence[float]) -> GpuModel:
    """A ``GpuModel`` with ``FIELDS`` from ``point`` (their natural logs, clipped to ``BOUNDS``) and ``start``'s
    source."""
    v = [min(BOUNDS[n][1], max(BOUNDS[n][0], math.exp(u))) for n, u in zip(FIELDS, point)]
    return GpuModel(v[0], v[1], v[2], v[3], int(round(v[4])), v[5], start.source)


def _point(model: GpuModel) -> list[float]:
    return [math.log(float(getattr(model, name))) for name in FIELDS]


def _clip(point: Sequence[float]) -> list[float]:
    return [min(math.log(BOUNDS[n][1]), max(math.log(BOUNDS[n][0]), u)) for n, u in zip(FIELDS, point)]


def fit_group(targets: Sequence[Target], start: GpuModel, fields: Sequence[str] | None = None) -> Fit:
    """The constants minimising the mean squared log error over ``targets`` from ``start`` (module docstring):
    Hooke and Jeeves' pattern search (J. ACM 8, 1961) in the logs of the constants. Exploratory moves change one
    constant at a time by the factor ``exp(h)`` either way and keep what lowers the loss; after a successful
    exploration the whole move is repeated (the pattern move); when nothing improves, ``h`` halves, from a factor
    of 2 down to ``TOLERANCE``. Only ``fields`` move (None: ``default_fields``).

    Raises:
        ValueError: no targets.
    """
    if not targets:
        raise ValueError("no rows to fit")
    evaluations = 0

    def loss(point: Sequence[float]) -> float:
        nonlocal evaluations
        evaluations += 1
        return _loss(targets, _model(start, point))

    base = _clip(_point(start))
    f_base = loss(base)
    reference = [t.predict(start) for t in targets]
    responsive = any(abs(t.predict(far) - r) > 1e-9 * abs(r) for far in _far(start) for t, r in zip(targets, reference))
    if not responsive:
        return Fit(start, math.sqrt(f_base), evaluations, False, len(targets))
    if fields is None:
        fields = default_fields(start, len(targets))
    movable = [FIELDS.index(f) for f in fields]

    def explore(point: list[float], f_point: float, h: float) -> tuple[list[float], float]:
        for i in movable:
            for step in (h, -h):
                trial = _clip([u + (step if j == i else 0.0) for j, u in enumerate(point)])
                if trial == point:
                    continue
                f_trial = loss(trial)
                if f_trial < f_point - 1e-15:
                    point, f_point = trial, f_trial
                    break
        return point, f_point

    h = math.log(2.0)
    while h > math.log(TOLERANCE) and evaluations < MAX_EVALUATIONS:
        new, f_new = explore(base, f_base, h)
        if f_new >= f_base:
            h /= 2
            continue
        while f_new < f_base and evaluations < MAX_EVALUATIONS:  # pattern moves while they pay
            pattern = _clip([2 * n - b for n, b in zip(new, base)])
            base, f_base = new, f_new
            new, f_new = explore(pattern, loss(pattern), h)
    return Fit(replace(_model(start, base), source=start.source), math.sqrt(f_base), evaluations, True, len(targets))


def default_fields(start: GpuModel, rows: int) -> tuple[str, ...]:
    """The constants a fit of ``rows`` rows from ``start`` moves: the GEMM share alone under ``MIN_ROWS_ALL_FIELDS``
    rows; else every one of ``FIELDS`` but ``HELD`` where ``start`` is a microbenchmark (its source does not start
    with ``advisor.timing.gpu_model.BORROWED``), all of them where it is borrowed."""
    if rows < MIN_ROWS_ALL_FIELDS:
        return ("gemm",)
    if start.source.startswith(BORROWED):
        return FIELDS
    return tuple(f for f in FIELDS if f not in HELD)


def _far(model: GpuModel) -> list[GpuModel]:
    """``model`` with each constant in turn moved far (half its share, 8x its sizes): the responsiveness probe."""
    point = _point(model)
    return [
        _model(model, [u + (math.log(0.5 if k < 4 else 8.0) if k == i else 0.0) for k, u in enumerate(point)])
        for i in range(len(FIELDS))
    ]


def fit_all(targets: Sequence[Target], starts: Mapping[str, GpuModel]) -> dict[str, Fit]:
    """``fit_group`` for every group that has targets, from its constants in ``starts``."""
    return {
        g: fit_group([t for t in targets if t.group == g], starts[g])
        for g in sorted({t.group for t in targets})
        if g in starts
    }


def leave_one_source_out(
    targets: Sequence[Target], starts: Mapping[str, GpuModel], shown: Sequence[Target] = ()
) -> dict[str, float]:
    """Each target's throughput predicted by constants fitted without its source: per source, every group that
    has rows of it is refitted on the other sources' rows of that group (a group with no other rows keeps its
    ``starts`` constants: nothing was fitted to predict it). ``shown`` rows are predicted the same way and never
    fitted (figures that are not steady-state throughputs)."""
    held: dict[str, float] = {}
    everything = [*targets, *shown]
    fits: dict[tuple[str, str], GpuModel] = {}
    for t in everything:
        if (t.source, t.group) not in fits:
            rest = [r for r in targets if r.group == t.group and r.source != t.source]
            fits[t.source, t.group] = fit_group(rest, starts[t.group]).model if rest else starts[t.group]
        held[t.key] = t.predict(fits[t.source, t.group])
    return held


def band(ratios: Sequence[float], cover: float = COVER) -> tuple[float, float, int]:
    """(low, high, rows covered): the narrowest relative interval [low, high] around 0 that holds at least
    ``cover`` of the rows' ``predicted / published - 1`` throughput residuals (= truth time / predicted time - 1:
    a time figure t means truth in [t (1 + low), t (1 + high)]), widened to include 0.

    Raises:
        ValueError: no residuals.
    """
    if not ratios:
        raise ValueError("no residuals")
    r = sorted(ratios)
    need = max(1, math.ceil(cover * len(r)))
    lo, hi = min(((r[i], r[i + need - 1]) for i in range(len(r) - need + 1)), key=lambda p: p[1] - p[0])
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    return lo, hi, sum(1 for x in r if lo <= x <= hi)


def summary(errors: Sequence[float]) -> dict[str, float]:
    """median |error|, worst |error| and bias (the geometric mean of predicted / published, minus 1) of signed
    relative errors."""
    if not errors:
        return {"n": 0, "median": math.nan, "worst": math.nan, "bias": math.nan}
    logs = [math.log1p(e) for e in errors]
    return {
        "n": len(errors),
        "median": statistics.median(abs(e) for e in errors),
        "worst": max(abs(e) for e in errors),
        "bias": math.expm1(sum(logs) / len(logs)),
    }


def paste(fits: Mapping[str, Fit]) -> str:
    """The fitted constants as Python to paste into advisor/timing/gpu_model.py (a ``MODELS`` table)."""
    lines = ["MODELS: dict[str, GpuModel] = {"]
    for g, f in fits.items():
        m = f.model
        if not f.responsive:
            lines.append(f"    # {g}: the predictions do not depend on GpuModel (nothing read it): not fitted")
            continue
        lines.append(
            f'    "{g}": GpuModel(gemm={m.gemm:.3f}, conv={m.conv:.3f}, attention={m.attention:.3f}, '
            f"bandwidth={m.bandwidth:.3f}, half_bandwidth_bytes={m.half_bandwidth_bytes}, "
            f'dispatch_s={m.dispatch_s:.2e}, source="fitted in bench/PUBLISHED.md to {f.rows} published runs, '
            f'rms log error {f.rms_log_error:.3f}"),'
        )
    return "\n".join(lines + ["}"])


def paste_bands(bands: Mapping[str, Mapping[str, float]]) -> str:
    """The leave-one-source-out residual bands as Python for the error band on time figures: (generation,
    workload) -> (low, high, what it is based on), truth time in [t (1 + low), t (1 + high)]."""
    lines = ["TIME_ERROR_BAND: dict[tuple[str, str], tuple[float, float, str]] = {"]
    for key, b in bands.items():
        g, w = key.split("/")
        lines.append(
            f'    ("{g}", "{w}"): ({b["low"]:.3f}, {b["high"]:.3f}, "leave-one-source-out residuals of '
            f'{b["rows"]:.0f} published runs, {b["covered"]:.0f} inside (bench/PUBLISHED.md)"),'
        )
    return "\n".join(lines + ["}"])
