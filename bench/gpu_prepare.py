"""The CPU half of the GPU truth run: plan each case for one H200 here, emit its script, and write what the GPU
machine needs to run it and compare (``python -m bench.gpu prepare --out bench/gpu_cases``).

One folder per case: the emitted files (``train.py``, ``launch.sh``, ``ds_config.json`` for ZeRO), the plan's JSON
(``plan.json``, the ``--json`` document) and ``expected.json`` (``CaseSpec``): the estimate, the command that runs the
script through the measurement probe (placeholders ``{python}``, ``{probe}``, ``{port}`` filled in there), the
packages beyond torch the script imports, and the seconds budgeted for it. The folder ignores itself (a
``.gitignore`` of ``*``): it is carried to the GPU machine, not committed.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from advisor.choices import LauncherKind

from .cases import Case

if TYPE_CHECKING:
    from advisor.plan import Plan

GPU_PRESET = "H200-141GB"  # the lent machine's GPU (the device tool's KINDS.md: one NVIDIA H200, 141 GB)
LLAMA_1B = "llama-3.2-1b"  # the preset copies meta-llama/Llama-3.2-1B's config.json; the scripts embed it, no hub
STEPS = 15  # optimizer steps per case: memory over all of them, step time the median after WARMUP_STEPS
OFFLOAD_STEPS = 8  # offload cases step on the CPU (about 1 s a step predicted for the 1B model): fewer steps
WARMUP_STEPS = 2  # advisor.verify.WARMUP_STEPS: steps left out of the measured step time
# The packages a generated script may import beyond torch, and whether the lent machine has them (KINDS.md's
# package list, 2026-11-17: transformers 5.17 and peft are there; deepspeed and bitsandbytes are not).
OPTIONAL_PACKAGES = ("transformers", "peft", "deepspeed", "bitsandbytes", "torchvision")
# Budget per case, seconds: start-up before the first step (interpreter, ``import torch, transformers``: 8.8 s with
# deepspeed on this project's CPU machines, ENGINEERING_NOTES; the model built on the CPU and moved; CUDA and NCCL
# set-up; the deepspeed launcher starts a second interpreter), then the steps at STEP_MARGIN x the predicted step
# time (the time model's LLM errors reach +42% against held-back runs). These are allowances for the run's
# schedule, not model constants: each result records its wall time, so the next schedule can use those.
STARTUP_S = {LauncherKind.PYTHON: 30.0, LauncherKind.TORCHRUN: 35.0, LauncherKind.DEEPSPEED: 50.0}
STEP_MARGIN = 3.0
STAND_IN_BASE_S = 20.0  # QLoRA without --init-from first saves a random base and loads it quantized (5 GB for 1B)
TIMEOUT_FACTOR = 2.5  # a case is stopped at this x its budget (and never after the whole run's deadline)
_PORT = 29555  # a placeholder port, replaced by ``{port}`` in the command
_PROBE_OPTS = ("--measured-steps",)


def _lm(model: str, seq: int, strategy: str, mb: int, steps: int = STEPS, adapter: str = "") -> Case:
    """A world-size-1 bf16 AdamW case; ``adapter``: "" (full fine-tuning), "lora" (rank 16 on peft's default targets
    for the architecture: q_proj, v_proj; c_attn) or "qlora" (the same over an nf4 base with double quantization,
    the QLoRA paper's recipe)."""
    return Case(
        model=model,
        seq_len=seq,
        strategy=strategy,
        world=1,
        micro_batch=mb,
        precision="bf16",
        steps=steps,
        lora_rank=16 if adapter else None,
        quantize="nf4" if adapter == "qlora" else None,
        double_quant=adapter == "qlora",
    )


# In run order, most telling first: the 1B model (GEMM-bound at seq 2048, micro-batch 4) under each family of
# strategy, then the variants that repeat one (DDP at one rank is single plus a wrapper, ZeRO-1 is ZeRO-2's
# memory), then gpt2 at its longest sequence (1024) and micro-batch 8. A case whose packages are missing there is
# skipped at no cost, so without deepspeed and bitsandbytes the torch-only cases run in the same order; the schedule
# skips any case whose budget no longer fits before the deadline.
CASES: tuple[Case, ...] = (
    _lm(LLAMA_1B, 2048, "single", 4),
    _lm(LLAMA_1B, 2048, "fsdp2", 4),
    _lm(LLAMA_1B, 2048, "zero2", 4),
    _lm(LLAMA_1B, 2048, "zero3", 4),
    _lm(LLAMA_1B, 2048, "single", 4, adapter="lora"),
    _lm(LLAMA_1B, 2048, "single", 4, adapter="qlora"),
    _lm(LLAMA_1B, 2048, "zero3_offload", 4, steps=OFFLOAD_STEPS),
    _lm(LLAMA_1B, 2048, "ddp", 4),
    _lm(LLAMA_1B, 2048, "zero1", 4),
    _lm(LLAMA_1B, 2048, "zero2_offload", 4, steps=OFFLOAD_STEPS),
    _lm(LLAMA_1B, 2048, "fsdp2_offload", 4, steps=OFFLOAD_STEPS),
    _lm("gpt2", 1024, "single", 8),
    _lm("gpt2", 1024, "fsdp2", 8),
    _lm("gpt2", 1024, "ddp", 8),
    _lm("gpt2", 1024, "single", 8, adapter="lora"),
    _lm("gpt2", 1024, "zero2", 8),
    _lm("gpt2", 1024, "zero3", 8),
    _lm("gpt2", 1024, "single", 8, adapter="qlora"),
)


class Expected(TypedDict):
    """The plan's figures for the case on one GPU of the preset: bytes and seconds. ``peak_reserved_bytes``: the
    allocated peak plus the plan's fragmentation allowance (its device total less the CUDA context and the
    communicator, which ``torch.cuda.max_memory_reserved`` does not count)."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_total_bytes: int
    step_s: float | None
    mfu: float | None
    peak_phase: str
    attention: str
    breakdown_bytes: dict[str, int]


class CaseSpec(TypedDict):
    """``expected.json``: one case as the GPU half reads it (``bench.gpu_run``)."""

    case_id: str
    order: int
    case: dict[str, object]  # ``Case.as_dict``
    strategy: str
    model: str
    gpu_preset: str
    launch: str  # the line a user runs (the strategy's launcher)
    advisor_command: str  # the advisor command that plans and emits the same script (with its default --steps)
    argv: list[str]  # the probe's command, with {python}, {probe} and {port} to fill in
    steps: int
    measured_steps: int
    warmup_steps: int
    needs: list[str]  # packages beyond torch the script imports
    budget_s: float
    timeout_s: float
    estimate: Expected


def script_imports(text: str) -> list[str]:
    """The packages of ``OPTIONAL_PACKAGES`` a script imports anywhere (top level or inside functions), in that
    order. ``text``: Python source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return [p for p in OPTIONAL_PACKAGES if p in found]


def needs_for(case: Case, script: str) -> list[str]:
    """The packages beyond torch the case needs: what its script imports, and bitsandbytes for a quantized base
    (peft and transformers load it themselves, ``BitsAndBytesConfig``, so the script need not import it)."""
    needs = script_imports(script)
    if case.quantize and "bitsandbytes" not in needs:
        needs.append("bitsandbytes")
    return needs


def probe_argv(launcher_argv: Callable[..., list[str]], steps: int, probe_path: str) -> list[str]:
    """The command that runs ``train.py`` through the probe for ``steps`` steps (memory measured over all of them,
    no evaluation, no checkpoint), as ``Launcher.verify_argv`` builds it, with this machine's interpreter, probe and
    port replaced by ``{python}``, ``{probe}`` and ``{port}`` (the deepspeed launcher as ``python -m
    deepspeed.launcher.runner``)."""
    script_args = ["--steps", str(steps), "--out", "out", "--eval-every", "0", "--save-every", "0", "--no-save"]
    argv = launcher_argv(1, _PORT, script_args, probe=[_PROBE_OPTS[0], str(steps)])
    deepspeed_exe = str(Path(sys.executable).parent / "deepspeed")
    out: list[str] = []
    for token in argv:
        if token == deepspeed_exe:
            out += ["{python}", "-m", "deepspeed.launcher.runner"]
        elif token == sys.executable:
            out.append("{python}")
        elif token == probe_path:
            out.append("{probe}")
        else:
            out.append(token.replace(str(_PORT), "{port}"))
    return out


def advisor_command(case: Case, gpu: str, out_dir: str) -> str:
    """The ``python -m advisor ... --emit`` line that plans and emits the same script."""
    v = case.values()
    parts = ["python -m advisor", str(v.get("model") or f"--config {v.get('config_path')}")]
    parts += [f"--gpu {gpu}", f"--gpus {case.world}", f"--seq-len {case.seq_len}", f"--precision {case.precision}"]
    parts += [f"--micro-batch-size {case.micro_batch}", f"--optimizer {case.optimizer}"]
    if case.checkpointing:
        parts.append("--activation-checkpointing")
    if case.lora_rank:
        parts.append(f"--lora-rank {case.lora_rank}")
    if case.lora_targets:
        parts.append(f"--lora-targets {case.lora_targets}")
    if case.quantize:
        parts.append(f"--quantize {case.quantize}")
    if case.double_quant:
        parts.append("--double-quant")
    parts += [f"--strategy {case.strategy}", f"--emit {out_dir}"]
    return " ".join(parts)


def _expected(estimate: dict[str, object], overhead: dict[str, int]) -> Expected:
    peak, total = estimate["peak_allocated_bytes"], estimate["device_total_bytes"]
    step, mfu, breakdown = estimate["step_s"], estimate["mfu"], estimate["breakdown_bytes"]
    assert isinstance(peak, int) and isinstance(total, int) and isinstance(breakdown, dict), "Estimate's types"
    assert step is None or isinstance(step, float), "seconds"
    assert mfu is None or isinstance(mfu, float), "a fraction"
    return {
        "peak_allocated_bytes": peak,
        "peak_reserved_bytes": peak + int(overhead.get("fragmentation", 0)),
        "device_total_bytes": total,
        "step_s": step,
        "mfu": mfu,
        "peak_phase": str(estimate["peak_phase"]),
        "attention": str(estimate["attention"]),
        "breakdown_bytes": {str(k): int(v) for k, v in breakdown.items()},
    }


def budget_s(launcher: LauncherKind, steps: int, step_s: float | None, quantized: bool = False) -> float:
    """Seconds allowed for one case: ``STARTUP_S`` for its launcher (plus ``STAND_IN_BASE_S`` for a quantized base)
    and ``steps`` x ``STEP_MARGIN`` x the predicted step (1 s when the plan has no time)."""
    extra = STAND_IN_BASE_S if quantized else 0.0
    return STARTUP_S[launcher] + extra + steps * STEP_MARGIN * (step_s if step_s else 1.0)


def prepare(
    cases: Iterable[Case], out_dir: Path, gpu: str = GPU_PRESET, say: Callable[[str], None] = print
) -> list[Path]:
    """Plan, emit and describe each case into ``out_dir``/<case id>/; returns the folders in run order. Cases with
    the same inputs but the strategy share one plan.

    Raises:
        AdvisorError: a case the planner refuses, or a strategy that does not apply to it.
    """
    from advisor.document import plan_to_dict
    from advisor.errors import AdvisorError
    from advisor.plan import plan
    from advisor.schema import inputs_from_values
    from strategies import get_strategy
    from strategies.launchers import PROBE
    from strategies.render import job_from_plan, launch_command_for, render_job, write_files

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / ".gitignore").write_text("# bench.gpu prepare's output: carried to the GPU machine, not committed\n*\n")
    plans: dict[str, Plan] = {}
    folders: list[Path] = []
    for order, case in enumerate(cases):
        values = case.values() | {"gpu": gpu}
        key = json.dumps(values, sort_keys=True)
        if key not in plans:
            plans[key] = plan(inputs_from_values(values)[0])
        p = plans[key]
        row = p.row(case.strategy)
        if not row.applicable:
            raise AdvisorError(f"{case.case_id}: {case.strategy} does not apply: {row.reason}")
        unit = get_strategy(case.strategy)
        job = job_from_plan(p, case.strategy, steps=case.steps)
        folder = out_dir / case.case_id
        files = render_job(job)
        write_files(files, folder, force=True)
        doc: dict[str, object] = dict(plan_to_dict(p))
        (folder / "plan.json").write_text(json.dumps(doc, indent=1) + "\n")
        overhead = _device_overhead(doc, case.strategy)
        expected = _expected(dict(job.estimate), overhead)
        budget = budget_s(unit.launcher.name, case.steps, expected["step_s"], case.quantize is not None)
        spec: CaseSpec = {
            "case_id": case.case_id,
            "order": order,
            "case": case.as_dict(),
            "strategy": case.strategy,
            "model": case.model,
            "gpu_preset": gpu,
            "launch": launch_command_for(job),
            "advisor_command": advisor_command(case, gpu, str(folder)),
            "argv": probe_argv(unit.launcher.verify_argv, case.steps, str(PROBE)),
            "steps": case.steps,
            "measured_steps": case.steps,
            "warmup_steps": WARMUP_STEPS,
            "needs": needs_for(case, files["train.py"]),
            "budget_s": round(budget, 1),
            "timeout_s": round(TIMEOUT_FACTOR * budget, 1),
            "estimate": expected,
        }
        (folder / "expected.json").write_text(json.dumps(spec, indent=2) + "\n")
        needs = f" (needs {', '.join(spec['needs'])})" if spec["needs"] else ""
        say(
            f"{case.case_id}: {expected['peak_allocated_bytes'] / 2**30:.2f} GiB allocated, "
            f"{1e3 * (expected['step_s'] or 0):.0f} ms per step, budget {budget:.0f} s{needs}"
        )
        folders.append(folder)
    return folders


def _device_overhead(doc: dict[str, object], strategy: str) -> dict[str, int]:
    """The strategy row's ``device_overhead_bytes`` (CUDA context, communicator, fragmentation) from the plan's
    JSON document; empty when absent."""
    rows = doc.get("strategies")
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("name") == strategy:
            over = row.get("device_overhead_bytes")
            return {str(k): int(v) for k, v in over.items()} if isinstance(over, dict) else {}
    return {}


def read_cases(cases_dir: Path) -> list[CaseSpec]:
    """Every ``expected.json`` under ``cases_dir`` (one folder down), in run order.

    Raises:
        ValueError: a file that is not a case's JSON.
    """
    specs: list[CaseSpec] = []
    for path in sorted(cases_dir.glob("*/expected.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not {"case_id", "argv", "estimate", "budget_s"} <= set(data):
            raise ValueError(f"{path}: not a case description (no case_id, argv, estimate or budget_s)")
        specs.append(data)  # type: ignore[arg-type]
    return sorted(specs, key=lambda s: (s.get("order", 0), s["case_id"]))


def select(cases: Iterable[Case], patterns: list[str]) -> list[Case]:
    """The cases whose id matches any of the regular expressions ``patterns`` (all cases when none is given)."""
    chosen = list(cases)
    if patterns:
        chosen = [c for c in chosen if any(re.search(p, c.case_id) for p in patterns)]
    return chosen
