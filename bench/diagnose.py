"""Where does a case's measured peak come from? Runs one benchmark case's generated script with the
profiler's allocator events and named ranges around the DDP/DeepSpeed/optimizer methods that
allocate (``ANNOTATE`` in the wrapper), and reports per rank: the peak, the ranges and op running at
it, the largest allocations alive at that moment and the live bytes grouped by the range that
allocated them. ``--categories`` adds the PyTorch memory profiler's categories (parameter, gradient,
optimizer state, activation, ...; slow and memory-hungry, fine for single-rank DDP cases);
``--save`` keeps the script's checkpoint step. Our estimate's breakdown is printed first.

    .venv/bin/python -m bench.diagnose llama-small-s256-b4-fp32-adamw-zero2-w2

The script is the one ``--verify`` runs, unchanged: a small wrapper runs it through advisor's measurement probe
(``strategies/probe/_advisor_probe.py``) with the probe's CPU meter swapped for the recording one below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from .cases import SMOKE, SUITE

_WRAPPER = r"""
import functools, importlib, importlib.util, json, os, sys, tempfile
import torch

sys.path.insert(0, os.environ["DIAG_PROBE_DIR"])
import _advisor_probe
CATEGORIES = os.environ.get("DIAG_CATEGORIES") == "1"
# Methods wrapped in a named profiler range, so allocations can be attributed to them.
ANNOTATE = [
    ("torch.optim.optimizer", "Optimizer", "zero_grad"),
    ("torch.optim.adamw", "AdamW", "step"), ("torch.optim.adam", "Adam", "step"), ("torch.optim.sgd", "SGD", "step"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "forward"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel", "__init__"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "forward"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "backward"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "step"),
    ("deepspeed.runtime.engine", "DeepSpeedEngine", "__init__"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "step"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "setup_buckets"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "independent_gradient_partition_epilogue"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "reduce_ipg_grads"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "copy_grads_in_partition"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "_optimizer_step"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer", "process_gradients"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "step"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "_optimizer_step"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "independent_gradient_partition_epilogue"),
    (
        "deepspeed.runtime.zero.stage3",
        "DeepSpeedZeroOptimizer_Stage3",
        "reduce_independent_p_g_buckets_and_remove_grads",
    ),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "partition_grads"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "_pre_step"),
    ("deepspeed.runtime.zero.stage3", "DeepSpeedZeroOptimizer_Stage3", "_post_step"),
    ("deepspeed.runtime.zero.partitioned_param_coordinator", "PartitionedParameterCoordinator", "fetch_sub_module"),
    ("deepspeed.runtime.zero.partitioned_param_coordinator", "PartitionedParameterCoordinator", "release_sub_module"),
]


def _annotate():
    for mod, cls, meth in ANNOTATE:
        try:
            klass = getattr(importlib.import_module(mod), cls)
        except Exception:
            continue
        fn = klass.__dict__.get(meth)
        if fn is None:
            continue

        def make(fn, label):
            @functools.wraps(fn)
            def wrapper(*a, **k):
                with torch.profiler.record_function(label):
                    return fn(*a, **k)
            return wrapper

        setattr(klass, meth, make(fn, f"{cls}.{meth}"))


def _categories(prof):
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    names = ["unused"] + [c.name if c is not None else "UNCATEGORISED" for c in _CATEGORY_TO_INDEX]
    totals = [sum(row) for row in sizes]
    i = max(range(len(totals)), key=totals.__getitem__)
    return {names[j]: v for j, v in enumerate(sizes[i]) if v}


class RecordingMeter:
    # CpuPeakMeter's interface; also attributes the live allocations at the peak to annotated ranges.

    def __enter__(self):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                           record_shapes=CATEGORIES, with_stack=CATEGORIES)
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        self.prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        os.remove(path)
        mem = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                     key=lambda e: e["ts"])
        live, best, best_i, snapshot = {}, -1, 0, {}
        for i, e in enumerate(mem):
            a = e["args"]
            if a["Bytes"] > 0:
                live[a["Addr"]] = (a["Bytes"], e["ts"])
            else:
                live.pop(a["Addr"], None)
            if a["Total Allocated"] > best:
                best, best_i, snapshot = a["Total Allocated"], i, dict(live)
        self.peak_bytes, self.final_bytes, self.ranges = best, mem[-1]["args"]["Total Allocated"] if mem else 0, {}
        self.raw_peak_bytes, self.unseen_frees = best, 0  # the probe reads CpuPeakMeter's figures: the raw ones here
        t_peak = mem[best_i]["ts"] if mem else 0
        spans = [e for e in events if e.get("cat") in ("user_annotation", "cpu_op") and "dur" in e]

        def where(ts):
            inside = [e for e in spans if e["ts"] <= ts <= e["ts"] + e["dur"]]
            inside.sort(key=lambda e: -e["dur"])
            names = [e["name"] for e in inside if e.get("cat") == "user_annotation"]
            ops = [e["name"] for e in inside if e.get("cat") == "cpu_op"]
            return names + ops[-2:]

        largest = sorted(snapshot.values(), reverse=True)[:14]
        by_site = {}
        for n, ts in snapshot.values():
            site = " > ".join(where(ts))
            by_site[site] = by_site.get(site, 0) + n
        rank = int(os.environ.get("RANK", "0"))
        out = {"rank": rank, "peak_bytes": best, "live_bytes_tracked": sum(n for n, _ in snapshot.values()),
               "at_peak": where(t_peak),
               "largest_live_at_peak": [[n, round((t_peak - ts) / 1e3, 1), where(ts)] for n, ts in largest],
               "live_by_site_at_peak": sorted(([n, site] for site, n in by_site.items()), reverse=True)[:16]}
        if CATEGORIES:
            out["by_category_at_peak"] = _categories(self.prof)
        with open(os.path.join(os.path.dirname(__file__), f"diag-rank{rank}.json"), "w") as f:
            json.dump(out, f, indent=1)


_annotate()
_advisor_probe.CPU_METER = RecordingMeter
_advisor_probe.main(["train.py", *sys.argv[1:]])
"""


def _case(case_id: str):
    for c in SUITE + SMOKE:
        if c.case_id == case_id:
            return c
    raise SystemExit(
        f"unknown case {case_id!r}; ids: python -c 'from bench.cases import SUITE; "
        "print(*[c.case_id for c in SUITE], sep=chr(10))'"
    )


def render_case(case, run_dir: Path):
    """Write the files ``verify`` would write for ``case`` (same plan, hardware and precision)."""
    from advisor.plan import plan
    from advisor.verify import free_port
    from advisor.verify_setup import run_hardware
    from strategies import get_strategy
    from strategies.render import job_from_plan, render_job, write_files

    from .run import plan_inputs

    inputs = plan_inputs(case)
    target = plan(inputs)
    hw = run_hardware(case.world, "cpu", [])
    opts = replace(target.options, global_batch_size=None)
    hw, opts = get_strategy(case.strategy).verify_cluster(hw, opts, target.row(case.strategy))
    run_plan = plan(replace(inputs, training=opts), device="cpu", hardware=hw)
    port = free_port()
    write_files(render_job(job_from_plan(run_plan, case.strategy, steps=case.steps, master_port=port)), run_dir)
    (run_dir / "diag_wrap.py").write_text(_WRAPPER)
    return run_plan.row(case.strategy).memory.peak, port


def main(argv: list[str] | None = None) -> int:
    from strategies import get_strategy
    from strategies.launchers import PROBE

    args = list(argv if argv is not None else sys.argv[1:])
    categories = "--categories" in args
    case = _case(next(a for a in args if not a.startswith("--")))
    M = 2**20
    with tempfile.TemporaryDirectory(prefix="advisor-diag-") as tmp:
        run_dir = Path(tmp)
        peak, port = render_case(case, run_dir)
        argv = get_strategy(case.strategy).launcher.verify_argv(
            case.world, port, ["--steps", str(case.steps), "--out", "out"]
        )
        cmd = [("diag_wrap.py" if a == "train.py" else a) for a in argv]
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            DS_ACCELERATOR="cpu",
            HF_HUB_OFFLINE="1",
            PYTHONPATH=os.getcwd(),
            DIAG_CATEGORIES="1" if categories else "0",
            DIAG_PROBE_DIR=str(PROBE.parent),
        )
        proc = subprocess.run(
            cmd + ([] if "--save" in args else ["--no-save"]), cwd=run_dir, env=env, capture_output=True, text=True
        )
        if proc.returncode:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return 1
        print(
            f"{case.case_id}\nestimate ({peak.phase}), MiB: "
            + json.dumps({k: round(v / M, 1) for k, v in peak.as_dict().items()})
        )
        for f in sorted(run_dir.glob("diag-rank*.json")):
            d = json.loads(f.read_text())
            print(f"rank {d['rank']}: peak {d['peak_bytes'] / M:.1f} MiB in {d['at_peak']}")
            if "by_category_at_peak" in d:
                print(
                    "  by category (MiB): "
                    + json.dumps({k: round(v / M, 1) for k, v in sorted(d["by_category_at_peak"].items())})
                )
            print(f"  largest live allocations at the peak (tracked {d['live_bytes_tracked'] / M:.1f} MiB):")
            for n, age_ms, frames in d["largest_live_at_peak"]:
                print(f"    {n / M:8.1f} MiB, allocated {age_ms:9.1f} ms before, in {frames}")
            print("  live bytes at the peak by allocation site:")
            for n, site in d["live_by_site_at_peak"]:
                print(f"    {n / M:8.1f} MiB  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
