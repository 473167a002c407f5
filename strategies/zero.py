"""DeepSpeed ZeRO stages 1/2/3 and the CPU-offload variants: one module, one rule, parameterised
by stage and offload (they share one generated script and differ only in ds_config).

What DeepSpeed allocates per rank (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, N = data-
parallel size, W = bytes of the model's weights: 2 for bf16/fp16, 4 for fp32, P = parameters):

* weights: W*P (stages 1-2) or W*P/N plus the small "persistent" parameters (stage 3,
  ``stage3_param_persistence_threshold``) plus the gathered working set (prefetch bucket + the
  largest module's parameters);
* fp32 partition of the weights: 4*P/N. DeepSpeed clones it even when training in fp32
  (``single_partition_of_fp32_groups = ...clone().float()``);
* optimizer moments: 4*k*P/N (k = 2 for Adam);
* gradients: none in forward (released after each step); in backward stage 1 accumulates the full
  W*P gradients, stages 2-3 a W*P/N partition; at the step an fp32 gradient partition (4*P/N) is added;
* buffers: the contiguous-gradient reduce bucket (``reduce_bucket_size`` elements of W bytes, doubled
  when ``overlap_comm``, which DeepSpeed turns on by default only for stage 3).

The ZeRO paper's idealised accounting (advisor.memory.zero_paper_model_states) omits the fp32
gradient partition and the buckets; DeepSpeed's own estimator uses 2P + 18P/N for ZeRO-2.
"""

from __future__ import annotations

from advisor.memory import (
    OPTIMIZER_STATES_PER_PARAM,
    RULE_OF_THUMB_BYTES_PER_PARAM,
    Breakdown,
    StrategyMemory,
    device_overhead,
    optimizer_step_temp_bytes,
    peak_of,
)
from advisor.options import (
    DS_MAX_LIVE_PARAMETERS,
    DS_PREFETCH_BUCKET_ELEMS,
    DS_REDUCE_BUCKET_ELEMS,
    StrategyContext,
)

from .base import Strategy


def zero_trace_mode(precision: str) -> str:
    """DeepSpeed's bf16/fp16 modes cast the whole module to 16 bits (no autocast)."""
    return "fp32" if precision == "fp32" else "half"


def bucket_elems(ctx: StrategyContext) -> dict[str, int]:
    """Bucket sizes written into generated ds_configs: DeepSpeed's defaults, capped at the model's
    size (a bucket larger than all gradients is never filled but is still allocated in full)."""
    trainable = max(1, ctx.profile.stats.num_trainable)
    return {
        "reduce_bucket_size": min(DS_REDUCE_BUCKET_ELEMS, trainable),
        "allgather_bucket_size": min(DS_REDUCE_BUCKET_ELEMS, trainable),
        "stage3_prefetch_bucket_size": min(DS_PREFETCH_BUCKET_ELEMS, trainable),
        "stage3_max_live_parameters": DS_MAX_LIVE_PARAMETERS,
    }


class Zero(Strategy):
    launcher = "deepspeed"

    def __init__(self, stage: int, offload: bool = False) -> None:
        self.stage, self.offload = stage, offload
        self.name = f"zero{stage}" + ("_offload" if offload else "")
        self.title = f"ZeRO-{stage}" + (" + CPU offload" if offload else "")
        self.comm_order = 4 if offload else (2 if stage == 3 else 1)

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        if ctx.options.precision == "pure-bf16":
            return "DeepSpeed ZeRO keeps fp32 master weights; pure bf16 is a DDP/TP mode"
        return None

    def _sizes(self, ctx: StrategyContext) -> dict[str, int]:
        stats, n = ctx.profile.stats, ctx.world_size
        w = 4 if ctx.options.precision == "fp32" else 2
        p, t = stats.num_params, stats.num_trainable
        k = OPTIMIZER_STATES_PER_PARAM[ctx.options.optimizer]
        b = bucket_elems(ctx)
        overlap = 2 if self.stage == 3 else 1
        if self.stage == 3:
            gathered = min(DS_MAX_LIVE_PARAMETERS, b["stage3_prefetch_bucket_size"] + stats.largest_module_params)
            weights = -(-(p - stats.persistent_params) * w // n) + stats.persistent_params * w
        else:
            gathered, weights = 0, p * w
        return dict(
            weights=weights + stats.buffer_bytes,
            gathered=min(gathered, p) * w,
            master=-(-4 * t // n),
            moments=-(-4 * k * t // n),
            grads16=t * w if self.stage == 1 else -(-t * w // n),
            grads32=-(-4 * t // n),
            bucket=b["reduce_bucket_size"] * w * overlap,
        )

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        s = self._sizes(ctx)
        step = ctx.profile.activations(zero_trace_mode(ctx.options.precision)).at(micro_batch)
        optim = 0 if self.offload else s["master"] + s["moments"]
        # Offloaded ZeRO-3 keeps only the persistent small parameters resident on the GPU.
        params = s["weights"]
        if self.offload and self.stage == 3:
            params = ctx.profile.stats.persistent_params * (4 if ctx.options.precision == "fp32" else 2)
        buffers = s["bucket"] + s["gathered"]
        # Gradients during backward: stage 1 accumulates the full 16-bit gradients (the trace's
        # accumulated gradients); stages 2-3 reduce bucket by bucket into a 1/N partition.
        bwd_grads = step.bwd_grads if self.stage == 1 else (0 if self.offload else s["grads16"])
        in_flight = step.bwd_peak - step.bwd_activations - step.bwd_grads
        bwd = Breakdown(params=params, grads=bwd_grads, optimizer_states=optim, buffers=buffers,
                        activations=step.bwd_activations, other=max(0, in_flight), phase="backward")
        fwd = Breakdown(params=params, optimizer_states=optim, buffers=buffers, activations=step.activations,
                        other=max(0, step.fwd_peak - step.activations), phase="forward")
        phases = [fwd, bwd]
        if not self.offload:
            temp = optimizer_step_temp_bytes(ctx.options.optimizer, ctx.device,
                                             -(-ctx.profile.stats.largest_param_numel // ctx.world_size), 4)
            phases.append(Breakdown(params=params, grads=s["grads16"] + s["grads32"], optimizer_states=optim,
                                    buffers=s["bucket"], other=temp, phase="optimizer step"))
        peak = peak_of(*phases)
        host = 0
        if self.offload:
            per_rank = s["master"] + s["moments"] + s["grads32"]
            if self.stage == 3:
                per_rank += s["weights"]
            host = per_rank * ctx.hardware.gpus_per_node
        states = params if self.offload else params + optim + s["grads16"] + s["grads32"]
        return StrategyMemory(peak=peak, overhead=device_overhead(ctx.device, peak.total, ctx.world_size),
                              model_state_bytes=states,
                              host_bytes_per_node=host)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        p, n = ctx.profile.stats.num_params, ctx.world_size
        sharded = {1: 4 * p + 12 * p // n, 2: 2 * p + 14 * p // n, 3: RULE_OF_THUMB_BYTES_PER_PARAM * p // n}
        if self.offload:
            return 2 * p if self.stage == 2 else 2 * p // n
        return sharded[self.stage]

    def ds_config(self, ctx: StrategyContext, row) -> dict:
        """The ds_config.json matching this estimate (DeepSpeed config docs, "ZeRO optimizations")."""
        opts, b = ctx.options, bucket_elems(ctx)
        zero: dict = {
            "stage": self.stage,
            "contiguous_gradients": True,
            "overlap_comm": self.stage == 3,  # DeepSpeed's default: on for stage 3 only
            "reduce_bucket_size": b["reduce_bucket_size"],
            "allgather_bucket_size": b["allgather_bucket_size"],
        }
        if self.stage == 3:
            zero.update(stage3_prefetch_bucket_size=b["stage3_prefetch_bucket_size"],
                        stage3_param_persistence_threshold=100_000,
                        stage3_max_live_parameters=b["stage3_max_live_parameters"],
                        stage3_gather_16bit_weights_on_model_save=True)
        if self.offload:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
            if self.stage == 3:
                zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        config: dict = {
            "train_micro_batch_size_per_gpu": opts.micro_batch_size,
            "gradient_accumulation_steps": row.grad_accum_steps,
            "train_batch_size": opts.micro_batch_size * row.dp_size * row.grad_accum_steps,
            "zero_optimization": zero,
            "steps_per_print": 1_000_000,
            "wall_clock_breakdown": False,
        }
        if opts.precision == "bf16":
            config["bf16"] = {"enabled": True}
        elif opts.precision == "fp16":
            config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}  # dynamic loss scaling
        if self.offload:
            # A torch optimizer as the client optimizer with offload: DeepSpeed's CPU Adam needs a C++ build.
            config["zero_force_ds_cpu_optimizer"] = False
        return config

    def comm_bytes_per_step(self, ctx: StrategyContext) -> int:
        base = super().comm_bytes_per_step(ctx)
        return base * 3 // 2 if self.stage == 3 else base  # ZeRO paper section 7.2.2: 1.5x for P_os+g+p
