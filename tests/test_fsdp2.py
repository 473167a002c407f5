"""FSDP2 and single rows: the memory terms against hand arithmetic over the model's own parameters, the framework
filter and the one-GPU recommendation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from advisor.plan import plan
from advisor.schema import plan_inputs
from strategies import get_strategy
from strategies.fsdp2.layout import units

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "data" / "small_llama.json")


def _plan(gpus: int = 2, **training):
    opts = dict(precision="bf16", micro_batch_size=2)
    opts.update(training)
    return plan(plan_inputs(config_path=TINY, seq_len=32, gpus=gpus, detect_hardware=False, **opts))


def _hand_units(world: int) -> tuple[list[int], list[int]]:
    """(padded numel, numel) per unit, root first, counted here from the transformers model itself: the root holds
    every parameter outside ``model.model.layers``; dim 0 padded to a multiple of the world size."""
    import json

    import transformers

    cfg = json.loads(Path(TINY).read_text())
    cfg.pop("model_type")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    in_blocks = {id(p) for p in model.model.layers.parameters()}
    groups = [[p for p in model.parameters() if id(p) not in in_blocks]] + [
        list(b.parameters()) for b in model.model.layers
    ]
    padded = [sum(math.ceil(p.shape[0] / world) * world * (p.numel() // p.shape[0]) for p in g) for g in groups]
    return padded, [sum(p.numel() for p in g) for g in groups]


def test_units_pad_dim0_to_a_multiple_of_the_world_size():
    stats = _plan().context().profile.stats
    made = dataclasses.replace(
        stats, fsdp_units=(((10, 10, True, False),), ((3, 12, True, False), (5, 5, False, False)))
    )
    root, block = units(made, 4)
    assert (root.padded, root.numel, root.trainable_padded) == (12, 10, 12)  # 10 rows -> 12
    assert (block.padded, block.numel) == (4 * 4 + 8, 17)  # 3 rows of 4 -> 4 rows; 5 rows of 1 -> 8
    assert (block.trainable_padded, block.trainable_numel) == (16, 12)  # the frozen tensor has no gradient
    assert block.shard(4) == 6


@pytest.mark.parametrize("world", [2, 3])
def test_fsdp2_terms_match_hand_arithmetic(world):
    """bf16 policy: fp32 shards (4 bytes), Adam's two fp32 moments on them, gathered parameters in bf16 (2 bytes):
    the root throughout plus, for this two-block model, in forward one block and its flat all-gather output; at
    the traced backward peak (the loss and LM head, before any gradient) only the last block's prefetched flat
    output; at block 0's copy-out its flat output and unsharded tensors while block 1's fp32 reduce-scatter input
    is held; at the root's post-backward its fp32 reduce-scatter input and output after it resharded."""
    p = _plan(world)
    ctx = p.context()
    padded, numel = _hand_units(world)
    assert [u.padded for u in units(ctx.profile.stats, world)] == padded
    buffers = ctx.profile.stats.buffer_bytes
    shards = sum(x // world for x in padded)
    fwd, bwd, gather, copy_in, reduce, step = get_strategy("fsdp2").phases(ctx, 2)[0]
    assert fwd.params == step.params == 4 * shards + buffers
    assert fwd.optimizer_states == step.optimizer_states == 2 * 4 * shards
    assert step.grads == 4 * shards
    block = max(padded[1:])
    assert fwd.buffers == 2 * padded[0] + 2 * 2 * block
    assert bwd.phase.startswith("backward (loss and head") and bwd.grads == 0
    assert bwd.buffers == 2 * padded[0] + 2 * padded[-1]
    assert gather.buffers == 2 * padded[0] + 2 * 2 * block + 4 * block
    # The root's unsharded bf16 gradients but the untied input embedding's (2048 x 256), which come last.
    assert gather.grads >= 2 * (numel[0] - 2048 * 256)
    assert copy_in.buffers == 4 * padded[0]
    assert copy_in.grads == 4 * (shards - padded[0] // world) + 2 * numel[0]  # the blocks' shards + the root's
    assert reduce.buffers == 4 * padded[0] + 4 * (padded[0] // world)


def test_noreshard_keeps_every_block_gathered():
    ctx = _plan(2).context()
    padded, _ = _hand_units(2)
    fwd = get_strategy("fsdp2_noreshard").phases(ctx, 2)[0][0]
    assert fwd.buffers == 2 * padded[0] + 2 * sum(padded[1:]) + 2 * max(padded[1:])


def test_fp32_gathers_in_fp32_and_pure_bf16_keeps_bf16_shards():
    padded, _ = _hand_units(2)
    fwd32 = get_strategy("fsdp2").phases(_plan(2, precision="fp32").context(), 2)[0][0]
    assert fwd32.buffers == 4 * padded[0] + 2 * 4 * max(padded[1:])
    ctx = _plan(2, precision="pure-bf16").context()
    fwd16, _, gather16 = get_strategy("fsdp2").phases(ctx, 2)[0][:3]
    shards = sum(x // 2 for x in padded)
    assert fwd16.params == 2 * shards + ctx.profile.stats.buffer_bytes
    assert gather16.buffers == 2 * padded[0] + 2 * 2 * max(padded[1:]) + 2 * max(padded[1:])  # reduced in bf16


def test_accumulation_without_sync_holds_every_unsharded_gradient():
    """Sync every micro-step: the sharded fp32 gradients accumulate (they exist in forward from the second
    micro-step on). Sync on the last only: every unit's unsharded gradients, in fp32 (reduce_dtype), instead."""
    padded, numel = _hand_units(2)
    every = get_strategy("fsdp2").phases(_plan(2, global_batch_size=8).context(), 2)[0][0]
    last = get_strategy("fsdp2").phases(_plan(2, global_batch_size=8, fsdp_grad_sync="last-micro-step").context(), 2)[
        0
    ][0]
    assert every.grads == 4 * sum(x // 2 for x in padded)
    assert last.grads == 4 * sum(numel)
    p_every, p_last = _plan(2, global_batch_size=8), _plan(2, global_batch_size=8, fsdp_grad_sync="last-micro-step")
    assert p_last.row("fsdp2").comm_bytes_per_step < p_every.row("fsdp2").comm_bytes_per_step


def test_offload_keeps_shards_in_host_ram():
    p = _plan(2)
    ctx = p.context()
    padded, _ = _hand_units(2)
    shards = sum(x // 2 for x in padded)
    assert p.row("fsdp2_offload").memory.host_bytes_per_node == 2 * (4 * shards + 4 * shards + 8 * shards)
    fwd = get_strategy("fsdp2_offload").phases(ctx, 2)[0][0]
    assert fwd.params == ctx.profile.stats.buffer_bytes and fwd.optimizer_states == 0


def test_one_node_hsdp_is_not_applicable_and_fp16_gathers_in_16_bits():
    assert "2 nodes" in _plan(2).row("hsdp").reason
    padded, _ = _hand_units(2)
    fwd = get_strategy("fsdp2").phases(_plan(2, precision="fp16").context(), 2)[0][0]
    assert fwd.buffers == 2 * padded[0] + 2 * 2 * max(padded[1:])


def test_single_has_no_buckets_and_is_recommended_on_one_gpu():
    p = _plan(1, precision="fp32")
    single, ddp = p.row("single"), p.row("ddp")
    assert p.recommendation.strategy == "single"
    assert single.memory.peak.total < ddp.memory.peak.total  # DDP's gradient buckets are resident
    assert p.row("single").tp_degree == 1 and p.row("single").dp_size == 1


def test_single_is_only_the_baseline_with_several_gpus():
    p = _plan(4, precision="fp32")
    assert p.recommendation.strategy != "single"
    assert p.row("single").grad_accum_steps == 4  # the other GPUs' share, to the same global batch
    assert any("without distribution it fits on one GPU" in r for r in p.recommendation.reasons)


@pytest.mark.parametrize("model,gpus", [("llama-2-7b", 8), ("gpt2", 4), ("resnet50", 2)])
def test_framework_limits_the_strategies(model, gpus):
    torch_plan = plan(plan_inputs(model=model, gpus=gpus, detect_hardware=False, framework="torch"))
    ds_plan = plan(plan_inputs(model=model, gpus=gpus, detect_hardware=False, framework="deepspeed"))
    assert torch_plan.recommendation.strategy is not None and not torch_plan.recommendation.strategy.startswith("zero")
    assert ds_plan.recommendation.strategy is not None and ds_plan.recommendation.strategy.startswith("zero")
    assert "--framework torch leaves it out" in torch_plan.row("zero3").reason
    assert "--framework deepspeed leaves it out" in ds_plan.row("fsdp2").reason


# The FSDP2 estimate against torch's own FSDPMemTracker (tests/fixtures/fsdp_tracker.py: fake tensors, a fake
# process group) on the same model: within TRACKER_BELOW below and TRACKER_ABOVE above its peak. The estimate sits
# above where it adds a block's copy-out to the trace's backward activations, which the tracker sees at different
# moments (measured here, 2026-12-01: -0.3% .. +8.3% over eight small-Llama cases, fp32/bf16, world size 2/4,
# with and without resharding; resnet18 -3.3%).
TRACKER_BELOW, TRACKER_ABOVE = 0.05, 0.10


def _tracker_llama(world: int, param_dtype, reshard: bool) -> int:
    import json

    import transformers

    from tests.fixtures.fsdp_tracker import tracker_peak

    cfg = json.loads(Path(TINY).read_text())
    cfg.pop("model_type")

    def build():
        config = transformers.LlamaConfig(**cfg)
        config._attn_implementation = "sdpa"
        return transformers.LlamaForCausalLM(config)

    def batch(b: int) -> dict:
        ids = torch.randint(0, cfg["vocab_size"], (b, 32))
        return {"input_ids": ids, "labels": ids}

    return tracker_peak(
        build,
        batch,
        lambda m, b: m(**b).loss,
        world,
        2,
        param_dtype=param_dtype,
        reshard_after_forward=reshard,
        blocks=lambda m: list(m.model.layers),
    )["peak_bytes"]


def _cpu_plan(world: int, **inputs):
    from advisor.verify_setup import run_hardware

    hw = dataclasses.replace(run_hardware(world, "cpu", []), cpu_conv_scratch_threads=0)  # the tracker sees no oneDNN
    return plan(plan_inputs(gpus=world, detect_hardware=False, micro_batch_size=2, **inputs), device="cpu", hardware=hw)


@pytest.mark.parametrize("precision,world,reshard", [("fp32", 2, True), ("bf16", 4, True), ("bf16", 2, False)])
def test_llama_estimate_matches_fsdp_mem_tracker(precision, world, reshard):
    measured = _tracker_llama(world, torch.bfloat16 if precision == "bf16" else None, reshard)
    p = _cpu_plan(world, config_path=TINY, seq_len=32, precision=precision)
    est = p.row("fsdp2" if reshard else "fsdp2_noreshard").memory.peak.total
    assert -TRACKER_BELOW <= est / measured - 1 <= TRACKER_ABOVE, (est, measured)


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_resnet_estimate_matches_fsdp_mem_tracker():
    """Blocks of different sizes (resnet18's layer4 is 4x layer3): the windows follow the blocks in order."""
    import torchvision

    from advisor.checkpointing import repeated_blocks
    from tests.fixtures.fsdp_tracker import tracker_peak

    measured = tracker_peak(
        lambda: torchvision.models.resnet18(),
        lambda b: {"x": torch.randn(b, 3, 64, 64), "y": torch.randint(0, 1000, (b,))},
        lambda m, b: torch.nn.functional.cross_entropy(m(b["x"]), b["y"]),
        2,
        2,
        blocks=repeated_blocks,
    )["peak_bytes"]
    est = _cpu_plan(2, model="resnet18", image_size=64, precision="fp32").row("fsdp2").memory.peak.total
    assert -TRACKER_BELOW <= est / measured - 1 <= TRACKER_ABOVE, (est, measured)


def test_one_gpu_picks_a_micro_batch_single_fits():
    """With the micro-batch left to advisor, one GPU still gets plain training: the micro-batch is chosen among
    those at which ``single`` fits (not a larger one only ZeRO's 16-bit module fits)."""
    p = plan(plan_inputs(model="gpt2", seq_len=512, gpus=1, detect_hardware=False))
    assert p.recommendation.strategy == "single"
    assert p.options.micro_batch_size <= p.row("single").max_micro_batch_size


def test_no_applicable_strategy_is_a_one_line_error():
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match="no strategy applies"):
        _plan(2, framework="deepspeed", precision="pure-bf16")
