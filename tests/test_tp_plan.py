"""TP by transformers' own plans (``advisor.models.tp_plan``): which model types it shards and why others are
refused, the tied-embedding default of the config class, and a TP script of another family (gemma: tied
embeddings, GeGLU, explicit head_dim) run on 2 CPU ranks, its exported weights loading into the plain model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from advisor.models.tp_plan import ties_embeddings, tp_plan_blocker
from advisor.schema import plan_inputs
from advisor.verify import TOLERANCE, verify
from tests.emitted import load_train_py


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "gemma", "gemma2", "starcoder2", "phi", "olmo"])
def test_column_and_row_wise_plans_are_sharded(model_type):
    assert tp_plan_blocker(model_type, {}) is None


@pytest.mark.parametrize(
    ("model_type", "config", "why"),
    [
        ("qwen3", {}, "styles advisor does not map: replicated_with_grad_allreduce"),
        ("gpt_neox", {}, "styles advisor does not map: embedding_rowwise"),
        ("olmo2", {}, "colwise_gather_output, rowwise_split_input"),
        ("llama", {"num_local_experts": 8}, "mixture of experts"),
        ("mixtral", {}, "does not shard both the attention and the MLP"),  # its base plan shards the attention only
        ("gpt2", {}, "no tensor-parallel plan in transformers"),
        ("t5", {}, "not a causal language model"),
        (None, {}, "not a causal language model"),
    ],
)
def test_other_plans_are_refused_with_their_style(model_type, config, why):
    blocker = tp_plan_blocker(model_type, config)
    assert blocker is not None and why in blocker


def test_tied_embeddings_follow_the_config_class_default():
    from transformers import CONFIG_MAPPING

    for model_type in ("llama", "gemma", "starcoder2"):
        assert ties_embeddings(model_type, {}) == CONFIG_MAPPING[model_type]().tie_word_embeddings
    assert ties_embeddings("gemma", {"tie_word_embeddings": False}) is False


GEMMA = dict(
    model_type="gemma",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=128,
)


@pytest.mark.slow  # a 2-rank script run (about 20 s on 2 cores)
def test_gemma_tp_script_trains_and_exports_full_weights(tmp_path):
    cfg = tmp_path / "gemma.json"
    cfg.write_text(json.dumps(GEMMA))
    inputs = plan_inputs(
        config_path=str(cfg), seq_len=32, gpus=2, interconnect="nvlink", detect_hardware=False, precision="fp32",
        micro_batch_size=2, base_lr=2e-3, base_batch_size=4,
    )  # fmt: skip
    out = tmp_path / "run"
    result = verify(inputs, "tp", steps=4, timeout_s=300, out_dir=str(out), precision_explicit=True)
    assert result.ok, result.message
    assert result.world_size == 2 and result.losses[-1] < result.losses[0]
    assert abs(result.relative_error) <= TOLERANCE, result.per_rank
    from safetensors.torch import load_file

    script = load_train_py(out / "train.py", "generated_gemma_tp")
    model = script.build_model()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # gemma ties them
    exported = load_file(Path(out) / "out" / "model" / "model.safetensors")
    model.load_state_dict(exported, strict=False)  # the tied head is saved once
    full = {k: v.shape for k, v in model.state_dict().items()}
    assert (
        all(full[k] == v.shape for k, v in exported.items())
        and torch.isfinite(torch.cat([v.flatten().float() for v in exported.values()])).all()
    )


_LOSS_PARALLEL = """
import os, torch, torch.nn.functional as F
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel
from advisor.measure import CpuPeakMeter
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + os.environ["PORT"])
mesh = init_device_mesh("cpu", (1,))
rows, vocab = 1024, 4000
for parallel in (False, True):
    x = torch.randn(rows, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,))
    ctx = loss_parallel if parallel else torch.enable_grad
    with CpuPeakMeter() as forward, ctx():
        loss = F.cross_entropy(DTensor.from_local(x, mesh, [Shard(-1)]) if parallel else x, labels)
    with CpuPeakMeter() as backward, ctx():
        loss.backward()
    print(forward.peak_bytes, backward.peak_bytes)
    del loss, x
dist.destroy_process_group()
"""


def test_loss_parallel_holds_one_logits_copy_more_than_the_fused_loss():
    """The rule strategies.tp adds (``loss_extra_bytes``): torch's vocab-parallel cross-entropy keeps one fp32 copy
    of the logits more than F.cross_entropy at forward's peak (2 vs 1) and at backward's (3 vs 2)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), PORT=str(port))
    out = subprocess.run([sys.executable, "-c", _LOSS_PARALLEL], env=env, capture_output=True, text=True, check=True)
    (plain_f, plain_b), (par_f, par_b) = (map(int, line.split()) for line in out.stdout.split("\n")[:2])
    copy = 1024 * 4000 * 4
    assert (round(plain_f / copy, 2), round(plain_b / copy, 2)) == (1.0, 2.0)
    assert (round(par_f / copy, 2), round(par_b / copy, 2)) == (2.0, 3.0)


def test_pipeline_stages_stay_with_llama_style_decoders(tmp_path):
    """TP takes gemma by transformers' plan; the pipeline script's stages rebuild Llama-style decoders by attribute
    name, so PP refuses it in one line (and the layout search tries no PP layout for it)."""
    from advisor.errors import AdvisorError
    from advisor.plan import plan

    cfg = tmp_path / "gemma.json"
    cfg.write_text(json.dumps(GEMMA))
    ask = dict(config_path=str(cfg), seq_len=32, gpus=4, gpu="A100-80GB", detect_hardware=False)
    with pytest.raises(AdvisorError, match="cut for llama/mistral/qwen2 decoders only .* not gemma"):
        plan(plan_inputs(**ask, pp_degree=2))
    searched = plan(plan_inputs(**ask, nodes=2, top=100)).layouts
    assert searched and {c.layout.pp for c in searched} == {1} and max(c.layout.tp for c in searched) > 1
