"""The CLI's human-readable report of a plan (``python -m advisor MODEL`` without ``--json``): the inputs, the
per-GPU memory table (GiB), the step-time table, the recommendation and the launch line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .candidates import TIE
from .choices import Precision
from .explain import HEADROOM_WARN, tokens_per_sample
from .layout_search import best_layout, trade_off
from .rows import MAX_SEARCH_MICRO_BATCH
from .text_table import amount, fits_word, gib_cell, short_phase, table
from .units import counted, fmt_count, fmt_rate, fmt_s, gib

if TYPE_CHECKING:
    from .document import TimeDoc
    from .plan import Plan
    from .rows import StrategyRow


def render_text(p: Plan, strategy: str | None = None) -> str:
    """The human-readable report: inputs, a breakdown table (GiB), the recommendation, and the launch
    line of ``strategy`` (default: the recommended one)."""
    spec, st, hw, o = p.spec, p.profile.stats, p.hardware, p.options
    act = p.profile.activations(p.model_mode)
    host = "unknown (give --host-mem)" if hw.host_mem_bytes is None else f"{gib(hw.host_mem_bytes):.0f} GiB/node"
    lines = [
        f"Model      {spec.name} ({spec.source})",
        f"           {fmt_count(st.num_params)} parameters ({st.num_params:,}; trainable {st.num_trainable:,}"
        + (
            f"; {fmt_count(st.num_active_params)} active per token, top-{st.experts_per_token} of "
            f"{st.num_experts} experts"
            if st.num_experts
            else ""
        )
        + "), "
        f"{spec.shape_text}, {act.flops_per_sample / 1e9:.1f} GFLOP/sample fwd+bwd"
        + (" (recompute included; MFU counts without it)" if p.options.activation_checkpointing else "")
        + ", "
        f"activations {gib(act.activation_bytes_per_sample):.3f} GiB/sample",
        f"Hardware   {hw.num_gpus} x {hw.gpu_name} ({hw.gpus_per_node} per node x {counted(hw.num_nodes, 'node')}), "
        f"{gib(hw.gpu_memory_bytes):.2f} GiB usable each [{hw.sources.get('gpu_memory_bytes')}], "
        f"{hw.interconnect} [{hw.sources.get('interconnect')}]"
        + (f", network {hw.network} [{hw.sources.get('network')}]" if hw.network else "")
        # an unknown host RAM's source already says what to give
        + (
            f", host RAM {host} [{hw.sources.get('host_mem_bytes')}]"
            if hw.host_mem_bytes is not None
            else f", host RAM {hw.sources.get('host_mem_bytes') or host}"
        ),
        f"Training   {o.precision}, {o.optimizer}, micro-batch {o.micro_batch_size}/GPU"
        + (
            " (chosen for throughput)"
            if p.inputs.training.micro_batch_size is None and p.recommendation.micro_batch_note
            else ""
        )
        + ", "
        f"activation checkpointing {o.checkpointing_label}, attention {act.attention}, "
        f"rule-of-thumb safety factor {o.safety_factor}",
        "",
        "Per-GPU memory, GiB (peak allocated = sum of the components; device total adds CUDA context, NCCL, "
        "fragmentation)",
    ]
    columns = [
        ("strategy", "<", 15, ""),
        *((name, ">", 8, "") for name in ("params", "grads", "optim", "activ", "buffers", "other", "peak", "device")),
        ("fits", "<", 5, "  "),
        ("16B/p", ">", 8, ""),
        ("max mb", ">", 7, ""),
        ("GA", ">", 4, ""),
        ("peak in", "<", 10, "  "),
        ("host/node", "<", 0, ""),
    ]
    cells: list[list[str] | str] = []
    for r in p.rows:
        if not r.applicable:
            cells.append(f"{r.name} n/a: {r.reason}")
            continue
        m = r.memory
        assert m is not None and r.rule_of_thumb_bytes is not None, "a row that applies is sized"
        b = m.peak
        rule = f"{gib(r.rule_of_thumb_bytes):.1f}{'' if r.rule_of_thumb_fits else '!'}"
        cells.append(
            [
                r.name,
                *map(
                    gib_cell,
                    (b.params, b.grads, b.optimizer_states, b.activations, b.buffers, b.other, b.total, m.device_total),
                ),
                fits_word(r.fits, r.short_of),
                rule,
                f"{r.max_micro_batch_size}+"
                if r.max_micro_batch_size >= MAX_SEARCH_MICRO_BATCH
                else str(r.max_micro_batch_size),
                str(r.grad_accum_steps),
                short_phase(b.phase),
                gib_cell(m.host_bytes_per_node) if m.host_bytes_per_node else "-",
            ]
        )
        if r.deepspeed_estimate:
            de = r.deepspeed_estimate
            cells.append(
                f"DeepSpeed's estimator (model states only): {gib_cell(de['gpu_bytes'])} GiB/GPU, "
                f"{gib_cell(de['host_bytes_per_node'])} GiB host/node"
            )
    lines += table(columns, cells)
    lines.append("16B/p: 16 bytes/parameter x safety factor, sharded per strategy ('!' = over the GPU memory)")
    if p.options.memory_options:
        lines.append("max mb: searched without the memory options (they are applied at the plan's micro-batch only)")
    if any(r.applicable and r.fits is None for r in p.rows):
        lines.append(
            "fits ?: the strategy keeps model states in host RAM and the target's host RAM is unknown: "
            "give --host-mem GIB"
        )
    short: dict[str | None, list[str]] = {}
    for r in p.rows:
        if r.applicable and r.fits is False and r.short_of == "host RAM":
            short.setdefault(r.fit_note, []).append(r.name)
    lines += [f"RAM! {', '.join(names)}: {note}" for note, names in short.items()]
    load = _load_line(p.rows, p.options.init_from, p.spec.adapter is not None and p.options.precision != Precision.FP32)
    if load:
        lines.append(load)
    lines.append(
        "peak in: the moment of the step with the largest total (fwd, bwd, bwd-end: gradient reduction, "
        "step; step-flat: DeepSpeed flattening the gradients for the optimizer)"
    )
    if o.precision is not None and o.precision.is_mixed and p.spec.adapter is None:  # a LoRA base is 16-bit: no copies
        lines.append(
            f"DDP/TP activ or other include autocast's {o.precision} copies of the weights (cached until the "
            "forward ends, kept for backward; about 2 bytes per parameter), and their activ keeps in fp32 what runs "
            "outside autocast's 16-bit ops (the residual stream, norms, MoE token dispatch: the weights are fp32); "
            "ZeRO keeps 16-bit weights and FSDP2 gathers them in 16 bits (buffers), so they have no copies and keep "
            "those activations in 16 bits"
        )
    for r in p.rows:  # a row's own memory notes (a pipeline row: every stage), under its name
        if r.applicable and r.memory is not None:
            lines += [f"{r.name}: {note}" for note in r.memory.notes]
    rec = p.recommendation
    chosen_name = strategy or rec.strategy
    chosen = p.row(chosen_name) if chosen_name else None
    memory_band = _memory_band_line(p, chosen)
    if memory_band:
        lines.append(memory_band)
    lines += _time_lines(p, chosen)
    lines.append("")
    if rec.strategy:
        lines.append(f"Recommendation: {p.row(rec.strategy).title} ({rec.strategy})")
    else:
        lines.append("Recommendation: none - nothing fits this hardware" + _searched_fit(p))
    lines += [f"  - {reason}" for reason in rec.reasons]
    for w in p.warnings + rec.warnings:
        lines.append(f"  ! {w}")
    if p.ladder is not None:
        lines += ["", *_ladder_lines(p)]
    if p.layouts is not None:
        lines += ["", *_layout_lines(p)]
    launch = _launch_line(p, strategy or rec.strategy)
    if launch:
        lines += ["", f"Launch{'' if strategy in (None, rec.strategy) else f' ({strategy})'}: {launch}"]
    return "\n".join(lines)


def _memory_band_line(p: Plan, chosen: StrategyRow | None) -> str | None:
    """How far to trust the chosen row's memory figures (``advisor.timing.error_band.memory_band``); None when no
    row is chosen or it does not apply."""
    from .document import memory_band_of

    if chosen is None or chosen.memory is None:
        return None
    band, m = memory_band_of(p), chosen.memory
    return (
        f"{chosen.name}: peak allocated {gib_cell(m.peak.total)} GiB, device total {gib_cell(m.device_total)} GiB "
        f"per GPU, {band.text()} ({band.reading('more memory')}; band: {band.based_on})"
    )


# Above this share of exposed communication a step is unlike the published runs the GPU bands were fitted on
# (bench/PUBLISHED.md: every one ran in one node or over InfiniBand/RoCE; none crossed Ethernet between nodes).
COMM_BOUND_SHARE = 0.3


def _time_band_lines(p: Plan, chosen: StrategyRow, d: TimeDoc) -> list[str]:
    """The chosen row's step time and, with a training budget, its train time, each with its error band."""
    from .document import time_band_of
    from .units import fmt_s

    band = time_band_of(p, chosen.name)
    lines = [f"{chosen.name}: {fmt_s(d['step_s'])} per step, {band.text()} ({band.reading()}; band: {band.based_on})"]
    exposed = d["exposed_comm_s"] / d["step_s"] if d["step_s"] else 0.0
    if exposed > COMM_BOUND_SHARE and band.rows:
        lines.append(
            f"{chosen.name}: {100 * exposed:.0f}% of this step is communication compute does not hide; the published "
            "runs behind the band ran in one node or over InfiniBand/RoCE, where less of it shows, so this "
            "step's error can be wider than the band"
        )
    hours = d.get("train_hours")
    if hours is not None:
        gpu_h, cost = d.get("gpu_hours"), d.get("cost")
        also = f", {amount(gpu_h)} GPU-h" if gpu_h is not None else ""
        also += f", cost {amount(cost, cents=True)}" if cost is not None else ""
        lines.append(f"{chosen.name}: train time {amount(hours)} h{also}, {band.text()}")
    return lines


def _time_lines(p: Plan, chosen: StrategyRow | None = None) -> list[str]:
    """The step-time table: one optimizer step at each row's global batch, its parts, throughput, MFU and the
    speed-up over one GPU, then the ``chosen`` row's step (and train) time with its error band and the time
    model's source. Empty when no row could be timed (a GPU without a preset)."""
    from .document import time_to_dict, timing_doc
    from .units import fmt_rate, fmt_s

    timed = [(r, d) for r in p.rows if r.applicable and r.time is not None and (d := time_to_dict(p, r)) is not None]
    if not timed:
        return []
    lm = any(d["tokens_per_s"] is not None for _, d in timed)
    unit = "tokens/s" if lm else "samples/s"
    budget = any("train_hours" in d for _, d in timed)
    columns = [
        ("strategy", "<", 15, ""),
        *((name, ">", 9, "") for name in ("step", "compute", "comm", "exposed", "optim")),
        (unit, ">", 11, ""),
        ("per GPU", ">", 9, ""),
        ("MFU", ">", 6, ""),
        ("speedup", ">", 9, ""),
        ("fits", "<", 5, "  "),
    ]
    if budget:
        columns += [("hours", ">", 9, ""), ("GPU-h", ">", 9, ""), ("cost", ">", 10, "")]
    cells: list[list[str] | str] = []
    for r, d in timed:
        rate = d["tokens_per_s"] if lm else d["samples_per_s"]
        per = d["tokens_per_s_per_gpu"] if lm else d["samples_per_s_per_gpu"]
        speed = "-" if d["speedup_vs_single_gpu"] is None else f"{d['speedup_vs_single_gpu']:.2f}x"
        mfu = "-" if d["mfu"] is None else f"{100 * d['mfu']:.0f}%"
        row = [
            r.name,
            *(fmt_s(d[k]) for k in ("step_s", "compute_s", "comm_s", "exposed_comm_s", "optimizer_s")),
            fmt_rate(rate or 0),
            fmt_rate(per or 0),
            mfu,
            speed,
            fits_word(r.fits, r.short_of),
        ]
        if budget:
            row += [amount(d.get("train_hours")), amount(d.get("gpu_hours")), amount(d.get("cost"), cents=True)]
        cells.append(row)
    lines = [
        "",
        f"Step time of one optimizer step at global batch {timed[0][0].global_batch_size} (compute + "
        "communication not hidden + optimizer step). Data loading is not modelled.",
        *table(columns, cells),
    ]
    timing = timing_doc(p)
    if timing is not None:
        lines.append(f"Time model: {timing['source']}")
    lines.append(
        "comm: all communication per step; exposed: the part compute does not hide; speedup: against the "
        "fastest recipe that fits one GPU, at the same global batch by accumulation (plain single runs "
        "autocast's weight casts, which ZeRO's 16-bit module skips, so it can read below 1.00x; '-': one GPU "
        "cannot hold the model); fits: as in the memory table (a row that does not fit is timed as if it did)"
    )
    for r, d in timed:
        if chosen is not None and r.name == chosen.name:
            lines += _time_band_lines(p, chosen, d)
    return lines


def _load_line(rows: list[StrategyRow], init_from: str | None = None, base_16bit: bool = False) -> str | None:
    """Host RAM each strategy's script needs per node while it builds the model (``init_from``: while it loads the
    pretrained weights), grouped by value. ``base_16bit``: a LoRA base loaded in 16 bits (``from_pretrained(...,
    dtype=)`` under bf16/fp16; ``strategies.base.pretrained_bytes``)."""
    groups: dict[int, list[str]] = {}
    for r in rows:
        if r.applicable and r.load_host_bytes_per_node:
            groups.setdefault(r.load_host_bytes_per_node, []).append(r.name)
    if not groups:
        return None
    parts = [f"{'/'.join(names)} {gib(n):.2f}" for n, names in sorted(groups.items(), reverse=True)]
    if init_from:
        dtype = "16 bits (the LoRA base)" if base_16bit else "fp32"
        return (
            "host RAM per node while the script loads the pretrained weights from --init-from (each rank loads "
            f"them on the CPU in {dtype}, twice over where a torch.load'ed state_dict sits beside the model; "
            "ZeRO-3 under zero.Init: rank 0 alone reads the checkpoint; FSDP2: the shards plus rank 0's whole "
            "copy, which it broadcasts into them, on node 0; single is one process), GiB: " + ", ".join(parts)
        )
    return (
        "host RAM per node while the script builds the model (each rank builds it on the CPU in fp32; "
        "ZeRO-3 partitions as it builds; FSDP2 builds on the meta device and materialises only its shards; "
        "single is one process), GiB: " + ", ".join(parts)
    )


def _searched_fit(p: Plan) -> str:
    """When nothing fits at the planned settings but the layout search found a layout that does (another
    micro-batch, checkpointing, TP or PP): what it takes, so the headline does not read as a dead end."""
    best = best_layout(p.layouts or [], None)
    if best is None:
        return ""
    return (
        f" at these settings; the layout search below finds {len(p.layouts or [])} that fit and takes "
        f"{best.layout.label()} with {best.title} ({best.flags()})"
    )


def _launch_line(p: Plan, strategy: str | None) -> str | None:
    """The launch command of ``strategy``'s script, or why the row has none (an estimate-only row)."""
    if not strategy:
        return None
    row = next((r for r in p.rows if r.name == strategy), None)
    if row is not None and row.estimate_only:
        return f"none, the row is sized and timed only ({row.estimate_only})"
    from strategies.render import launch_command

    return launch_command(p, strategy)


def _ladder_lines(p: Plan) -> list[str]:
    """The memory-savings ladder (``advisor.ladder``) as a table: each rung adds its option to those above it."""
    ladder = p.ladder
    assert ladder is not None
    cols = [
        ("rung", "<", 4, ""),
        ("peak", ">", 6, "  "),
        ("device", ">", 6, " "),
        ("fits", "<", 4, "  "),
        ("step", ">", 6, " "),
        ("rate", ">", 6, " "),
        ("slowdown", ">", 8, " "),
        ("flags", "<", 0, "  "),
    ]
    rows: list[list[str] | str] = []
    blocked = []
    for r in ladder.rungs:
        if r.blocker is not None:
            blocked.append(f"  {r.label}: n/a: {r.blocker}")
            continue
        if r.peak_bytes is None:  # more GPUs: the recommendation's cluster, not sized here
            blocked.append(f"  {r.label}: {r.flags} ({r.note})")
            continue
        rows.append(
            [
                r.label + (" <- first fit" if r.first_fit else ""),
                gib_cell(r.peak_bytes),
                gib_cell(r.device_bytes),
                fits_word(None if r.short_of == "host RAM unknown" else r.fits, r.short_of),
                fmt_s(r.step_s) if r.step_s is not None else "-",
                f"{fmt_rate(r.throughput)} {r.unit}" if r.throughput else "-",
                f"{100 * r.slowdown:+.0f}%" if r.key != "base" else "-",
                r.flags,
            ]
        )
        if r.note:
            rows.append(f"  {r.note}")
    head = (
        f"Memory-savings ladder on {ladder.title} ({ladder.strategy}), each rung adding its option to those above, "
        "least slowdown per GiB saved first; LoRA and QLoRA are two alternatives, each added to the last rung before "
        "them (GiB per GPU; peak allocated and device total):"
    )
    return [head, *table(cols, rows), *blocked]


def _layout_lines(p: Plan) -> list[str]:
    """The layout search (``advisor.layout_search``): the ``--top`` fastest candidates that fit, the one it takes,
    and how it compares with the recommended row."""
    found, top = p.layouts or [], p.options.top or 0
    tokens = tokens_per_sample(p.context())
    unit, per = ("tokens/s", tokens) if tokens else ("samples/s", 1)
    target = p.options.global_batch_size or (p.options.micro_batch_size or 1) * p.hardware.num_gpus
    head = (
        f"Layout search at global batch {target} ({len(found)} fit; TP inside a node, PP across, data parallel the "
        f"rest; GiB per GPU, a pipeline's most-loaded stage):"
    )
    if not found:
        return [head, "  no layout fits: see the ladder and the recommendation's fixes above"]
    best = best_layout(found, p.planned_key())
    room = int(HEADROOM_WARN * p.hardware.gpu_memory_bytes)
    cols = [
        ("#", ">", 2, ""),
        ("layout", "<", 6, "  "),
        ("row", "<", 3, "  "),
        ("mb", ">", 2, "  "),
        ("GA", ">", 2, " "),
        ("AC", "<", 3, "  "),
        ("device", ">", 6, "  "),
        ("step", ">", 6, "  "),
        ("rate", ">", 6, "  "),
        ("MFU", ">", 3, " "),
        ("bubble", ">", 6, " "),
        ("flags", "<", 0, "  "),
    ]
    rows: list[list[str] | str] = []
    for i, c in enumerate(found[:top], 1):
        rows.append(
            [
                str(i),
                c.layout.label(),
                c.strategy + ("*" if c.estimate_only else ""),
                str(c.micro_batch_size),
                str(c.grad_accum_steps),
                "on" if c.activation_checkpointing else "off",
                gib_cell(c.device_total) + ("!" if c.device_total > room else ""),
                fmt_s(c.step_s),
                fmt_rate(c.samples_per_s * per),
                f"{100 * c.mfu:.0f}%" if c.mfu is not None else "-",
                f"{100 * c.bubble_fraction / (1 + c.bubble_fraction):.0f}%" if c.layout.pp > 1 else "-",
                c.flags() + ("  <- takes" if c is best else ""),
            ]
        )
    lines = [head, *table(cols, rows)]
    shown = found[:top]
    if any(c.estimate_only for c in shown):
        lines.append(
            "*: sized and timed only, no script (" + next(c.estimate_only for c in shown if c.estimate_only) + "); "
            "the search never takes one"
        )
    if any(c.device_total > room for c in shown):
        lines.append(
            f"!: over {100 * HEADROOM_WARN:.0f}% of the GPU's memory, inside the estimate's error band of not fitting"
        )
    lines.append(
        f"rate: {unit}; MFU without recompute; bubble: the pipeline's idle share of its compute time; the ladder's "
        "memory options are not searched"
    )
    rec = p.row(p.recommendation.strategy) if p.recommendation.strategy else None
    if best is None:
        lines.append("none of these has a script: --emit cannot write one")
        return lines
    where = "" if best in shown else f" (#{found.index(best) + 1} of the search, not shown: raise --top)"
    script = f"--emit DIR --strategy {best.strategy} writes its script"
    if rec is not None and rec.time is not None and rec.global_batch_size == target:
        ratio = best.samples_per_s * rec.time.step_s / target
        verdict = (
            "the recommendation's own row"
            if p.planned_key() == best.key
            else f"{ratio:.2f}x the recommended {rec.title}'s rate"
            + (" (within the tie band: the recommendation stands)" if ratio < 1 + TIE else "")
        )  # fmt: skip
        lines.append(f"takes {best.layout.label()} with {best.title}{where}: {verdict}")
    else:
        lines.append(f"takes {best.layout.label()} with {best.title}{where}")
    lines.append(f"  plan it with {best.flags()}; {script}")
    lines.append(f"  {trade_off(best, found, p.spec.tp_capable)}")
    return lines
