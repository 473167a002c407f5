"""Plans made at the same time in several threads (the Streamlit page plans each browser session in its
own thread) give exactly the plans made one after another, and a trace changes nothing another thread
can see (issue 11, item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "tiny_llama.json")

# Four questions of four model families (small sequence lengths / images: two CPU cores), each planned for the
# cluster ("cuda") and as the estimate of a 2-rank CPU verification run ("cpu"): 8 plans at once. (16 plans of 8
# questions found nothing these do not; they took a minute of CI.) Flat field values,
# as in tests/golden/corpus.py, turned into plans by tests/golden/build.py.
QUESTIONS: dict[str, dict] = {
    "gpt2-s256": dict(model="gpt2", seq_len=256),
    "resnet18-64px": dict(model="resnet18", image_size=64, optimizer="sgd-momentum"),
    "tiny_llama": dict(config_path=TINY),
    "t5-base-s128": dict(model="t5-base", seq_len=128),
}
CLUSTER = dict(gpus=2, gpu="A100-80GB", host_mem_gib=512)
CPU_RUN = dict(device="cpu", cpu_world=2)
CASES: dict[str, dict] = {}
for _name, _question in QUESTIONS.items():
    CASES[f"cuda:{_name}"] = dict(_question, **CLUSTER)
    CASES[f"cpu:{_name}"] = dict(_question, **CPU_RUN)

_SERIAL = """
import json, sys
from advisor.document import plan_to_dict
from tests.golden.build import plan_for
cases = json.loads(sys.argv[1])
docs = {name: json.dumps(plan_to_dict(plan_for(dict(case))), sort_keys=True) for name, case in cases.items()}
print(json.dumps(docs))
"""


def _serial_in_fresh_process(cache_dir: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), ADVISOR_CACHE_DIR=str(cache_dir))
    return subprocess.Popen(
        [sys.executable, "-c", _SERIAL, json.dumps(CASES)],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _first_difference(a, b, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or a[k] != b[k]:
                return _first_difference(a.get(k), b.get(k), f"{path}/{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: serial {str(a)[:120]} vs threads {str(b)[:120]}"


@pytest.mark.slow  # about 40 s on 2 busy cores: every one of its 8 plans traces, in threads and in a process
def test_concurrent_plans_equal_serial_plans(tmp_path, monkeypatch):
    from advisor.document import plan_to_dict
    from advisor.profile import clear_trace_cache
    from tests.golden.build import plan_for

    # The reference: the same plans one after another in a fresh process (on the other core meanwhile).
    serial = _serial_in_fresh_process(tmp_path / "serial-cache")
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "threads-cache"))  # no trace comes from disk
    clear_trace_cache()  # nor from memory: every thread traces
    barrier = threading.Barrier(len(CASES))

    def one(case: dict) -> str:
        barrier.wait(timeout=120)  # all start together
        return json.dumps(plan_to_dict(plan_for(dict(case))), sort_keys=True)

    started = time.perf_counter()
    with ThreadPoolExecutor(len(CASES)) as pool:
        futures = {name: pool.submit(one, case) for name, case in CASES.items()}
        errors, threaded = {}, {}
        for name, future in futures.items():
            try:
                threaded[name] = future.result(timeout=600)
            except Exception as err:  # noqa: BLE001 - every failure is reported below
                errors[name] = f"{type(err).__name__}: {err}"
    threaded_s = time.perf_counter() - started
    out, err = serial.communicate(timeout=600)
    assert not errors, errors
    assert serial.returncode == 0, err[-3000:]
    reference = json.loads(out)
    assert set(reference) == set(threaded) == set(CASES)
    differ = {
        name: _first_difference(json.loads(reference[name]), json.loads(threaded[name]))
        for name in CASES
        if reference[name] != threaded[name]
    }
    assert not differ, differ
    print(f"{len(CASES)} threaded plans in {threaded_s:.1f} s")


def test_a_trace_changes_nothing_other_threads_see():
    import sys as _sys

    import torch
    import torch.nn.functional as F

    from advisor.models import resolve_model
    from advisor.trace import profile_activations

    sdpa, normal, kaiming = F.scaled_dot_product_attention, torch.nn.init.normal_, torch.nn.init.kaiming_uniform_
    linear_kaiming = torch.nn.modules.linear.init.kaiming_uniform_
    default = torch.get_default_dtype()
    seen: list[str] = []
    samples = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal samples
        while not done.is_set():
            samples += 1
            if F.scaled_dot_product_attention is not sdpa:
                seen.append("F.scaled_dot_product_attention rebound")
            if torch.get_default_dtype() != default:
                seen.append(f"default dtype {torch.get_default_dtype()}")
            if torch.nn.init.normal_ is not normal or torch.nn.init.kaiming_uniform_ is not kaiming:
                seen.append("torch.nn.init patched")
            if torch.nn.modules.linear.init.kaiming_uniform_ is not linear_kaiming:
                seen.append("torch.nn.modules.linear's init patched")
            time.sleep(0)

    results = []

    def trace() -> None:
        # bf16 weights (the build dtype), the math path and fused stand-in, recomputation in backward,
        # nn.MultiheadAttention (ViT), transformers and torchvision builds.
        results.append(profile_activations(resolve_model("gpt2", seq_len=64), "half", "math", True))
        results.append(profile_activations(resolve_model("vit_b_16", image_size=32), "half", "flash", True))
        results.append(profile_activations(resolve_model("resnet18", image_size=32), "half", "flash", False))

    interval = _sys.getswitchinterval()
    _sys.setswitchinterval(1e-4)  # sample densely
    try:
        watcher = threading.Thread(target=watch)
        watcher.start()
        tracer = threading.Thread(target=trace)
        tracer.start()
        tracer.join(timeout=300)
        done.set()
        watcher.join(timeout=10)
    finally:
        _sys.setswitchinterval(interval)
    assert len(results) == 3, "the traces did not finish"
    assert results[0].uses_sdpa and results[1].uses_sdpa  # the attention mode saw the calls
    assert samples > 1000, samples
    assert not seen, sorted(set(seen))


def test_busy_verify_lock_exits_75_and_names_its_holder(tmp_path, monkeypatch, capsys):
    """Issue 25: a second --verify while one runs exited 2, as if the input were bad, and did not say who held the
    machine. Now: exit 75 (sysexits' EX_TEMPFAIL), and the line names the holder's pid and command."""
    from advisor.cli import main
    from advisor.processes import MachineLock

    monkeypatch.setenv("ADVISOR_VERIFY_LOCK", str(tmp_path / "verify.lock"))
    small = str(Path(__file__).resolve().parent / "data" / "small_llama.json")
    with MachineLock():
        code = main(
            [
                "--config",
                small,
                "--seq-len",
                "32",
                "--micro-batch-size",
                "2",
                "--gpus",
                "2",
                "--precision",
                "fp32",
                "--strategy",
                "ddp",
                "--verify",
                "--steps",
                "1",
                "--emit",
                str(tmp_path / "run"),
            ]
        )
    err = capsys.readouterr().err
    assert code == 75, err
    line = next(x for x in err.splitlines() if x.startswith("advisor: error:"))
    assert "another verification is running on this machine (held by pid " in line and f"pid {os.getpid()}," in line
    assert "retry" in line
    # the job as planned is written (--emit), nothing of the verification while busy
    assert (tmp_path / "run" / "train.py").exists() and not (tmp_path / "run" / "verify").exists()
    assert (tmp_path / "verify.lock").read_text() == ""  # the holder left it empty when it let go
