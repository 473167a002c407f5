"""``slurm.sbatch`` (strategies/slurm.py): the #SBATCH header, and the command each node runs, found by running the
file with stand-in ``srun``, ``scontrol`` and ``python`` first on PATH (srun records its argv and starts nothing;
python, which the file runs to check that torch imports ($STUB_TORCH_RC) and train.py's options (records its argv and
exits with $STUB_PYTHON_RC))."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from advisor.errors import AdvisorError
from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies.render import job_from_plan
from strategies.slurm import SLURM_FILE, render_slurm, slurm_time

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "small_llama.json")
PORT = 29517  # not the default, so a hard-coded port would show

SRUN = """#!/usr/bin/env bash
# Stand-in srun: one task per node is emulated by running nothing; record argv (NUL-separated) and cwd.
printf '%s\\0' "$@" > "$STUB_LOG/srun.argv"
pwd > "$STUB_LOG/srun.cwd"
"""
PYTHON = """#!/usr/bin/env bash
# The torch probe (python -c ...) answers $STUB_TORCH_RC; train.py's option check records its argv and answers
# $STUB_PYTHON_RC.
if [ "$1" = "-c" ]; then exit "${STUB_TORCH_RC:-0}"; fi
printf '%s\\0' "$@" > "$STUB_LOG/python.argv"
exit "${STUB_PYTHON_RC:-0}"
"""
SCONTROL = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_LOG/scontrol.argv"
[ "$1 $2" = "show hostnames" ] || exit 2
printf 'nodeA\\nnodeB\\n'
# A large allocation: more names than a pipe holds (a reader that stops early makes this write fail).
if [ -n "${STUB_EXTRA_HOSTS:-}" ]; then seq -f 'node%g' "$STUB_EXTRA_HOSTS"; fi
"""


@pytest.fixture(scope="module")
def jobs():
    """Jobs for a tiny Llama planned on 2 nodes x 4 GPUs: single (python launcher), ddp (torchrun), zero3
    (DeepSpeed, with script arguments)."""
    p = plan(
        plan_inputs(
            config_path=TINY,
            seq_len=32,
            gpus=4,
            nodes=2,
            interconnect="nvlink",
            detect_hardware=False,
            precision="fp32",
            micro_batch_size=2,
        )
    )
    return {s: job_from_plan(p, s, master_port=PORT) for s in ("single", "ddp", "zero2", "zero3")}


def _header(text: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^#SBATCH --([a-z-]+)=(\S+)$", text, re.MULTILINE))


def _run(
    tmp_path: Path,
    text: str,
    *args: str,
    env_extra: dict[str, str] | None = None,
    slurm_env: bool = True,
    job: str = "job",
) -> tuple[subprocess.CompletedProcess, Path]:
    """Write ``text`` as slurm.sbatch in a job dir (tmp_path / ``job``) and run it with bash from elsewhere, stubs
    first on PATH; the job is submitted from the job dir unless ``env_extra`` sets SLURM_SUBMIT_DIR."""
    job_dir, stubs, logs, elsewhere = (tmp_path / d for d in (job, "bin", "log", "elsewhere"))
    for d in (job_dir, stubs, logs, elsewhere):
        d.mkdir()
    for name, body in (("srun", SRUN), ("scontrol", SCONTROL), ("python", PYTHON)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    script = job_dir / SLURM_FILE
    script.write_text(text)
    (job_dir / "train.py").write_text("")  # an emit folder holds the script (the stub python does not read it)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{stubs}{os.pathsep}{env['PATH']}", STUB_LOG=str(logs))
    if slurm_env:
        env.update(
            SLURM_JOB_NODELIST="node[A-B]", SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="77", SLURM_SUBMIT_DIR=str(job_dir)
        )
    env.update(env_extra or {})
    proc = subprocess.run(
        ["bash", str(script), *args], cwd=elsewhere, env=env, capture_output=True, text=True, check=False, timeout=30
    )
    return proc, logs


def _argv(logs: Path, name: str) -> list[str]:
    return (logs / f"{name}.argv").read_text().split("\0")[:-1]


def _torchrun(port: int = PORT, gpus: int = 4) -> list[str]:
    return [
        "--kill-on-bad-exit=1",
        "torchrun",
        "--nnodes=2",
        f"--nproc_per_node={gpus}",
        "--rdzv_id=77",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=nodeA:{port}",
        "train.py",
    ]


@pytest.mark.parametrize("strategy", ["single", "ddp", "zero3"])
def test_bash_syntax(jobs, tmp_path, strategy):
    path = tmp_path / SLURM_FILE
    path.write_text(render_slurm(jobs[strategy]))
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert len(text.splitlines()) <= 45


def test_ddp_runs_one_torchrun_per_node(jobs, tmp_path):
    proc, logs = _run(tmp_path, render_slurm(jobs["ddp"]), "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert _argv(logs, "srun") == [*_torchrun(), "--steps", "5"]
    assert _argv(logs, "scontrol") == ["show", "hostnames", "node[A-B]"]
    assert (logs / "srun.cwd").read_text().strip() == str(tmp_path / "job")  # SLURM_SUBMIT_DIR, not the caller's


def test_large_allocation_head_node(jobs, tmp_path):
    """Under pipefail, ``scontrol ... | head -n 1`` ends the job with SIGPIPE (rc 141) once the host list
    outgrows the pipe; the first name must still come through."""
    proc, logs = _run(tmp_path, render_slurm(jobs["ddp"]), env_extra={"STUB_EXTRA_HOSTS": "50000"})
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert _argv(logs, "srun") == _torchrun()


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_deepspeed_runs_torchrun_with_its_config(jobs, tmp_path, strategy):
    job = jobs[strategy]
    assert job.strategy_unit.launcher.name == "deepspeed"
    proc, logs = _run(tmp_path, render_slurm(job), "--steps", "5", "--out", "run dir")
    assert proc.returncode == 0, proc.stderr
    assert _argv(logs, "srun") == [
        *_torchrun(),
        "--deepspeed_config",
        "ds_config.json",
        "--steps",
        "5",
        "--out",
        "run dir",
    ]
    assert "deepspeed " not in render_slurm(job).split("set -euo pipefail")[1]  # never the deepspeed launcher


def test_single_runs_python_on_one_gpu(jobs, tmp_path):
    job = jobs["single"]
    assert (job.num_nodes, job.gpus_per_node) == (2, 4)  # planned on 2 x 4; the script still takes one GPU
    text = render_slurm(job)
    head = _header(text)
    assert (head["nodes"], head["gpus-per-node"], head["ntasks-per-node"]) == ("1", "1", "1")
    proc, logs = _run(tmp_path, text, "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert _argv(logs, "srun") == ["python", "train.py", "--steps", "5"]
    assert not (logs / "scontrol.argv").exists()
    assert "torchrun" not in text and "HEAD_NODE" not in text


@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_header(jobs, strategy):
    text = render_slurm(jobs[strategy], time_limit_s=3601)
    head = _header(text)
    assert head == {
        "job-name": "small_llama",
        "nodes": "2",
        "ntasks-per-node": "1",
        "gpus-per-node": "4",
        "time": "01:01:00",
        "signal": "TERM@120",
        "output": "slurm-%j.out",
    }
    assert re.search(r"^##SBATCH --cpus-per-task=\d+$", text, re.MULTILINE)  # a hint, commented out
    assert _header(render_slurm(jobs[strategy]))["time"] == "24:00:00"


def test_header_follows_the_job(jobs, tmp_path):
    job = dataclasses.replace(jobs["ddp"], num_nodes=3, gpus_per_node=8, master_port=30001)
    text = render_slurm(job)
    assert (_header(text)["nodes"], _header(text)["gpus-per-node"]) == ("3", "8")
    proc, logs = _run(tmp_path, text)
    assert proc.returncode == 0, proc.stderr
    assert _argv(logs, "srun") == _torchrun(port=30001, gpus=8)  # --nnodes comes from SLURM (2 here)


@pytest.mark.parametrize(
    "seconds, expected",
    [
        (3601, "01:01:00"),
        (3600, "01:00:00"),
        (60, "00:10:00"),
        (599.5, "00:10:00"),
        (601, "00:11:00"),
        (None, "24:00:00"),
        (90000, "25:00:00"),
        (7 * 24 * 3600, "168:00:00"),
    ],
)
def test_time(seconds, expected):
    assert slurm_time(seconds) == expected


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf"), True, "3600"])
def test_bad_time_limit(jobs, bad):
    with pytest.raises(AdvisorError, match="time limit"):
        render_slurm(jobs["ddp"], time_limit_s=bad)


@pytest.mark.parametrize(
    "field, value",
    [("num_nodes", 0), ("gpus_per_node", "4; rm -rf ~"), ("master_port", 70000), ("gpus_per_node", True)],
)
def test_bad_sizes(jobs, field, value):
    with pytest.raises(AdvisorError, match=field):
        render_slurm(dataclasses.replace(jobs["ddp"], **{field: value}))


def test_job_name_is_sanitised(jobs, tmp_path):
    spec = dataclasses.replace(jobs["ddp"].spec, name='my model"; touch $HOME/x `id` \n#SBATCH --nodes=99')
    text = render_slurm(dataclasses.replace(jobs["ddp"], spec=spec))
    name = _header(text)["job-name"]
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", name) and name.startswith("my_model")
    assert _header(text)["nodes"] == "2" and text.count("--nodes=") == 1
    home = tmp_path / "home"
    home.mkdir()
    proc, logs = _run(tmp_path, text, env_extra={"HOME": str(home)})
    assert proc.returncode == 0, proc.stderr
    assert not (home / "x").exists()  # nothing of the name ran
    assert _argv(logs, "srun") == _torchrun()
    empty = dataclasses.replace(jobs["ddp"].spec, name="???")
    assert _header(render_slurm(dataclasses.replace(jobs["ddp"], spec=empty)))["job-name"] == "advisor"


def test_outside_slurm_says_to_use_sbatch(jobs, tmp_path):
    proc, logs = _run(tmp_path, render_slurm(jobs["ddp"]), slurm_env=False)
    assert proc.returncode != 0
    assert "sbatch" in proc.stderr
    assert not (logs / "srun.argv").exists()


def test_without_submit_dir_works_in_the_scripts_dir(jobs, tmp_path):
    proc, logs = _run(tmp_path, render_slurm(jobs["single"]), slurm_env=False)
    assert proc.returncode == 0, proc.stderr
    assert (logs / "srun.cwd").read_text().strip() == str(tmp_path / "job")


def test_submitted_from_elsewhere_runs_the_emit_folders_files(jobs, tmp_path):
    """Under sbatch ``$0`` is a copy in a spool directory: the emit folder's absolute path is written in, so a job
    submitted from another directory still finds train.py and ds_config.json; it works in the directory it was
    submitted from (relative paths in the options are the submitter's), and checks the options once first."""
    folder = tmp_path / "job dir's"  # a space and a quote: written shell-quoted
    text = render_slurm(jobs["zero3"], folder=str(folder))
    assert f"HERE={shlex.quote(str(folder))}" in text
    submit = tmp_path / "elsewhere"
    proc, logs = _run(tmp_path, text, "--steps", "5", job=folder.name, env_extra={"SLURM_SUBMIT_DIR": str(submit)})
    assert proc.returncode == 0, proc.stderr
    script, config = str(folder / "train.py"), str(folder / "ds_config.json")
    assert _argv(logs, "srun") == [*_torchrun()[:-1], script, "--deepspeed_config", config, "--steps", "5"]
    assert (logs / "srun.cwd").read_text().strip() == str(submit)
    assert _argv(logs, "python") == [script, "--check-args", "--steps", "5"]


def test_a_copied_folder_runs_the_files_of_the_folder_it_is_submitted_from(jobs, tmp_path):
    """The folder written in is where advisor ran; copied to a cluster it is gone there (a new user's find): the job
    then takes train.py from the folder it is submitted from."""
    text = render_slurm(jobs["ddp"], folder=str(tmp_path / "on-the-laptop"))  # never created here
    proc, logs = _run(tmp_path, text, "--steps", "5")  # submitted from the job dir (the copy)
    assert proc.returncode == 0, proc.stderr
    assert _argv(logs, "python") == [str(tmp_path / "job" / "train.py"), "--check-args", "--steps", "5"]


@pytest.mark.parametrize("folder", ["relative/dir", "/two\nlines"])
def test_folder_must_be_absolute_on_one_line(jobs, folder):
    with pytest.raises(AdvisorError, match="absolute path on one line"):
        render_slurm(jobs["ddp"], folder=folder)


@pytest.mark.parametrize("python_rc, job_rc", [(2, 2), (3, 0)])
def test_bad_options_stop_before_srun(jobs, tmp_path, python_rc, job_rc):
    """train.py --check-args exits 2 on a bad option (its one line is the job's error) and 3 after --help: either
    way no torchrun is started, so no rank prints the same error again."""
    proc, logs = _run(tmp_path, render_slurm(jobs["ddp"]), "--bogus", env_extra={"STUB_PYTHON_RC": str(python_rc)})
    assert proc.returncode == job_rc, proc.stderr
    assert _argv(logs, "python") == ["train.py", "--check-args", "--bogus"]
    assert not (logs / "srun.argv").exists()


def test_a_python_without_torch_stops_before_srun_with_one_line(jobs, tmp_path):
    proc, logs = _run(tmp_path, render_slurm(jobs["ddp"]), env_extra={"STUB_TORCH_RC": "1"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"error: {tmp_path / 'bin' / 'python'} cannot import torch: activate the environment advisor was installed "
        "in (e.g. source .venv/bin/activate)"
    )
    assert not (logs / "srun.argv").exists() and not (logs / "python.argv").exists()
