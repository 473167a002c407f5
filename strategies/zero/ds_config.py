"""The DeepSpeed config a generated ZeRO script reads (``ds_config.json``): DeepSpeed's bucket defaults, the bucket
sizes written into it, and the config itself (DeepSpeed config docs, "ZeRO optimizations"). The memory and time
rules (``strategies.zero.memory``, ``strategies.zero.timing``) read the same bucket sizes."""

from __future__ import annotations

from advisor.choices import Precision
from advisor.context import StrategyContext

# DeepSpeed defaults (deepspeed/runtime/zero/config.py) and what generated ds_configs use.
DS_REDUCE_BUCKET_ELEMS = 500_000_000
DS_ALLGATHER_BUCKET_ELEMS = 500_000_000
DS_PREFETCH_BUCKET_ELEMS = 50_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000


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


def build_ds_config(
    ctx: StrategyContext, stage: int, offload: bool, dp_size: int, grad_accum_steps: int
) -> dict[str, object]:
    """The ds_config.json matching the estimate of ZeRO ``stage`` (1-3, ``offload``: optimizer states, and under
    stage 3 parameters, in host memory) at ``dp_size`` data-parallel ranks and ``grad_accum_steps`` micro-steps
    per optimizer step (DeepSpeed config docs, "ZeRO optimizations"). A JSON document; batch sizes in samples,
    bucket sizes in elements."""
    opts, b = ctx.options, bucket_elems(ctx)
    mb = ctx.micro_batch_size
    zero: dict[str, object] = {
        "stage": stage,
        "contiguous_gradients": True,
        "overlap_comm": stage == 3,  # DeepSpeed's default: on for stage 3 only
        "reduce_bucket_size": b["reduce_bucket_size"],
        "allgather_bucket_size": b["allgather_bucket_size"],
    }
    if stage == 3 and ctx.profile.spec.adapter is not None:
        # zero.Init's memory-efficient linear (deepspeed/runtime/zero/linear.py, LinearFunctionForZeroStage3)
        # saves every linear's input for backward, also where the weight is frozen, which torch's F.linear does
        # not: under LoRA that is every frozen projection's input (measured on 2 gloo ranks, tiny Llama, q/v
        # adapters: +15% of the peak with it, -0.4% against the estimate without it).
        zero["memory_efficient_linear"] = False
    if stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=b["stage3_prefetch_bucket_size"],
            stage3_param_persistence_threshold=100_000,
            stage3_max_live_parameters=b["stage3_max_live_parameters"],
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, object] = {
        "train_micro_batch_size_per_gpu": mb,
        "gradient_accumulation_steps": grad_accum_steps,
        "train_batch_size": mb * dp_size * grad_accum_steps,
        "zero_optimization": zero,
        # Set explicitly, as every other strategy's script clips (DeepSpeed's default is also 1.0).
        "gradient_clipping": 1.0,
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if opts.precision == Precision.BF16:
        config["bf16"] = {"enabled": True}
    elif opts.precision == Precision.FP16:
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}  # dynamic loss scaling
    if offload:
        # A torch optimizer as the client optimizer with offload: DeepSpeed's CPU Adam needs a C++ build.
        config["zero_force_ds_cpu_optimizer"] = False
    if not opts.optimizer.is_adam:
        # DeepSpeed refuses a client optimizer outside ZERO_SUPPORTED_OPTIMIZERS (zero/utils.py: Adam,
        # AdamW, Adagrad, Lion...; engine.py ``_do_optimizer_sanity_check``) unless this is set.
        config["zero_allow_untested_optimizer"] = True
    return config
