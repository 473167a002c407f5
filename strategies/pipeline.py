"""Pipeline stages of a planned model: the per-block figures ``advisor.stage_memory`` splits over the stages, read
from the figures every other strategy reads (no formula of the model's shape), and the stages' memory under a
data-parallel policy (``stages``).

Where each figure comes from:

* parameters: ``ParamStats.fsdp_units`` of the TP shard (``ModelProfile.tp_stats``; what FSDP2's rule shards,
  ``strategies.fsdp2.layout.units``): one unit per repeated block, and the root holding everything else. Of the
  root, the input embedding (the unit's ``late`` flag: ``get_input_embeddings``) goes to the first stage, the rest
  (final norm, LM head, and any other root parameter, such as GPT-2's position embedding) to the last. A head tied to
  the embedding (``tie_word_embeddings``) is not in the root a second time, so the last stage adds the embedding's
  elements as its own copy (``StageModel.tied_params``).
* activations: the trace at one and two blocks (``ActivationProfile.depths``, which deep stacks have already; a
  stack of at most ``TRUNCATE_ABOVE_LAYERS`` blocks is traced at one and two blocks here, as
  ``advisor.trace.profile_activations`` traces deep ones): one block's retained bytes are the two traces'
  difference, what is left of the one-block trace (the batch, the final norm, logits and loss) sits on the last
  stage, and the one-block trace's backward temporaries (the fp32 logits) too. What a block's own backward
  temporaries add on a stage without the head is not counted (no trace of a block alone).
"""

from __future__ import annotations

import json
from dataclasses import replace

from advisor import bnb_layout
from advisor.choices import PipelineSchedule, Precision, TraceMode
from advisor.context import StrategyContext
from advisor.layout import Layout
from advisor.memory import trace_mode
from advisor.models.limits import as_int
from advisor.once_cache import OnceCache
from advisor.stage_memory import StageMemory, StageModel, StatePolicy, stage_memory
from advisor.timing.compute import ComputeTime, Rates
from advisor.timing.pipeline import p2p_bytes
from advisor.trace import BASE_B, ActivationProfile, StepTrace, Timeline, evaluate, trace_step
from advisor.trace.keys import model_key

from .tp import vocab_shape

# Shallow stacks' one- and two-block traces, per model, mode, kernel, checkpointing and TP degree (traces are pure
# functions of these and immutable, as ``advisor.profile``'s trace cache keeps them).
_SHALLOW: OnceCache[tuple[tuple[Timeline, Timeline], ...]] = OnceCache(maxsize=16)


def block_traces(
    ctx: StrategyContext, mode: TraceMode, tp: int = 1, untie: bool = False
) -> tuple[tuple[Timeline, Timeline], ...]:
    """The traces at micro-batch ``BASE_B`` and ``BASE_B + 1`` of the model with one block and with two (module
    docstring): the profile's own for a deep stack, else traced here (once per model and settings). ``untie``: of
    the model with its head untied from the embedding (``tie_word_embeddings`` False), what a tied model split over
    stages is: each end its own copy, so the last stage's backward does not add the embedding's gradient into the
    head's (traced here, whatever the depth).

    Raises:
        AdvisorError: the model cannot be traced (``advisor.trace.trace_step``).
    """
    act = ctx.profile.activations(mode, tp)
    if len(act.depths) == 2 and not untie:
        return tuple((t1, t2) for _, t1, t2 in act.depths)
    p = ctx.profile
    spec = replace(p.spec, config={**(p.spec.config or {}), "tie_word_embeddings": False}) if untie else p.spec

    def trace() -> tuple[tuple[Timeline, Timeline], ...]:
        out = []
        for layers in (1, 2):
            pair = tuple(
                trace_step(spec, b, mode, p.attention, p.checkpointing, layers=layers, tp_degree=tp)[0]
                for b in (BASE_B, BASE_B + 1)
            )
            out.append((pair[0], pair[1]))
        return tuple(out)

    key = (json.dumps(model_key(spec), sort_keys=True, default=str), mode, p.attention, p.checkpointing, tp)
    return _SHALLOW.get(key, trace)


def _depth_steps(
    ctx: StrategyContext, mode: TraceMode, tp: int, micro_batch: int, untie: bool = False
) -> tuple[StepTrace, StepTrace]:
    (a1, a2), (b1, b2) = block_traces(ctx, mode, tp, untie)
    return evaluate(a1, a2, micro_batch), evaluate(b1, b2, micro_batch)


def block_compute(ctx: StrategyContext, rates: Rates, tp: int, micro_batch: int) -> tuple[ComputeTime, ComputeTime]:
    """(one block's, everything else's) forward + backward at ``micro_batch`` on one GPU of TP ``tp``: the time model
    over the one- and two-block traces' ops (``ActivationProfile.compute_time``, each depth on its own), one block
    the two's difference, the rest (embedding, final norm, head and loss) what is left of the one-block trace. FLOPs
    likewise (recompute included, ``ComputeTime.recompute_flops`` apart)."""
    mode = trace_mode(ctx.options.precision, casts_weights=False)
    (a1, a2), (b1, b2) = block_traces(ctx, mode, tp)
    one = ActivationProfile(((1, a1, a2),), 1, "", 0).compute_time(micro_batch, rates)
    two = ActivationProfile(((2, b1, b2),), 2, "", 0).compute_time(micro_batch, rates)
    block = ComputeTime(
        fwd_s=max(0.0, two.fwd_s - one.fwd_s),
        bwd_s=max(0.0, two.bwd_s - one.bwd_s),
        flops=max(0, two.flops - one.flops),
        recompute_flops=max(0, two.recompute_flops - one.recompute_flops),
    )
    rest = ComputeTime(
        fwd_s=max(0.0, one.fwd_s - block.fwd_s),
        bwd_s=max(0.0, one.bwd_s - block.bwd_s),
        flops=max(0, one.flops - block.flops),
        recompute_flops=max(0, one.recompute_flops - block.recompute_flops),
    )
    return block, rest


def stage_model(ctx: StrategyContext, tp: int = 1, micro_batch: int | None = None, split: bool = False) -> StageModel:
    """``StageModel`` of ``ctx``'s transformer on TP ``tp`` at ``micro_batch`` (default: the plan's), in the trace
    mode of autocast-style scripts (``advisor.memory.trace_mode``), module docstring for every figure. ``split``:
    over more than one stage, where a tied head's activations and temporaries are the untied model's
    (``block_traces``' ``untie``: measured on CPU, PP 2 of a tied small Llama, the last stage's peak is the untied
    model's, 3.9 MiB below what the tied trace's backward temporaries give).

    Raises:
        AdvisorError: the model cannot be traced.
        ValueError: the model has no repeated blocks (nothing to split into stages).
    """
    stats = ctx.profile.tp_stats(tp)
    if len(stats.fsdp_units) < 2:
        raise ValueError(f"{ctx.profile.spec.name} has no repeated blocks to split into pipeline stages")
    root, blocks = stats.fsdp_units[0], stats.fsdp_units[1:]
    embed = sum(numel for _dim0, numel, _trainable, late in root if late)
    rest = sum(numel for _dim0, numel, _trainable, _late in root) - embed
    tied, _, _ = vocab_shape(ctx)
    tied_params = embed if tied else 0
    mode = trace_mode(ctx.options.precision, casts_weights=False)
    one, two = _depth_steps(ctx, mode, tp, micro_batch or ctx.micro_batch_size, untie=split and tied)
    per_block = max(0, two.activations - one.activations)
    head_tensors = [numel for _dim0, numel, _trainable, late in root if not late]
    return StageModel(
        block_params=tuple(sum(numel for _d, numel, _t, _l in unit) for unit in blocks),
        embed_params=embed,
        head_params=rest + tied_params,
        block_activation_bytes=per_block,
        head_activation_bytes=max(0, one.activations - per_block),
        head_temp_bytes=max(0, one.bwd_other),
        tied_params=tied_params,
        largest_block_param=max((numel for unit in blocks for _d, numel, _t, _l in unit), default=0),
        largest_embed_param=max((numel for _d, numel, _t, late in root if late), default=0),
        largest_head_param=max([*head_tensors, tied_params], default=0),
    )


def activation_bytes(ctx: StrategyContext) -> int:
    """Bytes per element of the hidden states between blocks: 4 in fp32, 2 under bf16/fp16 autocast and pure bf16
    (the compute dtype, as ``strategies.tp`` sizes its activation all-reduces)."""
    return 4 if ctx.options.precision == Precision.FP32 else 2


def state_policy(ctx: StrategyContext, zero_stage: int, dp: int) -> StatePolicy:
    """``StatePolicy`` of ``ctx``'s precision and optimizer for a DDP (``zero_stage`` 0), ZeRO-1/2/3 or FSDP2 (3)
    policy over ``dp`` ranks, as PyTorch AMP holds the states (``advisor.memory.bytes_per_element``: fp32 weights,
    gradients and optimizer states under autocast, bf16 under pure bf16; the optimizer's state bytes per element,
    ``advisor.bnb_layout.state_bytes_per_element``)."""
    opts = ctx.options
    elem = Precision.FP32.param_bytes if opts.precision is None else opts.precision.param_bytes
    return StatePolicy.zero(zero_stage, dp, elem, elem, bnb_layout.state_bytes_per_element(opts.optimizer, elem))


def stages(
    ctx: StrategyContext,
    layout: Layout,
    schedule: PipelineSchedule = PipelineSchedule.ONE_F_ONE_B,
    zero_stage: int = 0,
    micro_batches: int | None = None,
    virtual: int = 1,
    sequence_parallel: bool = False,
    micro_batch: int | None = None,
) -> list[StageMemory]:
    """Every pipeline stage's memory on ``layout`` (``advisor.stage_memory.stage_memory``): the model's blocks split
    by ``Layout.stage_blocks`` (``virtual`` chunks per rank for the interleaved schedule), states held by a ZeRO
    ``zero_stage`` policy (0: DDP) over ``layout.dp`` ranks, ``micro_batches`` per step and pipeline (default: the
    pipeline's degree, the fewest that fill it), the p2p message of the hidden states in the activations' dtype (2
    bytes under bf16/fp16 autocast, 4 in fp32), at ``micro_batch`` samples (default: the plan's).

    Raises:
        AdvisorError: the layout does not fit the model (``Layout.validate``) or the model cannot be traced.
        ValueError: as ``stage_model``.
    """
    cfg = ctx.profile.spec.config or {}
    heads = as_int(cfg.get("num_attention_heads") or 0) or None
    kv = as_int(cfg.get("num_key_value_heads") or 0) or None
    layout.validate(layout.world_size, heads, kv, as_int(cfg.get("num_hidden_layers") or 0) or None)
    mb = micro_batch or ctx.micro_batch_size
    model = stage_model(ctx, layout.tp, mb, split=layout.pp > 1)
    message = p2p_bytes(
        ctx.profile.spec.seq_len or 1,
        mb,
        as_int(cfg.get("hidden_size") or 0),
        activation_bytes(ctx),
        layout.tp,
        sequence_parallel,
    )
    return stage_memory(
        model,
        layout.stage_blocks(model.layers, virtual),
        state_policy(ctx, zero_stage, layout.dp),
        schedule,
        micro_batches or layout.pp,
        message,
        virtual,
    )
