"""The trace cache wired into planning (issue 11, item 5): a what-if question that changes only the GPU
count, micro-batch, global batch, nodes, network or strategy traces nothing; every component of the
key misses; a corrupt entry is traced again and rewritten; --no-cache neither reads nor writes. The
cache module itself (atomic writes, concurrent writers, eviction) is tested in tests/test_cache.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor import profile, trace
from advisor.cache import DiskCache
from advisor.document import plan_to_dict
from advisor.plan import plan
from advisor.schema import plan_inputs
from advisor.trace import keys

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "tiny_llama.json")
# These tests are about the cache, what-if traces included (tests/conftest.py turns them off elsewhere).
pytestmark = pytest.mark.what_if_traces
BASE = dict(config_path=TINY, seq_len=64, gpus=2, gpu="A100-80GB", host_mem_gib=64, detect_hardware=False)


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """A fresh cache directory, no in-process traces, and counters of the traces and builds that run."""
    monkeypatch.setenv("ADVISOR_CACHE_DIR", str(tmp_path / "cache"))
    profile.clear_trace_cache()
    calls = {"traces": [], "counts": 0}
    real_trace, real_count = trace.profile_activations, profile.param_stats

    def traced(spec, mode, attention, checkpointing, tp_degree=1):
        calls["traces"].append((mode, attention, checkpointing, tp_degree))
        return real_trace(spec, mode, attention, checkpointing, tp_degree=tp_degree)

    def counted_stats(spec, tp_degree=1):
        calls["counts"] += 1
        return real_count(spec, tp_degree)

    monkeypatch.setattr(profile, "profile_activations", traced)
    monkeypatch.setattr(profile, "param_stats", counted_stats)
    yield calls
    profile.clear_trace_cache()


def _doc(**values) -> dict:
    profile.clear_trace_cache()  # as a new process would: only the disk remembers
    return plan_to_dict(plan(plan_inputs(**(BASE | values))))


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_what_if_questions_reuse_every_trace(counted):
    first = _doc()
    assert counted["traces"] and counted["counts"]
    counted["traces"].clear()
    counted["counts"] = 0
    for change in (
        dict(micro_batch_size=4),
        dict(global_batch_size=8),
        dict(nodes=2, network="ib-hdr"),
        dict(network="1gbe", nodes=2),
        dict(gpu="H100-80GB"),
        dict(gpus=4, tp_degree=2),
    ):
        doc = _doc(**change)
        assert doc["strategies"], change
    assert counted["traces"] == [] and counted["counts"] == 0
    assert _doc() == first  # the answer from the cache is the answer


@pytest.mark.parametrize(
    "change", [dict(seq_len=32), dict(precision="fp32"), dict(activation_checkpointing=True), dict(attention="math")]
)
@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_every_key_component_misses(counted, change):
    _doc()
    counted["traces"].clear()
    _doc(**change)
    assert counted["traces"], f"{change} re-used a trace made for other inputs"


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_another_gpu_count_finds_its_tp_shard_already_traced(counted):
    """bench/llama_small.json has 8 heads and 4 kv heads: 2 GPUs shard TP 2 ways, 4 GPUs 4 ways. The TP
    degree is in the key, so the first question also traces the shards of the usual node sizes (2 and 4
    here; 8 does not divide the kv heads), and the question with 4 GPUs traces nothing."""
    small = dict(config_path=str(ROOT / "bench" / "llama_small.json"), seq_len=32)
    _doc(**small)
    assert {t for t in counted["traces"] if t[3] > 1} == {
        ("autocast", "flash", False, 2),
        ("autocast", "flash", False, 4),
    }
    counted["traces"].clear()
    doc = _doc(**small, gpus=4)
    assert counted["traces"] == []
    assert {r["name"]: r.get("tp_degree") for r in doc["strategies"]}["tp"] == 4


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_the_tp_degree_is_in_the_key(counted, monkeypatch):
    """Without the what-if traces (as --no-cache plans: they write nothing to keep), a new TP degree traces."""
    from strategies.tp import TensorParallel

    monkeypatch.setattr(TensorParallel, "what_if_traces", lambda self, ctx: [])
    small = dict(config_path=str(ROOT / "bench" / "llama_small.json"), seq_len=32)
    _doc(**small)
    counted["traces"].clear()
    _doc(**small, gpus=4)
    assert counted["traces"] == [("autocast", "flash", False, 4)]  # only the TP rows' shard is new


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_a_changed_config_misses(counted, tmp_path):
    _doc()
    counted["traces"].clear()
    other = tmp_path / "wider.json"
    other.write_text(json.dumps(json.loads(Path(TINY).read_text()) | {"intermediate_size": 384}))
    _doc(config_path=str(other))
    assert counted["traces"] and counted["counts"]


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_library_and_code_versions_are_in_the_key(counted, monkeypatch):
    _doc()
    counted["traces"].clear()
    monkeypatch.setattr(keys, "library_versions", lambda: {"torch": "0.0.0"})
    _doc()
    assert counted["traces"]
    key = keys.model_key(plan(plan_inputs(**BASE)).spec)
    assert key["code"] == keys.code_hash() and len(key["code"]) == 16


def test_the_code_hash_reads_every_file_of_the_trace_package():
    read = {p.resolve() for p in keys.code_files()}
    package = ROOT / "advisor" / "trace"
    assert {package / "__init__.py", package / "timeline.py", ROOT / "advisor" / "profile.py"} <= read
    assert set(package.rglob("*.py")) <= read


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_a_corrupt_entry_is_traced_again_and_rewritten(counted, tmp_path):
    first = _doc()
    entries = sorted((tmp_path / "cache" / "activations").iterdir())
    assert entries
    for path in entries:
        path.write_bytes(b"\x00 not an entry")
    counted["traces"].clear()
    assert _doc() == first
    assert counted["traces"]
    assert all(p.read_bytes() != b"\x00 not an entry" for p in entries)
    counted["traces"].clear()
    _doc()
    assert counted["traces"] == []


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_no_cache_neither_reads_nor_writes(counted, tmp_path, capsys):
    from advisor.cli import main

    argv = ["--config", TINY, "--seq-len", "64", "--gpus", "2", "--gpu", "A100-80GB", "--json"]
    assert main(argv + ["--no-cache"]) == 0
    assert not (tmp_path / "cache").exists()
    assert main(argv) == 0
    info = DiskCache().info()
    assert (
        info.by_namespace["activations"][0] >= 1 and info.by_namespace["param_stats"][0] == 2
    )  # the model and its TP shard
    profile.clear_trace_cache()
    counted["traces"].clear()
    assert main(argv + ["--no-cache"]) == 0
    assert counted["traces"], "--no-cache read the cache"
    capsys.readouterr()
    assert main(["cache", "clear"]) == 0 and "removed" in capsys.readouterr().out
    assert DiskCache().info().entries == 0


def test_mem_efficient_is_the_flash_trace_relabelled(counted):
    """One stand-in traces both fused kernels (``advisor.trace``: ``FusedAttention``), so the memory-efficient
    profile is the flash one under its own name (``advisor.profile._TRACED_AS``): asked after flash, it traces
    nothing, and it equals its own uncached trace (were the stand-in ever to tell the kernels apart, that last
    check fails: drop the kernel from ``_TRACED_AS``)."""
    from advisor.models import resolve_model

    spec = resolve_model(None, config_path=TINY, seq_len=32)
    flash = profile.build_profile(spec, "flash", False).activations("autocast")
    assert len(counted["traces"]) == 1 and flash.attention == "flash"
    mem = profile.build_profile(spec, "mem-efficient", False).activations("autocast")
    assert len(counted["traces"]) == 1
    assert mem.attention == "mem-efficient" and mem.depths == flash.depths
    assert mem == trace.profile_activations(spec, "autocast", "mem-efficient", False)
