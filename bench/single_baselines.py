"""Plain single-process CPU training loops, written independently of advisor's generated scripts, against
advisor's estimate for its ``single`` strategy row (one process, no DDP).

Each case runs in a fresh subprocess (``python -m bench.single_baselines --case NAME``, ``OMP_NUM_THREADS=1`` as
``advisor.verify`` launches CPU ranks) so allocator state and library caches do not leak between cases. The loop is
what a user writes: build the model (transformers: ``AutoConfig.for_model`` + ``AutoModelForCausalLM.from_config``
with the attention implementation advisor selects; torchvision: the constructor with ``weights=None``),
``torch.optim.AdamW(model.parameters(), lr=1e-4)`` (torch's CPU default: the single-tensor loop), bf16 =
``torch.autocast("cpu", dtype=torch.bfloat16)`` over fp32 weights, activation checkpointing = transformers'
``gradient_checkpointing_enable(use_reentrant=False)`` or, for torchvision, a non-reentrant
``torch.utils.checkpoint`` wrapper around every block of the repeated-block runs (ResNet's ``layer1..4``, ViT's
``encoder.layers``, as ``advisor/checkpointing.py`` assumes), then 3 steps of forward, backward,
``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.

The peak is advisor's own meter (``advisor.measure.CpuPeakMeter``: profiler memory events), started after
``torch.manual_seed`` and before the model is built, where the generated ``single`` script starts its
``MemoryMeter`` (strategies/templates/single.py ``main()``; the model library is imported inside it there too).
Forward, backward and optimizer step of every step run in ``record_function`` ranges, so the measured figures
per phase sit beside the estimate's breakdown.

The estimate mimics ``advisor.verify.verify``: ``plan(inputs, device="cpu", hardware=run_hardware(1, "cpu", []))``
and its ``single`` row's ``memory.peak`` (trace cache off, so it is the estimator as it is now).

    .venv/bin/python -m bench.single_baselines   # every case -> bench/SINGLE.md + bench/single_baselines.json
    .venv/bin/python -m bench.single_baselines --only gpt2-s128-b2-fp32 --out /tmp/sb
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMALL_LLAMA = ROOT / "tests" / "data" / "small_llama.json"
STEPS = 3
SEED = 1234
THREADS = 1  # advisor.verify_setup.CPU_RANK_THREADS
CASE_TIMEOUT_S = 900
MiB = 2**20
# gpt2 as advisor's preset (and openai-community/gpt2's config.json) sizes it; the rest are transformers' defaults.
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # torchvision name, "gpt2" or "small_llama"
    precision: str  # fp32 | bf16 (autocast over fp32 weights)
    ckpt: bool
    micro_batch: int
    seq_len: int | None = None
    image_size: int | None = None

    @property
    def family(self) -> str:
        return "vision" if self.image_size else "transformer"

    @property
    def shape(self) -> str:
        return f"seq {self.seq_len}" if self.seq_len else f"{self.image_size} px"


def _cases() -> list[Case]:
    out = []
    for model, size, mb in (("resnet18", 64, 8), ("resnet50", 64, 8), ("vit_b_16", 224, 2)):
        for ckpt in (False, True):
            out.append(
                Case(
                    f"{model}-{size}px-b{mb}-fp32" + ("-ckpt" if ckpt else ""), model, "fp32", ckpt, mb, image_size=size
                )
            )
    for seq, ckpt in ((128, False), (256, False), (256, True)):
        out.append(Case(f"gpt2-s{seq}-b2-fp32" + ("-ckpt" if ckpt else ""), "gpt2", "fp32", ckpt, 2, seq_len=seq))
    for precision in ("fp32", "bf16"):
        for ckpt in (False, True):
            out.append(
                Case(
                    f"llama-small-s128-b4-{precision}" + ("-ckpt" if ckpt else ""),
                    "small_llama",
                    precision,
                    ckpt,
                    4,
                    seq_len=128,
                )
            )
    return out


CASES = {c.name: c for c in _cases()}


# ---- advisor's estimate -----------------------------------------------------------------------------------------


def estimate(case: Case) -> dict:
    """The ``single`` row's peak for ``case`` as a CPU verification plans it (``advisor.verify.verify``)."""
    from dataclasses import replace

    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from advisor.verify_setup import run_hardware

    values = dict(
        gpus=1,
        detect_hardware=False,
        precision=case.precision,
        micro_batch_size=case.micro_batch,
        activation_checkpointing=case.ckpt,
        optimizer="adamw",
    )
    if case.model == "small_llama":
        values.update(config_path=str(SMALL_LLAMA), seq_len=case.seq_len)
    elif case.family == "transformer":
        values.update(model=case.model, seq_len=case.seq_len)
    else:
        values.update(model=case.model, image_size=case.image_size)
    inputs = replace(plan_inputs(**values), use_cache=False)
    hw = run_hardware(1, "cpu", [])
    p = plan(inputs, device="cpu", hardware=hw)
    row = p.row("single")
    if not row.applicable:
        raise RuntimeError(f"{case.name}: single not applicable: {row.reason}")
    peak = row.memory.peak
    act = p.profile.activations(p.model_mode)
    return {
        "peak_bytes": int(peak.total),
        "breakdown": peak.as_dict(),
        "phase": peak.phase,
        "num_params": int(p.profile.stats.num_params),
        "buffer_bytes": int(p.profile.stats.buffer_bytes),
        "attention": getattr(act, "attention", None),
        "cpu_conv_scratch_threads": hw.cpu_conv_scratch_threads,
        "precision": p.options.precision,
    }


# ---- the plain loop (runs in the child process) ------------------------------------------------------------------


def _build(case: Case):
    """The model, built as a user would; imports inside, as the generated script's ``build_model()``."""
    import torch

    if case.family == "vision":
        import torchvision

        kwargs = {"image_size": case.image_size} if case.model.startswith("vit_") else {}
        model = getattr(torchvision.models, case.model)(weights=None, num_classes=1000, **kwargs)
        if case.ckpt:
            _checkpoint_blocks(model)
        return model
    import transformers

    cfg = dict(GPT2) if case.model == "gpt2" else json.loads(SMALL_LLAMA.read_text())
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    # advisor selects "sdpa" for every class that supports it (advisor/models/families/transformer.py,
    # attention_implementation); GPT2LMHeadModel and LlamaForCausalLM do.
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    assert all(p.dtype == torch.float32 for p in model.parameters())
    if case.ckpt:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers 5: the deprecated alias of activation_...
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _checkpoint_blocks(model) -> int:
    """Wrap every block of ResNet's layer1..4 / ViT's encoder.layers in a non-reentrant checkpoint."""
    import torch
    import torch.utils.checkpoint

    class Checkpointed(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)

    if hasattr(model, "encoder") and hasattr(model.encoder, "layers"):  # torchvision VisionTransformer
        stacks = [model.encoder.layers]
    else:  # ResNet
        stacks = [model.layer1, model.layer2, model.layer3, model.layer4]
    n = 0
    for seq in stacks:
        for name, block in list(seq.named_children()):
            setattr(seq, name, Checkpointed(block))
            n += 1
    return n


def _batch(case: Case, g):
    import torch

    if case.family == "vision":
        return (
            torch.randn(case.micro_batch, 3, case.image_size, case.image_size, generator=g),
            torch.randint(0, 1000, (case.micro_batch,), generator=g),
        )
    vocab = 50257 if case.model == "gpt2" else json.loads(SMALL_LLAMA.read_text())["vocab_size"]
    return torch.randint(0, vocab, (case.micro_batch, case.seq_len), generator=g), None


def measure(case: Case) -> dict:
    import resource

    import torch
    import torch.nn.functional as F
    from torch.profiler import record_function

    from advisor.measure import CpuPeakMeter

    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    bf16 = case.precision == "bf16"
    losses, step_s = [], []
    t_start = time.perf_counter()
    with CpuPeakMeter() as meter:
        with record_function("build"):
            model = _build(case)
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for i in range(STEPS):
            t0 = time.perf_counter()
            x, target = _batch(case, g)
            with record_function(f"s{i}.forward"):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    if case.family == "vision":
                        loss = F.cross_entropy(model(x), target)
                    else:
                        loss = model(input_ids=x, labels=x).loss
            with record_function(f"s{i}.backward"):
                loss.backward()
            with record_function(f"s{i}.optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.item()))
            del loss, x, target
            step_s.append(time.perf_counter() - t0)
    params = list(model.parameters())
    return {
        "case": case.name,
        "peak_bytes": int(meter.peak_bytes),
        "final_bytes": int(meter.final_bytes),
        "ranges": {k: list(v) for k, v in meter.ranges.items()},
        "losses": losses,
        "step_s": step_s,
        "run_s": time.perf_counter() - t_start,
        "num_params": sum(p.numel() for p in params),
        "largest_param_numel": max(p.numel() for p in params),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "threads": torch.get_num_threads(),
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


# ---- the driver ---------------------------------------------------------------------------------------------------


def run_case(name: str) -> dict:
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(THREADS),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.single_baselines", "--case", name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=CASE_TIMEOUT_S,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"case": name, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    out = json.loads(lines[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def _ranges_summary(ranges: dict) -> dict:
    """Per phase: the largest peak inside it over the steps, and where the peak step is."""
    out = {}
    for phase in ("forward", "backward", "optimizer"):
        rows = [(i, ranges[f"s{i}.{phase}"]) for i in range(STEPS) if f"s{i}.{phase}" in ranges]
        if rows:
            i, (before, peak, after) = max(rows, key=lambda r: r[1][1])
            out[phase] = {"step": i, "before": before, "peak": peak, "after": after}
    return out


def machine() -> dict:
    import torch

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        pass
    isa = "AVX-512" if " avx512f" in flags else ("AVX2" if " avx2" in flags else "no AVX2")
    date = subprocess.run(["date"], capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "isa": isa, "cores": os.cpu_count(), "torch": torch.__version__, "date": date}


def _fmt(n: int) -> str:
    return f"{n / MiB:.1f}"


def render(results: list[dict], info: dict) -> str:
    lines = [
        "# single: plain CPU training loops vs advisor's `single` estimate",
        "",
        "Measured: a plain single-process training loop written in `bench/single_baselines.py` (not advisor's "
        "generated script), one fresh process per case, `OMP_NUM_THREADS=1`, 3 steps of forward / backward / "
        "`AdamW.step()` / `zero_grad(set_to_none=True)`, peak allocated CPU bytes over all steps from "
        "`advisor.measure.CpuPeakMeter` started before the model is built. Estimated: the `single` row of "
        '`plan(..., device="cpu", hardware=run_hardware(1, "cpu", []))`. Error = (estimated - measured) / '
        "measured. MiB = 2**20 bytes.",
        "",
        "| case | precision | act. ckpt | micro-batch | measured MiB | estimated MiB | error % | est. phase | "
        "measured peak phase |",
        "|---|---|---|---|---:|---:|---:|---|---|",
    ]
    errors = []
    for r in results:
        c = CASES[r["case"]]
        if "error" in r:
            lines.append(
                f"| {c.name} | {c.precision} | {'yes' if c.ckpt else 'no'} | {c.micro_batch} | failed | "
                f"| | | {r['error'][:120]} |"
            )
            continue
        err = r["relative_error"]
        errors.append(abs(err))
        lines.append(
            f"| {c.name} | {c.precision} | {'yes' if c.ckpt else 'no'} | {c.micro_batch} | "
            f"{_fmt(r['peak_bytes'])} | {_fmt(r['estimate']['peak_bytes'])} | {100 * err:+.1f} | "
            f"{r['estimate']['phase']} | {r['measured_phase']} |"
        )
    lines.append("")
    if errors:
        lines.append(
            f"Median |error| {100 * statistics.median(errors):.1f}%, worst |error| {100 * max(errors):.1f}% "
            f"over {len(errors)} cases (target: median <= 5%, worst <= 10%)."
        )
    lines += [
        "",
        "## Breakdown (MiB)",
        "",
        "Estimate at its peak phase: params / grads / optimizer states / activations / other. Measured, per "
        "phase, the largest peak inside that phase over the 3 steps (and the live total before it).",
        "",
        "| case | est. params | est. grads | est. optim | est. act. | est. other | meas. fwd peak (before) | "
        "meas. bwd peak (before) | meas. opt peak (before) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            continue
        b, ph = r["estimate"]["breakdown"], r["phases"]

        def cell(p):
            return f"{_fmt(ph[p]['peak'])} ({_fmt(ph[p]['before'])})" if p in ph else ""

        lines.append(
            f"| {r['case']} | {_fmt(b['params'])} | {_fmt(b['grads'])} | {_fmt(b['optimizer_states'])} | "
            f"{_fmt(b['activations'])} | {_fmt(b['other'])} | {cell('forward')} | {cell('backward')} | "
            f"{cell('optimizer')} |"
        )
    lines += [
        "",
        "## Machine",
        "",
        f"* CPU: {info['cpu']} ({info['isa']}, {info['cores']} cores visible; each case runs 1 thread)",
        f"* torch {info['torch']}",
        f"* date: {info['date']}",
        f"* wall time of the whole run: {info['wall_s']:.0f} s",
        "",
        "Reproduce:",
        "",
        "```bash",
        ".venv/bin/python -m bench.single_baselines",
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", help=argparse.SUPPRESS)  # child: run one case, print one JSON line
    ap.add_argument("--only", help="comma-separated case names (default: all)")
    ap.add_argument("--out", default=str(ROOT / "bench"), help="directory for SINGLE.md and single_baselines.json")
    ap.add_argument("--list", action="store_true", help="print the case names")
    args = ap.parse_args(argv)
    if args.case:
        print(json.dumps(measure(CASES[args.case])), flush=True)
        return 0
    if args.list:
        print("\n".join(CASES))
        return 0
    names = args.only.split(",") if args.only else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; --list shows them")
    t0 = time.perf_counter()
    results = []
    for name in names:
        r = run_case(name)
        if "error" not in r:
            est = estimate(CASES[name])
            r["estimate"] = est
            r["relative_error"] = (est["peak_bytes"] - r["peak_bytes"]) / r["peak_bytes"]
            r["phases"] = _ranges_summary(r["ranges"])
            at_peak = [p for p, v in r["phases"].items() if v["peak"] == r["peak_bytes"]]
            r["measured_phase"] = at_peak[0] if at_peak else "build"
            print(
                f"{name}: measured {_fmt(r['peak_bytes'])} MiB ({r['measured_phase']}), estimated "
                f"{_fmt(est['peak_bytes'])} MiB ({est['phase']}): {100 * r['relative_error']:+.1f}%  "
                f"[{r['process_s']:.0f} s]",
                flush=True,
            )
        else:
            print(f"{name}: FAILED {r['error']}", flush=True)
        results.append(r)
    info = machine()
    info["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = render(results, info)
    (out / "SINGLE.md").write_text(text)
    (out / "single_baselines.json").write_text(
        json.dumps(
            {
                "machine": info,
                "steps": STEPS,
                "threads": THREADS,
                "cases": [asdict(CASES[r["case"]]) for r in results],
                "results": results,
            },
            indent=1,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
