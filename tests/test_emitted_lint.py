"""Every emitted train.py is lint-clean: ruff's default rules (`ruff check --isolated`, ruff pinned in the test
extra) and `advisor check` with no findings, for every model family x strategy x fine-tuning mode (full, LoRA,
QLoRA where it applies), and the modes that write code of their own (pure bf16, HSDP with the gradient sync on the
last micro-step, offload); every script carries only the code of its own mode."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.check import check_source
from advisor.errors import AdvisorError
from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies import get_strategy, strategy_names
from strategies.render import render_files
from tests.shared import computed_once

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "small_llama.json")
LLAMA = dict(config_path=TINY, seq_len=32, interconnect="nvlink", micro_batch_size=2)
CASES = {
    "llama-fp32": dict(LLAMA, gpus=4, tp_degree=2, precision="fp32"),
    "llama-lora": dict(LLAMA, gpus=2, precision="bf16", lora_rank=4),
    "llama-qlora": dict(LLAMA, gpus=2, precision="bf16", lora_rank=4, quantize="nf4"),
    "llama-pure-bf16": dict(LLAMA, gpus=2, precision="pure-bf16", host_mem_gib=64),
    "llama-hsdp": dict(
        LLAMA, gpus=2, nodes=2, precision="bf16", global_batch_size=16, fsdp_grad_sync="last-micro-step"
    ),
    # the pinned pipeline row (--pp-degree): PP x DP in fp32 under 1F1B, pure bf16 under GPipe
    "llama-pp": dict(LLAMA, gpus=4, precision="fp32", pp_degree=2),
    "llama-pp-pure-bf16": dict(LLAMA, gpus=2, precision="pure-bf16", pp_degree=2, pp_schedule="gpipe"),
    # selective checkpointing: torchtitan's op policy (its save list copied in) and layer policy (CHECKPOINT_EVERY)
    "llama-sac-op": dict(LLAMA, gpus=2, precision="bf16", selective_checkpointing="op"),
    "resnet18-sac-layer": dict(model="resnet18", gpus=2, precision="fp32", selective_checkpointing="layer"),
    # chunked cross-entropy: advisor.chunked_ce's ChunkedCrossEntropy copied in (not into TP's script)
    "llama-chunked-ce": dict(LLAMA, gpus=2, precision="bf16", chunked_cross_entropy=4),
    # the optimizer step in backward: one optimizer per parameter in its gradient's hook (the single-GPU script)
    "llama-in-backward": dict(LLAMA, gpus=1, precision="bf16", optimizer_in_backward=True),
    "resnet18": dict(model="resnet18", gpus=2, precision="fp32"),
    "resnet18-lora": dict(model="resnet18", gpus=2, precision="fp32", lora_rank=4, lora_targets="fc"),
    "factory": dict(model_factory="tests.fixtures.factories:small_cnn", image_size=16, gpus=2, precision="fp32"),
}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> dict[str, str]:
    """case-strategy -> train.py for every applicable strategy of every case (rendered once per run:
    tests/test_script_shape.py reads the same, tests/shared.py)."""
    return computed_once("emitted-train-py", _render_every_case)


def _render_every_case() -> dict[str, str]:
    scripts = {}
    for case, inputs in CASES.items():
        p = plan(plan_inputs(detect_hardware=False, **inputs), device="cpu")
        for strategy in (r.name for r in p.rows if r.name in strategy_names() or r.estimate_only is None):
            if not p.row(strategy).applicable:
                continue
            refused = dict(get_strategy(strategy).unscripted_options)
            flag = next((f for f in refused if inputs.get(f.removeprefix("--").replace("-", "_"))), None)
            if flag:  # the option the plan sizes but this strategy's script does not write: one line
                with pytest.raises(AdvisorError, match=f"^{flag}: the {strategy} script {re.escape(refused[flag])}"):
                    render_files(p, strategy)
                continue
            scripts[f"{case}-{strategy}"] = render_files(p, strategy)["train.py"]
    return scripts


def test_every_family_strategy_and_mode_is_emitted(emitted):
    # Each family's scripts exist for the strategies that apply to it (TP needs a TP-capable transformer).
    for needed in (
        "llama-fp32-tp_dp",
        "llama-fp32-zero3",
        "llama-lora-fsdp2",
        "llama-qlora-ddp",
        "resnet18-fsdp2",
        "resnet18-lora-zero2",
        "factory-ddp",
        "llama-fp32-single",
        "llama-pp-pp",
        "llama-pp-pure-bf16-pp",
    ):
        assert needed in emitted, sorted(emitted)
    assert len(emitted) >= 40, len(emitted)


def test_each_script_carries_only_its_own_mode(emitted):
    """The code of other modes is not written: the pure-bf16 cast, ZeRO-3's zero.Init and gathered export, the CPU
    offload, HSDP's 2-D mesh and FSDP2's last-micro-step sync each appear in the scripts of that mode alone."""
    zero3 = ("zero3", "zero3_offload")
    fsdp2_rows = ("fsdp2", "fsdp2_noreshard", "fsdp2_offload", "hsdp")
    marks = {
        "model.to(torch.bfloat16)": lambda n: "pure-bf16" in n and "zero" not in n,  # DeepSpeed casts itself
        # transformers only, and not a quantized base (from_pretrained builds those whole)
        "deepspeed.zero.Init": lambda n: n.endswith(zero3) and n.startswith("llama") and "qlora" not in n,
        "def load_quantized_base": lambda n: "qlora" in n and not n.endswith(zero3),
        # the full weights (a QLoRA script exports the adapters alone: no merged export)
        "_zero3_consolidated_16bit_state_dict": lambda n: n.endswith(zero3) and "qlora" not in n,
        "# offload: the optimizer steps in host memory": lambda n: n.endswith("offload"),
        "CPUOffloadPolicy": lambda n: n.endswith("fsdp2_offload"),
        "REPLICATE_DEGREE": lambda n: n.endswith("-hsdp"),
        # several accumulation micro-steps and --fsdp-grad-sync last-micro-step: FSDP2's rows of that case
        "set_requires_gradient_sync": lambda n: n.removeprefix("llama-hsdp-") in fsdp2_rows,
        'PRECISION == "pure-bf16"': lambda n: False,
        # DeepSpeed starts its own process group and steps through its engine; the pipeline (bf16 and fp32 only: no
        # fp16, no GradScaler) steps its optimizer itself, after its stages' gradient exchanges
        "def init_torchrun": lambda n: "zero" not in n and "single" not in n,
        "run.scaler.step(run.optimizer)": lambda n: (
            "zero" not in n and not n.endswith("-pp") and not n.startswith("llama-in-backward-")
        ),
        # the op policy's save list and context, the layer policy's count: in their own scripts alone
        "SAVE_OP_NAMES": lambda n: n.startswith("llama-sac-op-"),
        "create_selective_checkpoint_contexts": lambda n: n.startswith("llama-sac-op-"),
        "CHECKPOINT_EVERY = 2": lambda n: n.startswith("resnet18-sac-layer-"),
        # the chunked loss: its slices' count and the per-slice loss function, in its own scripts alone
        "CE_CHUNKS = 4": lambda n: n.startswith("llama-chunked-ce-"),
        "class ChunkedCrossEntropy": lambda n: n.startswith("llama-chunked-ce-"),
        "class OptimizerInBackward": lambda n: n.startswith("llama-in-backward-"),
        "clip_grad_norm_": lambda n: not n.startswith("llama-in-backward-") and "zero" not in n,
        # stepping in backward clips nothing: the docstring says so, and no clipping constant is written
        "no gradient clipping\n": lambda n: n.startswith("llama-in-backward-"),
        "MAX_GRAD_NORM = 1.0": lambda n: not n.startswith("llama-in-backward-"),
    }
    for mark, owner in marks.items():
        have = sorted(name for name, text in emitted.items() if mark in text)
        want = sorted(name for name in emitted if owner(name))
        assert have == want, (mark, have, want)
    assert any(n.endswith("hsdp") for n in emitted) and any(n.endswith("offload") for n in emitted), sorted(emitted)


def test_ruff_default_rules_find_nothing(emitted, tmp_path):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: it is in the test extra (bash scripts/setup.sh --dev)")
    for name, text in emitted.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(text)
    done = subprocess.run(
        [ruff, "check", "--isolated", "--output-format", "concise", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_advisor_check_finds_nothing(emitted):
    findings = {name: check_source(text, f"{name}/train.py") for name, text in emitted.items()}
    assert {name: f for name, f in findings.items() if f} == {}


def test_a_fine_tuning_rate_from_fresh_weights_is_flagged(emitted):
    """Full fine-tuning scripts start from fresh weights unless --init-from is given, at the fine-tuning rate
    (2e-5): the docstring says training from scratch wants more and where to set it; LoRA (2e-4, always on a base)
    and the CNNs (their own rates) say nothing of it."""
    note = "from fresh weights training wants more"
    for name, text in emitted.items():
        doc = text.split('"""')[1]
        full_transformer = name.startswith("llama-") and "lora" not in name
        assert (note in doc) == full_transformer, name
