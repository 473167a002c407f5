"""Emitted scripts as a user runs them: resuming with a larger --steps (the LR carries on, it does not jump back up),
``bash launch.sh`` with a bad option (one line, exit code 2, no launcher started) and ``--emit --force`` into a
folder an earlier --emit wrote (its stale files go, the user's stay)."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies.emit_manifest import MANIFEST, read_manifest, stale_files
from strategies.render import render_files, write_files
from tests.emitted import load_train_py

ROOT = Path(__file__).resolve().parents[1]
CNN = dict(model_factory="tests.fixtures.factories:small_cnn", image_size=16, detect_hardware=False, precision="fp32")
CNN_FLAGS = ["--model-factory", "tests.fixtures.factories:small_cnn", "--image-size", "16", "--precision", "fp32"]


@pytest.fixture(scope="module")
def cnn_plan():
    """A small CNN planned on 2 GPUs (single, DDP, ZeRO and FSDP2 rows apply), micro-batch 2."""
    return plan(plan_inputs(gpus=2, micro_batch_size=2, **CNN), device="cpu")


@pytest.fixture(scope="module")
def script(cnn_plan, tmp_path_factory):
    """The single-process train.py of ``cnn_plan``, imported (its helpers are called directly)."""
    folder = tmp_path_factory.mktemp("single")
    write_files(render_files(cnn_plan, "single"), folder)
    return load_train_py(folder / "train.py", "generated_single_lr")


# --- whole accumulation windows -----------------------------------------------------------------------------------
def test_an_epochs_remainder_is_not_carried_into_the_next_step(script, tmp_path, monkeypatch):
    """An epoch of 2 x GRAD_ACCUM_STEPS + 1 micro-batches: every optimizer step sums exactly GRAD_ACCUM_STEPS
    micro-batches (the remainder was carried into the next epoch's first step, which summed one more: a new user
    read it in the loop)."""
    ga = script.GRAD_ACCUM_STEPS
    assert ga > 1
    monkeypatch.setattr(script, "NUM_SAMPLES", script.MICRO_BATCH_SIZE * (2 * ga + 1))
    per_step = []

    class Counting(script.StepLog):
        def end_step(self, lr, grad_norm=None):  # noqa: ANN001, ANN202
            per_step.append(self._count)
            super().end_step(lr, grad_norm)

    monkeypatch.setattr(script, "StepLog", Counting)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["train.py", "--steps", "5", "--eval-every", "0", "--save-every", "0",
                                      "--no-save", "--out", str(out)])  # fmt: skip
    script.main()
    assert per_step == [ga] * 5


# --- the LR schedule on --resume --------------------------------------------------------------------------------
def test_fresh_schedule_warms_up_then_reaches_the_floor_at_the_last_step(script):
    s = script.lr_schedule(100)
    assert s == {"warmup": 10, "start": 10, "start_factor": 1.0, "total": 100}  # WARMUP_STEPS = 100 // 10
    lr = script.LR
    assert script.lr_at(0, s) == pytest.approx(lr / 10) and script.lr_at(9, s) == pytest.approx(lr)
    # cosine from LR at step 10 to 10% of LR at step 99: half-way (step 54.5) at 0.55 x LR
    assert script.lr_at(54, s) == pytest.approx(lr * (0.1 + 0.45 * (1 + math.cos(math.pi * 44 / 89))))
    assert script.lr_at(99, s) == pytest.approx(0.1 * lr)


def test_resuming_a_finished_run_with_more_steps_stays_at_the_floor(script):
    """Stopped at 100/100 (0.1 x LR) and resumed with --steps 200: the cosine over 200 steps from the start would
    give 0.1 + 0.45 x (1 + cos(pi x 90 / 189)) = 0.584 x LR at step 100; the resumed run stays at 0.1 x LR."""
    old = script.lr_schedule(100)
    new = script.lr_schedule(200)
    assert script.lr_at(100, new) == pytest.approx(0.584 * script.LR, abs=1e-3 * script.LR)  # the jump, unfixed
    script.resume_lr_schedule(new, dict(old), 100, script.lr_at(100, old))
    assert [script.lr_at(s, new) for s in (100, 150, 199)] == pytest.approx([0.1 * script.LR] * 3)


def test_resuming_mid_run_with_more_steps_decays_from_where_it_stopped(script):
    """Checkpoint at step 50 of 100, resumed with --steps 201: step 50 keeps the old run's LR, then a cosine from it
    down to the floor at step 200 (half-way at step 125)."""
    old, new = script.lr_schedule(100), script.lr_schedule(201)
    script.resume_lr_schedule(new, dict(old), 50, script.lr_at(50, old))
    f = 0.1 + 0.45 * (1 + math.cos(math.pi * 40 / 89))  # the old run's factor at step 50
    assert script.lr_at(50, new) == pytest.approx(f * script.LR)
    assert script.lr_at(125, new) == pytest.approx((0.1 + (f - 0.1) * 0.5) * script.LR)
    assert script.lr_at(200, new) == pytest.approx(0.1 * script.LR)
    lrs = [script.lr_at(s, new) for s in range(50, 201)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))
    # resumed again with the same --steps: the same schedule, not a new cosine from step 125
    again = script.lr_schedule(201)
    script.resume_lr_schedule(again, dict(new), 125, script.lr_at(125, new))
    assert again == new


def test_resuming_during_the_warmup_finishes_it(script):
    old, new = script.lr_schedule(100), script.lr_schedule(300)
    script.resume_lr_schedule(new, dict(old), 3, script.lr_at(3, old))
    assert script.lr_at(3, new) == pytest.approx(0.4 * script.LR) and script.lr_at(10, new) == pytest.approx(script.LR)
    assert script.lr_at(299, new) == pytest.approx(0.1 * script.LR)


def test_a_checkpoint_without_a_saved_schedule_still_resumes(script):
    """Checkpoints written before the schedule was saved have only the LR scheduler's last LR: the resumed run
    starts from it and decays to the floor at the new --steps."""
    new = script.lr_schedule(200)
    script.resume_lr_schedule(new, None, 100, 0.1 * script.LR)
    assert script.lr_at(100, new) == pytest.approx(0.1 * script.LR)
    assert script.lr_at(199, new) == pytest.approx(0.1 * script.LR)
    warming = script.lr_schedule(200)
    script.resume_lr_schedule(warming, None, 4, 0.5 * script.LR)
    assert warming == script.lr_schedule(200)  # within the warmup: it goes on


def _lrs(log: str) -> dict[int, str]:
    """Step -> the LR its log line shows (``step N/T loss L lr X ...``)."""
    return {int(m[1]): m[2] for m in re.finditer(r"^step (\d+)/\d+ loss \S+ lr (\S+)", log, re.MULTILINE)}


def _train(folder: Path, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the model factory is tests.fixtures.factories
    done = subprocess.run(
        [sys.executable, "train.py", "--eval-every", "0", "--out", "o", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_resume_with_more_steps_logs_the_old_runs_next_lr_then_decays_to_the_floor(cnn_plan, tmp_path):
    """Run 8 steps with checkpoints at 4 and 8, resume the step-4 one with --steps 12: step 5 logs the LR the
    8-step run used at its step 5, the LR never rises, and step 12 runs at the floor (10% of LR)."""
    files = render_files(cnn_plan, "single")
    write_files(files, tmp_path)
    lr = next(
        ast.literal_eval(n.value)
        for n in ast.parse(files["train.py"]).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "LR"
    )
    first = _lrs(_train(tmp_path, "--steps", "8", "--save-every", "4", "--keep-checkpoints", "2"))
    (tmp_path / "o" / "checkpoints" / "latest").write_text("step-4")
    resumed = _lrs(_train(tmp_path, "--resume", "--steps", "12"))
    assert sorted(resumed) == list(range(5, 13))
    assert resumed[5] == first[5]  # the old schedule's next value
    assert resumed[12] == f"{0.1 * lr:.3g}"  # the floor, at the new last step
    values = [float(resumed[s]) for s in range(5, 13)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False)) and values[1] < values[0], resumed


# --- launch.sh checks train.py's options once ---------------------------------------------------------------------
@pytest.mark.slow
def test_launch_sh_with_a_bad_option_prints_one_line_and_exits_2(cnn_plan, tmp_path):
    """The check runs before torchrun, so no rank prints the usage and no ChildFailedError traceback follows;
    --help prints the options once and launches nothing."""
    write_files(render_files(cnn_plan, "ddp"), tmp_path)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def launch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(tmp_path / "launch.sh"), *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    bad = launch("--bogus")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == ["train.py: error: unrecognized arguments: --bogus"] and bad.stdout == ""
    low = launch("--steps", "0")
    assert (low.returncode, low.stderr.strip()) == (2, "train.py: error: --steps must be 1 or more, got 0")
    shown = launch("--help")
    assert shown.returncode == 0 and shown.stdout.count("usage: train.py") == 1, shown.stdout + shown.stderr
    assert "no CUDA GPU" not in shown.stdout  # stopped after the check, before the launch
    # what a rank would find only after torchrun started every process: missing data, nothing to resume, an --out
    # that takes no file (root passes os.access on /proc: a file is written to find out), an --out that holds
    # checkpoints without --resume
    earlier = tmp_path / "earlier"
    (earlier / "checkpoints" / "step-4").mkdir(parents=True)
    (earlier / "checkpoints" / "latest").write_text("step-4")
    for args, line in (
        (("--data", "/nonexistent/data"), "train.py: error: --data /nonexistent/data: no such file or directory"),
        (("--resume",), "train.py: error: --resume: no checkpoint in ./checkpoints: checkpoints are written"),
        (("--out", "/proc/advisor-x"), "train.py: error: --out /proc/advisor-x: /proc cannot take files"),
        # an earlier run's checkpoints: starting over would replace its 'latest' and its weights (a new-user find)
        (
            ("--out", str(earlier)),
            f"train.py: error: --out {earlier} holds an earlier run's checkpoints: pass --resume",
        ),
    ):
        said = launch(*args)
        assert said.returncode == 2 and said.stdout == "", said.stdout + said.stderr
        assert len(said.stderr.splitlines()) == 1 and said.stderr.startswith(line), said.stderr
    assert not list(elsewhere.iterdir())  # the --out check left no file behind


@pytest.mark.slow  # a launch.sh run (train.py's option check imports torch) per strategy
@pytest.mark.parametrize("strategy, first", [("ddp", "NODE_RANK"), ("zero2", "MASTER_ADDR")])
def test_a_two_node_launch_sh_says_which_variable_to_export(tmp_path, strategy, first):
    """Two nodes: the docstring names them (it said "one node of 2 GPUs" above a --nnodes=2 line) and launch.sh,
    without NODE_RANK (torchrun, every node) or MASTER_ADDR exported, says which in one line and exits 2 (a new user
    got bash's "NODE_RANK: unbound variable"); the launch line reads the exported address, not the HOST0
    placeholder."""
    p = plan(plan_inputs(gpus=2, nodes=2, micro_batch_size=2, **CNN))
    files = render_files(p, strategy)
    assert "Launch (2 nodes of 2 GPUs each, as planned" in files["train.py"]
    assert re.search(r'--master_addr[= ]"\$MASTER_ADDR"', files["launch.sh"]), files["launch.sh"]
    assert ("NODE_RANK" in files["launch.sh"]) == (strategy == "ddp")  # DeepSpeed's launcher starts every node
    write_files(files, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "MASTER_ADDR")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", str(tmp_path / "launch.sh")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"error: 2 nodes: export {first} ("), done.stderr


# --- --emit --force removes what an earlier --emit wrote and this one does not -----------------------------------
def _emit(capsys: pytest.CaptureFixture[str], folder: Path, strategy: str, *extra: str) -> str:
    from advisor.cli import main

    capsys.readouterr()
    code = main([*CNN_FLAGS, "--gpus", "2", "--strategy", strategy, "--emit", str(folder), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_emit_force_removes_the_stale_ds_config_and_keeps_the_users_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    folder = tmp_path / "job"
    _emit(capsys, folder, "zero2")
    assert set(read_manifest(folder)) == {"train.py", "launch.sh", "slurm.sbatch", "ds_config.json"}
    (folder / "notes.txt").write_text("mine")
    out = _emit(capsys, folder, "ddp", "--force")
    assert not (folder / "ds_config.json").exists() and (folder / "notes.txt").read_text() == "mine"
    assert f"Removed {folder / 'ds_config.json'}" in out
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, "launch.sh", "notes.txt", "slurm.sbatch", "train.py"]
    assert "DistributedDataParallel" in (folder / "train.py").read_text()
    assert f"HERE={shlex.quote(str(folder.resolve()))}\n" in (folder / "slurm.sbatch").read_text()
    # A listed file changed since advisor wrote it is the user's now: it stays.
    _emit(capsys, folder, "zero2", "--force")
    (folder / "ds_config.json").write_text('{"mine": true}\n')
    out = _emit(capsys, folder, "ddp", "--force")
    assert (folder / "ds_config.json").read_text() == '{"mine": true}\n' and "Removed" not in out
    # ... and said: a torchrun script beside an edited ds_config.json it does not read (it was silent)
    assert f"Left your edited {folder / 'ds_config.json'} in place: this job does not use it" in out


def test_emitting_an_offload_row_short_of_host_ram_names_the_host_ram(tmp_path, capsys):
    """A new user's find: --emit of gpt2's ZeRO-3 offload with 1 GiB of host RAM warned "does not fit: 68.07 GiB per
    GPU estimated vs 80.00 GiB" (less than the GPU holds). It now names what is short, with the plan's own figures;
    without --host-mem it says the row fits only if the host RAM allows."""
    from advisor.cli import main

    def warning(folder: str, *extra: str) -> str:
        capsys.readouterr()
        argv = ["gpt2", "--gpus", "2", "--gpu", "A100-80GB", "--strategy", "zero3_offload", *extra]
        assert main([*argv, "--emit", str(tmp_path / folder)]) == 0
        return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  ! ZeRO-3 + CPU offload"))

    short = warning("short", "--host-mem", "1")
    assert short.startswith("  ! ZeRO-3 + CPU offload does not fit in host RAM: needs ") and "per GPU" not in short
    assert "1.00 GiB" in short, short  # what the node has
    unknown = warning("unknown")
    assert unknown.startswith("  ! ZeRO-3 + CPU offload fits only if the host RAM allows: keeps "), unknown
    assert unknown.endswith("the target's host RAM is unknown"), unknown


def test_emit_force_keeps_an_edited_train_py_beside_the_new_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    folder = tmp_path / "job"
    _emit(capsys, folder, "ddp")
    mine = (folder / "train.py").read_text() + "# my change\n"
    (folder / "train.py").write_text(mine)
    out = _emit(capsys, folder, "ddp", "--force")
    assert (folder / "train.py.edited").read_text() == mine and "# my change" not in (folder / "train.py").read_text()
    assert f"Kept your edited train.py as {folder / 'train.py.edited'}" in out
    (folder / "train.py").write_text(mine)  # edited again: the first kept copy is never overwritten
    _emit(capsys, folder, "ddp", "--force")
    assert (folder / "train.py.edited.1").read_text() == mine and (folder / "train.py.edited").read_text() == mine
    _emit(capsys, folder, "ddp", "--force")  # unchanged since written: nothing more is kept
    assert not (folder / "train.py.edited.2").exists()


def test_emit_force_keeps_a_train_py_advisor_did_not_write(tmp_path, capsys, monkeypatch):
    """A hand-written train.py in the folder (no manifest lists it) is the user's: --force moves it aside too."""
    monkeypatch.chdir(ROOT)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text("print('my own loop')\n")
    out = _emit(capsys, folder, "ddp", "--force")
    assert (folder / "train.py.edited").read_text() == "print('my own loop')\n"
    assert "DistributedDataParallel" in (folder / "train.py").read_text()
    assert f"Kept your own train.py as {folder / 'train.py.edited'} (advisor did not write it)" in out


def test_a_manifest_cannot_point_outside_its_folder(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / ".hidden").write_text("x")
    digest = "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"  # sha256 of "x"
    (folder / MANIFEST).write_text(
        json.dumps({"files": {"../outside.txt": digest, ".hidden": digest, "gone.txt": digest}})
    )
    assert read_manifest(folder) == {"gone.txt": digest}
    assert stale_files(folder, frozenset({"train.py"})) == []  # gone.txt is not there
    (folder / MANIFEST).write_text("not json")
    assert read_manifest(folder) == {}
