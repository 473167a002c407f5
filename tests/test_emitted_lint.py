"""Every emitted train.py is lint-clean: ruff's default rules (`ruff check --isolated`, ruff pinned in the test
extra) and `advisor check` with no findings, for every model family x strategy x fine-tuning mode (full, LoRA,
QLoRA where it applies). The precision changes only constants in a script (its code paths are chosen when it runs),
so one precision per mode covers it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.check import check_source
from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies import strategy_names
from strategies.render import render_files

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "small_llama.json")
LLAMA = dict(config_path=TINY, seq_len=32, interconnect="nvlink", micro_batch_size=2)
CASES = {
    "llama-fp32": dict(LLAMA, gpus=4, tp_degree=2, precision="fp32"),
    "llama-lora": dict(LLAMA, gpus=2, precision="bf16", lora_rank=4),
    "llama-qlora": dict(LLAMA, gpus=2, precision="bf16", lora_rank=4, quantize="nf4"),
    "resnet18": dict(model="resnet18", gpus=2, precision="fp32"),
    "resnet18-lora": dict(model="resnet18", gpus=2, precision="fp32", lora_rank=4, lora_targets="fc"),
    "factory": dict(model_factory="tests.fixtures.factories:small_cnn", image_size=16, gpus=2, precision="fp32"),
}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> dict[str, str]:
    """case-strategy -> train.py for every applicable strategy of every case."""
    scripts = {}
    for case, inputs in CASES.items():
        p = plan(plan_inputs(detect_hardware=False, **inputs), device="cpu")
        for strategy in strategy_names():
            if p.row(strategy).applicable:
                scripts[f"{case}-{strategy}"] = render_files(p, strategy)["train.py"]
    return scripts


def test_every_family_strategy_and_mode_is_emitted(emitted):
    # Each family's scripts exist for the strategies that apply to it (TP needs a TP-capable transformer).
    for needed in ("llama-fp32-tp_dp", "llama-fp32-zero3", "llama-lora-fsdp2", "llama-qlora-ddp", "resnet18-fsdp2",
                   "resnet18-lora-zero2", "factory-ddp", "llama-fp32-single"):
        assert needed in emitted, sorted(emitted)
    assert len(emitted) >= 40, len(emitted)


def test_ruff_default_rules_find_nothing(emitted, tmp_path):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: it is in the test extra (bash scripts/setup.sh --dev)")
    for name, text in emitted.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(text)
    done = subprocess.run([ruff, "check", "--isolated", "--output-format", "concise", "."], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_advisor_check_finds_nothing(emitted):
    findings = {name: check_source(text, f"{name}/train.py") for name, text in emitted.items()}
    assert {name: f for name, f in findings.items() if f} == {}
