"""The results of ``python -m bench.published`` (bench/published.py): each row's prediction and errors, the
run's fits and times, and their summaries; bench/published_report.py renders them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from advisor.timing.gpu_model import GpuModel
from advisor.timing.step import StepTime

from .published_case import CNN, Case
from .published_fit import Fit, band, summary

# The targets over the fitted rows: in-sample median |error| <= 10%, worst <= 25%; leave-one-source-out
# median <= 15%, worst <= 35%; ResNet-50 within 25%; no source's bias above 10%.
TARGETS = {"in_median": 0.10, "in_worst": 0.25, "loso_median": 0.15, "loso_worst": 0.35, "resnet": 0.25, "bias": 0.10}


@dataclass(frozen=True)
class RowResult:
    """One row's prediction: the figure in the case's unit, its signed throughput errors (with today's constants,
    with constants fitted without the row's source, with the refit constants under ``--fit``) and the step."""

    case: Case
    generation: str
    predicted: float
    error: float
    loso_error: float
    refit_error: float | None
    step: StepTime


@dataclass
class Results:
    """What ``evaluate`` found: the rows, the rows that failed to plan (id -> reason), the fits (``--fit``), the
    constants predictions used, and the wall times (planning, fitting and cross-validation, all)."""

    rows: list[RowResult]
    failed: dict[str, str]
    fits: dict[str, Fit]
    starts: dict[str, GpuModel]
    planned_s: float
    fit_s: float
    wall_s: float = 0.0


@dataclass(frozen=True)
class Stats:
    """Summaries (``bench.published_fit.summary``: n, median, worst, bias) of the fitted rows' errors: ``all``,
    ``per_source``, the ResNet-50 rows (``resnet``); and the leave-one-source-out residual band per generation and
    workload (``bands``: low, high, covered, rows; ``bench.published_fit.band``)."""

    all: dict[str, float]
    per_source: dict[str, dict[str, float]]
    resnet: dict[str, float]
    bands: dict[str, dict[str, float]]


def stats(rows: Sequence[RowResult], which: str = "error") -> Stats:
    """``Stats`` of ``rows``' ``which`` errors ("error", "loso_error" or "refit_error")."""
    fitted = [r for r in rows if r.case.fitted]

    def errs(rs: Sequence[RowResult], attr: str = which) -> list[float]:
        return [float(e) for e in (getattr(r, attr) for r in rs) if e is not None]

    sources = sorted({r.case.source for r in rows})
    bands: dict[str, dict[str, float]] = {}
    for g, w in sorted({(r.generation, r.case.workload) for r in fitted}):
        res = errs([r for r in fitted if r.generation == g and r.case.workload == w], "loso_error")
        lo, hi, covered = band(res)
        bands[f"{g}/{w}"] = {"low": lo, "high": hi, "covered": covered, "rows": len(res)}
    return Stats(
        summary(errs(fitted)),
        {s: summary(errs([r for r in fitted if r.case.source == s])) for s in sources},
        summary(errs([r for r in rows if r.case.workload == CNN])),
        bands,
    )
