"""Every strategy's script starts from the same weights (issue 25): the small Llama emitted for 2 ranks with one
SEED, one optimizer step of the same 4 samples each (2 ranks x 2 or 1 rank x 2 x 2 accumulation), run as a user
runs them (launch line, no measurement probe). The first step's loss is a forward pass of those 4 samples through
the initial weights, so it is equal only if the initial weights are."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from advisor.plan import plan
from advisor.processes import free_port
from advisor.schema import plan_inputs
from advisor.verify import remove_deepspeed_shm
from strategies import get_strategy
from strategies.render import render_files, write_files

ROOT = Path(__file__).resolve().parents[1]
SMALL_LLAMA = str(ROOT / "tests" / "data" / "small_llama.json")
STRATEGIES = ["single", "ddp", "fsdp2", "tp", "zero2", "zero3"]
pytestmark = pytest.mark.slow


def _first_loss(out: Path, strategy: str, p) -> float:
    """Emit ``strategy`` into ``out``, run one step on the CPU and return the loss its step log prints (4
    decimals)."""
    write_files(render_files(p, strategy), out)
    launcher = get_strategy(strategy).launcher
    port = free_port()
    cmd = launcher.verify_argv(
        1 if strategy == "single" else 2, port, ["--steps", "1", "--eval-every", "0", "--no-save", "--out", "out"]
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **dict(launcher.cpu_env))
    try:
        proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        remove_deepspeed_shm(port)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{strategy}: {log[-3000:]}"
    found = re.findall(r"^step 1/1 loss (\d+\.\d+)", proc.stdout, re.MULTILINE)
    assert len(found) == 1, f"{strategy}: {proc.stdout[-2000:]}"
    return float(found[0])


@pytest.fixture(scope="module")
def first_loss(tmp_path_factory):
    """``first_loss(strategy)``: that strategy's first loss, each strategy run once for the whole module."""
    inputs = plan_inputs(
        config_path=SMALL_LLAMA,
        seq_len=32,
        gpus=2,
        interconnect="nvlink",
        detect_hardware=False,
        precision="fp32",
        micro_batch_size=2,
        base_lr=2e-3,
        base_batch_size=8,
        global_batch_size=4,
    )
    p, found = plan(inputs), {}

    def get(strategy: str) -> float:
        if strategy not in found:
            found[strategy] = _first_loss(tmp_path_factory.mktemp(strategy), strategy, p)
        return found[strategy]

    return get


# ZeRO-3 builds the model under deepspeed.zero.Init, which partitions each module's parameters as its constructor
# ends: transformers' init (post_init, _init_weights) then writes the empty partitions, and the model keeps torch's
# constructor init (measured after the build: embedding std 1.0000, layer 0's q_proj 0.0361, where transformers
# draws std 0.02). Left for a later change (issue 25's report).
ZERO3_INIT = pytest.mark.xfail(strict=True, reason="zero.Init: transformers' _init_weights writes empty partitions")


@pytest.mark.parametrize(
    "strategy", [pytest.param(s, marks=ZERO3_INIT) if s == "zero3" else s for s in STRATEGIES if s != "ddp"]
)
def test_first_loss_equals_ddps(first_loss, strategy):
    """The step log prints 4 decimals: equal initial weights give figures at most one last digit apart (fp32, 4
    samples; only the order of the sums differs between strategies, by far less than that digit); different ones
    differ by more (FSDP2's per-rank seeds: 7.6499 against DDP's 7.6504; ZeRO-3's constructor-only init 7.7542)."""
    mine, ddp = first_loss(strategy), first_loss("ddp")
    assert abs(mine - ddp) <= 1.01e-4, f"{strategy} {mine} vs ddp {ddp}"


def test_zero3_runs_as_a_user_launches_it(first_loss):
    """Launched without the measurement probe (which imports transformers first), the ZeRO-3 script used to import
    transformers' Llama code inside zero.Init and fail (torch._dynamo's polyfill of torch.Tensor's constructor)."""
    assert 7.0 < first_loss("zero3") < 8.5  # ln(vocab 2048) = 7.6 at the start
