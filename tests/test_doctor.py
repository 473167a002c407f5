"""``advisor doctor``: the pre-flight checklist. One real 2-rank torchrun run (CPU, gloo) is shared by the
tests that need it; the others stub the all-reduce check so each test stays well under a second."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import advisor.doctor as doctor
from advisor.doctor import FAIL, PASS, WARN, Check, NvmlFacts, launch
from advisor.processes import MachineLock, free_port

ROOT = Path(__file__).resolve().parents[1]
STUB = Check("allreduce", PASS, "stubbed in this test")


@pytest.fixture(autouse=True)
def own_lock(tmp_path, monkeypatch):
    """A private verification lock, so a suite running elsewhere in this tree never makes a test 'busy'."""
    monkeypatch.setenv("ADVISOR_VERIFY_LOCK", str(tmp_path / "verify.lock"))


@pytest.fixture
def stub_allreduce(monkeypatch):
    monkeypatch.setattr(doctor, "check_allreduce", lambda gpus, timeout_s: STUB)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """Text output of one full run on this machine (real torchrun), with a data dir and a ckpt dir."""
    base = tmp_path_factory.mktemp("real")
    (base / "data").mkdir()
    (base / "data" / "shard-0.bin").write_bytes(b"\0" * 16)
    (base / "ckpt").mkdir()
    port = free_port()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVISOR_VERIFY_LOCK", str(base / "verify.lock"))
        calls: list[Check] = []
        real = doctor.check_allreduce
        mp.setattr(doctor, "check_allreduce", lambda gpus, timeout_s: calls.append(real(gpus, timeout_s)) or calls[-1])
        argv = ["--master-port", str(port), "--data", str(base / "data"), "--ckpt-dir", str(base / "ckpt")]
        code, out, err = _main(argv)
    return {"code": code, "out": out, "err": err, "argv": argv, "allreduce": calls[0], "base": base, "port": port}


def _main(argv: list[str]) -> tuple[int, str, str]:
    """Run ``doctor.main`` in this process, capturing stdout and stderr."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = doctor.main(argv)
    return code, out.getvalue(), err.getvalue()


def _statuses(text: str) -> dict[str, str]:
    """``{check name: status}`` from the text report."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^(PASS|WARN|FAIL)  ([\w-]+): ", text, re.M)}


def _fix_after(text: str, name: str) -> str:
    """The ``fix:`` line printed under check ``name``."""
    m = re.search(rf"^(?:PASS|WARN|FAIL)  {re.escape(name)}: .*\n\s+fix: (.*)$", text, re.M)
    assert m, f"no fix line under {name}:\n{text}"
    return m.group(1)


# ---------------------------------------------------------------- the CPU path, for real


def test_cpu_path_passes(real_run):
    out = real_run["out"]
    assert real_run["code"] == 0, out + real_run["err"]
    st = _statuses(out)
    assert st == {
        "gpus": WARN,
        "cuda-driver": WARN,
        "backend": PASS,
        "allreduce": PASS,
        "master-port": PASS,
        "data": PASS,
        "ckpt-dir": PASS,
    }, out
    assert "no GPU: CPU/gloo only" in out
    assert "PASS  backend: gloo (CPU)" in out
    assert re.search(r"PASS  allreduce: 2 ranks over gloo \(CPU\) via torchrun .* \d+\.\d s$", out, re.M), out
    assert f"PASS  master-port: port {real_run['port']} is free" in out
    assert _fix_after(out, "gpus") and _fix_after(out, "cuda-driver")
    for label in ("Python", "torch", "torch CUDA", "cuDNN", "NCCL", "deepspeed", "transformers", "NVIDIA driver"):
        assert re.search(rf"^  {re.escape(label)} +\S", out, re.M), label
    assert re.search(r"^5 passed, 2 warning\(s\), 0 failed$", out, re.M), out
    assert os.listdir(real_run["base"] / "ckpt") == []  # the write test leaves nothing behind


def test_json_matches_text(real_run, monkeypatch):
    monkeypatch.setattr(doctor, "check_allreduce", lambda gpus, timeout_s: real_run["allreduce"])
    code, out, err = _main(real_run["argv"] + ["--json"])
    doc = json.loads(out)
    assert code == doc["exit_code"] == real_run["code"] == 0 and err == ""
    assert {c["name"]: c["status"] for c in doc["checks"]} == _statuses(real_run["out"])
    assert all(set(c) == {"name", "status", "detail", "fix"} for c in doc["checks"])
    assert all((c["fix"] is None) == (c["status"] == PASS) for c in doc["checks"])
    v = doc["versions"]
    assert {"python", "torch", "torch_cuda", "cudnn", "nccl", "deepspeed", "transformers", "driver"} <= set(v)
    import torch

    assert v["torch"] == str(torch.__version__) and v["python"] == ".".join(map(str, sys.version_info[:3]))


# ---------------------------------------------------------------- failures the user must see


def test_taken_port_fails_with_fix(stub_allreduce):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        port = s.getsockname()[1]
        code, out, _ = _main(["--master-port", str(port)])
    assert code == 1
    assert (
        f"FAIL  master-port: port {port} is taken (a stale torchrun/deepspeed process? `ss -ltnp | grep {port}`)" in out
    )
    fix = _fix_after(out, "master-port")
    assert "ss -ltnp" in fix and "--master_port" in fix


def test_paths_fail_and_warn(tmp_path, stub_allreduce):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    (tmp_path / "empty").mkdir()
    # A path under a regular file cannot be created, even by root.
    code, out, _ = _main(
        ["--master-port", str(free_port()), "--data", str(tmp_path / "missing"), "--ckpt-dir", str(blocker / "ckpt")]
    )
    assert code == 1
    assert f"FAIL  ckpt-dir: {blocker / 'ckpt'}: not a directory ({blocker} is a file)" in out
    assert "directory path" in _fix_after(out, "ckpt-dir")
    assert f"FAIL  data: {tmp_path / 'missing'} does not exist" in out
    assert "same path on every node" in _fix_after(out, "data")
    code, out, _ = _main(["--master-port", str(free_port()), "--data", str(tmp_path / "empty")])
    assert code == 0 and f"WARN  data: {tmp_path / 'empty'} is empty" in out
    assert _fix_after(out, "data")
    assert blocker.read_text() == "not a directory"


def test_ckpt_dir_states(tmp_path):
    new = tmp_path / "ckpt-new"
    c = doctor.check_ckpt_dir(str(new))
    assert c.status == WARN and "will be created" in c.detail and "mkdir -p" in c.fix
    assert not new.exists() and os.listdir(tmp_path) == []  # the probe left nothing
    c = doctor.check_ckpt_dir(str(tmp_path / "a" / "b"))
    assert c.status == FAIL and "nor its parent exists" in c.detail
    assert doctor.check_ckpt_dir(str(tmp_path)).status == PASS
    c = doctor.check_data(str(tmp_path / "x" / "y"))
    assert c.status == FAIL
    (tmp_path / "f").write_text("x")
    assert doctor.check_data(str(tmp_path / "f")) == Check(
        "data", FAIL, f"{tmp_path / 'f'}: not a directory", "pass the directory that holds the data files"
    )


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_ckpt_dir_on_a_file_system_that_takes_no_files():
    """/proc refuses new entries whatever the permission bits (ENOENT): the fix is another path, not chmod."""
    c = doctor.check_ckpt_dir("/proc/advisor-doctor-ckpt")
    assert c.status == FAIL and "not writable" in c.detail
    assert "chmod" not in c.fix and "pick a path on a disk" in c.fix, c.fix


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits; the under-a-file case covers root")
def test_ckpt_dir_without_write_permission(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        c = doctor.check_ckpt_dir(str(locked))
    finally:
        locked.chmod(0o700)
    assert c.status == FAIL and "not writable" in c.detail and "chmod u+w" in c.fix


# ---------------------------------------------------------------- bad input: exit 2, one line


@pytest.fixture
def bad_files(tmp_path) -> dict[str, str]:
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "comments").write_text("# nothing here\n\n")
    (tmp_path / "slots").write_text("node-1 slots=zero\n")
    (tmp_path / "twice").write_text("node-1\nnode-1 slots=2\n")
    (tmp_path / "shell").write_text("node-1; rm -rf ~\n")
    return {
        "dir": str(tmp_path),
        "missing": str(tmp_path / "nope"),
        **{name: str(tmp_path / name) for name in ("binary", "comments", "slots", "twice", "shell")},
    }


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--master-port", "70000"], ["--master-port", "between 1 and 65535"]),
        (["--master-port", "abc"], ["--master-port", "not an integer"]),
        (["--master-port", "0"], ["--master-port", "positive"]),
        (["--timeout", "0"], ["--timeout"]),
        (["--timeout", "nan"], ["--timeout"]),
        (["--data", ""], ["--data", "needs a path"]),
        (["--bogus"], ["unrecognized arguments"]),
        (["--nodes-file", "{missing}"], ["--nodes-file", "no such file"]),
        (["--nodes-file", "{dir}"], ["is a directory"]),
        (["--nodes-file", "{binary}"], ["not a text file"]),
        (["--nodes-file", "{comments}"], ["lists no host"]),
        (["--nodes-file", "{slots}"], ["line 1", "slots=N"]),
        (["--nodes-file", "{twice}"], ["line 2", "listed twice"]),
        (["--nodes-file", "{shell}"], ["line 1"]),
    ],
)
def test_bad_input_is_one_line(argv, needles, bad_files, monkeypatch):
    monkeypatch.setattr(doctor, "run_checks", lambda *a, **k: pytest.fail("checks ran on bad input"))
    code, out, err = _main([a.format(**bad_files) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("advisor: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("entry", [["advisor", "doctor"], ["advisor.doctor"]])
def test_bad_input_from_the_command_line(entry):
    proc = subprocess.run(
        [sys.executable, "-m", *entry, "--master-port", "abc"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("advisor: error: ")


# ---------------------------------------------------------------- other nodes


def test_nodes_file_prints_a_command_per_host(tmp_path, stub_allreduce):
    hosts = tmp_path / "hosts"
    hosts.write_text("# the cluster\nnode-a slots=8\nnode-b   # backup\n\nuser@node-c slots=4\n")
    code, out, _ = _main(["--nodes-file", str(hosts), "--master-port", str(free_port()), "--data", str(tmp_path)])
    assert code == 0
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("ssh ")]
    assert len(lines) == 3
    for line, host in zip(lines, ("node-a", "node-b", "user@node-c")):
        assert line.startswith(f"ssh {host} ") and "-m advisor doctor --json" in line
        assert f"--data {tmp_path}" in line and f"> doctor-{host.replace('@', '_')}.json" in line
    assert "# slots=8" in lines[0]
    doc = json.loads(_main(["--nodes-file", str(hosts), "--json", "--master-port", str(free_port())])[1])
    assert [n["host"] for n in doc["nodes"]] == ["node-a", "node-b", "user@node-c"]
    assert [n["slots"] for n in doc["nodes"]] == [8, None, 4]
    assert doc["compare"] in out


def test_compare_command_finds_differences(tmp_path):
    base = {
        "checks": [{"name": "gpus", "status": PASS, "detail": "8 GPU(s)", "fix": None}],
        "versions": {"python": "3.11.7", "torch": "2.14.1", "driver": "550.1"},
    }
    other = {
        "checks": [{"name": "data", "status": FAIL, "detail": "/d does not exist", "fix": "x"}],
        "versions": {"python": "3.11.7", "torch": "2.13.0", "driver": "535.0"},
    }
    (tmp_path / "doctor-a.json").write_text(json.dumps(base))
    (tmp_path / "doctor-b.json").write_text(json.dumps(other))
    (tmp_path / "doctor-c.json").write_text("")
    proc = subprocess.run(
        ["bash", "-c", doctor.compare_command()], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "DIFFERS torch" in proc.stdout and "DIFFERS driver" not in proc.stdout
    assert "doctor-b.json FAIL data: /d does not exist" in proc.stdout
    assert "doctor-c.json EMPTY" in proc.stdout and "versions DIFFER" in proc.stdout


# ---------------------------------------------------------------- GPU facts without a GPU


@pytest.mark.parametrize(
    "nvml, torch_count, cvd, status, needle",
    [
        (4, 4, None, PASS, "4 GPU(s) visible"),
        (4, 2, None, FAIL, "GPU counts disagree"),
        (2, 0, None, FAIL, "torch.cuda.device_count() = 0"),
        (4, 2, "0,1", PASS, "CUDA_VISIBLE_DEVICES='0,1'"),
        (4, 3, "0,1", FAIL, "CUDA_VISIBLE_DEVICES='0,1' should expose 2"),
        (4, 1, "2,7,1", PASS, "CUDA_VISIBLE_DEVICES"),  # CUDA stops at the first invalid index
        (4, 0, "", WARN, "hides them all"),
        (None, 0, None, WARN, "no GPU: CPU/gloo only"),
        (0, 0, None, WARN, "no GPU: CPU/gloo only"),
        (None, 2, None, WARN, "NVML cannot be read"),
    ],
)
def test_gpu_count_comparison(nvml, torch_count, cvd, status, needle):
    c = doctor.compare_gpu_counts(nvml, torch_count, cvd, nvml_error="NVMLError_LibraryNotFound")
    assert c.status == status and needle in c.detail, c
    assert (c.fix is None) == (status == PASS)


def test_gpu_disagreement_end_to_end(monkeypatch, stub_allreduce):
    monkeypatch.setattr(doctor, "read_nvml", lambda: NvmlFacts(gpu_count=8, driver="550.54.15", driver_cuda=12040))
    monkeypatch.setattr(doctor, "torch_gpu_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code, out, _ = _main(["--master-port", str(free_port())])
    assert code == 1
    assert (
        "FAIL  gpus: GPU counts disagree: NVML nvmlDeviceGetCount = 8, torch.cuda.device_count() = 4, "
        "CUDA_VISIBLE_DEVICES='0,1'" in out
    )
    assert "CUDA_VISIBLE_DEVICES" in _fix_after(out, "gpus")
    assert re.search(r"^  NVIDIA driver +550\.54\.15$", out, re.M) and re.search(r"^  driver CUDA +12\.4$", out, re.M)


@pytest.mark.parametrize(
    "driver_cuda, torch_cuda, status",
    [
        (12040, "12.1", PASS),
        (12040, "12.4", PASS),
        (13000, "12.8", PASS),
        (12020, "12.4", WARN),  # minor-version compatibility
        (11080, "12.1", FAIL),
        (None, "13.0", WARN),
        (12040, None, WARN),
    ],
)
def test_cuda_driver_comparison(driver_cuda, torch_cuda, status):
    c = doctor.compare_cuda_versions(driver_cuda, torch_cuda)
    assert c.status == status, c
    assert (c.fix is None) == (status == PASS)


def test_visible_count():
    assert doctor.visible_count(4, None) == 4
    assert doctor.visible_count(4, "") == 0
    assert doctor.visible_count(4, "3,0") == 2
    assert doctor.visible_count(4, "0,0,1") == 1
    assert doctor.visible_count(2, "GPU-abc,MIG-def") == 2
    assert doctor.visible_count(8, "-1") == 0


# ---------------------------------------------------------------- the launcher's edges


def test_allreduce_waits_for_a_verification_then_skips():
    start = time.monotonic()
    with MachineLock():
        c = doctor.check_allreduce(0, 1.5)
    assert time.monotonic() - start >= 1.5  # it waited for the lock before giving up
    assert c.status == WARN and "verification kept this machine busy for 1.5 s" in c.detail, c
    assert "raise --timeout" in c.fix


def test_allreduce_runs_once_the_verification_ends():
    import threading

    lock = MachineLock().__enter__()
    threading.Timer(1.0, lambda: lock.__exit__(None, None, None)).start()
    c = doctor.check_allreduce(0, 60.0)
    assert c.status == PASS, c


def test_allreduce_timeout_fails_and_kills(monkeypatch):
    start = time.monotonic()
    c = doctor.check_allreduce(0, 0.5)
    assert time.monotonic() - start < 15
    assert c.status == FAIL and "did not finish within 0.5 s" in c.detail and "raise --timeout" in c.fix
    kept = re.search(r"kept in (\S+);", c.fix)
    if kept:  # the ranks printed something: their script and log stay for reading
        assert Path(kept.group(1), "allreduce.py").exists()
        import shutil

        shutil.rmtree(kept.group(1))
    else:  # nothing to read: no empty directory left behind
        assert "the ranks printed nothing" in c.fix
        assert f"{launch._WORKER} gloo 0.5" in c.fix  # the rerun line names a script that still exists


def test_allreduce_failure_names_the_root_cause(tmp_path, monkeypatch):
    worker = tmp_path / "worker.py"
    # One rank fails, as when a peer is unreachable. (When both raise at once, their tracebacks can
    # interleave in the shared launcher log: a CI run read "RuntimeErrorRuntimeError: : ...".)
    worker.write_text(
        "import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('simulated: connection refused by rank 1')\n"
    )
    monkeypatch.setattr(launch, "_WORKER", worker)
    c = doctor.check_allreduce(0, 60.0)
    assert c.status == FAIL, c
    assert c.detail.endswith("RuntimeError: simulated: connection refused by rank 1"), c.detail
    assert "rerun by hand" in c.fix and "torch.distributed.run" in c.fix
    import shutil

    shutil.rmtree(re.search(r"kept in (\S+);", c.fix).group(1))


def test_ranks_in_their_own_session_are_killed(tmp_path):
    """torchrun starts ranks with start_new_session; the group kill misses them, the pid kill does not."""
    rank = "import os, sys, time; print('DOCTOR_PID', os.getpid(), flush=True); time.sleep(120)"
    launcher = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}, {str(tmp_path)!r}], "
        "start_new_session=True); time.sleep(120)"
    )
    log = tmp_path / "run.log"
    rc, timed_out = launch._run_group([sys.executable, "-c", launcher], tmp_path, log, dict(os.environ), 3.0)
    assert (rc, timed_out) == (None, True)
    pids = re.findall(r"^DOCTOR_PID (\d+)$", log.read_text(), re.M)
    assert pids, log.read_text()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(int(pids[0])):
        time.sleep(0.1)
    assert not _alive(int(pids[0]))


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False
