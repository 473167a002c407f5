"""Generated scripts fine-tune for real: a tiny pretrained Llama (save_pretrained into a temp directory, with a
tokenizer trained here) on a local text file, 2 ranks on CPU, for DDP, ZeRO-2, ZeRO-3 and TP; a torchvision model
from a local state_dict on a generated ImageFolder (DDP). No download: everything is made in the test.

Each run is shared by its assertions: the first loss is the pretrained model's on the same batches (the weights
were loaded), the loss falls, evaluation on the held-out split ran, the saved weights load into the plain model."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies import get_strategy
from strategies.render import render_files, write_files
from tests.emitted import load_train_py

ROOT = Path(__file__).resolve().parents[1]
SEQ_LEN = 32
STEPS = 4
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny Llama with random weights and a word-level tokenizer, saved as a user's pretrained directory, and a
    text file of short sentences in its vocabulary."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("pretrained")
    cfg = json.loads((ROOT / "tests" / "data" / "small_llama.json").read_text())
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    model.save_pretrained(root / "base")
    rng = random.Random(0)
    words = "the cat dog sat ran on under a mat log big small red blue and then".split()
    lines = [" ".join(rng.choice(words) for _ in range(12)) + " ." for _ in range(600)]
    (root / "train.txt").write_text("\n".join(lines))
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>").save_pretrained(
        root / "base"
    )
    return root


def _load_script(path: Path):
    return load_train_py(path, f"generated_{path.parent.name}")


def _run_script(job_dir: Path, strategy: str, *script_args: str, steps: int = STEPS) -> dict:
    """Run the emitted train.py on 2 CPU ranks with its strategy's launcher for ``steps`` optimizer steps, through
    advisor's measurement probe; returns the probe's report."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    launcher = get_strategy(strategy).launcher
    env.update(dict(launcher.cpu_env))
    port = 29600 + sum(map(ord, strategy)) % 200
    argv = launcher.verify_argv(2, port, [*script_args, "--steps", str(steps), "--out", "out"], probe=[])
    done = subprocess.run(argv, cwd=job_dir, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((job_dir / "out" / "report.json").read_text())


def _emit(tmp_path_factory, strategy: str, **inputs) -> Path:
    job_dir = tmp_path_factory.mktemp(strategy)
    p = plan(
        plan_inputs(
            gpus=2,
            interconnect="nvlink",
            detect_hardware=False,
            precision="fp32",
            micro_batch_size=2,
            base_lr=2e-3,
            base_batch_size=8,
            global_batch_size=8,
            **inputs,
        ),
        device="cpu",
    )
    write_files(render_files(p, strategy), job_dir, force=True)
    return job_dir


def _first_step_loss(script, dataset, model, world: int, accum: int) -> float:
    """The first optimizer step's mean loss as the script computes it (every rank's first ``accum`` micro-batches,
    in its DistributedSampler order), with ``model`` in eval mode."""
    losses = []
    model.eval()
    for rank in range(world):
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=True, seed=script.DATA_SEED, drop_last=True
        )
        sampler.set_epoch(0)
        order = list(sampler)
        for micro in range(accum):
            idx = order[micro * script.MICRO_BATCH_SIZE : (micro + 1) * script.MICRO_BATCH_SIZE]
            batch = torch.utils.data.default_collate([dataset[i] for i in idx])
            with torch.no_grad():
                losses.append(script.compute_loss(model, batch, torch.device("cpu")).item())
    return sum(losses) / len(losses)


LM_STRATEGIES = ["ddp", "zero2", "zero3", "tp"]


def _data_args(pretrained: Path) -> list[str]:
    """Fine-tune from the tiny pretrained model on the text file; evaluate and checkpoint every 2 steps, keeping both
    checkpoints (the resume test continues from the first)."""
    return [
        "--init-from",
        str(pretrained / "base"),
        "--data",
        str(pretrained / "train.txt"),
        "--eval-every",
        "2",
        "--save-every",
        "2",
        "--keep-checkpoints",
        "2",
    ]


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory, pretrained):
    """strategy -> (strategy, job directory, report) of one fine-tuning run, made on first use and shared."""
    runs = {}

    def get(strategy: str):
        if strategy not in runs:
            job_dir = _emit(
                tmp_path_factory, strategy, config_path=str(pretrained / "base" / "config.json"), seq_len=SEQ_LEN
            )
            runs[strategy] = strategy, job_dir, _run_script(job_dir, strategy, *_data_args(pretrained))
        return runs[strategy]

    return get


@pytest.fixture(params=LM_STRATEGIES)
def lm_run(request, lm_runs):
    return lm_runs(request.param)


def test_fine_tuning_starts_from_the_pretrained_weights(lm_run, pretrained):
    import transformers

    strategy, job_dir, report = lm_run
    script = _load_script(job_dir / "train.py")
    args = argparse.Namespace(data=str(pretrained / "train.txt"), tokenizer=None, init_from=str(pretrained / "base"))
    train, held_out = script.load_real_dataset(args)
    assert len(train) > 10 * len(held_out) > 0 and train[0]["input_ids"].shape == (SEQ_LEN,)
    base = transformers.LlamaForCausalLM.from_pretrained(pretrained / "base", dtype=torch.float32)
    expected = _first_step_loss(
        script,
        train,
        base,
        report["world_size"] // script.TP_DEGREE if hasattr(script, "TP_DEGREE") else report["world_size"],
        report["gradient_accumulation_steps"],
    )
    first = report["per_rank"][0]["losses"][0]
    # A fresh init of the same config gives a different loss: the weights were loaded, not re-drawn.
    assert first == pytest.approx(expected, rel=1e-4), (strategy, first, expected)
    losses = report["per_rank"][0]["losses"]
    assert len(losses) == STEPS and losses[-1] < losses[0], losses
    # Evaluated every 2 steps and after the last, on the held-out blocks, as the same figure on every rank.
    assert [step for step, _ in report["eval_losses"]] == [2, 4]
    assert all(0 < loss < losses[0] for _, loss in report["eval_losses"]), report["eval_losses"]


def test_fine_tuned_weights_load_into_the_plain_model(lm_run, pretrained):
    import transformers

    strategy, job_dir, report = lm_run
    exported = job_dir / "out" / "model"
    # A Hugging Face directory: safetensors weights, the config, and the tokenizer of --init-from.
    assert (exported / "model.safetensors").exists() and (exported / "tokenizer.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
    assert type(model) is transformers.LlamaForCausalLM
    state = model.state_dict()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert (
        tokenizer("hello")["input_ids"]
        == transformers.AutoTokenizer.from_pretrained(pretrained / "base")("hello")["input_ids"]
    )
    # The exported model is the trained one: its loss on the first micro-batch is the probe's figure for the
    # model in memory at the end of training (ZeRO exports DeepSpeed's 16-bit module weights: fp32 here).
    script = _load_script(job_dir / "train.py")
    args = argparse.Namespace(data=str(pretrained / "train.txt"), tokenizer=None, init_from=str(pretrained / "base"))
    train, _ = script.load_real_dataset(args)
    batch = torch.utils.data.default_collate([train[i] for i in range(script.MICRO_BATCH_SIZE)])
    model.eval()
    with torch.no_grad():
        loss = script.compute_loss(model, batch, torch.device("cpu")).item()
    assert loss == pytest.approx(report["per_rank"][0]["final_eval_loss"], rel=1e-4), strategy
    # Trained: the weights moved away from the pretrained ones.
    pretrained_state = transformers.LlamaForCausalLM.from_pretrained(pretrained / "base").state_dict()
    assert not torch.equal(
        state["model.layers.0.self_attn.q_proj.weight"].float(),
        pretrained_state["model.layers.0.self_attn.q_proj.weight"],
    )
    if strategy == "zero3":
        # ZeRO-3 loaded through zero.Init: every rank held only its partition of the parameters.
        for rank in report["per_rank"]:
            assert rank["local_param_numel"] <= rank["full_param_numel"] // 2 + 1024, rank


@pytest.fixture(scope="module")
def vision_run(tmp_path_factory):
    """resnet18 at 32 px from a local state_dict, on a generated ImageFolder (2 classes of 24 PNGs), DDP."""
    import torchvision
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = torch.Generator().manual_seed(0)
    for label, shade in (("dark", 40), ("light", 215)):
        (root / "data" / label).mkdir(parents=True)
        for i in range(24):
            pixels = (torch.rand((32, 32, 3), generator=rng) * 40 + shade - 20).clamp(0, 255).to(torch.uint8)
            Image.fromarray(pixels.numpy()).save(root / "data" / label / f"{i}.png")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), root / "resnet18.pt")
    job_dir = _emit(tmp_path_factory, "ddp", model="resnet18", image_size=32)
    report = _run_script(
        job_dir, "ddp", "--init-from", str(root / "resnet18.pt"), "--data", str(root / "data"), "--eval-every", "2"
    )
    return job_dir, root, report


def test_vision_fine_tuning_reads_an_image_folder(vision_run):
    import torchvision

    job_dir, root, report = vision_run
    script = _load_script(job_dir / "train.py")
    train, held_out = script.load_real_dataset(argparse.Namespace(data=str(root / "data")))
    # 48 images, 5% held out (seeded), the rest trained on; samples are the dicts the loop reads.
    assert (len(train), len(held_out)) == (46, 2)
    sample = train[0]
    assert sample["x"].shape == (3, 32, 32) and sample["target"] in (0, 1)
    assert [step for step, _ in report["eval_losses"]] == [2, 4]
    state = torch.load(job_dir / "out" / "model.pt", map_location="cpu", weights_only=True)
    torchvision.models.resnet18().load_state_dict(state)
    # The run started from the state_dict: 4 steps moved conv1 a little from the saved weights (relative distance
    # about 0.05), where a fresh init (another seed) lies a whole norm away (about 1.4).
    saved = torch.load(root / "resnet18.pt", weights_only=True)["conv1.weight"]
    moved = float((state["conv1.weight"] - saved).norm() / saved.norm())
    assert 0 < moved < 0.3, moved


def test_data_without_a_tokenizer_says_what_to_pass(tmp_path_factory, pretrained):
    job_dir = _emit(tmp_path_factory, "single", config_path=str(pretrained / "base" / "config.json"), seq_len=SEQ_LEN)
    done = subprocess.run(
        [sys.executable, "train.py", "--data", str(pretrained / "train.txt"), "--steps", "1"],
        cwd=job_dir,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--data needs a tokenizer: pass --tokenizer DIR" in done.stderr
    # launch.sh's check before it starts the ranks says it too (it said the options were good)
    check = subprocess.run(
        [sys.executable, "train.py", "--data", str(pretrained / "train.txt"), "--check-args"],
        cwd=job_dir,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert check.returncode == 2 and "--data needs a tokenizer" in check.stderr, (check.returncode, check.stderr)


@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_resume_continues_with_the_same_losses(strategy, lm_runs, pretrained, tmp_path_factory):
    """Continue the uninterrupted run's step-2 checkpoint with --resume: the same losses for steps 3 and 4."""
    import shutil

    _, job_dir, uninterrupted_report = lm_runs(strategy)
    resume_dir = tmp_path_factory.mktemp(f"{strategy}-resume")
    for name in ("train.py", "data.py", "ds_config.json"):
        if (job_dir / name).exists():
            shutil.copy(job_dir / name, resume_dir / name)
    saved = job_dir / "out" / "checkpoints"
    # (DeepSpeed also writes its zero_to_fp32.py converter beside its checkpoints)
    assert sorted(p.name for p in saved.iterdir() if p.name.startswith(("step-", "latest"))) == [
        "latest",
        "step-2",
        f"step-{STEPS}",
    ]
    assert (saved / "latest").read_text() == f"step-{STEPS}"
    shutil.copytree(saved / "step-2", resume_dir / "out" / "checkpoints" / "step-2")
    (resume_dir / "out" / "checkpoints" / "latest").write_text("step-2")
    report = _run_script(resume_dir, strategy, *_data_args(pretrained), "--resume")
    assert (resume_dir / "out" / "checkpoints" / "latest").read_text() == f"step-{STEPS}"
    uninterrupted = uninterrupted_report["per_rank"][0]["losses"]
    resumed = report["per_rank"][0]["losses"]
    assert len(resumed) == STEPS - 2
    if strategy == "ddp":  # fp32 DDP: the same arithmetic in the same order, bit for bit
        assert resumed == uninterrupted[2:]
    else:
        assert resumed == pytest.approx(uninterrupted[2:], rel=1e-6)
    assert [step for step, _ in report["eval_losses"]] == [STEPS]
    assert report["eval_losses"][0][1] == pytest.approx(uninterrupted_report["eval_losses"][-1][1], rel=1e-6)


def test_resume_past_the_last_step_says_so(lm_runs, pretrained):
    _, job_dir, _ = lm_runs("ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    argv = get_strategy("ddp").launcher.verify_argv(
        2, 29913, [*_data_args(pretrained), "--resume", "--steps", "3", "--out", "out"]
    )
    done = subprocess.run(argv, cwd=job_dir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert f"is at step {STEPS} and --steps is 3: raise --steps to train further" in done.stdout + done.stderr


def test_sigterm_saves_a_checkpoint_and_exits_0(lm_runs, pretrained):
    """SIGTERM to every rank (what SLURM's --signal does before the time limit): the ranks agree at the next step
    boundary, save that step and exit 0; --resume then continues from it."""
    import signal
    import time

    _, job_dir, _ = lm_runs("ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    argv = get_strategy("ddp").launcher.verify_argv(
        2, 29911, [*_data_args(pretrained), "--steps", "100000", "--save-every", "0", "--out", "sigterm"]
    )
    proc = subprocess.Popen(argv, cwd=job_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("step 3/"):
                break
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, (workers, lines[-20:])
        for pid in workers:
            os.kill(int(pid), signal.SIGTERM)
        lines += proc.stdout.readlines()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            time.sleep(1)
    log = "".join(lines)
    assert rc == 0, log[-3000:]
    latest = (job_dir / "sigterm" / "checkpoints" / "latest").read_text()
    step = int(latest.removeprefix("step-"))
    assert step >= 3 and f"SIGTERM: stopped after step {step} with a checkpoint" in log, log[-3000:]
    assert (job_dir / "sigterm" / "checkpoints" / latest / "training-state-rank1.pt").exists()
