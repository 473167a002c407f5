"""Mixture of experts (issue 12): Mixtral-8x7B from its real config.json plans in every precision, its
parameter counts (all experts for memory, the routed top-k for FLOPs) and the traced FLOPs and activations
of a tiny Mixtral under balanced top-k routing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from advisor.document import plan_to_dict
from advisor.models import build_model, resolve_model
from advisor.plan import plan
from advisor.profile import param_stats
from advisor.schema import plan_inputs
from advisor.text_report import render_text

MIXTRAL = Path(__file__).parent / "data" / "configs" / "mixtral-8x7b-v0.1.json"
TINY = {
    "model_type": "mixtral",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 32,
    "tie_word_embeddings": False,
}


def _mixtral_expert_params(cfg: dict) -> int:
    """Routed-expert weights of a Mixtral: per layer n experts x (gate + up + down) = n x 3 x H x I."""
    return cfg["num_hidden_layers"] * cfg["num_local_experts"] * 3 * cfg["hidden_size"] * cfg["intermediate_size"]


def test_mixtral_8x7b_counts():
    """Total = every parameter of the meta-built model (46,702,792,704, the published 46.7B); active per token
    = total - (1 - k/n) x expert weights = 12,879,925,248 (the published 12.9B)."""
    cfg = json.loads(MIXTRAL.read_text())
    spec = resolve_model(None, config_path=str(MIXTRAL))
    with torch.device("meta"):
        real = sum(p.numel() for p in build_model(spec).parameters())
    stats = param_stats(spec)
    assert stats.num_params == real == 46_702_792_704
    k, n = cfg["num_experts_per_tok"], cfg["num_local_experts"]
    assert stats.num_active_params == real - _mixtral_expert_params(cfg) * (n - k) // n == 12_879_925_248
    assert (stats.num_experts, stats.experts_per_token) == (8, 2)


def test_dense_model_active_equals_total():
    stats = param_stats(resolve_model("gpt2"))
    assert stats.num_active_params == stats.num_params and stats.num_experts == stats.experts_per_token == 0


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
@pytest.mark.parametrize("precision", ["bf16", "fp32", "pure-bf16"])
def test_mixtral_8x7b_plans(precision):
    """It used to fail in bf16 and fp32: FakeTensor's meta kernel of aten::_grouped_mm (transformers' default
    experts path) rejects the fp32 operands that fp32 weights give."""
    p = plan(plan_inputs(config_path=str(MIXTRAL), gpus=8, gpu="A100-80GB", precision=precision, detect_hardware=False))
    doc = plan_to_dict(p)["model"]
    assert doc["num_params"] == 46_702_792_704 and doc["num_active_params"] == 12_879_925_248
    assert doc["activation_bytes_per_sample"] > 0
    # forward + backward = 3 x 2 x tokens x active matmul weights, roughly (attention adds a few per cent)
    assert 6 * 2048 * 12.75e9 < doc["flops_per_sample"] < 1.1 * 6 * 2048 * 12.75e9
    assert (
        "46.70B parameters (46,702,792,704; trainable 46,702,792,704; 12.88B active per token, top-2 of 8 "
        "experts)" in render_text(p)
    )


@pytest.mark.parametrize("mode", ["autocast", "fp32", "half"])
def test_tiny_mixtral_flops_and_activations(mode):
    """Balanced top-2 routing of 32 tokens over 4 experts (each expert 32 x 2 / 4 rows; the grouped matmul
    sees S = 32 x 2 rows however the router splits them). Per token and layer the forward's multiply-adds
    are q, k, v, o (H x H, H x kv, H x kv, H x H), the router (H x n) and k experts (gate+up H x 2I, down
    I x H); plus the LM head (H x V). Forward = 2 x s x that + attention 4 x L x s^2 x H (QK^T and AV);
    fwd + bwd = 3 x forward + the fused kernel's recompute of the scores in backward, 2 x L x s^2 x H."""
    from advisor.trace import profile_activations

    spec = resolve_model(None, config_dict=TINY, seq_len=32)
    s, h, i, n, k, layers, vocab = 32, 64, 128, 4, 2, 2, 1000
    kv = 2 * (h // 4)  # 2 kv heads of head_dim 16
    per_token = layers * (2 * h * h + 2 * h * kv + h * n + k * (h * 2 * i + i * h)) + h * vocab
    forward = 2 * s * per_token + 4 * layers * s * s * h
    hand = 3 * forward + 2 * layers * s * s * h
    prof = profile_activations(spec, mode, "flash", False)
    assert prof.flops_per_sample == pytest.approx(hand, rel=0.02)
    acts = [prof.at(b).activations for b in (1, 2, 4)]
    assert 0 < acts[0] < acts[1] < acts[2]


def test_grouped_mm_fp32_stand_in_matches_the_real_kernel():
    """The trace's fp32 ``_grouped_mm`` output (shape, dtype) and FLOP count against the real CPU kernel on
    the four layouts: (S,K)x(G,K,N), (G,M,K)x(K,S), (M,S)x(S,N) and (G,M,K)x(G,K,N)."""
    from advisor.trace.grouped_mm import _grouped_mm_flops, _grouped_mm_fp32

    offs = torch.tensor([3, 7, 16], dtype=torch.int32)
    cases = [
        (torch.randn(16, 8), torch.randn(3, 8, 4), offs, 2 * 16 * 8 * 4),
        (torch.randn(3, 4, 8), torch.randn(8, 16), offs, 2 * 4 * 8 * 16),
        (torch.randn(16, 4).t(), torch.randn(16, 8), offs, 2 * 4 * 16 * 8),
        (torch.randn(3, 4, 8), torch.randn(3, 8, 4), None, 2 * 3 * 4 * 8 * 4),
    ]
    for a, b, o, flops in cases:
        real = torch._grouped_mm(a, b, offs=o)
        with torch.device("meta"):
            stand_in = _grouped_mm_fp32(a.to("meta"), b.to("meta"), o)
        assert (stand_in.shape, stand_in.dtype) == (real.shape, real.dtype)
        assert _grouped_mm_flops(a, b, o, out_val=real) == flops


def test_tiny_mixtral_trace_matches_a_real_cpu_step():
    """Real fp32 AdamW steps on CPU (transformers' grouped_mm experts, real routing) against the trace:
    activations and backward peak within 5% (measured 3%: hidden 128, seq 256, batch 2)."""
    from advisor.trace import profile_activations
    from tests.test_core import _measure_cpu_step

    cfg = dict(TINY, hidden_size=128, intermediate_size=256, max_position_embeddings=256)
    spec = resolve_model(None, config_dict=cfg, seq_len=256)
    measured_act, measured_peak = _measure_cpu_step(spec, 2)
    est = profile_activations(spec, "fp32", "flash", False).at(2)
    assert est.activations == pytest.approx(measured_act, rel=0.05)
    assert est.bwd_peak == pytest.approx(measured_peak, rel=0.05)


def test_more_routed_experts_than_experts_is_one_line(tmp_path):
    """top-k over 4 experts with k 8 cannot run (torch.topk: 'k not in range'): refused as the config's error, not
    'could not trace'."""
    from advisor.errors import AdvisorError

    path = tmp_path / "moe.json"
    path.write_text(json.dumps(dict(TINY, num_experts_per_tok=8)))
    with pytest.raises(AdvisorError, match=r"^config field 'num_experts_per_tok' is 8, more than the 4 experts"):
        plan(plan_inputs(config_path=str(path), gpus=2, detect_hardware=False))


def test_googlenet_and_inception_train_with_their_auxiliary_classifiers(tmp_path):
    """In training both return named tuples of logits and auxiliary logits (torchvision's GoogLeNetOutputs and
    InceptionOutputs); the loss adds each auxiliary loss at 0.3 (it failed: 'cross_entropy(): argument 'input' must be
    Tensor, not GoogLeNetOutputs'), in the trace and in the emitted script alike."""
    import torch.nn.functional as F

    from advisor.models.families.vision import classification_loss

    logits, aux1, aux2 = torch.randn(4, 10), torch.randn(4, 10), torch.randn(4, 10)
    target = torch.tensor([1, 2, 3, 4])
    from torchvision.models import GoogLeNetOutputs, InceptionOutputs

    want = F.cross_entropy(logits, target) + 0.3 * (F.cross_entropy(aux2, target) + F.cross_entropy(aux1, target))
    assert torch.allclose(classification_loss(GoogLeNetOutputs(logits, aux2, aux1), target), want)
    inception = F.cross_entropy(logits, target) + 0.3 * F.cross_entropy(aux1, target)
    assert torch.allclose(classification_loss(InceptionOutputs(logits, aux1), target), inception)
    assert torch.allclose(classification_loss(logits, target), F.cross_entropy(logits, target))
    p = plan(plan_inputs(model="googlenet", gpus=2, image_size=64, detect_hardware=False))
    assert p.recommendation.strategy is not None and p.row("ddp").fits
    # the emitted script's loss (the vision fragment's compute_loss) gives the same
    from strategies.render import render_files, write_files
    from tests.emitted import load_train_py

    write_files(render_files(p, "single"), tmp_path / "job")
    script = load_train_py(tmp_path / "job" / "train.py", "generated_googlenet")
    batch = {"x": torch.randn(4, 3, 8, 8), "target": target}
    got = script.compute_loss(lambda x: GoogLeNetOutputs(logits, aux2, aux1), batch, torch.device("cpu"))
    assert torch.allclose(got, want)
