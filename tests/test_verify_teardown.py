"""verify's verdict when a run crashes after measuring: a run whose every rank reported and which then
died in teardown (a rank aborting with SIGABRT in interpreter shutdown, issue 12 item 7) is measured,
with a note; a run where some rank did not report is a failure, whatever happened afterwards.

The launched cases use a stand-in ``train.py`` (no torch: it starts in well under a second) that
writes a report in the format ``strategies/probe/_advisor_probe.py`` writes and then
calls ``os.abort()``, started with the same launchers and ``_launch`` as ``verify``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from advisor.run_report import read_report, teardown_note
from advisor.verify import VerifyResult, _launch, conclude, free_port
from strategies.launchers import DEEPSPEED, TORCHRUN

STEPS = 2

STANDIN = r"""
import json, os, resource, sys, time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
args = sys.argv[1:]
steps, out = int(args[args.index("--steps") + 1]), args[args.index("--out") + 1]
mode = os.environ["STANDIN_MODE"]
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from os.abort()
os.makedirs(out, exist_ok=True)


def wait_for(paths, seconds=60):
    deadline = time.monotonic() + seconds
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)


if mode == "abort_before_report" and rank == 1:
    os.abort()
# every rank's figures reach rank 0 (the template's all_gather_object), rank 0 writes the report
part = {"rank": rank, "local_rank": rank, "peak_allocated_bytes": 1000 + rank, "peak_reserved_bytes": None,
        "losses": [2.0 - 0.1 * i for i in range(steps)], "step_times_s": [0.01] * steps}
with open(os.path.join(out, f".part{rank}.tmp"), "w") as f:
    json.dump(part, f)
os.replace(os.path.join(out, f".part{rank}.tmp"), os.path.join(out, f"part{rank}.json"))
report = os.path.join(out, "report.json")
if rank == 0:
    parts = [os.path.join(out, f"part{r}.json") for r in range(world)]
    wait_for(parts)
    everyone = [json.load(open(p)) for p in parts]
    with open(report, "w") as f:
        json.dump({"strategy": "standin", "device": "cpu", "world_size": world, "steps": steps,
                   "per_rank": everyone}, f)
    print(f"report written to {report}", flush=True)
else:
    wait_for([report])
    time.sleep(0.5)  # rank 0 has closed the file
if mode == "abort_after_report" and rank == 1:
    os.abort()  # SIGABRT in "teardown", after the figures are on disk
"""


def _result(run_dir: Path) -> VerifyResult:
    return VerifyResult(
        strategy="standin", device="cpu", world_size=2, steps=STEPS, log_dir=str(run_dir), estimated_peak_bytes=1000
    )


def _launch_standin(tmp_path: Path, launcher, mode: str) -> tuple[int | None, VerifyResult]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.py").write_text(STANDIN)
    env = dict(os.environ, STANDIN_MODE=mode, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **dict(launcher.cpu_env))
    cmd = launcher.verify_argv(2, free_port(), ["--steps", str(STEPS), "--out", "out"])
    since = time.time()
    rc, timed_out = _launch(cmd, run_dir, env, 240, STEPS, lambda _msg: None)
    assert not timed_out, (run_dir / "run.log").read_text()[-2000:]
    return rc, conclude(_result(run_dir), rc, timed_out, 240, since)


def _deepspeed_launcher_available() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


LAUNCHERS = [
    pytest.param(TORCHRUN, id="torchrun"),
    pytest.param(
        DEEPSPEED, id="deepspeed", marks=pytest.mark.skipif(not _deepspeed_launcher_available(), reason="no deepspeed")
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_abort_after_every_rank_reported_is_measured_with_a_note(launcher, tmp_path):
    rc, result = _launch_standin(tmp_path, launcher, "abort_after_report")
    log = (tmp_path / "run" / "run.log").read_text()
    assert rc != 0, log[-2000:]  # the launcher did see the crash
    assert result.ok, (result.message, log[-2000:])
    assert [r["measured_peak_bytes"] for r in result.per_rank] == [1000, 1001]
    assert result.losses == pytest.approx([2.0, 1.9])
    assert result.message == "completed"
    assert (
        "all ranks reported, then rank 1 exited with -6 (SIGABRT) during teardown: figures are valid" in result.notes
    ), (result.notes, log[-2000:])


@pytest.mark.slow
def test_rank_that_never_reported_is_a_failure(tmp_path):
    rc, result = _launch_standin(tmp_path, TORCHRUN, "abort_before_report")
    assert rc != 0
    assert not result.ok and not result.per_rank
    assert "exit code" in result.message and "run.log" in result.message
    assert not any("figures are valid" in n for n in result.notes)


# --- the verdict on fabricated run directories (no launch) ---------------------------------------
def _report(ranks=(0, 1), steps=STEPS) -> dict:
    return {"per_rank": [{"rank": r, "peak_allocated_bytes": 1000 + r, "losses": [1.0] * steps} for r in ranks]}


def _run_dir(tmp_path: Path, report: dict | str | None, log: str = "", age_s: float = 0.0) -> Path:
    run_dir = tmp_path / "run"
    (run_dir / "out").mkdir(parents=True)
    (run_dir / "run.log").write_text(log)
    if report is not None:
        path = run_dir / "out" / "report.json"
        path.write_text(report if isinstance(report, str) else json.dumps(report))
        if age_s:
            old = time.time() - age_s
            os.utime(path, (old, old))
    return run_dir


def test_report_left_by_an_earlier_run_does_not_count(tmp_path):
    run_dir = _run_dir(tmp_path, _report(), log="RuntimeError: boom\n", age_s=600)
    result = conclude(_result(run_dir), 1, False, 60, time.time())
    assert not result.ok and "RuntimeError: boom" in result.message
    assert "earlier run" in read_report(run_dir / "out" / "report.json", 2, STEPS, time.time())[1]


@pytest.mark.parametrize(
    "report, why",
    [
        (_report(ranks=(0,)), "the report has ranks [0], expected 0..1"),
        (_report(steps=1), "rank 0 reported 1 of 2 steps"),
        ('{"per_rank": [{"rank": 0, "peak', "cut short"),
        ({"per_rank": None}, "no per-rank list"),
    ],
)
def test_incomplete_report_is_a_failure_even_with_exit_0(report, why, tmp_path):
    run_dir = _run_dir(tmp_path, report)
    result = conclude(_result(run_dir), 0, False, 60, time.time() - 5)
    assert not result.ok and why in result.message and "exited 0" in result.message, result.message
    crashed = conclude(_result(run_dir), -6, False, 60, time.time() - 5)
    assert not crashed.ok and "exit code -6" in crashed.message


def test_no_report_with_exit_0_is_a_failure(tmp_path):
    result = conclude(_result(_run_dir(tmp_path, None)), 0, False, 60, time.time())
    assert not result.ok and "no report was written" in result.message


def test_clean_run_has_no_note(tmp_path):
    result = conclude(_result(_run_dir(tmp_path, _report())), 0, False, 60, time.time() - 5)
    assert result.ok and result.message == "completed" and result.notes == []


def test_hang_in_teardown_after_reporting_is_measured(tmp_path):
    result = conclude(_result(_run_dir(tmp_path, _report())), None, True, 60, time.time() - 5)
    assert result.ok
    assert result.notes == [
        (
            "all ranks reported, then the run did not exit within 60 s (stuck in teardown) and "
            "was stopped: figures are valid"
        )
    ]


def test_teardown_note_reads_each_launchers_summary():
    ds = (
        "[2026-12-01 11:06:15,267] [ERROR] [launch.py:325:sigkill_handler] ['/v/bin/python3.11', '-u', "
        "'train.py', '--local_rank=1', '--steps', '3'] exits with return code = -6\n"
    )
    assert (
        teardown_note(ds, 250, False, 60)
        == "all ranks reported, then rank 1 exited with -6 (SIGABRT) during teardown: figures are valid"
    )
    tr = (
        "[0]:\n  time      : 2026-12-01_11:06:15\n  host      : h\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -11 (pid: 42)\n"
    )
    assert "rank 1 exited with -11 (SIGSEGV)" in teardown_note(tr, 1, False, 60)
    assert "the launcher exited with code 1 during teardown" in teardown_note("", 1, False, 60)


# --- the first DeepSpeed launch on a CPU (issue 25) ---------------------------------------------------------
def test_deepspeed_cpu_launch_says_it_will_compile_when_the_op_is_not_cached(tmp_path):
    """An empty TORCH_EXTENSIONS_DIR: DeepSpeed will JIT-compile its CPU communication op (minutes, silent), and
    the pre-launch note says so and where it is cached; torchrun scripts and GPU runs get no note."""
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    note = DEEPSPEED.first_use_note("cpu", env)
    assert note == (
        "DeepSpeed builds its CPU communication op on first use: a C++ compile of a few minutes (2.5 on "
        f"2 cores), once, silent until it is done; cached in {tmp_path / 'deepspeed_shm_comm'}"
    )
    assert DEEPSPEED.first_use_note("cuda", env) is None
    assert TORCHRUN.first_use_note("cpu", env) is None


def test_deepspeed_cpu_launch_is_quiet_once_the_op_is_cached(tmp_path):
    built = tmp_path / "deepspeed_shm_comm"
    built.mkdir()
    (built / "build.ninja").write_text("")  # a build that stopped half-way is still no op: the note stays
    assert DEEPSPEED.first_use_note("cpu", {"TORCH_EXTENSIONS_DIR": str(tmp_path)}) is not None
    (built / "deepspeed_shm_comm.so").write_bytes(b"")
    assert DEEPSPEED.first_use_note("cpu", {"TORCH_EXTENSIONS_DIR": str(tmp_path)}) is None


def test_deepspeed_op_cache_defaults_to_torchs_extension_root(monkeypatch):
    """Without TORCH_EXTENSIONS_DIR: torch's own build directory for the op (what cpp_extension.load uses)."""
    from torch.utils.cpp_extension import _get_build_directory

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    from strategies.launchers import deepspeed_shm_op_dir

    assert deepspeed_shm_op_dir({}) == _get_build_directory("deepspeed_shm_comm", verbose=False)


def test_deepspeed_launch_sh_says_so_on_a_cpu(tmp_path):
    """A user's own `bash launch.sh` on a machine without CUDA is told about the compile too; torchrun's is not."""
    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from strategies.render import render_files

    tiny = str(Path(__file__).resolve().parents[1] / "tests" / "data" / "small_llama.json")
    p = plan(
        plan_inputs(
            config_path=tiny,
            seq_len=32,
            gpus=2,
            interconnect="nvlink",
            detect_hardware=False,
            precision="fp32",
            micro_batch_size=2,
        )
    )
    zero = render_files(p, "zero2")["launch.sh"]
    assert (
        "  export DS_ACCELERATOR=cpu\n  echo \"the first run compiles DeepSpeed's CPU communication op (C++, a few "
        "minutes, once; cached in torch's extension directory): nothing is printed until it is done\"\nfi\n"
    ) in zero
    assert "compiles" not in render_files(p, "ddp")["launch.sh"]


def test_kill_group_reaches_descendants_in_sessions_of_their_own():
    """torchrun starts each rank in a session of its own, so a killpg of the launcher's group misses them: a
    launcher that dies on SIGTERM before stopping its children leaves them running unless kill_group kills its
    descendants too, by pid and start time."""
    import subprocess

    from advisor.processes import _alive, descendants, kill_group

    # A leader that starts two children in sessions of their own, as torchrun starts its ranks, and dies on SIGTERM
    # without stopping them; it says "ready" once both exist (bash's setsid may still be forking when listed).
    spawn = (
        "import subprocess, time\n"
        "kids = [subprocess.Popen(['sleep', str(300 + i)], start_new_session=True) for i in range(2)]\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert leader.stdout is not None and leader.stdout.readline().strip() == "ready"
    below = descendants(leader.pid)
    assert len(below) == 2
    assert all(os.getpgid(pid) == pid for pid, _ in below)  # each its own group: killpg(leader) cannot reach them
    kill_group(leader)
    assert leader.poll() is not None
    assert not any(_alive(pid, started) for pid, started in below)
