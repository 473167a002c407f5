"""``python -m advisor MODEL [options]``: a thin argparse face over ``advisor.plan.plan``; plus subcommands
with their own faces: ``check`` (advisor.check.cli), ``doctor`` (advisor.doctor), ``cache`` (advisor.cache)
and ``page`` (the Streamlit page, advisor.page.launch).

Examples:
    python -m advisor resnet50 --gpus 4
    python -m advisor llama-2-7b --gpus 8 --gpu A100-80GB --activation-checkpointing
    python -m advisor --config my/config.json --gpus 8 --json
    python -m advisor check train.py            # multi-GPU pitfalls in your own script
    python -m advisor doctor --ckpt-dir ckpt/   # pre-flight checks of this machine
    python -m advisor page                      # the same planner in a browser (needs streamlit)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .choices import Precision
from .errors import AdvisorError
from .faces import OneLineParser, finite_float, positive_float, positive_int, quiet_library_logs, run_face
from .fields import Field, resolve_choices
from .free_text import parse_shape
from .schema import GROUP_TITLES, PlanInputs, RunOptions, fields_for, inputs_from_values
from .text_table import amount, fits_word, gib_cell, short_phase, table
from .units import counted, fmt_count, gib

if TYPE_CHECKING:
    from .plan import Plan
    from .rows import StrategyRow
    from .verify import VerifyResult

VERIFY_STEPS, VERIFY_TIMEOUT_S = 6, 600.0


def _argparse_type(f: Field) -> Callable[[str], int | float | str]:
    """The argparse type of a schema field (one-line errors; ranges are checked by the schema)."""
    if f.kind == "int":
        return positive_int if (f.opt.low or 0) >= 1 else int
    if f.kind == "float":
        return positive_float if f.opt.low == 0.0 else finite_float
    return str


def _any_case(choices: Sequence[str]) -> Callable[[str], str]:
    """An argparse type mapping a value to the choice it equals ignoring case (else the value itself, which
    argparse then refuses with the list of choices)."""
    by_fold = {str(c).casefold(): c for c in choices}

    def canonical(text: str) -> str:
        return by_fold.get(text.casefold(), text)

    return canonical


def _help(f: Field, strategy_names: tuple[str, ...]) -> str:
    text = f.opt.help
    choices = resolve_choices(f, strategy_names)
    if choices and not f.opt.strict:
        text += f": {', '.join(map(str, choices))}"
    elif choices and f.kind == "str" and f.opt.choices == "strategies":
        text += f": {', '.join(choices)}"
    if f.opt.none and f.kind != "bool" and "default" not in text:
        text += f" (default: {f.opt.none})"
    return text


def build_parser(strategy_names: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The CLI, derived from ``advisor.schema``: one argument per field tagged "cli", grouped as the
    schema groups them, choices from the registries (``strategy_names`` defaults to the registered
    strategies)."""
    if strategy_names is None:
        from strategies import strategy_names as registered

        strategy_names = registered()
    p = OneLineParser(
        prog="advisor",
        description="Per-GPU memory, parallel strategy and a verified training script "
        "for PyTorch training. Sizes are per GPU; GiB = 2**30 bytes.",
        epilog="Subcommands: 'advisor check FILE.py ...' finds single-to-multi-GPU pitfalls in your own "
        "training script (read as a syntax tree, never run); 'advisor doctor' runs the pre-flight "
        "checks of this machine (GPUs, driver, NCCL/gloo, a 2-rank all-reduce, port, directories); "
        "'advisor cache info|clear' shows or empties the trace cache; 'advisor page [streamlit run options]' "
        "serves the Streamlit page (needs advisor[app]). Each has --help.",
    )
    p.add_argument("--version", action="store_true", help="print advisor's version and exit")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields_for("cli"):
        if f.opt.positional:
            p.add_argument(f.name, nargs="?", help=_help(f, strategy_names))
            continue
        group = groups.get(f.group) or groups.setdefault(f.group, p.add_argument_group(GROUP_TITLES[f.group]))
        flag, help_text = f.opt.flag, _help(f, strategy_names)
        assert flag is not None, f"the CLI field {f.name} is positional or has a flag"
        if f.kind == "bool":
            group.add_argument(flag, dest=f.name, help=help_text, default=False, action="store_true")
            continue
        convert = _argparse_type(f)
        choices = resolve_choices(f, strategy_names)
        strict = choices if choices and f.opt.strict else None
        if strict and f.kind == "str":  # any case, as --gpu: --strategy ZeRO3 is zero3, --precision BF16 is bf16
            convert = _any_case(strict)
        group.add_argument(
            flag, dest=f.name, help=help_text, default=None, type=convert, choices=strict, metavar=f.opt.metavar or None
        )
    return p


def _values(args: argparse.Namespace) -> dict[str, object]:
    """The parsed flags as schema field values (unset flags keep the schema's defaults)."""
    values: dict[str, object] = {}
    for f in fields_for("cli"):
        value = getattr(args, f.name)
        if f.kind == "shape":
            value = parse_shape(value)
        if value is not None and not (f.kind == "bool" and value is False):
            values[f.name] = value
    return values


def inputs_from_args(args: argparse.Namespace) -> tuple[PlanInputs, RunOptions]:
    """Parsed flags -> validated ``PlanInputs`` and ``RunOptions`` (``advisor.schema.inputs_from_values``).

    Raises:
        AdvisorError: as ``advisor.schema.validate``.
    """
    return inputs_from_values(_values(args))


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
        f"activation checkpointing {'on' if o.activation_checkpointing else 'off'}, attention {act.attention}, "
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
                str(r.max_micro_batch_size),
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
            "forward ends, kept for backward; about 2 bytes per parameter); ZeRO keeps 16-bit weights and "
            "FSDP2 gathers them in 16 bits (buffers), so they have none"
        )
    lines += _time_lines(p)
    rec = p.recommendation
    lines.append("")
    if rec.strategy:
        lines.append(f"Recommendation: {p.row(rec.strategy).title} ({rec.strategy})")
    else:
        lines.append("Recommendation: none - nothing fits this hardware")
    lines += [f"  - {reason}" for reason in rec.reasons]
    for w in p.warnings + rec.warnings:
        lines.append(f"  ! {w}")
    launch = _launch_line(p, strategy or rec.strategy)
    if launch:
        lines += ["", f"Launch{'' if strategy in (None, rec.strategy) else f' ({strategy})'}: {launch}"]
    return "\n".join(lines)


def _time_lines(p: Plan) -> list[str]:
    """The step-time table: one optimizer step at each row's global batch, its parts, throughput, MFU and the
    speed-up over one GPU (issue 13). Empty when no row could be timed (a GPU without a preset)."""
    from .document import time_to_dict
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
    lines.append(
        "comm: all communication per step; exposed: the part compute does not hide; speedup: against the "
        "fastest recipe that fits one GPU, at the same global batch by accumulation (plain single runs "
        "autocast's weight casts, which ZeRO's 16-bit module skips, so it can read below 1.00x; '-': one GPU "
        "cannot hold the model)"
    )
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


def _launch_line(p: Plan, strategy: str | None) -> str | None:
    if not strategy:
        return None
    from strategies.render import launch_command

    return launch_command(p, strategy)


def _check_run_flags(run: RunOptions) -> RunOptions:
    """--emit is checked before minutes of planning, not after; fills the verify defaults."""
    if run.emit:
        from strategies.render import check_emit_dir

        check_emit_dir(run.emit, run.force)
    return replace(
        run,
        steps=VERIFY_STEPS if run.steps is None else run.steps,
        timeout=VERIFY_TIMEOUT_S if run.timeout is None else run.timeout,
    )


def _emit(result: Plan, args: RunOptions, out_dir: str) -> None:
    from strategies.render import job_from_plan, launch_command_for, render_job, write_files

    from .plan import training_budget

    name = args.strategy or result.recommendation.strategy
    if name is None:
        raise AdvisorError("nothing fits, so there is no recommended strategy to emit: pass --strategy NAME")
    job = job_from_plan(result, name)
    budget = training_budget(result.options, result.context(), result.row(name)) or {}
    if hours := budget.get("train_hours"):
        # slurm.sbatch's time limit: the estimated training time, plus 20% and 30 minutes for loading, evaluation
        # and checkpoints (a job past its limit is killed; --signal gives it 120 s to save first).
        job = replace(job, time_limit_s=hours * 3600 * 1.2 + 1800)
    written = write_files(render_job(job), out_dir, force=args.force)
    stream = sys.stderr if args.json else sys.stdout
    row, mem = result.row(name), job.estimate["device_total_bytes"]
    if not row.strategy.distributes and result.hardware.num_gpus > 1:
        print(
            f"  ! {row.title} runs one process on one of the {result.hardware.num_gpus} GPUs "
            "(the baseline row); for all of them emit the recommended strategy",
            file=stream,
        )
    if not row.fits:
        print(
            f"  ! {row.title} does not fit: {gib(mem):.2f} GiB per GPU estimated vs "
            f"{gib(result.hardware.gpu_memory_bytes):.2f} GiB; the script will likely run out of memory",
            file=stream,
        )
    print(f"\nWrote {', '.join(str(p) for p in written)}", file=stream)
    where = shlex.quote(out_dir.rstrip("/") or "/")
    print(f"Run: cd {where} && {launch_command_for(job)}   (or: bash {where}/launch.sh)", file=stream)


def _verify(inputs: PlanInputs, args: RunOptions, precision_explicit: bool) -> VerifyResult:
    from .verify import step_time_line, verify

    def progress(msg: str) -> None:
        print(f"[verify] {msg}", file=sys.stderr, flush=True)

    assert args.steps is not None and args.timeout is not None, "_check_run_flags fills them"
    outcome = verify(
        inputs,
        args.strategy,
        steps=args.steps,
        timeout_s=args.timeout,
        out_dir=args.emit,
        force=args.force,
        precision_explicit=precision_explicit,
        progress=progress,
    )
    stream = sys.stderr if args.json else sys.stdout
    print("", file=stream)
    for note in outcome.notes:
        print(f"  ! {note}", file=stream)
    if not outcome.ok:
        print(f"Verify FAILED ({outcome.strategy}, {outcome.device}): {outcome.message}", file=stream)
        return outcome
    print(
        f"Verify {outcome.strategy} on {outcome.world_size} {outcome.device} rank(s), {outcome.steps} steps "
        f"(loss {outcome.losses[0]:.3f} -> {outcome.losses[-1]:.3f}); peak allocated per rank:",
        file=stream,
    )
    assert outcome.relative_error is not None, "a completed run measured a peak"
    for r in outcome.per_rank:
        assert r["relative_error"] is not None, "every rank measured a peak"
        print(
            f"  rank {r['rank']}: measured {gib(r['measured_peak_bytes']):.3f} GiB, estimated "
            f"{gib(r['estimated_peak_bytes']):.3f} GiB, error {100 * r['relative_error']:+.1f}%",
            file=stream,
        )
    verdict = "within" if outcome.within_tolerance else "OUTSIDE"
    print(
        f"  worst error {100 * outcome.relative_error:+.1f}% ({verdict} the {100 * 0.25:.0f}% tolerance); "
        f"log and files: {outcome.log_dir}",
        file=stream,
    )
    line = step_time_line(outcome)
    if line:
        print(f"  {line}", file=stream)
    return outcome


def package_version() -> str:
    """advisor's version: the installed distribution's (``importlib.metadata``), else ``advisor.__version__``
    (a checkout used without installing it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("advisor")
    except PackageNotFoundError:
        from . import __version__

        return __version__


SUBCOMMANDS = ("check", "doctor", "cache", "page")


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "check":
        from .check.cli import main as check_main

        return check_main(argv)
    if name == "cache":
        from .cache_face import main as cache_main

        return cache_main(argv)
    if name == "page":
        from .page.launch import main as page_main

        return page_main(argv)
    from .doctor import main as doctor_main

    return doctor_main(argv)


def _plan_face(argv: list[str]) -> int:
    """Plan, print, and --emit / --verify as asked; raises AdvisorError on bad input."""
    from strategies import strategy_names

    from .schema import validate_run
    from .unsupported import find_unsupported

    pointer = find_unsupported(argv)  # before argparse's "unrecognized arguments" / "invalid choice"
    if pointer:
        raise AdvisorError(pointer)
    args = build_parser().parse_args(argv)
    if args.version:
        print(f"advisor {package_version()}")
        return 0
    if args.list_models:
        from .models import known_model_names

        names = known_model_names()
        print(json.dumps(names, indent=2) if args.json else "\n".join(names))
        return 0
    inputs, run = inputs_from_args(args)
    validate_run(run, strategy_names())
    run = _check_run_flags(run)
    from .document import plan_to_dict
    from .plan import plan

    result = plan(inputs)
    if run.emit and run.strategy and not result.row(run.strategy).applicable:  # before pages of a plan
        raise AdvisorError(f"--strategy {run.strategy} does not apply here: {result.row(run.strategy).reason}")
    doc = plan_to_dict(result) if run.json else None
    if not run.json:
        print(render_text(result, run.strategy))
    code = 0
    if run.emit and not run.verify:  # --verify writes into --emit DIR itself
        _emit(result, run, run.emit)
    if run.verify:
        outcome = _verify(inputs, run, precision_explicit=args.precision is not None)
        code = 0 if outcome.ok else 1
        if doc is not None:
            doc["verify"] = outcome.to_dict()
    if doc is not None:
        print(json.dumps(doc, indent=2))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry. Returns the exit code: 0 answered (even "nothing fits"), 1 a failed verification, 2 bad input,
    75 the machine busy with another verification.
    ``check``, ``doctor``, ``cache`` and ``page`` as the first argument hand the rest to their own faces.
    Never contacts a model hub (``HF_HUB_OFFLINE=1``; set here, at the entry point, not on import)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # advisor prints its own warnings
    quiet_library_logs()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    return run_face(lambda: _plan_face(argv))


if __name__ == "__main__":
    sys.exit(main())
