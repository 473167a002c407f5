"""bench/GPU.md from a GPU truth run's folder (``python -m bench.gpu render --results DIR``): per case the estimate
beside the measured allocated peak, reserved peak and step time, with the errors, and the machine the run read
(``machine.json``: GPU, driver, torch, date)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .gpu_run import MACHINE, RESULTS, CaseResult

GPU_MD = Path(__file__).resolve().parent / "GPU.md"


def read_results(results_dir: Path) -> tuple[dict[str, object], list[CaseResult]]:
    """(``machine.json``, the results in run order) from a run's folder. A line cut short by a stopped run is left
    out.

    Raises:
        FileNotFoundError: no ``results.jsonl`` in ``results_dir``.
    """
    machine_path = results_dir / MACHINE
    machine = json.loads(machine_path.read_text()) if machine_path.exists() else {}
    results: list[CaseResult] = []
    for line in (results_dir / RESULTS).read_text().splitlines():
        try:
            results.append(json.loads(line))
        except ValueError:
            continue
    return machine, results


def _gib(n: object) -> str:
    return f"{n / 2**30:.2f}" if isinstance(n, (int, float)) else "-"


def _ms(s: object) -> str:
    return f"{1e3 * s:.1f}" if isinstance(s, (int, float)) else "-"


def _pct(e: object) -> str:
    return f"{100 * e:+.1f}%" if isinstance(e, (int, float)) else "-"


def _summary(results: list[CaseResult], key: str) -> str:
    """ "median |error| X%, worst Y% (n cases)" over the measured cases with that error."""
    errors = [abs(float(e)) for r in results if isinstance(e := r.get(key), (int, float))]
    if not errors:
        return "no measured case"
    worst = max(errors)
    n = len(errors)
    return f"median |error| {100 * statistics.median(errors):.1f}%, worst {100 * worst:.1f}% ({n} case{'s' * (n != 1)})"


def render(machine: dict[str, object], results: list[CaseResult]) -> str:
    """The Markdown page: the machine, a summary per figure, one row per case (measured or failed) and the skipped
    cases with why."""
    packages = machine.get("packages")
    found = "not recorded"
    if isinstance(packages, dict):
        found = ", ".join(f"{k} {v}" for k, v in packages.items() if v) or "none"
        absent = [str(k) for k, v in packages.items() if not v]
        found += f"; not installed: {', '.join(absent)}" if absent else ""
    calibrate = machine.get("calibrate")
    lines = [
        "# GPU truth run: estimates vs one GPU",
        "",
        "Written by `python -m bench.gpu render --results DIR` from the folder `python -m bench.gpu run` wrote on the",
        'GPU machine (bench/README.md, "GPU truth run"). Estimates were planned on the CPU machine for the preset',
        "named in each case (`python -m bench.gpu prepare`); measured figures are the probe's, as `--verify` takes",
        "them: `torch.cuda.max_memory_allocated` / `max_memory_reserved` over every step, and the median step after",
        "the warm-up steps. Errors are (estimate - measured) / measured.",
        "",
        f"- GPU: {machine.get('gpu', 'not recorded')} ({_gib(machine.get('gpu_memory_bytes'))} GiB, "
        f"{machine.get('sm_count', '-')} SMs), driver {machine.get('driver') or 'not recorded'}",
        f"- torch {machine.get('torch', '-')} (CUDA {machine.get('cuda', '-')}), Python {machine.get('python', '-')}; "
        f"packages: {found}",
        f"- date: {machine.get('date', 'not recorded')}",
        f"- `advisor calibrate`: {json.dumps(calibrate) if calibrate is not None else 'not asked for'}",
        f"- allocated peak: {_summary(results, 'allocated_error')}",
        f"- reserved peak: {_summary(results, 'reserved_error')}",
        f"- step time: {_summary(results, 'step_error')}",
        "",
        "| case | est. allocated GiB | measured | error | est. reserved GiB | measured | error | est. step ms | "
        "measured | error | wall s | budget s | status |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    skipped = []
    for r in results:
        if r["status"] == "skipped":
            skipped.append(f"- {r['case_id']}: {r['error']}")
            continue
        est, m = r["estimate"], r["measured"]
        status = "ok" if r["status"] == "ok" else f"FAILED: {r['error']}"
        if r.get("notes"):
            status += " (" + "; ".join(r["notes"]) + ")"
        cells = [
            r["case_id"],
            _gib(est.get("peak_allocated_bytes")),
            _gib(m["peak_allocated_bytes"] if m else None),
            _pct(r["allocated_error"]),
            _gib(est.get("peak_reserved_bytes")),
            _gib(m["peak_reserved_bytes"] if m else None),
            _pct(r["reserved_error"]),
            _ms(est.get("step_s")),
            _ms(m["step_s"] if m else None),
            _pct(r["step_error"]),
            f"{r['wall_s']:.0f}",
            f"{r['budget_s']:.0f}" if isinstance(r.get("budget_s"), (int, float)) else "-",
            status.replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if skipped:
        lines += ["", "Skipped:", "", *skipped]
    return "\n".join(lines) + "\n"


def write(results_dir: Path, out: Path = GPU_MD) -> Path:
    """Render ``results_dir`` into ``out`` (bench/GPU.md); returns the path.

    Raises:
        FileNotFoundError: no ``results.jsonl`` in ``results_dir``.
    """
    machine, results = read_results(results_dir)
    out.write_text(render(machine, results))
    return out
