"""Render a benchmark run (the results.json document) as RESULTS.md and estimate_vs_measured.png."""

from __future__ import annotations

import json
from pathlib import Path

MiB = 2**20
GiB = 2**30
_COLUMNS = (
    ("ours", "advisor (ours)"),
    ("deepspeed", "DeepSpeed estimator"),
    ("accelerate", "accelerate estimate-memory"),
    ("rule", "16 B/param x 1.2"),
)


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / MiB:,.1f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _case_label(r: dict) -> str:
    shape = f"seq {r['seq_len']}" if r.get("seq_len") else f"{r['image_size']} px"
    ac = ", AC" if r["checkpointing"] else f", selective AC ({r['selective']})" if r.get("selective") else ""
    ac += f", chunked CE ({r['ce_chunks']})" if r.get("ce_chunks") else ""
    ac += ", optimizer in backward" if r.get("in_backward") else ""
    lora = ""
    if r.get("lora_rank"):  # issue 16: the adapters, and QLoRA's quantized base
        quant = f"{r['quantize']}{'+dq' if r.get('double_quant') else ''} " if r.get("quantize") else ""
        lora = f", {'QLoRA ' + quant if quant else 'LoRA '}r{r['lora_rank']} {r.get('lora_targets') or 'default'}"
    return f"{r['model']} ({shape}) b{r['micro_batch']} {r['precision']} {r['optimizer']}{ac}{lora}"


def header(data: dict) -> list[str]:
    m = data["machine"]
    bf16 = "native bf16" if m["native_bf16"] else "no native bf16 (bf16 emulated)"
    return [
        "# advisor benchmark: estimated vs measured per-rank peak memory",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / GiB:.1f} GiB RAM, {bf16}. "
        f"Date: {m['date']}. Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, "
        f"deepspeed {m['deepspeed']}.",
        "",
        "Regenerate: `.venv/bin/python -m bench.run` ("
        + (
            f"{len(data['cases'])} cases, {len({c for m in data['merges'] for c in m['cases']})} of them from later "
            "runs merged in (listed below the table); the full run's figures: "
            if data.get("merges")
            else f"this run: {len(data['cases'])} cases, "
        )
        + "wall time "
        f"{data['suite_wall_s'] / 60:.1f} min, {data.get('suite_cpu_s', 0) / 60:.1f} CPU-min in the runs, "
        "1-minute load "
        f"average {' -> '.join(str(x) for x in data.get('load_avg_1min', []))} at start -> end; "
        "`--smoke` runs 3 small cases).",
        "",
        "Each case renders advisor's training script for the strategy and runs it on CPU ranks "
        "(gloo; ZeRO via DeepSpeed with `DS_ACCELERATOR=cpu`) through `advisor.verify.verify`; "
        "*measured* is the largest per-rank peak allocated (profiler allocator events, from before the "
        "model is built). Errors are signed, (estimate - measured) / measured. DeepSpeed's estimators "
        "(ZeRO-2/3 rows only) assume fp16 + Adam and omit activations; accelerate's `estimate-memory` "
        "training figure is for one GPU at batch 1 (fp32: 4x the model bytes; mixed: 2x), unsharded; the "
        "rule of thumb is 16 bytes/parameter x 1.2, unsharded. Sizes in MiB (2^20 bytes). "
        "What the cases are, and the causes of the largest errors: bench/README.md.",
        "",
    ]


def _share(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "" if x is None else f"{1e3 * x:,.1f}"


def case_table(data: dict) -> list[str]:
    lines = [
        "| # | case | strategy | ranks | measured MiB | ours MiB | ours err | DeepSpeed err | "
        "accelerate err | 16B/p x1.2 err | step ms measured | step ms predicted | step time err | others' CPU | "
        "run s | CPU s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(data["cases"], 1):
        if not r.get("errors"):
            lines.append(
                f"| {i} | {_case_label(r)} | {r['strategy']} | {r['world']} | FAILED: "
                f"{(r.get('message') or '')[:160]} | | | | | | | | | | {r.get('wall_s', '')} | "
                f"{r.get('cpu_s', '')} |"
            )
            continue
        e = r["errors"]
        lines.append(
            f"| {i} | {_case_label(r)} | {r['strategy']} | {r['world']} | "
            f"{_mib(r['measured_peak_bytes'])} | {_mib(r['estimates']['ours'])} | {_pct(e['ours'])} | "
            f"{_pct(e['deepspeed'])} | {_pct(e['accelerate'])} | {_pct(e['rule'])} | "
            f"{_ms(r.get('measured_step_s'))} | {_ms(r.get('predicted_step_s'))} | "
            f"{_pct(r.get('step_time_error'))} | {_share(r.get('cpu_contention'))} | {r['wall_s']} | "
            f"{r.get('cpu_s', '')} |"
        )
    s = data["summary"]
    st = s.get("step_time") or {}
    for stat, label in (("median_abs", "median \\|err\\|"), ("worst_abs", "worst \\|err\\|")):
        cells = [("n/a" if s[k][stat] is None else f"{100 * s[k][stat]:.1f}%") for k, _ in _COLUMNS]
        step = "n/a" if st.get(stat) is None else f"{100 * st[stat]:.1f}%"
        lines.append(
            f"| | **{label}** | | | | | **{cells[0]}** | {cells[1]} | {cells[2]} | {cells[3]} | | | **{step}** | | | |"
        )
    return lines


def targets(data: dict) -> list[str]:
    s, t = data["summary"]["ours"], data["targets"]
    if s["median_abs"] is None:
        return ["No case completed."]
    ok_m, ok_w = s["median_abs"] <= t["median_abs"], s["worst_abs"] <= t["worst_abs"]
    failed = sum(1 for r in data["cases"] if not r.get("errors"))
    return (
        [
            f"Targets for our estimate on this machine's CPU runs: median |error| <= {100 * t['median_abs']:.0f}% "
            f"({'met' if ok_m else 'MISSED'}: {100 * s['median_abs']:.1f}%), worst <= {100 * t['worst_abs']:.0f}% "
            f"({'met' if ok_w else 'MISSED'}: {100 * s['worst_abs']:.1f}%), over {s['n']} cases"
            + (f"; {failed} case(s) failed to run." if failed else ".")
        ]
        + group_lines(data)
        + step_time_targets(data)
    )


# Issue 15's targets on its own cases: FSDP2 and single, median |error| <= 3%, worst <= 10%.
GROUP_TARGETS = {"fsdp2": (0.03, 0.10), "single": (0.03, 0.10), "lora": (0.03, 0.10), "qlora": (0.03, 0.10)}


def group_lines(data: dict) -> list[str]:
    """Median and worst |error| per strategy family, with the targets that apply to it."""
    groups = data["summary"].get("by_strategy") or {}
    if not groups:
        return []
    lines = ["", "| strategies | cases | median \\|err\\| | worst \\|err\\| | target |", "|---|---:|---:|---:|---|"]
    for g, s in groups.items():
        t = GROUP_TARGETS.get(g)
        verdict = (
            ""
            if t is None
            else (
                f"median <= {100 * t[0]:.0f}%, worst <= {100 * t[1]:.0f}%: "
                + ("met" if s["median_abs"] <= t[0] and s["worst_abs"] <= t[1] else "MISSED")
            )
        )
        lines.append(f"| {g} | {s['n']} | {100 * s['median_abs']:.1f}% | {100 * s['worst_abs']:.1f}% | {verdict} |")
    merges = data.get("merges") or []
    if merges:
        lines += [
            "",
            "Cases rerun after the full run (`--only ... --merge bench/results.json`): "
            + "; ".join(f"{m['date']}: {len(m['cases'])} cases" for m in merges)
            + ".",
        ]
    return lines


def step_time_targets(data: dict) -> list[str]:
    """Issue 13's step-time targets on the CPU runs (median |error| <= 20%, worst <= 50%), when measured."""
    s, t = data["summary"].get("step_time"), data.get("step_time_targets")
    if not s or not t or s.get("median_abs") is None:
        return []
    ok_m, ok_w = s["median_abs"] <= t["median_abs"], s["worst_abs"] <= t["worst_abs"]
    return [
        "",
        (
            "Step time (measured: the slowest rank's median step after 2 warm-up steps, timed in steps run "
            "after the memory-measured ones with the profiler off; predicted: the step-time model with this "
            "machine's CPU calibration, advisor.timing.calibrate; data loading not modelled; *others' CPU*: "
            "the share of all cores other processes took during the run, which inflates the measured time): "
            f"median |error| <= {100 * t['median_abs']:.0f}% ({'met' if ok_m else 'MISSED'}: "
            f"{100 * s['median_abs']:.1f}%), worst <= {100 * t['worst_abs']:.0f}% "
            f"({'met' if ok_w else 'MISSED'}: {100 * s['worst_abs']:.1f}%), over {s['n']} cases."
            + _quiet_line(s, t)
            + _repredicted_line(data)
        ),
    ]


def _quiet_line(s: dict, t: dict) -> str:
    """The step-time targets over the cases measured on a quiet machine (others' CPU at most the contended share)."""
    q = s.get("quiet") or {}
    if not q.get("n"):
        return ""
    ok_m, ok_w = q["median_abs"] <= t["median_abs"], q["worst_abs"] <= t["worst_abs"]
    return (
        f" Over the {q['n']} cases measured while other processes took at most "
        f"{100 * s['contended_share']:.0f}% of the CPUs: median {100 * q['median_abs']:.1f}% "
        f"({'met' if ok_m else 'MISSED'}), worst {100 * q['worst_abs']:.1f}% ({'met' if ok_w else 'MISSED'})."
    )


def _repredicted_line(data: dict) -> str:
    when = data.get("step_time_repredicted")
    return (
        f" Predictions recomputed on {when} with that day's model and calibration (`python -m bench.run "
        "--repredict bench/results.json`); the measured times keep their runs' dates."
        if when
        else ""
    )


def cli_table(data: dict) -> list[str]:
    if not data.get("cli"):
        return []
    lines = [
        "## Cost of the advisor CLI itself",
        "",
        "Median wall time of 3 runs and the peak RSS of the process (`os.wait4` rusage), on the same machine "
        "in the same run.",
        "",
        "| command | wall s | peak RSS MiB | exit |",
        "|---|---:|---:|---|",
    ]
    for c in data["cli"]:
        lines.append(
            f"| `{c['command']}` | {c['wall_s']:.2f} | {c['peak_rss_bytes'] / MiB:,.0f} | "
            f"{','.join(map(str, c['exit_codes']))} |"
        )
    return lines + [""] + cli_targets(data)


def cli_targets(data: dict) -> list[str]:
    """Issue 11's CLI targets: a warm question with another --gpus <= 1.3 x `import torch, transformers`,
    a cold one (--no-cache) <= 1.25 x the import floor of building Llama with transformers' classes, peak
    RSS < 1.5 GiB; each measured in the same run."""
    by = {c["command"]: c for c in data["cli"]}
    base = next((c for k, c in by.items() if k.endswith('import torch, transformers"')), None)
    floor = next((c for k, c in by.items() if "LlamaForCausalLM" in k), None)
    cold = next((c for k, c in by.items() if k.startswith("cold: python -m advisor llama-2-70b")), None)
    warm = [c for k, c in by.items() if k.startswith("warm:")]
    if not (base and floor and cold and warm):
        return []
    t = data.get("cli_targets", {})
    wr, cr, rss = t.get("warm_ratio", 1.3), t.get("cold_ratio", 1.25), t.get("rss_bytes", 1.5 * 2**30)
    verdict = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    lines = []
    for c in warm:
        ratio = c["wall_s"] / base["wall_s"]
        lines.append(
            f"- `{c['command'][6:]}`: {ratio:.2f}x `import torch, transformers` (target <= {wr}x: "
            f"{verdict(ratio <= wr)})"
        )
    ratio = cold["wall_s"] / floor["wall_s"]
    lines.append(
        f"- cold (`--no-cache`): {ratio:.2f}x the Llama import floor (target <= {cr}x: {verdict(ratio <= cr)})"
    )
    worst = max(c["peak_rss_bytes"] for c in data["cli"] if c["command"].startswith(("cold", "warm")))
    lines.append(f"- peak RSS {worst / 2**30:.2f} GiB (target < {rss / 2**30:.1f} GiB: {verdict(worst < rss)})")
    return ["Targets (llama-2-70b):", ""] + lines


def render_markdown(data: dict) -> str:
    lines = header(data) + ["## Per-rank peak memory", ""] + case_table(data) + [""] + targets(data) + [""]
    lines += cli_table(data)
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    """Log-log scatter, one point per case: estimate vs measured, with the y = x line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["cases"] if r.get("errors")]
    fig, ax = plt.subplots(figsize=(7, 6.5))
    styles = {
        "ours": dict(marker="o", s=42, color="tab:blue", zorder=3),
        "deepspeed": dict(marker="s", s=22, facecolors="none", edgecolors="tab:orange"),
        "accelerate": dict(marker="^", s=22, facecolors="none", edgecolors="tab:green"),
        "rule": dict(marker="x", s=22, color="tab:gray"),
    }
    values = []
    for key, label in _COLUMNS:
        pts = [(r["measured_peak_bytes"] / MiB, r["estimates"][key] / MiB) for r in rows if r["estimates"].get(key)]
        if pts:
            values += [v for p in pts for v in p]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=label, **styles[key])
    if values:
        lo, hi = min(values) / 1.5, max(values) * 1.5
        ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
        ax.fill_between(
            [lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="tab:blue", alpha=0.08, label="+/-25%"
        )
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured per-rank peak (MiB)")
    ax.set_ylabel("estimated per-rank peak (MiB)")
    m = data["machine"]
    ax.set_title(f"advisor estimate vs measured, {len(rows)} CPU runs\n{m['cpu']}, {m['date']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(data: dict, out: Path) -> None:
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "RESULTS.md").write_text(render_markdown(data))
    plot(data, out / "estimate_vs_measured.png")
