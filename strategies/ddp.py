"""DDP: every rank holds the full model states; gradients are all-reduced in buckets.

Memory rule (PyTorch DDP docs, "gradient_as_bucket_view"): the reducer allocates bucket storage
the size of all trainable gradients at construction. With ``gradient_as_bucket_view=True`` (what
generated scripts use) the ``.grad`` tensors are views into those buckets, so gradients are
resident for the whole run; without it the buckets are a second copy ("buffers").
"""

from __future__ import annotations

import math

from advisor import bnb_layout
from advisor.choices import Precision
from advisor.context import StrategyContext
from advisor.memory import (
    RULE_OF_THUMB_BYTES_PER_PARAM,
    Breakdown,
    StrategyMemory,
    dequantized_weight_bytes,
    device_overhead,
    optimizer_step_temp_bytes,
    peak_of,
    quantized_base_parts,
    rule_of_thumb_split,
    trace_mode,
    weight_bytes,
)
from advisor.models.families import ModelFamily
from advisor.profile import ParamStats
from advisor.timing.comm import allreduce_s, bucketed_allreduce
from advisor.timing.step import Collective, StepTime, exposed_s

from .base import DCP_IMPORTS, PlannedRow, ScriptJob, Strategy, accumulated_step, fabric_of, optimizer_step_s, timing_of


def grad_accum_steps(ctx: StrategyContext, dp_size: int) -> int:
    """Accumulation steps that reach the global batch: --global-batch-size, else micro-batch x all GPUs (every
    row is compared at the same global batch, so a smaller data-parallel size, TP's, accumulates).
    The same figure as ``advisor.rows.evaluate_row``'s."""
    mb = ctx.micro_batch_size
    target = ctx.options.global_batch_size or mb * ctx.world_size
    return max(1, -(-target // (mb * dp_size)))


def replicated_memory(
    ctx: StrategyContext,
    micro_batch: int,
    stats: ParamStats,
    tp_degree: int = 1,
    dp_size: int | None = None,
    ddp: bool = True,
    end_of_backward_bytes: int = 0,
    loss_extra_bytes: int = 0,
) -> StrategyMemory:
    """Memory of a rank holding full (or TP-sharded) model states.

    Phases (the peak is their maximum, not a sum):
      forward, backward: weights + gradients + optimizer states + traced activations/temporaries;
      end of backward (only with ``end_of_backward_bytes``): weights + every gradient + optimizer states + that
      transient (TP's tied, vocab-sharded embedding: torch computes its weight gradient whole, ``strategies.tp``);
      optimizer step: weights + gradients + optimizer states + step temporaries.
    ``loss_extra_bytes`` (TP's vocab-parallel loss: one fp32 copy of the rank's logits more than the traced fused
    cross-entropy holds, in forward and in backward, ``strategies.tp``): forward's transient beyond the activations
    is at least it; backward's in-flight bytes gain it where the loss is backward's peak (the traced in-flight bytes
    hold at least the plain loss's two copies), else are at least the loss's three.

    Gradients. Under DDP the reducer's buckets hold them for the whole run (with
    ``gradient_as_bucket_view`` the ``.grad`` tensors are views into them). With gradient
    accumulation, ``no_sync()`` micro-steps accumulate into ordinary ``.grad`` tensors beside the
    buckets, so a second copy is alive from the first micro-step to the step (measured on 2 gloo
    ranks: +1.00x the fp32 gradients). Without DDP (TP's hand-written all-reduce) gradients only
    exist from the backward pass to ``zero_grad(set_to_none=True)``, or across the window when
    accumulating.

    Fine-tuning (``advisor.memory.weight_bytes``): frozen parameters (a LoRA base, 16-bit or quantized) count
    only as weights; gradients, DDP's buckets (its reducer buckets only parameters that require grad,
    ``DistributedDataParallel._build_params_for_reducer``) and optimizer states cover the trainable ones, per
    tensor (``advisor.bnb_layout.optimizer_state_bytes``). QLoRA adds one layer's dequantized weight to the
    forward and backward temporaries (``advisor.memory.dequantized_weight_bytes``).
    """
    opts = ctx.options
    mode = trace_mode(opts.precision, casts_weights=False)
    adapter = ctx.profile.spec.adapter
    wb = weight_bytes(stats, adapter, mode)
    w = wb.trainable_elem  # the trainable weights' dtype, which their gradients and torch's moments share
    trainable = stats.num_trainable
    params = wb.frozen + trainable * w + stats.buffer_bytes
    # QLoRA: name the parts of the weights (``weight_bytes``: the quantized storage + the fp32 rest, which holds a
    # mixture of experts' fused expert weights: bitsandbytes quantizes nn.Linear only).
    parts = (
        quantized_base_parts(
            stats,
            stats.quantized_bytes,
            wb.frozen_elem,
            stats.num_frozen - stats.quantized_numel,
            extra=trainable * w + stats.buffer_bytes,
        )
        if adapter is not None and adapter.quantize
        else ()
    )
    full_grads = trainable * w
    optim = bnb_layout.optimizer_state_bytes(opts.optimizer, stats.trainable_shapes, w)
    dp = ctx.world_size // tp_degree if dp_size is None else dp_size
    accumulating = grad_accum_steps(ctx, dp) > 1
    step = ctx.profile.activations(mode, tp_degree).at(micro_batch)
    # QLoRA: one layer's dequantized weight, in forward and in backward
    dequant = {ph: dequantized_weight_bytes(stats, adapter, ctx.device, ph) for ph in ("forward", "backward")}
    if ddp:  # gradients resident in the buckets: the backward peak is the traced peak net of gradients
        buckets = 0 if opts.gradient_as_bucket_view else full_grads
        resident = full_grads * (2 if accumulating else 1)
        fwd_grads, bwd_grads = resident, resident
        bwd_act, in_flight = step.bwd_net_activations, step.bwd_net_peak - step.bwd_net_activations
    else:
        buckets = 0
        fwd_grads = full_grads if accumulating else 0
        bwd_grads = full_grads if accumulating else step.bwd_grads
        bwd_act, in_flight = step.bwd_activations, step.bwd_peak - step.bwd_activations - step.bwd_grads
    fwd_other = max(0, step.fwd_peak - step.activations)
    if loss_extra_bytes:
        fwd_other = max(fwd_other, loss_extra_bytes)
        at_loss = in_flight >= 2 * loss_extra_bytes
        in_flight = in_flight + loss_extra_bytes if at_loss else max(in_flight, 3 * loss_extra_bytes)
    fwd = Breakdown(
        params=params,
        grads=fwd_grads,
        optimizer_states=optim,
        buffers=buckets,
        activations=step.activations,
        other=fwd_other + dequant["forward"],
        phase="forward",
        params_parts=parts,
    )
    bwd = Breakdown(
        params=params,
        grads=bwd_grads,
        optimizer_states=optim,
        buffers=buckets,
        activations=bwd_act,
        other=max(0, in_flight) + dequant["backward"],
        phase="backward",
        params_parts=parts,
    )
    largest = max((math.prod(s) for s in stats.trainable_shapes), default=0) if adapter else stats.largest_param_numel
    temp = optimizer_step_temp_bytes(opts.optimizer, ctx.device, largest, w)
    opt_step = Breakdown(
        params=params,
        grads=full_grads,
        optimizer_states=optim,
        buffers=buckets,
        other=temp,
        phase="optimizer step",
        params_parts=parts,
    )
    phases = [fwd, bwd, opt_step]
    if end_of_backward_bytes:
        phases.append(
            Breakdown(
                params=params,
                grads=full_grads,
                optimizer_states=optim,
                buffers=buckets,
                other=end_of_backward_bytes,
                phase="end of backward",
                params_parts=parts,
            )
        )
    peak = peak_of(*phases)
    return StrategyMemory(
        peak=peak,
        # one process (the single row, whatever --gpus says) starts no process group: no NCCL communicator
        overhead=device_overhead(ctx.device, peak.total, ctx.world_size if ddp or tp_degree > 1 else 1),
        model_state_bytes=params + full_grads + optim,
    )


class DDP(Strategy):
    name = "ddp"
    sharding_stage = 0
    optimizer_in_backward_blocker = (
        "DDP all-reduces gradients in buckets after the hook has fired, so the step would use this rank's "
        "unreduced gradient (needs a DDP comm hook instead)"
    )
    title = "DDP"
    comm_order = 0
    quantized_base = True  # QLoRA: each rank holds the quantized base; only the adapters' gradients are reduced
    comm_pattern = "all-reduce of the gradients in buckets, overlapped with backward"
    script_imports = (*DCP_IMPORTS, "from torch.nn.parallel import DistributedDataParallel as DDP")
    script_loop = ("torch_steps.py", "ddp.py")

    def script_variants(self, job: ScriptJob) -> dict[str, str]:
        # SyncBatchNorm's decision where a model may have BatchNorm (images, your own model); transformers have none.
        return {"wrap_model": "plain" if job.spec.is_transformer else "batchnorm"}

    def script_constants(self, job: ScriptJob, family: ModelFamily) -> dict[str, object]:
        # SyncBatchNorm below this per-GPU batch (docs/pitfalls.md, pitfall 8: small batches need global statistics);
        # transformers have no BatchNorm, and their scripts no SyncBatchNorm decision.
        return {} if job.spec.is_transformer else {"SYNC_BN_MAX_MICRO_BATCH": 32}

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        return replicated_memory(ctx, micro_batch, ctx.profile.stats, dp_size=ctx.world_size)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        frozen, p = rule_of_thumb_split(ctx.profile.stats, ctx.profile.spec.adapter)
        return frozen + RULE_OF_THUMB_BYTES_PER_PARAM * p

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """Time rule. Every micro-step runs forward + backward (the roofline of the autocast trace); the gradient
        all-reduce runs only on the last micro-step (the template wraps the others in ``no_sync()``), in
        DDP's buckets (``advisor.timing.comm.bucketed_allreduce``: 25 MiB, the first 1 MiB) and in the
        gradients' dtype (fp32 under autocast, whose gradients follow the fp32 weights; bf16 under pure bf16).
        Overlap (PyTorch DDP design notes: a bucket's all-reduce starts as soon as its gradients are ready, on
        its own stream): the buckets hide behind the rest of that backward except the last, which starts when
        backward ends (``advisor.timing.step.exposed_s``). The last bucket holds at least the input embedding's
        gradient: DDP fills buckets in reverse order of ``model.parameters()`` and gives a parameter larger than the
        cap a bucket of its own (torch ``dist._compute_bucket_assignment_by_size``, called from
        ``DistributedDataParallel._build_params_for_reducer``), the embedding is registered first, and its gradient
        is the last that backward produces (its lookup is the first op of forward; a tied LM head's share waits in
        autograd's input buffer for it): GPT-2's 154 MB fp32 ``wte`` gradient is all-reduced after backward.
        Optimizer: fused AdamW / foreach SGD over the full
        fp32 (pure bf16: bf16) states at HBM bandwidth (fp16 adds GradScaler's unscale: a read and write of the
        gradients)."""
        t = timing_of(ctx)
        if t is None:
            return None
        hw, opts, stats = ctx.hardware, ctx.options, ctx.profile.stats
        ga = row.grad_accum_steps or 1
        c = self.compute_time(ctx, t)
        g = weight_bytes(stats, ctx.profile.spec.adapter, self.trace_mode(opts.precision)).trainable_elem
        fabric = fabric_of(ctx, t, hw.gpus_per_node, hw.num_nodes)
        ar = bucketed_allreduce(stats.num_trainable * g, fabric)
        late = stats.late_trainable_numel * g
        last_s = max(ar.last_s, allreduce_s(late, fabric) if late else 0.0)
        hidden = exposed_s(ar.total_s, c.bwd_s, len(ar.buckets), last_s=min(last_s, ar.total_s))
        dtype = "fp32" if g == 4 else "bf16"
        coll = (
            (
                Collective(
                    f"gradient all-reduce ({dtype}, {len(ar.buckets)} buckets, last micro-step only)",
                    "all_reduce",
                    "data-parallel",
                    stats.num_trainable * g,
                    len(ar.buckets),
                    ar.total_s,
                    hidden,
                ),
            )
            if ar.total_s
            else ()
        )
        opt = optimizer_step_s(
            ctx, t, stats.num_trainable, g, g, g, extra=2 * g if opts.precision == Precision.FP16 else 0
        )
        return accumulated_step(
            ctx,
            t,
            c,
            ga,
            comm_s=ar.total_s,
            exposed_comm_s=hidden,
            optimizer_s=opt,
            overlap="gradient buckets overlap the last micro-step's backward, except the last bucket",
            collectives=coll,
        )
