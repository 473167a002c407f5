"""Where does a case's measured peak come from? Runs one benchmark case's generated script under a
profiler that also records shapes and stacks, and reports, per rank, the live bytes at the peak by
the PyTorch memory profiler's categories (parameter, gradient, optimizer state, activation, input,
temporary, autograd detail, uncategorised) next to our estimate's breakdown.

    .venv/bin/python -m bench.diagnose resnet18-i64-b8-fp32-sgd-momentum-ddp-w1

The script is the one ``--verify`` runs, unchanged: a small wrapper imports it as a module and swaps
its ``CpuPeakMeter`` for the recording one below before calling ``main()``. Slow (stacks are
recorded); meant for the small benchmark cases.
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

_WRAPPER = r'''
import importlib.util, json, os, sys
import torch

spec = importlib.util.spec_from_file_location("train_diag", os.path.join(os.path.dirname(__file__), "train.py"))
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)


class RecordingMeter:
    """CpuPeakMeter's interface; also categorises the live bytes at the peak."""

    def __enter__(self):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                           record_shapes=True, with_stack=True)
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

        self.prof.__exit__(*exc)
        times, sizes = MemoryProfileTimeline(self.prof._memory_profile())._coalesce_timeline("cpu")
        names = ["unused"] + [c.name if c is not None else "UNCATEGORISED" for c in _CATEGORY_TO_INDEX]
        totals = [sum(row) for row in sizes]
        i = max(range(len(totals)), key=totals.__getitem__)
        best, best_t, total = totals[i], times[i] * 1000, totals[-1]
        snapshot = {names[j]: v for j, v in enumerate(sizes[i])}
        largest = []
        self.peak_bytes, self.final_bytes, self.ranges = best, total, {}
        ops = [e for e in self.prof.events() if e.time_range.start * 1000 <= best_t <= e.time_range.end * 1000]
        ops.sort(key=lambda e: e.time_range.end - e.time_range.start)
        rank = int(os.environ.get("RANK", "0"))
        out = {"rank": rank, "peak_bytes": best, "by_category_at_peak": {k: v for k, v in snapshot.items() if v},
               "largest_live_at_peak": [[n, c] for n, c in largest],
               "innermost_ops_at_peak": [e.name for e in ops[:6]]}
        with open(os.path.join(os.path.dirname(__file__), f"diag-rank{rank}.json"), "w") as f:
            json.dump(out, f, indent=1)


train.CpuPeakMeter = RecordingMeter
sys.argv[0] = "train.py"
train.main()
'''


def _case(case_id: str):
    for c in SUITE + SMOKE:
        if c.case_id == case_id:
            return c
    raise SystemExit(f"unknown case {case_id!r}; ids: python -c 'from bench.cases import SUITE; "
                     "print(*[c.case_id for c in SUITE], sep=chr(10))'")


def render_case(case, run_dir: Path):
    """Write the files ``verify`` would write for ``case`` (same plan, hardware and precision)."""
    from advisor.verify import free_port, run_hardware
    from advisor.plan import plan
    from strategies.render import job_from_plan, render_job, write_files

    from .run import plan_inputs

    inputs = plan_inputs(case)
    target = plan(inputs)
    hw = run_hardware(case.world, "cpu", [])
    opts = replace(target.options, global_batch_size=None)
    if case.strategy == "tp":
        hw, opts = replace(hw, gpus_per_node=case.world), replace(opts, tp_degree=case.world)
    run_plan = plan(replace(inputs, training=opts), device="cpu", hardware=hw)
    port = free_port()
    write_files(render_job(job_from_plan(run_plan, case.strategy, steps=case.steps, master_port=port)), run_dir)
    (run_dir / "diag_wrap.py").write_text(_WRAPPER)
    return run_plan.row(case.strategy).memory.peak, port


def main(argv: list[str] | None = None) -> int:
    from advisor.verify import _command

    case = _case((argv or sys.argv[1:])[0])
    with tempfile.TemporaryDirectory(prefix="advisor-diag-") as tmp:
        run_dir = Path(tmp)
        peak, port = render_case(case, run_dir)
        cmd = [("diag_wrap.py" if a == "train.py" else a) for a in _command(case.strategy, case.world, port, case.steps)]
        env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
                   PYTHONPATH=os.getcwd())
        proc = subprocess.run(cmd + ["--no-save"], cwd=run_dir, env=env, capture_output=True, text=True)
        if proc.returncode:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return 1
        print(f"{case.case_id}\nestimate ({peak.phase}): " + json.dumps({k: round(v / 2**20, 1) for k, v in
                                                                         peak.as_dict().items()}))
        for f in sorted(run_dir.glob("diag-rank*.json")):
            d = json.loads(f.read_text())
            print(f"rank {d['rank']}: peak {d['peak_bytes'] / 2**20:.1f} MiB at {d['innermost_ops_at_peak'][:3]}")
            print("  by category (MiB): " + json.dumps({k: round(v / 2**20, 1) for k, v in
                                                       sorted(d['by_category_at_peak'].items())}))
            print("  largest live tensors (MiB, category): " +
                  ", ".join(f"{n / 2**20:.1f} {c}" for n, c in d["largest_live_at_peak"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
