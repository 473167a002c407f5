"""The GPU truth run's CPU-side logic (bench/gpu*.py): prepare writes each case's folder with what the GPU half reads,
run reads a script's report and stops, skips and fails as it should, render writes the table."""

from __future__ import annotations

import json
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from bench import gpu, gpu_prepare, gpu_run, gpu_wheels
from bench.cases import Case

TINY = dict(model="llama-small", seq_len=64, world=1, micro_batch=2, steps=3)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    from strategies import all_strategies

    out = tmp_path_factory.mktemp("cases")
    cases = [Case(strategy="single", **TINY), Case(strategy="zero2", **TINY)]
    with pytest.MonkeyPatch.context() as mp:  # conftest's no_what_if_traces, for the module: no TP shards traced
        for cls in {type(s) for s in all_strategies()}:
            mp.setattr(cls, "what_if_traces", lambda self, ctx: [])
        return out, gpu_prepare.prepare(cases, out, say=lambda _m: None)


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_prepare_writes_a_folder_per_case_with_what_run_reads(prepared: tuple[Path, list[Path]]):
    from advisor.plan import plan
    from advisor.schema import inputs_from_values

    out, folders = prepared
    assert [f.name for f in folders] == [
        "llama-small-s64-b2-fp32-adamw-single-w1",
        "llama-small-s64-b2-fp32-adamw-zero2-w1",
    ]
    assert (out / ".gitignore").read_text().splitlines()[-1] == "*"  # carried, never committed
    single, zero2 = (json.loads((f / "expected.json").read_text()) for f in folders)
    assert {"train.py", "launch.sh", "plan.json", "expected.json"} <= {p.name for p in folders[0].iterdir()}
    assert (folders[1] / "ds_config.json").exists()
    assert [s["case_id"] for s in gpu_prepare.read_cases(out)] == [f.name for f in folders]
    # The probe's command: the interpreter, the probe and the port are filled in on the GPU machine.
    steps = ["--steps", "3", "--out", "out", "--eval-every", "0", "--save-every", "0", "--no-save"]
    assert single["argv"] == ["{python}", "{probe}", "--measured-steps", "3", "train.py", *steps]
    assert zero2["argv"][:6] == ["{python}", "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port"]
    assert zero2["argv"][6] == "{port}" and zero2["argv"][-2:] == ["--deepspeed_config", "ds_config.json"]
    assert single["launch"] == "python train.py"
    assert single["needs"] == ["transformers"] and zero2["needs"] == ["transformers", "deepspeed"]
    # The estimate is the plan's row for an H200, the reserved figure its allocated peak plus fragmentation.
    values = Case(strategy="single", **TINY).values() | {"gpu": "H200-141GB"}
    p = plan(inputs_from_values(values)[0])
    for spec in (single, zero2):
        row = p.row(spec["strategy"])
        assert row.memory is not None and row.time is not None
        est = spec["estimate"]
        assert est["peak_allocated_bytes"] == row.memory.peak.total
        frag = next(r for r in json.loads((out / spec["case_id"] / "plan.json").read_text())["strategies"]
                    if r["name"] == spec["strategy"])["device_overhead_bytes"]["fragmentation"]  # fmt: skip
        assert frag > 0 and est["peak_reserved_bytes"] == row.memory.peak.total + frag
        assert est["step_s"] == pytest.approx(row.time.step_s)
    # Budget: start-up for the launcher (python 30 s, deepspeed 50 s) + 3 steps x 3 x the predicted step.
    assert single["budget_s"] == pytest.approx(30.0 + 3 * 3.0 * single["estimate"]["step_s"], abs=0.06)
    assert zero2["budget_s"] == pytest.approx(50.0 + 3 * 3.0 * zero2["estimate"]["step_s"], abs=0.06)
    assert single["timeout_s"] == pytest.approx(2.5 * single["budget_s"], abs=0.2)


def test_the_default_cases_are_world_size_one_at_gemm_sizes():
    ids = [c.case_id for c in gpu_prepare.CASES]
    assert len(ids) == len(set(ids)) == 18
    assert all(c.world == 1 and c.precision == "bf16" for c in gpu_prepare.CASES)
    big = [c for c in gpu_prepare.CASES if c.model == gpu_prepare.LLAMA_1B]
    assert {c.seq_len for c in big} == {2048} and {c.micro_batch for c in big} == {4}
    assert {c.strategy for c in big} == {
        "single", "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "fsdp2", "fsdp2_offload"
    }  # fmt: skip
    assert sum(1 for c in big if c.quantize == "nf4" and c.double_quant) == 1
    assert [c.case_id for c in gpu_prepare.select(gpu_prepare.CASES, ["gpt2.*fsdp2"])] == [
        "gpt2-s1024-b8-bf16-adamw-fsdp2-w1"
    ]


def test_script_imports_finds_imports_inside_functions():
    text = "import os\nimport torch.nn\ndef f():\n    import deepspeed.comm as c\n    from peft import x\n"
    assert gpu_prepare.script_imports(text) == ["peft", "deepspeed"]
    assert gpu_run.fill_argv(["{python}", "{probe}", "--port={port}"], "/py", "/p.py", 123) == [
        "/py",
        "/p.py",
        "--port=123",
    ]


# A stand-in for a generated script run through the probe: it prints the script's step lines and writes the
# probe's report (advisor.run_report's format) with the figures given, or fails as told.
_FAKE = """
import json, os, sys
print("step 1/5 loss 2.0", flush=True)
if "{fail}":
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
os.makedirs("out", exist_ok=True)
rank = {{"rank": 0, "peak_allocated_bytes": 100, "peak_reserved_bytes": 200, "losses": [2.0, 1.9, 1.8, 1.7, 1.6],
        "step_times_s": [1.0, 0.5, 0.2, 0.3, 0.4], "profiled_steps": 0}}
json.dump({{"device": "cuda", "world_size": 1, "per_rank": [rank]}}, open("out/report.json", "w"))
"""


def _fake_case(root: Path, case_id: str, order: int, fail: bool = False, **over: object) -> None:
    folder = root / case_id
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(_FAKE.format(fail="yes" if fail else "")))
    spec = {
        "case_id": case_id,
        "order": order,
        "strategy": "single",
        "model": "fake",
        "argv": ["{python}", "train.py"],
        "steps": 5,
        "measured_steps": 5,
        "warmup_steps": 2,
        "needs": [],
        "budget_s": 20.0,
        "timeout_s": 60.0,
        "estimate": {"peak_allocated_bytes": 150, "peak_reserved_bytes": 180, "step_s": 0.45},
    } | over
    (folder / "expected.json").write_text(json.dumps(spec))


def test_run_reads_the_report_and_skips_or_fails_cases(tmp_path: Path):
    cases, out = tmp_path / "cases", tmp_path / "out"
    cases.mkdir()
    _fake_case(cases, "a-measured", 0)
    _fake_case(cases, "b-oom", 1, fail=True)
    _fake_case(cases, "c-missing", 2, needs=["no_such_package_here"])
    _fake_case(cases, "d-too-long", 3, budget_s=10_000.0)
    assert [r["case_id"] for r in gpu_run.run(cases, tmp_path / "one", calibrate=False, say=print, only=["^c-"])] == [
        "c-missing"
    ]
    results = gpu_run.run(cases, out, deadline_s=300.0, calibrate=False, say=lambda _m: None)
    assert [r["status"] for r in results] == ["ok", "failed", "skipped", "skipped"]
    ok, oom, missing, long = results
    m = ok["measured"]
    assert m is not None and m["peak_allocated_bytes"] == 100 and m["peak_reserved_bytes"] == 200
    assert m["step_s"] == pytest.approx(0.3)  # median of the steps after 2 warm-up: 0.2, 0.3, 0.4
    assert ok["allocated_error"] == pytest.approx(0.5)  # (150 - 100) / 100
    assert ok["reserved_error"] == pytest.approx(-0.1)  # (180 - 200) / 200
    assert ok["step_error"] == pytest.approx(0.5)  # (0.45 - 0.3) / 0.3
    assert "out of memory" in oom["error"] and oom["measured"] is None
    assert missing["error"] == "needs no_such_package_here (not installed here)"
    assert long["error"].startswith("budget 10000 s > ")
    # Written as each case ended: one line per case, the logs of those that ran, the machine.
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["case_id"] for line in lines] == ["a-measured", "b-oom", "c-missing", "d-too-long"]
    logs = (out / "logs.txt").read_text()
    assert "===== a-measured (ok)" in logs and "CUDA out of memory" in logs and "c-missing" not in logs
    machine = json.loads((out / "machine.json").read_text())
    import torch

    assert machine["torch"] == torch.__version__ and machine["python"] == sys.version.split()[0]
    # What comes back from the device machine: a few flat files.
    assert sorted(p.name for p in out.iterdir()) == ["logs.txt", "machine.json", "results.jsonl"]


def test_a_case_past_its_timeout_is_stopped(tmp_path: Path):
    cases, out = tmp_path / "cases", tmp_path / "out"
    cases.mkdir()
    folder = cases / "slow"
    _fake_case(cases, "slow", 0, timeout_s=1.0)
    (folder / "train.py").write_text("import time\nprint('step 1/5 loss 2.0', flush=True)\ntime.sleep(30)\n")
    (result,) = gpu_run.run(cases, out, calibrate=False, say=lambda _m: None)
    assert result["status"] == "failed" and "did not finish within 1 s" in result["error"]
    assert result["wall_s"] < 10


def test_render_writes_the_table_from_results(tmp_path: Path):
    machine = {
        "gpu": "NVIDIA H200",
        "gpu_memory_bytes": 150_754_820_096,
        "sm_count": 132,
        "driver": "580.159.04",
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "python": "3.12.3",
        "packages": {"transformers": "5.17.0", "peft": "0.18.0", "deepspeed": None},
        "date": "2026-12-10 09:00 UTC",
        "calibrate": {"ran": False, "reason": "no subcommand"},
    }
    ok = {
        "case_id": "llama-x-single-w1",
        "status": "ok",
        "error": "",
        "wall_s": 31.4,
        "budget_s": 36.5,
        "estimate": {"peak_allocated_bytes": 3 * 2**30, "peak_reserved_bytes": 4 * 2**30, "step_s": 0.15},
        "measured": {"peak_allocated_bytes": 2 * 2**30, "peak_reserved_bytes": 5 * 2**30, "step_s": 0.125},
        "allocated_error": 0.5,
        "reserved_error": -0.2,
        "step_error": 0.2,
        "notes": [],
    }
    failed = ok | {"case_id": "llama-x-fsdp2-w1", "status": "failed", "error": "out of memory", "measured": None}
    failed |= {"allocated_error": None, "reserved_error": None, "step_error": None}
    skipped = failed | {"case_id": "llama-x-zero2-w1", "status": "skipped", "error": "needs deepspeed"}
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    lines = [json.dumps(r) for r in (ok, failed, skipped)]
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + '\n{"case_id": "cut sh')  # a run stopped mid-line
    md = tmp_path / "GPU.md"
    assert gpu.main(["render", "--results", str(tmp_path), "--md", str(md)]) == 0
    text = md.read_text()
    assert "- GPU: NVIDIA H200 (140.40 GiB, 132 SMs), driver 580.159.04" in text
    assert (
        "torch 2.11.0+cu130 (CUDA 13.0)" in text
        and "packages: transformers 5.17.0, peft 0.18.0; not installed: deepspeed\n" in text
    )
    assert "- date: 2026-12-10 09:00 UTC" in text
    assert (
        "| llama-x-single-w1 | 3.00 | 2.00 | +50.0% | 4.00 | 5.00 | -20.0% | 150.0 | 125.0 | +20.0% | 31 | 36 | ok |"
        in text
    )
    assert (
        "| llama-x-fsdp2-w1 | 3.00 | - | - | 4.00 | - | - | 150.0 | - | - | 31 | 36 | FAILED: out of memory |" in text
    )
    assert "- llama-x-zero2-w1: needs deepspeed" in text
    assert "- allocated peak: median |error| 50.0%, worst 50.0% (1 case)" in text


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert gpu.main(["run", "--cases", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert gpu.main(["render", "--results", str(tmp_path)]) == 2
    assert gpu.main(["prepare", "--only", "no-such-case", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("advisor: error: ") for line in err)
    assert "no such folder" in err[0] and "results.jsonl" in err[1] and "no case matches" in err[2]


@pytest.mark.slow
def test_one_tiny_case_runs_end_to_end_on_cpu(tmp_path: Path, prepared: tuple[Path, list[Path]]):
    """The emitted script through the probe, as on the GPU machine (here on the CPU: memory profiled, no step
    time)."""
    out_cases, folders = prepared
    only = tmp_path / "cases"
    only.mkdir()
    import shutil

    shutil.copytree(folders[0], only / folders[0].name)
    (result,) = gpu_run.run(only, tmp_path / "out", calibrate=False, say=lambda _m: None)
    assert result["status"] == "ok", result["error"]
    m = result["measured"]
    assert m is not None and m["device"] == "cpu" and len(m["losses"]) == 3 and m["peak_allocated_bytes"] > 0


def test_slim_wheel_keeps_only_the_named_libraries(tmp_path: Path):
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    libs = ["cpu", "cuda130", "cuda128", "rocm72"]
    names = ["bitsandbytes/__init__.py", *(f"bitsandbytes/libbitsandbytes_{x}.so" for x in libs)]
    record = "bitsandbytes-0.50.2.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as z:
        for n in names:
            z.writestr(n, b"x" * 1000)
        z.writestr(record, "".join(f"{n},sha256=abc,1000\n" for n in names) + f"{record},,\n")
    gpu_wheels.slim_wheel(wheel)
    with zipfile.ZipFile(wheel) as z:
        kept = sorted(z.namelist())
        lines = z.read(record).decode().splitlines()
    assert kept == sorted([*names[:3], record])
    assert [line.split(",")[0] for line in lines] == [*names[:3], record]
