"""LoRA / QLoRA / 8-bit optimizers (issue 16): trainable counts against peft's own count and the hand formula,
quantized-base bytes against bitsandbytes' real layers, memory terms against hand arithmetic, and the
recommendation cases the issue names."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from advisor import bnb_layout
from advisor.errors import AdvisorError
from advisor.models import AdapterSpec, resolve_source
from advisor.plan import plan
from advisor.profile import param_stats
from advisor.schema import ModelSource, plan_inputs

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "small_llama.json")
QWEN2 = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def _spec(adapter: AdapterSpec | None, **source):
    spec = resolve_source(ModelSource(**source))
    return dataclasses.replace(spec, adapter=adapter)


_BASES: dict[str, object] = {}


def _base_stats(spec):
    """``param_stats`` of ``spec`` without its adapter, once per model (the parametrized cases share it)."""
    key = spec.name
    if key not in _BASES:
        _BASES[key] = param_stats(dataclasses.replace(spec, adapter=None))
    return _BASES[key]


def _peft_count(spec) -> tuple[int, int]:
    """peft's own (trainable, all) on a fresh meta model: ``get_nb_trainable_parameters``."""
    import torch
    from peft import get_peft_model

    from advisor.models import build_model
    from advisor.models.adapters import lora_config

    with torch.device("meta"):
        base = build_model(dataclasses.replace(spec, adapter=None))
        fan = spec.model_type == "gpt2"
        model = get_peft_model(base, lora_config(spec.adapter, fan_in_fan_out=fan))
    return model.get_nb_trainable_parameters()


def _hand_lora(cfg: dict, rank: int, targets: tuple[str, ...]) -> int:
    """r x (d_in + d_out) per adapted linear, from the config's dimensions alone."""
    if cfg["model_type"] == "gpt2":
        h, layers = cfg["n_embd"], cfg["n_layer"]
        shapes = {"c_attn": (h, 3 * h), "attn.c_proj": (h, h), "c_fc": (h, 4 * h), "mlp.c_proj": (4 * h, h)}
        chosen = shapes if targets == ("all-linear",) else {k: v for k, v in shapes.items() if k in targets}
        return layers * sum(rank * (i + o) for i, o in chosen.values())
    h, layers, ffn = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads) * cfg.get("head_dim", h // heads)
    shapes = {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, ffn),
        "up_proj": (h, ffn),
        "down_proj": (ffn, h),
    }
    chosen = shapes if targets == ("all-linear",) else {k: v for k, v in shapes.items() if k in targets}
    return layers * sum(rank * (i + o) for i, o in chosen.values())


@pytest.mark.parametrize(
    "source, targets",
    [
        ({"model": "gpt2"}, ("c_attn",)),
        ({"model": "gpt2"}, ("all-linear",)),
        ({"model": "llama-2-7b"}, ("q_proj", "v_proj")),
        ({"model": "llama-2-7b"}, ("all-linear",)),
        ({"model": "mistral-7b"}, ("q_proj", "v_proj")),
        ({"model": "mistral-7b"}, ("all-linear",)),
        ({"config_dict": QWEN2}, ("q_proj", "v_proj")),
        ({"config_dict": QWEN2}, ("all-linear",)),
    ],
)
@pytest.mark.parametrize("rank", [8, 64])
def test_trainable_counts_equal_peft_and_the_hand_formula(source, targets, rank):
    spec = _spec(AdapterSpec(rank=rank, targets=targets), **source)
    stats = param_stats(spec)
    trainable, total = _peft_count(spec)
    assert (stats.num_trainable, stats.num_params) == (trainable, total)
    assert stats.num_trainable == _hand_lora(spec.config, rank, targets)
    base = _base_stats(spec)
    assert stats.num_params == base.num_params + stats.num_trainable  # peft's all-parameter count adds the adapters
    assert sum(math.prod(s) for s in stats.trainable_shapes) == stats.num_trainable


def test_issue_figures_llama_2_7b():
    """The issue's figures (peft's count, checked on a real model): r=8 on q_proj,v_proj; r=64 on all linear layers."""
    s8 = param_stats(_spec(AdapterSpec(rank=8, targets=("q_proj", "v_proj")), model="llama-2-7b"))
    assert (s8.num_trainable, s8.num_params) == (4_194_304, 6_742_609_920)
    s64 = param_stats(_spec(AdapterSpec(rank=64, targets=("all-linear",)), model="llama-2-7b"))
    assert s64.num_trainable == 159_907_840


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_peft_default_targets_fill_in():
    """No --lora-targets: peft's default for the architecture, written out (llama: q_proj, v_proj)."""
    p = plan(plan_inputs(config_path=TINY, seq_len=32, gpus=1, detect_hardware=False, lora_rank=4))
    assert p.spec.adapter.targets == ("q_proj", "v_proj")


def test_quantized_base_bytes_equal_bitsandbytes_layers(tmp_path):
    """``ParamStats.quantized_bytes`` of a tiny Llama equals what transformers' 4-bit loading holds: every
    ``Params4bit``'s packed data and quant-state tensors (double quantization on), loaded on the CPU."""
    pytest.importorskip("bitsandbytes")
    import torch
    import transformers

    spec = _spec(AdapterSpec(rank=4, targets=("q_proj", "v_proj"), quantize="nf4", double_quant=True), config_path=TINY)
    stats = param_stats(spec)
    cfg = dict(spec.config)
    model_type = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    q = transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=q, device_map={"": "cpu"})
    import bitsandbytes as bnb

    def tensors(obj, seen):
        if isinstance(obj, torch.Tensor):
            if obj.untyped_storage().data_ptr() not in seen:
                seen.add(obj.untyped_storage().data_ptr())
                yield obj.numel() * obj.element_size()
            return
        for v in vars(obj).values() if hasattr(obj, "__dict__") else ():
            if isinstance(v, torch.Tensor) or type(v).__name__ == "QuantState":
                yield from tensors(v, seen)

    real, numel = 0, 0
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            seen: set[int] = set()
            real += m.weight.numel() * m.weight.element_size() + sum(tensors(m.weight.quant_state, seen))
            numel += math.prod(m.weight.quant_state.shape)
    assert numel == stats.quantized_numel > 0
    assert real == stats.quantized_bytes


def test_memory_terms_by_hand():
    """DDP, LoRA bf16 plan: the frozen base in bf16 (2 bytes), fp32 adapters with fp32 gradients and two fp32 Adam
    moments; ZeRO-3 shards the whole 16-bit module (adapters cast too); FSDP2 shards the base in bf16 and the
    adapters in fp32."""
    p = plan(
        plan_inputs(
            config_path=TINY,
            seq_len=32,
            gpus=2,
            detect_hardware=False,
            precision="bf16",
            micro_batch_size=2,
            lora_rank=8,
            lora_targets="q_proj,v_proj",
        )
    )
    st = p.profile.stats
    frozen, t = st.num_frozen, st.num_trainable
    ddp = p.row("ddp").memory
    assert ddp.model_state_bytes == 2 * frozen + 4 * t + st.buffer_bytes + 4 * t + 8 * t
    assert ddp.peak.optimizer_states == 8 * t
    z3 = p.row("zero3").memory.peak
    assert z3.optimizer_states == -(-4 * t // 2) + bnb_layout.optimizer_state_bytes("adamw", [(-(-t // 2),)], 4)
    f = p.row("fsdp2").memory
    from strategies import get_strategy
    from strategies.fsdp2.layout import units

    us = units(st, 2)
    shards = sum((u.shard(2) - u.trainable_shard(2)) * 2 + u.trainable_shard(2) * 4 for u in us)
    assert f.peak.params == shards + st.buffer_bytes
    assert f.peak.optimizer_states == 8 * sum(u.trainable_shard(2) for u in us)  # fp32 moments on the adapter shards
    assert get_strategy("tp").lora_blocker and not p.row("tp").applicable


def test_adamw_8bit_states_in_the_plan():
    """adamw-8bit on gpt2 (single): bitsandbytes' layout over every trainable tensor (fp32 states for tensors under
    4096 elements: biases and norms) -- far below adamw's 8 bytes per parameter."""
    base = dict(model="gpt2", seq_len=128, gpus=1, detect_hardware=False, micro_batch_size=1)
    p8 = plan(plan_inputs(**base, optimizer="adamw-8bit"))
    p32 = plan(plan_inputs(**base))
    st = p8.profile.stats
    o8, o32 = p8.row("single").memory.peak.optimizer_states, p32.row("single").memory.peak.optimizer_states
    assert o32 == 8 * st.num_trainable
    assert o8 == bnb_layout.optimizer_state_bytes("adamw-8bit", st.trainable_shapes, 4)
    assert 2 * st.num_trainable < o8 < 2.2 * st.num_trainable
    assert not p8.row("fsdp2").applicable and "adamw-8bit" in p8.row("fsdp2").reason


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_llama_7b_lora_fits_ddp_on_4_rtx4090_full_does_not():
    """The issue's case: LoRA rank 8 on q_proj,v_proj, seq 512, micro-batch 1, bf16, no checkpointing."""
    p = plan(
        plan_inputs(
            model="llama-2-7b",
            gpus=4,
            gpu="RTX4090",
            detect_hardware=False,
            seq_len=512,
            micro_batch_size=1,
            precision="bf16",
            lora_rank=8,
            lora_targets="q_proj,v_proj",
        )
    )
    ddp = p.row("ddp")
    assert ddp.fits is True
    # 12.55 GiB of bf16 base + adapters, states and 2.8 GiB of activations: 17.9 GiB with the CUDA context.
    assert 17 * 2**30 < ddp.memory.device_total < 19 * 2**30
    assert p.recommendation.strategy == "ddp"
    text = " ".join(p.recommendation.reasons)
    assert "LoRA rank 8 on q_proj,v_proj: 4.19M trainable parameters; fits DDP on 4 x RTX4090" in text
    # The rule of thumb: ZeRO-1/2 replicate the 16-bit base (2 bytes per frozen parameter) and shard the rest.
    st = p.profile.stats
    frozen, t = 2 * st.num_frozen, st.num_trainable
    assert p.row("zero1").rule_of_thumb_bytes == int((frozen + 4 * t + 12 * t // 4) * 1.2)
    assert p.row("zero3").rule_of_thumb_bytes == int((frozen + 16 * t) // 4 * 1.2)
    assert "where full fine-tuning does not fit on this cluster" in text


@pytest.mark.slow  # over 10 s on 2 busy cores: the only 65B model of the suite
def test_qlora_65b_fits_one_48gb_gpu(no_what_if_traces):
    """The QLoRA paper's headline: 65B Llama architecture, nf4 + double quantization, rank 64 on all linear layers,
    bf16 adapters, paged AdamW, seq 512, micro-batch 1, activation checkpointing: under 48 GB on one 48 GB GPU;
    full fine-tuning of the same does not fit (named in the reasons)."""
    cfg = {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 22016,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
    }
    p = plan(
        plan_inputs(
            config_dict=cfg,
            gpus=1,
            gpu="RTXA6000",
            detect_hardware=False,
            seq_len=512,
            micro_batch_size=1,
            precision="bf16",
            activation_checkpointing=True,
            lora_rank=64,
            lora_targets="all-linear",
            lora_dtype="bf16",
            quantize="nf4",
            double_quant=True,
            optimizer="paged-adamw",
        )
    )
    single = p.row("single")
    assert single.memory.peak.total < 48e9
    assert p.recommendation.strategy == "single"
    st = p.profile.stats
    # 4-bit weights (0.5 byte + about 1/64 byte of 8-bit scales per parameter), the rest fp32, bf16 adapters.
    assert st.quantized_bytes == pytest.approx(st.quantized_numel * (0.5 + 1 / 64), rel=0.01)
    assert "where full fine-tuning (with activation checkpointing, as here) does not fit on this cluster" in " ".join(
        p.recommendation.reasons
    )
    # 16 bytes per trainable parameter plus the base as held (about 0.5 byte per quantized weight), unsharded
    frozen = st.quantized_bytes + 4 * (st.num_frozen - st.quantized_numel)
    assert single.rule_of_thumb_bytes == int((frozen + 16 * st.num_trainable) * 1.2)
    assert any("paged-adamw" in w and "unified memory" in w for w in p.warnings)


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_nothing_fits_names_lora_and_qlora_before_more_gpus(no_what_if_traces):
    p = plan(
        plan_inputs(model="llama-2-7b", gpus=1, gpu="RTX4090", detect_hardware=False, seq_len=512, micro_batch_size=1)
    )
    assert p.recommendation.strategy is None
    reasons = p.recommendation.reasons
    lora = next(i for i, r in enumerate(reasons) if r.startswith("fine-tune with LoRA instead"))
    qlora = next(i for i, r in enumerate(reasons) if r.startswith("fine-tune with QLoRA instead"))
    more = next(i for i, r in enumerate(reasons) if "would fit on" in r)
    assert lora < more and qlora < more
    assert "Single GPU then fits without offload" in reasons[lora]
    # One recipe in one answer: the offers are the ladder's LoRA and QLoRA rungs, flags and all
    rungs = {r.key: r for r in p.ladder.rungs}
    assert reasons[lora].endswith(f"({rungs['lora'].flags})"), reasons[lora]
    assert reasons[qlora].endswith(f"({rungs['qlora'].flags})"), reasons[qlora]
    assert "rank 8 on all linear layers" in reasons[lora] and "rank 8 on all linear layers" in reasons[qlora]
    # With host RAM given, an offload row fits at a micro-batch chosen for it (dozens); the offers are still
    # judged at the user's micro-batch, where QLoRA fits a 24 GB GPU (a fresh user saw "QLoRA would not fit").
    offload = plan(
        plan_inputs(
            model="llama-2-7b",
            gpus=1,
            gpu="RTX4090",
            detect_hardware=False,
            seq_len=512,
            activation_checkpointing=True,
            host_mem_gib=256,
        )
    )
    assert offload.row(offload.recommendation.strategy).strategy.offload
    assert offload.recommendation.micro_batch_size > 1
    said = " ".join(offload.recommendation.reasons)
    assert "QLoRA" in said and "then fits without offload" in said and "would not fit either" not in said


def test_bad_adapter_inputs():
    with pytest.raises(AdvisorError, match="--lora-targets"):
        plan(plan_inputs(model="resnet18", gpus=1, detect_hardware=False, lora_rank=8))
    with pytest.raises(AdvisorError, match="peft could not add"):
        plan(
            plan_inputs(
                config_path=TINY, seq_len=32, gpus=1, detect_hardware=False, lora_rank=8, lora_targets="no_such_module"
            )
        )


def test_qlora_gets_no_hint_to_drop_the_checkpointing_it_turns_on_itself(no_what_if_traces):
    """QLoRA checkpoints with or without --activation-checkpointing (peft's prepare_model_for_kbit_training), so the
    hint to drop the flag would change nothing; LoRA on a 16-bit base, which it does speed up, keeps the hint."""

    def hints(**adapter) -> list[str]:
        p = plan(
            plan_inputs(
                model="llama-3.2-1b", gpus=1, gpu="A100-80GB", detect_hardware=False, seq_len=512,
                micro_batch_size=1, activation_checkpointing=True, lora_rank=8, **adapter,
            )
        )  # fmt: skip
        return [w for w in p.warnings if "checkpointing is on but not needed" in w]

    assert hints(quantize="nf4") == []
    assert len(hints()) == 1


def test_a_rank_as_large_as_the_weights_is_said():
    """gpt2's 768 x 768 projections: rank 384 gives each as many adapter parameters as it has (r x d + d x r = d x d),
    which the answer says; rank 64 is ordinary."""

    def said(rank: int) -> list[str]:
        p = plan(plan_inputs(model="gpt2", gpus=1, gpu="A100-80GB", detect_hardware=False, seq_len=64, lora_rank=rank))
        return [w for w in p.warnings if w.startswith(f"--lora-rank {rank} is at least half the hidden size 768")]

    assert said(384) == [
        "--lora-rank 384 is at least half the hidden size 768: each adapted 768 x 768 weight gets 589,824 adapter "
        "parameters against its own 589,824; LoRA ranks are usually 8-64"
    ]
    assert said(64) == []
