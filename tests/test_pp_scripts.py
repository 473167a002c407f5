"""The pipeline-parallel script (``strategies/templates/pp.py``, ``--strategy pp``), run for real on CPU with gloo:
PP 2 of a small Llama whose head is tied to its embedding (2 ranks, 1F1B), and PP 2 x DP 2 of a 4-block one (4
ranks, interleaved 1F1B, 2 model chunks per rank). Each layout runs once (module-scoped), beside one process
training the same model on the same data from the same seed; every assertion on a layout reads that run.

Targets: every rank's peak within 10% of its own stage's estimate (``PipelineParallel.rank_peak_bytes``), the loss
falls and equals the one-process run's within 1e-5 relative after 3 steps, and the tied head's two copies (the
first stage's embedding, the last stage's head) stay equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from advisor.schema import PlanInputs, plan_inputs
from advisor.verify import VerifyResult, verify

ROOT = Path(__file__).resolve().parents[1]
SMALL = json.loads((ROOT / "tests" / "data" / "small_llama.json").read_text())  # 2 blocks, 2.2M parameters
pytestmark = pytest.mark.slow
STEPS = 3


def _inputs(config: Path, gpus: int, global_batch: int, **pp) -> PlanInputs:
    return plan_inputs(
        config_path=str(config),
        seq_len=32,
        gpus=gpus,
        interconnect="nvlink",
        detect_hardware=False,
        precision="fp32",
        micro_batch_size=2,
        global_batch_size=global_batch,
        base_lr=2e-3,
        base_batch_size=8,
        **pp,
    )


def _layout(tmp_path_factory, name: str, config: dict, gpus: int, global_batch: int, **pp):
    """(the pipeline run, the one-process run of the same model, data and seed, the pipeline run's folder)."""
    folder = tmp_path_factory.mktemp(name)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    runs = []
    for strategy, ranks, extra in (("pp", gpus, dict(pp_degree=2, **pp)), ("single", 1, {})):
        result = verify(
            _inputs(path, ranks, global_batch, **extra),
            strategy,
            steps=STEPS,
            timeout_s=300,
            out_dir=str(folder / strategy),
            precision_explicit=True,
            timing_steps=0,
        )
        assert result.ok, result.message
        runs.append(result)
    return runs[0], runs[1], folder / "pp"


@pytest.fixture(scope="module")
def tied_pp2(tmp_path_factory):
    """PP 2, 1F1B, 4 micro-batches of 2 per step (global batch 8), the head tied to the embedding."""
    return _layout(tmp_path_factory, "pp2_tied", {**SMALL, "tie_word_embeddings": True}, 2, 8)


@pytest.fixture(scope="module")
def pp2_dp2(tmp_path_factory):
    """PP 2 x DP 2, interleaved 1F1B over 4 blocks (2 chunks of 1 block per rank), 4 micro-batches of 2 per step
    and pipeline (global batch 2 x 2 x 4 = 16)."""
    config = {**SMALL, "num_hidden_layers": 4}
    return _layout(tmp_path_factory, "pp2_dp2", config, 4, 16, pp_schedule="interleaved-1f1b")


def _check(pp: VerifyResult, single: VerifyResult, world: int, dp: int) -> None:
    assert pp.world_size == world and len(pp.per_rank) == world
    # every rank against its own stage's estimate: rank r is stage r // dp
    assert pp.rank_estimates is not None and len(set(pp.rank_estimates)) == 2
    for r in pp.per_rank:
        assert r["estimated_peak_bytes"] == pp.rank_estimates[r["rank"] // dp * dp]
        assert abs(r["relative_error"]) <= 0.10, pp.per_rank
    assert len(pp.losses) == len(single.losses) == STEPS
    assert pp.losses[-1] < pp.losses[0]
    assert pp.losses == pytest.approx(single.losses, rel=1e-5)


def test_pp2_tied_matches_its_stages_and_one_process(tied_pp2):
    pp, single, _ = tied_pp2
    _check(pp, single, 2, 1)


def test_pp2_dp2_interleaved_matches_its_stages_and_one_process(pp2_dp2):
    pp, single, _ = pp2_dp2
    _check(pp, single, 4, 2)


def test_tied_copies_stay_equal(tied_pp2, tmp_path):
    """The last checkpoint (DCP: each stage wrote its part) after 3 steps: the first stage's embedding and the last
    stage's head, two tensors on two ranks, are equal (their gradients were summed between the ends) and trained
    (not the initial weights: the exported model differs from a fresh one)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = tied_pp2[2]
    whole = tmp_path / "checkpoint.pt"
    dcp_to_torch_save(run / "out" / "checkpoints" / f"step-{STEPS}", whole)
    model = torch.load(whole, weights_only=False)["model"]
    embedding, head = model["0.model.embed_tokens.weight"], model["0.lm_head.weight"]
    assert embedding.shape == (SMALL["vocab_size"], SMALL["hidden_size"])
    assert torch.equal(embedding, head)
    from safetensors.torch import load_file

    exported = load_file(run / "out" / "model" / "model.safetensors")
    assert torch.equal(exported["model.embed_tokens.weight"], embedding)
    assert "lm_head.weight" not in exported  # tied: from_pretrained points the head at the embedding
