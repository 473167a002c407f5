"""``python -m advisor MODEL [options]``: a thin argparse face over ``advisor.plan.plan``; plus two
subcommands with their own faces: ``check`` (advisor.check.cli) and ``doctor`` (advisor.doctor).

Examples:
    python -m advisor resnet50 --gpus 4
    python -m advisor llama-2-7b --gpus 8 --gpu A100-80GB --activation-checkpointing
    python -m advisor --config my/config.json --gpus 8 --json
    python -m advisor check train.py            # multi-GPU pitfalls in your own script
    python -m advisor doctor --ckpt-dir ckpt/   # pre-flight checks of this machine
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Sequence

from .errors import AdvisorError
from .faces import OneLineParser, finite_float, positive_float, positive_int, run_face
from .memory import OPTIMIZERS, PRECISIONS
from .options import ATTENTION_CHOICES, TrainingOptions
from .units import fmt_count, gib

VERIFY_STEPS, VERIFY_TIMEOUT_S = 6, 600.0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="advisor", description="Per-GPU memory, parallel strategy and a verified training script "
                "for PyTorch training. Sizes are per GPU; GiB = 2**30 bytes.",
                epilog="Subcommands: 'advisor check FILE.py ...' finds single-to-multi-GPU pitfalls in your own "
                "training script (read as a syntax tree, never run); 'advisor doctor' runs the pre-flight "
                "checks of this machine (GPUs, driver, NCCL/gloo, a 2-rank all-reduce, port, directories). "
                "Each has --help.")
    p.add_argument("model", nargs="?", help="torchvision name (resnet50, vit_b_16, ...), transformer preset "
                   "(gpt2, llama-2-7b, ...) or Hugging Face repo id alias; see --list-models")
    src = p.add_argument_group("model source")
    src.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (parsed as JSON only)")
    src.add_argument("--model-factory", metavar="MOD:FN", help="import MOD and call FN() -> nn.Module (your code)")
    src.add_argument("--seq-len", type=positive_int, help="tokens per sample (default min(model max, 2048))")
    src.add_argument("--image-size", type=positive_int, help="image side in pixels (default 224)")
    src.add_argument("--input-shape", metavar="C,H,W", help="per-sample input shape of a --model-factory model "
                     "(default 3,224,224; float inputs, loss = mean square of the output)")
    src.add_argument("--list-models", action="store_true", help="list the known model names and exit")
    tr = p.add_argument_group("training")
    tr.add_argument("--micro-batch-size", type=positive_int,
                    help="samples per GPU per step (default 1 for transformers, 32 for vision)")
    tr.add_argument("--global-batch-size", type=positive_int,
                    help="micro-batch x data-parallel size x accumulation steps (default: no accumulation)")
    tr.add_argument("--precision", choices=PRECISIONS, default=None,
                    help="bf16/fp16: mixed precision; fp32; pure-bf16 (default bf16; --verify on CPU: fp32)")
    tr.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    tr.add_argument("--activation-checkpointing", action="store_true", help="recompute blocks in backward")
    tr.add_argument("--attention", choices=ATTENTION_CHOICES, default="auto",
                    help="attention kernel to model (auto: what the target GPU runs)")
    tr.add_argument("--tp-degree", type=positive_int, help="tensor-parallel degree (default: GPUs per node)")
    tr.add_argument("--safety-factor", type=finite_float, default=1.2,
                    help="multiplier for the 16-bytes-per-parameter rule of thumb, 1.0-2.0 (default 1.2)")
    tr.add_argument("--base-lr", type=positive_float, help="learning rate tuned at --base-batch-size")
    tr.add_argument("--base-batch-size", type=positive_int, help="global batch the base LR was tuned at")
    hw = p.add_argument_group("hardware (default: detected GPUs, else the A100-80GB preset)")
    hw.add_argument("--gpus", type=positive_int, help="GPUs per node")
    hw.add_argument("--nodes", type=positive_int, default=1, help="number of nodes (default 1)")
    hw.add_argument("--gpu", metavar="PRESET", help="GPU preset: A100-40GB, A100-80GB, H100-80GB, H200-141GB, "
                    "V100-16GB, V100-32GB, A10G-24GB, L4-24GB, RTX3090, RTX4090, T4-16GB")
    hw.add_argument("--gpu-mem", type=positive_float, metavar="GIB", help="usable GPU memory, GiB (nvidia-smi MiB/1024)")
    hw.add_argument("--host-mem", type=positive_float, metavar="GIB", help="host RAM per node, GiB (default: detected)")
    hw.add_argument("--interconnect", choices=("nvlink", "pcie"), help="link between GPUs in a node")
    hw.add_argument("--network", help="link between nodes: ib-ndr, ib-hdr, ib-edr, 400gbe, 200gbe, 100gbe, 25gbe, "
                    "10gbe, 1gbe")
    run = p.add_argument_group("scripts and verification")
    run.add_argument("--strategy", help="strategy for --emit/--verify (default: the recommended one): "
                     "ddp, zero1, zero2, zero3, zero2_offload, zero3_offload, tp, tp_dp")
    run.add_argument("--emit", metavar="DIR", help="write train.py, launch.sh (and ds_config.json) into DIR "
                     "(with --verify: the run's directory; default advisor-runs/MODEL-STRATEGY-TIME)")
    run.add_argument("--force", action="store_true", help="let --emit overwrite its own files in a non-empty DIR")
    run.add_argument("--verify", action="store_true", help="run the script here and compare measured peaks")
    run.add_argument("--steps", type=positive_int, help=f"optimizer steps for --verify (default {VERIFY_STEPS})")
    run.add_argument("--timeout", type=positive_float, help=f"seconds before --verify gives up (default {VERIFY_TIMEOUT_S:g})")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON document (schema in README)")
    out.add_argument("--compare", action="store_true", help="also show DeepSpeed's own model-state estimates")
    return p


def _inputs(args: argparse.Namespace):
    from .plan import PlanInputs

    training = TrainingOptions(
        precision=args.precision or "bf16", optimizer=args.optimizer, micro_batch_size=args.micro_batch_size,
        global_batch_size=args.global_batch_size, activation_checkpointing=args.activation_checkpointing,
        attention=args.attention, tp_degree=args.tp_degree, safety_factor=args.safety_factor,
        base_lr=args.base_lr, base_batch_size=args.base_batch_size)
    return PlanInputs(model=args.model, config_path=args.config, model_factory=args.model_factory,
                      input_shape=_shape(args.input_shape, args.model_factory),
                      seq_len=args.seq_len, image_size=args.image_size, training=training, gpu=args.gpu,
                      gpu_mem_gib=args.gpu_mem, gpus=args.gpus, nodes=args.nodes, interconnect=args.interconnect,
                      network=args.network, host_mem_gib=args.host_mem, compare=args.compare)


def _shape(text: str | None, factory: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    if not factory:
        raise AdvisorError("--input-shape applies to --model-factory models only")
    try:
        dims = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise AdvisorError(f"--input-shape must be comma-separated integers like 3,224,224, got {text[:40]!r}")
    if not dims or len(dims) > 5 or any(not 1 <= d <= 65536 for d in dims):
        raise AdvisorError(f"--input-shape needs 1-5 dimensions between 1 and 65536, got {text[:40]!r}")
    return dims


def _g(n: int | None) -> str:
    return "-" if n is None else f"{gib(n):.2f}"


def render_text(p) -> str:
    """The human-readable report: inputs, a breakdown table (GiB), the recommendation."""
    spec, st, hw, o = p.spec, p.profile.stats, p.hardware, p.options
    mode = "fp32" if o.precision == "fp32" else "half" if o.precision == "pure-bf16" else "autocast"
    act = p.profile.activations(mode)
    shape = f"seq-len {spec.seq_len}" if spec.is_transformer else f"input {'x'.join(map(str, spec.input_shape))}"
    lines = [
        f"Model      {spec.name} ({spec.source})",
        f"           {fmt_count(st.num_params)} parameters ({st.num_params:,}; trainable {st.num_trainable:,}), "
        f"{shape}, {p.profile.flops_per_sample(mode) / 1e9:.1f} GFLOP/sample fwd+bwd, "
        f"activations {gib(act.activation_bytes_per_sample):.3f} GiB/sample",
        f"Hardware   {hw.num_gpus} x {hw.gpu_name} ({hw.gpus_per_node} per node x {hw.num_nodes} node(s)), "
        f"{gib(hw.gpu_memory_bytes):.2f} GiB usable each [{hw.sources.get('gpu_memory_bytes')}], "
        f"{hw.interconnect} [{hw.sources.get('interconnect')}]"
        + (f", network {hw.network} [{hw.sources.get('network')}]" if hw.network else "")
        + f", host RAM {gib(hw.host_mem_bytes):.0f} GiB/node [{hw.sources.get('host_mem_bytes')}]",
        f"Training   {o.precision}, {o.optimizer}, micro-batch {o.micro_batch_size}/GPU, "
        f"activation checkpointing {'on' if o.activation_checkpointing else 'off'}, attention {act.attention}, "
        f"rule-of-thumb safety factor {o.safety_factor}",
        "",
        "Per-GPU memory, GiB (peak allocated = sum of the components; device total adds CUDA context, NCCL, "
        "fragmentation)",
    ]
    head = (f"{'strategy':<15}{'params':>8}{'grads':>8}{'optim':>8}{'activ':>8}{'buffers':>8}{'other':>8}"
            f"{'peak':>8}{'device':>8}  {'fits':<5}{'16B/p':>8}{'max mb':>7}{'GA':>4}  {'peak in':<10}host/node")
    lines += [head, "-" * len(head)]
    for r in p.rows:
        if not r.applicable:
            lines.append(f"{r.name:<15}n/a: {r.reason}")
            continue
        b, m = r.memory.peak, r.memory
        rule = f"{gib(r.rule_of_thumb_bytes):.1f}{'' if r.rule_of_thumb_fits else '!'}"
        lines.append(f"{r.name:<15}{_g(b.params):>8}{_g(b.grads):>8}{_g(b.optimizer_states):>8}"
                     f"{_g(b.activations):>8}{_g(b.buffers):>8}{_g(b.other):>8}{_g(b.total):>8}"
                     f"{_g(m.device_total):>8}  {'yes' if r.fits else 'NO':<5}{rule:>8}{r.max_micro_batch_size:>7}"
                     f"{r.grad_accum_steps:>4}  {_short_phase(b.phase):<10}"
                     f"{_g(m.host_bytes_per_node) if m.host_bytes_per_node else '-'}")
        if r.deepspeed_estimate:
            de = r.deepspeed_estimate
            lines.append(f"{'':<15}DeepSpeed's estimator (model states only): {_g(de['gpu_bytes'])} GiB/GPU, "
                         f"{_g(de['host_bytes_per_node'])} GiB host/node")
    lines.append("16B/p: 16 bytes/parameter x safety factor, sharded per strategy ('!' = over the GPU memory)")
    lines.append("peak in: the moment of the step with the largest total (fwd, bwd, bwd-end: gradient reduction, "
                 "step; step-flat: DeepSpeed flattening the gradients for the optimizer)")
    if o.precision in ("bf16", "fp16"):
        lines.append(f"DDP/TP activ or other include autocast's {o.precision} copies of the weights (cached until the "
                     "forward ends, kept for backward; about 2 bytes per parameter); ZeRO keeps 16-bit weights, so "
                     "it has none")
    rec = p.recommendation
    lines.append("")
    if rec.strategy:
        lines.append(f"Recommendation: {p.row(rec.strategy).title} ({rec.strategy})")
    else:
        lines.append("Recommendation: none - nothing fits this hardware")
    lines += [f"  - {reason}" for reason in rec.reasons]
    for w in p.warnings + rec.warnings:
        lines.append(f"  ! {w}")
    launch = _launch_line(p)
    if launch:
        lines += ["", f"Launch: {launch}"]
    return "\n".join(lines)


def _short_phase(phase: str) -> str:
    """A strategy's phase label (``Breakdown.phase``) in the table's few characters."""
    for prefix, short in (("forward", "fwd"), ("backward", "bwd"), ("end of backward", "bwd-end"),
                          ("optimizer step (flatten)", "step-flat"), ("optimizer step", "step")):
        if phase.startswith(prefix):
            return short
    return phase[:9]


def _launch_line(p) -> str | None:
    if not p.recommendation.strategy:
        return None
    try:
        from strategies.render import launch_command
    except ImportError:
        return None
    return launch_command(p, p.recommendation.strategy)


def _check_run_flags(args: argparse.Namespace) -> None:
    """--strategy/--emit/--force/--verify/--steps/--timeout: together or refused; fills the verify defaults."""
    from strategies import STRATEGY_NAMES

    if args.strategy is not None and args.strategy not in STRATEGY_NAMES:
        raise AdvisorError(f"--strategy must be one of {', '.join(STRATEGY_NAMES)}, got {args.strategy!r}")
    if args.strategy and not (args.emit or args.verify):
        raise AdvisorError("--strategy chooses what --emit/--verify produce: add --emit DIR or --verify")
    if args.force and not args.emit:
        raise AdvisorError("--force only applies to --emit DIR")
    if args.emit is not None and not args.emit.strip():
        raise AdvisorError("--emit needs a directory path")
    if args.emit:  # before minutes of planning, not after
        from strategies.render import check_emit_dir

        check_emit_dir(args.emit, args.force)
    for flag in ("steps", "timeout"):
        if getattr(args, flag) is not None and not args.verify:
            raise AdvisorError(f"--{flag} applies to --verify only: add --verify or drop --{flag}")
    args.steps = VERIFY_STEPS if args.steps is None else args.steps
    args.timeout = VERIFY_TIMEOUT_S if args.timeout is None else args.timeout
    if args.steps > 10_000:
        raise AdvisorError(f"--steps must be between 1 and 10000, got {args.steps}")
    if args.timeout > 7 * 86400:
        raise AdvisorError(f"--timeout is in seconds, at most a week ({7 * 86400}), got {args.timeout:g}")


def _emit(result, args: argparse.Namespace) -> None:
    from strategies.render import job_from_plan, launch_command_for, render_job, write_files

    name = args.strategy or result.recommendation.strategy
    if name is None:
        raise AdvisorError("nothing fits, so there is no recommended strategy to emit: pass --strategy NAME")
    job = job_from_plan(result, name)
    written = write_files(render_job(job), args.emit, force=args.force)
    stream = sys.stderr if args.json else sys.stdout
    row = result.row(name)
    if not row.fits:
        print(f"  ! {row.title} does not fit: {gib(row.memory.device_total):.2f} GiB per GPU estimated vs "
              f"{gib(result.hardware.gpu_memory_bytes):.2f} GiB; the script will likely run out of memory", file=stream)
    print(f"\nWrote {', '.join(str(p) for p in written)}", file=stream)
    where = shlex.quote(args.emit.rstrip("/") or "/")
    print(f"Run: cd {where} && {launch_command_for(job)}   (or: bash {where}/launch.sh)", file=stream)


def _verify(inputs, args: argparse.Namespace):
    from .verify import verify

    def progress(msg: str) -> None:
        print(f"[verify] {msg}", file=sys.stderr, flush=True)

    outcome = verify(inputs, args.strategy, steps=args.steps, timeout_s=args.timeout, out_dir=args.emit,
                     force=args.force, precision_explicit=args.precision is not None, progress=progress)
    stream = sys.stderr if args.json else sys.stdout
    print("", file=stream)
    for note in outcome.notes:
        print(f"  ! {note}", file=stream)
    if not outcome.ok:
        print(f"Verify FAILED ({outcome.strategy}, {outcome.device}): {outcome.message}", file=stream)
        return outcome
    print(f"Verify {outcome.strategy} on {outcome.world_size} {outcome.device} rank(s), {outcome.steps} steps "
          f"(loss {outcome.losses[0]:.3f} -> {outcome.losses[-1]:.3f}); peak allocated per rank:", file=stream)
    for r in outcome.per_rank:
        print(f"  rank {r['rank']}: measured {gib(r['measured_peak_bytes']):.3f} GiB, estimated "
              f"{gib(r['estimated_peak_bytes']):.3f} GiB, error {100 * r['relative_error']:+.1f}%", file=stream)
    verdict = "within" if outcome.within_tolerance else "OUTSIDE"
    print(f"  worst error {100 * outcome.relative_error:+.1f}% ({verdict} the {100 * 0.25:.0f}% tolerance); "
          f"log and files: {outcome.log_dir}", file=stream)
    return outcome


SUBCOMMANDS = ("check", "doctor")


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "check":
        from .check.cli import main as check_main

        return check_main(argv)
    from .doctor import main as doctor_main

    return doctor_main(argv)


def _plan_face(argv: list[str]) -> int:
    """Plan, print, and --emit / --verify as asked; raises AdvisorError on bad input."""
    args = build_parser().parse_args(argv)
    if args.list_models:
        from .models import known_model_names

        names = known_model_names()
        print(json.dumps(names, indent=2) if args.json else "\n".join(names))
        return 0
    from .plan import plan, plan_to_dict

    _check_run_flags(args)
    inputs = _inputs(args)
    result = plan(inputs)
    doc = plan_to_dict(result) if args.json else None
    if not args.json:
        print(render_text(result))
    code = 0
    if args.emit and not args.verify:  # --verify writes into --emit DIR itself
        _emit(result, args)
    if args.verify:
        outcome = _verify(inputs, args)
        code = 0 if outcome.ok else 1
        if doc is not None:
            doc["verify"] = outcome.to_dict()
    if doc is not None:
        print(json.dumps(doc, indent=2))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry. Returns the exit code: 0 answered (even "nothing fits"), 2 bad input.
    ``check`` and ``doctor`` as the first argument hand the rest to their own faces."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    return run_face(lambda: _plan_face(argv))


if __name__ == "__main__":
    sys.exit(main())
