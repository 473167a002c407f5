"""``python -m advisor MODEL [options]``: a thin argparse face over ``advisor.plan.plan``; plus subcommands
with their own faces: ``check`` (advisor.check.cli), ``doctor`` (advisor.doctor), ``cache`` (advisor.cache),
``calibrate`` (advisor.calibrate_face) and ``page`` (the Streamlit page, advisor.page.launch).

Examples:
    python -m advisor resnet50 --gpus 4
    python -m advisor llama-2-7b --gpus 8 --gpu A100-80GB --activation-checkpointing
    python -m advisor --config my/config.json --gpus 8 --json
    python -m advisor check train.py            # multi-GPU pitfalls in your own script
    python -m advisor doctor --ckpt-dir ckpt/   # pre-flight checks of this machine
    python -m advisor calibrate                 # measure this machine's GPU (or CPU); plans then use it
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
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import AdvisorError
from .faces import (
    OneLineParser,
    collect_garbage_less_often,
    finite_float,
    positive_float,
    positive_int,
    quiet_library_logs,
    run_face,
)
from .fields import Field, resolve_choices
from .free_text import parse_shape
from .schema import GROUP_TITLES, PlanInputs, RunOptions, fields_for, inputs_from_values
from .text_report import render_text
from .units import gib

if TYPE_CHECKING:
    from .plan import Plan
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
        from strategies import runnable_names as registered

        strategy_names = registered()
    p = OneLineParser(
        prog="advisor",
        description="Per-GPU memory, parallel strategy and a verified training script "
        "for PyTorch training. Sizes are per GPU; GiB = 2**30 bytes.",
        epilog="Subcommands: 'advisor check FILE.py ...' finds single-to-multi-GPU pitfalls in your own "
        "training script (read as a syntax tree, never run); 'advisor doctor' runs the pre-flight "
        "checks of this machine (GPUs, driver, NCCL/gloo, a 2-rank all-reduce, port, directories); "
        "'advisor cache info|clear' shows or empties the trace cache; 'advisor calibrate [--show]' measures this "
        "machine's GPU (or CPU) for the step times, or shows what is stored; 'advisor page [streamlit run options]' "
        "serves the Streamlit page (needs streamlit). Each has --help.",
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
        spellings = (flag, f.opt.short) if f.opt.short else (flag,)
        group.add_argument(
            *spellings,
            dest=f.name,
            help=help_text,
            default=None,
            type=convert,
            choices=strict,
            metavar=f.opt.metavar or None,
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
    from strategies.emit_manifest import edited_files, kept_copy, left_edited, read_manifest, stale_files
    from strategies.render import job_from_plan, launch_command_for, render_job, write_files

    from .layout_search import best_layout
    from .plan import training_budget

    name = args.strategy or result.recommendation.strategy
    if name is None:
        taken = best_layout(result.layouts or [])
        hint = f" (the layout search takes: {taken.flags()} --strategy {taken.strategy})" if taken else ""
        raise AdvisorError(f"nothing fits, so there is no recommended strategy to emit: pass --strategy NAME{hint}")
    # slurm.sbatch finds train.py in this folder by its absolute path, wherever the job is submitted from.
    job = replace(job_from_plan(result, name), folder=str(Path(out_dir).resolve()))
    budget = training_budget(result.options, result.context(), result.row(name)) or {}
    if hours := budget.get("train_hours"):
        # slurm.sbatch's time limit: the estimated training time, plus 20% and 30 minutes for loading, evaluation
        # and checkpoints (a job past its limit is killed; --signal gives it 120 s to save first).
        job = replace(job, time_limit_s=hours * 3600 * 1.2 + 1800)
    files = render_job(job)
    removed = stale_files(Path(out_dir), frozenset(files)) if Path(out_dir).is_dir() else []
    left = left_edited(Path(out_dir), frozenset(files)) if Path(out_dir).is_dir() else []
    edited = (
        [(p, kept_copy(p)) for p in edited_files(Path(out_dir), frozenset(files))] if Path(out_dir).is_dir() else []
    )
    written_before = read_manifest(Path(out_dir))
    written = write_files(files, out_dir, force=args.force)
    stream = sys.stderr if args.json else sys.stdout
    row, mem = result.row(name), job.estimate["device_total_bytes"]
    if not row.strategy.distributes and result.hardware.num_gpus > 1:
        print(
            f"  ! {row.title} runs one process on one of the {result.hardware.num_gpus} GPUs "
            "(the baseline row); for all of them emit the recommended strategy",
            file=stream,
        )
    if row.fits is False and row.short_of == "GPU memory":
        print(
            f"  ! {row.title} does not fit: {gib(mem):.2f} GiB per GPU estimated vs "
            f"{gib(result.hardware.gpu_memory_bytes):.2f} GiB; the script will likely run out of memory",
            file=stream,
        )
    elif row.fits is not True:  # short of host RAM, or host RAM unknown: the row's fit note names it with figures
        verdict = "does not fit in host RAM" if row.fits is False else "fits only if the host RAM allows"
        print(f"  ! {row.title} {verdict}: {row.fit_note}", file=stream)
    print(f"\nWrote {', '.join(str(p) for p in written)}", file=stream)
    if removed:
        print(
            f"Removed {', '.join(str(p) for p in removed)} (written by an earlier --emit; not part of this job)",
            file=stream,
        )
    for path in left:
        print(f"Left your edited {path} in place: this job does not use it (delete it if it is stale)", file=stream)
    for path, kept in edited:
        if path.name in written_before:
            print(f"Kept your edited {path.name} as {kept} (it changed since advisor wrote it)", file=stream)
        else:
            print(f"Kept your own {path.name} as {kept} (advisor did not write it)", file=stream)
    where = shlex.quote(out_dir.rstrip("/") or "/")
    print(f"Run: cd {where} && {launch_command_for(job)}   (or: bash {where}/launch.sh)", file=stream)


def verify_dir(emit: str | None) -> str | None:
    """Where ``--verify`` runs: beside the emitted job, in ``--emit DIR``/verify (the run is this machine's variant of
    the job: on CPU fp32, a small micro-batch and CPU ranks; the job to keep stays in DIR), else ``advisor-runs/``."""
    return str(Path(emit) / "verify") if emit else None


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
        out_dir=verify_dir(args.emit),
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
        f"Verify {outcome.strategy} on {outcome.world_size} {outcome.device} rank(s), {_verify_steps(outcome)}; "
        "peak allocated per rank:",
        file=stream,
    )
    assert outcome.relative_error is not None, "a completed run measured a peak"
    size = _peak_unit(outcome)
    for r in outcome.per_rank:
        assert r["relative_error"] is not None, "every rank measured a peak"
        print(
            f"  rank {r['rank']}: measured {size(r['measured_peak_bytes'])}, estimated "
            f"{size(r['estimated_peak_bytes'])}, error {100 * r['relative_error']:+.1f}%",
            file=stream,
        )
    verdict = "within" if outcome.within_tolerance else "OUTSIDE"
    print(
        f"  worst error {100 * outcome.relative_error:+.1f}% ((estimate - measured) / measured: below 0 the run used "
        f"more than estimated; {verdict} the {100 * 0.25:.0f}% tolerance); log and files: {outcome.log_dir}",
        file=stream,
    )
    line = step_time_line(outcome)
    if line:
        print(f"  {line}", file=stream)
    return outcome


def _peak_unit(outcome: VerifyResult) -> Callable[[int], str]:
    """How the per-rank peaks are shown: GiB with 3 decimals, or MiB with 1 where every figure is below 1 GiB (a
    small model's 0.002 GiB hid a 10% difference); one unit for all ranks."""
    figures = [r[k] for r in outcome.per_rank for k in ("measured_peak_bytes", "estimated_peak_bytes")]
    if figures and max(figures) < 2**30:
        return lambda n: f"{n / 2**20:.1f} MiB"
    return lambda n: f"{gib(n):.3f} GiB"


def _verify_steps(outcome: VerifyResult) -> str:
    """What the run's steps were: "11 steps: 6 measured for memory (loss a -> b), then 5 timed with the memory meter
    off" (the progress lines count all of them)."""
    losses = f"(loss {outcome.losses[0]:.3f} -> {outcome.losses[-1]:.3f})"
    if not outcome.timing_steps:
        return f"{outcome.steps} steps measured for memory {losses}"
    return (
        f"{outcome.steps + outcome.timing_steps} steps: {outcome.steps} measured for memory {losses}, then "
        f"{outcome.timing_steps} timed with the memory meter off"
    )


def package_version() -> str:
    """advisor's version: the installed distribution's (``importlib.metadata``), else ``advisor.__version__``
    (a checkout used without installing it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("advisor")
    except PackageNotFoundError:
        from . import __version__

        return __version__


SUBCOMMANDS = ("check", "doctor", "cache", "calibrate", "page")


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "check":
        from .check.cli import main as check_main

        return check_main(argv)
    if name == "cache":
        from .cache_face import main as cache_main

        return cache_main(argv)
    if name == "calibrate":
        from .calibrate_face import main as calibrate_main

        return calibrate_main(argv)
    if name == "page":
        from .page.launch import main as page_main

        return page_main(argv)
    from .doctor import main as doctor_main

    return doctor_main(argv)


def _warn_unwritable_cache() -> None:
    """One stderr line when the cache directory cannot take a file: the cache skips I/O failures silently, so
    without it every run would trace again with no word why."""
    from .cache import cache_dir
    from .cache_face import unusable_reason, write_problem

    directory = cache_dir()
    problem = unusable_reason(directory) or write_problem(directory)
    if problem:
        print(
            f"advisor: ! {problem}: nothing is cached, so every run traces its model again; set ADVISOR_CACHE_DIR "
            "to a writable directory (or pass --no-cache)",
            file=sys.stderr,
        )


def _plan_face(argv: list[str]) -> int:
    """Plan, print, and --emit / --verify as asked; raises AdvisorError on bad input."""
    from strategies import get_strategy, runnable_names

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
    validate_run(run, runnable_names())
    run = _check_run_flags(run)
    if run.strategy and not get_strategy(run.strategy).pinned(inputs.training):  # before minutes of planning
        raise AdvisorError(f"--strategy {run.strategy} is the pipeline row: add --pp-degree N (short: --pp N)")
    if run.emit or run.verify:
        from .applied_options import unscripted_error

        if why := unscripted_error(inputs.training):  # before minutes of planning
            raise AdvisorError(why)
    from .document import plan_to_dict
    from .plan import plan

    if inputs.use_cache:
        _warn_unwritable_cache()
    result = plan(inputs)
    if run.emit and run.strategy and not result.row(run.strategy).applicable:  # before pages of a plan
        raise AdvisorError(f"--strategy {run.strategy} does not apply here: {result.row(run.strategy).reason}")
    if (run.emit or run.verify) and run.strategy and (why := result.row(run.strategy).estimate_only):
        # a row sized and timed only has no script to write or run: say so before pages of a plan
        raise AdvisorError(f"cannot {'verify' if run.verify else 'emit'} {run.strategy}: {why}")
    doc = plan_to_dict(result) if run.json else None
    if not run.json:
        print(render_text(result, run.strategy))
    code = 0
    if run.emit:  # the job as planned; --verify runs this machine's variant of it in DIR/verify
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
    ``check``, ``doctor``, ``cache``, ``calibrate`` and ``page`` as the first argument hand the rest to their own faces.
    Never contacts a model hub (``HF_HUB_OFFLINE=1``; set here, at the entry point, not on import)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # advisor prints its own warnings
    quiet_library_logs()
    collect_garbage_less_often()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    return run_face(lambda: _plan_face(_no_misspelt_subcommand(argv)))


def _no_misspelt_subcommand(argv: list[str]) -> list[str]:
    """``argv`` unchanged, unless its first word is not a model advisor knows but nearly a subcommand's name
    (``advisor calibrat``): then an ``AdvisorError`` naming the subcommand, rather than "unknown model"."""
    import difflib

    if not argv or argv[0].startswith("-"):
        return argv
    close = difflib.get_close_matches(argv[0].lower(), SUBCOMMANDS, n=1, cutoff=0.75)
    if close and argv[0].lower() != close[0]:
        from .models import known_model_names

        if argv[0] not in known_model_names():
            raise AdvisorError(f"unknown model {argv[0]!r}: did you mean the subcommand `advisor {close[0]}`?")
    return argv


if __name__ == "__main__":
    sys.exit(main())
