"""bench/PUBLISHED.md: the table ``python -m bench.published`` writes (bench/published.py)."""

from __future__ import annotations

from collections.abc import Mapping

from .published_case import THROUGHPUT_UNITS
from .published_cases import SOURCES
from .published_other import NOT_EXPRESSED
from .published_results import TARGETS, Results, RowResult, stats


def _pct(x: object) -> str:
    return f"{100 * float(str(x)):+.1f}%" if x is not None else ""


def _abs(x: object) -> str:
    return f"{100 * float(str(x)):.1f}%"


def _figure(value: float, unit: str) -> str:
    if unit in THROUGHPUT_UNITS:
        return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"
    return f"{value:,.3f}" if value < 100 else f"{value:,.0f}"


def _summary_line(label: str, s: Mapping[str, float]) -> str:
    if not s["n"]:
        return f"| {label} | 0 | | | |"
    return f"| {label} | {s['n']:.0f} | {_abs(s['median'])} | {_abs(s['worst'])} | {_pct(s['bias'])} |"


def _table(rows: list[RowResult]) -> list[str]:
    lines = [
        "| row | source | GPUs | strategy | unit | published | predicted | error | LOSO error | step: compute + "
        "exposed comm + optimizer (s) |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        c, t = r.case, r.step
        mark = "" if c.fitted else " (shown)"
        lines.append(
            f"| {c.row}{mark} | {c.source} | {c.gpus} x {c.gpu} | {c.strategy} | {c.unit} | "
            f"{_figure(c.published, c.unit)} | {_figure(r.predicted, c.unit)} | {_pct(r.error)} | "
            f"{_pct(r.loso_error)} | {t.compute_s:.3g} + {t.exposed_comm_s:.3g} + {t.optimizer_s:.3g} |"
        )
    return lines


def render(results: Results, times: Mapping[str, Mapping[str, object]], full: bool) -> str:
    """The markdown of ``results`` (``bench.published.evaluate``) with the recorded cold and warm wall times."""
    rows = results.rows
    ins, loso = stats(rows, "error"), stats(rows, "loso_error")
    refit = stats(rows, "refit_error") if results.fits else None
    timing = "; ".join(
        f"{mode} {float(str(t['wall_s'])):.0f} s ({t['date']}, {t['rows']} rows)"
        for mode, t in sorted(times.items())
        if isinstance(t, Mapping)
    )
    lines = [
        "# Step time against published GPU training runs",
        "",
        "Regenerate: `.venv/bin/python -m bench.published` (no training; `--fit` also refits the compute model's "
        "constants, `advisor/timing/gpu_model.py` `GpuModel`, and prints them to paste; `--cold` runs in an empty "
        "trace cache). Rows, inputs and sources: `bench/published_cases.py`, `bench/published_other.py`; the "
        "published figures: `../shared/anchors/published_runs.md` (row ids as there).",
        "",
        f"Wall time of the whole command: {timing or 'not recorded'} (cold: an empty trace cache, every model "
        f"traced; warm: the cache holds them). This run: {results.wall_s:.0f} s, of which planning "
        f"{results.planned_s:.0f} s and cross-validation / fit {results.fit_s:.0f} s"
        + ("" if full else " (a subset of the rows)")
        + ".",
        "",
        "Errors are of throughput: predicted / published - 1 (for a published time: published / predicted - 1); "
        "MFU is never compared (the sources' FLOP conventions differ). A prediction is the planned strategy's step "
        "(compute + exposed communication + optimizer; data loading not modelled) at the published micro-batch "
        "and accumulation steps. *LOSO error*: the same row predicted by constants fitted without its source. "
        "Rows marked *(shown)* are wall times of whole epochs or commands (start-up, warm-up, evaluation): "
        "reported, not fitted, not in the summaries.",
        "",
        f"Targets over the fitted rows: in-sample median |error| <= {_abs(TARGETS['in_median'])}, worst <= "
        f"{_abs(TARGETS['in_worst'])}; leave-one-source-out median <= {_abs(TARGETS['loso_median'])}, worst <= "
        f"{_abs(TARGETS['loso_worst'])}; ResNet-50 within {_abs(TARGETS['resnet'])}; per source |bias| <= "
        f"{_abs(TARGETS['bias'])}.",
        "",
        "## Summary",
        "",
        "| rows | n | median abs error | worst abs error | bias (geometric mean) |",
        "|---|---:|---:|---:|---:|",
        _summary_line("in-sample (MODELS: the fitted constants)", ins.all),
        _summary_line("leave-one-source-out", loso.all),
    ]
    if refit is not None:
        lines.append(_summary_line("in-sample after --fit", refit.all))
    lines.append(_summary_line("ResNet-50 (in-sample)", ins.resnet))
    lines += ["", "Per source (in-sample | leave-one-source-out):", ""]
    lines += [
        "| source | n | median | worst | bias | LOSO median | LOSO worst | LOSO bias |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    per_in, per_lo = ins.per_source, loso.per_source
    for src, s in per_in.items():
        lo = per_lo[src]
        if not s["n"]:
            lines.append(f"| {src} | 0 (shown only) | | | | | | |")
            continue
        lines.append(
            f"| {src} | {s['n']:.0f} | {_abs(s['median'])} | {_abs(s['worst'])} | {_pct(s['bias'])} | "
            f"{_abs(lo['median'])} | {_abs(lo['worst'])} | {_pct(lo['bias'])} |"
        )
    lines += _bands(loso.bands)
    lines += _constants(results)
    lines += ["", "## Rows", ""] + _table(rows)
    lines += _ratio(rows)
    lines += ["", "## How each source is compared", ""]
    seen: set[tuple[str, str]] = set()
    for r in rows:
        key = (r.case.source, r.case.compare + r.case.note)
        if key not in seen:
            seen.add(key)
            ids = [x.case.row for x in rows if (x.case.source, x.case.compare + x.case.note) == key]
            lines.append(f"* {', '.join(ids)}: {r.case.compare}. {r.case.note}".rstrip())
    lines += ["", "## Sources", ""] + [f"* {k}: {v}" for k, v in SOURCES.items()]
    lines += ["", "## Not expressed", ""] + [f"* {rid}: {why}" for rid, why in NOT_EXPRESSED]
    if results.failed:
        lines += ["", "## Rows that failed to plan", ""] + [f"* {k}: {v}" for k, v in results.failed.items()]
    return "\n".join(lines) + "\n"


def _bands(bands: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = [
        "",
        "## Error band (leave-one-source-out residuals)",
        "",
        "Per GPU generation and workload: the narrowest interval holding at least 80% of the held-out rows' "
        "residuals (truth time / predicted time - 1), widened to include 0. A time figure t means the truth is "
        "in [t (1 + low), t (1 + high)].",
        "",
        "| generation / workload | rows | low | high | rows covered |",
        "|---|---:|---:|---:|---:|",
    ]
    for k, b in bands.items():
        lines.append(f"| {k} | {b['rows']:.0f} | {_pct(b['low'])} | {_pct(b['high'])} | {b['covered']:.0f} |")
    return lines


def _constants(results: Results) -> list[str]:
    from advisor.timing.gpu_model import MODELS

    head = (
        "Predictions use the compute model's constants (`advisor/timing/gpu_model.py` `MODELS`, the fit below, "
        "pasted); fits and leave-one-source-out fits start from the microbenchmarked ones (`INITIAL`):"
    )
    lines = ["", "## Constants", "", head, ""]
    for g, m in MODELS.items():
        lines.append(
            f"* {g}: gemm {m.gemm:.3f}, conv {m.conv:.3f}, attention {m.attention:.3f}, bandwidth {m.bandwidth:.3f}, "
            f"half_bandwidth_bytes {m.half_bandwidth_bytes:,}, dispatch_s {m.dispatch_s:.2e} ({m.source})"
        )
    if results.fits:
        lines += ["", "`--fit` (pattern search in the logs of the constants, bench/published_fit.py):", ""]
        for g, f in results.fits.items():
            m = f.model
            state = (
                f"gemm {m.gemm:.3f}, conv {m.conv:.3f}, attention {m.attention:.3f}, bandwidth {m.bandwidth:.3f}, "
                f"half_bandwidth_bytes {m.half_bandwidth_bytes:,}, dispatch_s {m.dispatch_s:.2e}; rms log error "
                f"{f.rms_log_error:.3f} over {f.rows} rows, {f.evaluations} loss evaluations"
                if f.responsive
                else f"predictions do not depend on the constants (the compute model does not read "
                f"hardware.gpu_model): nothing fitted; rms log error {f.rms_log_error:.3f} over {f.rows} rows"
            )
            lines.append(f"* {g}: {state}")
    return lines


def _ratio(rows: list[RowResult]) -> list[str]:
    by = {r.case.row: r for r in rows}
    if "dp-vs-ddp-nvlink" not in by or "dp-vs-ddp-pcie" not in by:
        return []
    nv, pc = by["dp-vs-ddp-nvlink"], by["dp-vs-ddp-pcie"]
    pub, pred = pc.case.published / nv.case.published, pc.predicted / nv.predicted
    return [
        "",
        f"DP-vs-DDP, PCIe (P2P disabled) over NVLink: published {pub:.3f}, predicted {pred:.3f} "
        f"({100 * (pred / pub - 1):+.1f}%).",
    ]
