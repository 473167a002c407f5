"""O67 (torchtune's optimization-flags table, Llama 3.2 3B on one A100 80 GB) re-predicted rung by rung
(bench/published_ladder.py): the targets of issue 29 that hold, and the stated misses."""

from __future__ import annotations

import pytest

from bench.published_ladder import evaluate, render, speed_ratios

# Each plans a model of its own with the ladder's extra traces (over 5 s on 2 cores).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results():  # noqa: ANN201
    return {r.rung: r for r in evaluate()}


def test_o67_rungs_against_the_published_peaks(results) -> None:  # noqa: ANN001
    assert list(results) == [
        "packed",
        "chunked_ce",
        "ac_full",
        "optimizer_in_backward",
        "activation_offload",
        "adamw_8bit",
        "lora",
        "qlora",
    ]
    # The eager "+packed" peak within 15% of 60.0 GiB; each later saving within 15% or 1 GiB of the published delta
    # (checkpointing after compile's stated -9.0 GiB offset).
    for rung in ("packed", "chunked_ce", "ac_full", "activation_offload"):
        assert results[rung].within, rung
    assert abs(results["packed"].predicted_gib - 60.0) <= 0.15 * 60.0
    assert results["ac_full"].offset == 9.0
    # The stated misses: 8-bit AdamW saves about 2 bytes per parameter (5.9 GiB vs 4.2), QLoRA's fp32 embedding.
    assert not results["adamw_8bit"].within and 5.5 < results["adamw_8bit"].predicted_saving < 6.3
    # The chunked loss is sized as advisor's scripts compute it (the output head once, the logits' whole 16-bit
    # gradient beside them in backward: memory_options.chunked_ce_bytes), not as torchtune's per-chunk output head:
    # 2 bytes per logit more, 1.96 GiB at 8192 x 128256. The rungs above it carry that: the peak stays at the loss's
    # backward, before any gradient exists, so the optimizer step in backward saves next to nothing there (1.8 GiB
    # published), and LoRA's and QLoRA's peaks are about 2 GiB over torchtune's.
    assert not results["optimizer_in_backward"].within and results["optimizer_in_backward"].predicted_saving < 0.2
    assert not results["lora"].within and 10.0 < results["lora"].predicted_gib < 11.0
    assert not results["qlora"].within and 7.0 < results["qlora"].predicted_gib < 8.0


def test_o67_checkpointing_speed_ratio(results) -> None:  # noqa: ANN001
    pub, pred = speed_ratios(list(results.values()))["ac_full"]
    assert pred is not None
    # As savings ratios: the published slowdown 1 - 7210/9174 = 21.4%; the predicted within 25% of it.
    assert abs((1 - pred) / (1 - pub) - 1) <= 0.25
    assert "| ac_full |" in render(list(results.values()))
