"""The benchmark's --smoke mode end to end: 3 generated scripts run on CPU ranks (DDP, ZeRO-2, TP),
measured, compared with every estimate, rendered as RESULTS.md, results.json and the PNG plot."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from advisor.verify import TOLERANCE


@pytest.mark.slow
def test_bench_smoke(tmp_path, root):
    proc = subprocess.run([sys.executable, "-m", "bench.run", "--smoke", "--no-cli", "--out", str(tmp_path)],
                          cwd=root, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["suite"] == "smoke" and len(data["cases"]) == 3
    assert {c["strategy"] for c in data["cases"]} == {"ddp", "zero2", "tp"}
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
