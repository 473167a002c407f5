"""The benchmark end to end on the smoke set's one-rank DDP case (``--only``; the ZeRO and TP verify runs are
tests/test_scripts.py's): a generated script run on a CPU rank, measured, compared with every estimate, rendered as
RESULTS.md, results.json and the PNG plot; then ``--repredict`` on that results.json."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from advisor.verify import TOLERANCE
from bench.cases import SMOKE


@pytest.mark.slow
def test_bench_smoke(tmp_path, root):
    case_id = next(c.case_id for c in SMOKE if c.strategy == "ddp")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--only", case_id, "--no-cli", "--out", str(tmp_path)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["suite"] == "partial" and [c["case_id"] for c in data["cases"]] == [case_id]
    for case in data["cases"]:
        assert case["ok"], case.get("message")
        assert len(case["per_rank_peak_bytes"]) == case["world"]
        assert case["measured_peak_bytes"] == max(case["per_rank_peak_bytes"]) > 0
        errs = case["errors"]
        for key in ("ours", "accelerate", "rule"):
            assert math.isfinite(errs[key])
        assert (errs["deepspeed"] is None) == (case["strategy"] != "zero2")
        # our estimate within verify's tolerance on these small, well-understood cases
        assert abs(errs["ours"]) <= TOLERANCE, case["case_id"]
        expected = (case["estimates"]["ours"] - case["measured_peak_bytes"]) / case["measured_peak_bytes"]
        assert errs["ours"] == pytest.approx(expected)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "| # | case | strategy |" in text and "median" in text and "worst" in text
    assert "torch " in text and "deepspeed " in text  # versions in the header
    assert (tmp_path / "estimate_vs_measured.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The step time is measured and predicted; --repredict computes the prediction again without a run.
    case = data["cases"][0]
    assert case["measured_step_s"] > 0 and case["predicted_step_s"] > 0
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--repredict",
            str(tmp_path / "results.json"),
            "--out",
            str(tmp_path / "again"),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    redone = json.loads((tmp_path / "again" / "results.json").read_text())
    assert redone["step_time_repredicted"] and redone["cases"][0]["measured_step_s"] == case["measured_step_s"]
    assert redone["cases"][0]["predicted_step_s"] == pytest.approx(case["predicted_step_s"], rel=0.5)
    assert "recomputed" in (tmp_path / "again" / "RESULTS.md").read_text()
