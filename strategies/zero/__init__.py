"""DeepSpeed ZeRO stages 1/2/3 and the CPU-offload variants: one strategy, one rule, parameterised
by stage and offload (they share one generated script and differ only in ds_config).

The rules live beside it: ``sizes`` (what one rank holds, ``ZeroSizes``; QLoRA's quantized base,
``QuantizedSizes``), ``phases`` (the moments of a step), ``memory`` (the memory rule and DeepSpeed's own
estimators), ``ds_config`` (the config the script reads) and ``timing`` (the bytes sent and the time rule), each
sourced to the DeepSpeed code it follows (DeepSpeed 0.19).
"""

from __future__ import annotations

import json

from advisor.choices import Precision, Quant
from advisor.context import StrategyContext
from advisor.memory import RULE_OF_THUMB_BYTES_PER_PARAM, StrategyMemory, rule_of_thumb_split
from advisor.models import family_of
from advisor.models.families import ModelFamily
from advisor.timing.step import StepTime

from ..base import PlannedRow, ScriptJob, Strategy, pretrained_bytes, timing_of
from ..launchers import DEEPSPEED
from . import timing
from .ds_config import build_ds_config
from .memory import deepspeed_model_state_estimate, zero_memory
from .sizes import QuantizedSizes, quantized_sizes


class Zero(Strategy):
    framework = "deepspeed"
    launcher = DEEPSPEED
    template = "zero.py"
    script_parts = ()  # DeepSpeed writes its own checkpoints (engine.save_checkpoint)
    casts_weights = True  # DeepSpeed's bf16/fp16 modes cast the whole module to 16 bits (no autocast)
    optimizer_in_backward_blocker = "DeepSpeed's engine runs the optimizer step itself (engine.step())"

    def __init__(self, stage: int, offload: bool = False) -> None:
        self.stage, self.offload = stage, offload
        self.name = f"zero{stage}" + ("_offload" if offload else "")
        self.title = f"ZeRO-{stage}" + (" + CPU offload" if offload else "")
        self.comm_order = 4 if offload else (2 if stage == 3 else 1)
        self.shards_everything = stage == 3
        self.sharding_stage = None if offload else stage
        # QLoRA: ZeRO-3 partitions a 4-bit base stored in the module's dtype (``quantized_sizes``); stages 1-2 would
        # replicate it as DDP does, and are not verified with it.
        self.quantized_base = stage == 3 and not offload
        self.comm_pattern = (
            "all-gather of the parameters in forward and in backward, reduce-scatter of the gradients"
            if stage == 3
            else "reduce-scatter of the gradients (all-reduce in buckets), all-gather of the updated parameters"
        ) + ("; gradients and optimizer states over PCIe to host RAM" if offload else "")

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        if ctx.options.precision == Precision.PURE_BF16:
            return "DeepSpeed ZeRO keeps fp32 master weights; pure bf16 runs with single, DDP, FSDP2 or TP"
        return None

    def fine_tuning_blocker(self, ctx: StrategyContext) -> str | None:
        adapter = ctx.profile.spec.adapter
        if self.quantized_base and adapter is not None and adapter.quantize == Quant.INT8:
            return (
                "ZeRO-3 partitions a 4-bit base (nf4, fp4) stored in the module's dtype (bnb_4bit_quant_storage); "
                "an int8 (LLM.int8()) base under ZeRO-3 is not modelled: use --quantize nf4, or ddp with int8"
            )
        return super().fine_tuning_blocker(ctx)

    def quantized_sizes(self, ctx: StrategyContext) -> QuantizedSizes | None:
        """QLoRA under ZeRO-3 (None without a quantized base), per rank, in bytes
        (``strategies.zero.sizes.quantized_sizes``)."""
        return quantized_sizes(ctx, self.quantized_base)

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        """Per-GPU bytes at ``micro_batch`` samples per GPU (``strategies.zero.memory.zero_memory``)."""
        return zero_memory(
            ctx, micro_batch, self.stage, self.offload, self.quantized_base, self.trace_mode(ctx.options.precision)
        )

    def load_host_bytes_per_node(self, ctx: StrategyContext) -> int:
        """ZeRO-3 builds the model inside ``deepspeed.zero.Init`` where the family allows it
        (``script_constants``' ZERO_INIT): each parameter is partitioned as its module is created
        (partition_parameters.py, ``_post_init_method``), so a rank holds at most one module's full
        parameters in fp32 at a time; otherwise every rank builds the full fp32 model (the base rule,
        ``--init-from`` included: every rank loads the pretrained weights whole).

        ``--init-from`` under ZERO_INIT goes through transformers' DeepSpeed integration (transformers 5.24; the
        script keeps an ``HfDeepSpeedConfig`` alive): ``from_pretrained`` builds the model under ``zero.Init``
        (``PreTrainedModel.get_init_context``: the rule above), then ``PreTrainedModel._load_pretrained_model`` reads
        the checkpoint with ``load_state_dict(ckpt_file, map_location="cpu" if rank 0 else "meta")`` for every
        checkpoint shard file, merged into one dict before anything is copied: rank 0 holds the whole checkpoint,
        the other ranks only its shapes. ``integrations.deepspeed._load_state_dict_into_zero3_model`` then gathers
        each module's partitions on the GPU (``deepspeed.zero.GatheredParameters(params, modifier_rank=0)``), rank 0
        alone copies the values in (``module._load_from_state_dict``), and they are re-partitioned; buffers are
        broadcast from rank 0 on the GPU. Node 0 needs the larger of the build and rank 0's checkpoint (they do not
        overlap: the loading starts after the build, and each gather is a collective). The checkpoint's own dtype is
        not known to advisor: counted as ``pretrained_bytes`` (fp32; a 16-bit checkpoint needs half; safetensors'
        memory-mapped pages count as they are touched)."""
        if self.stage == 3 and family_of(ctx.profile.spec).zero_init and self.quantized_sizes(ctx) is None:
            stats = ctx.profile.stats
            build = ctx.hardware.gpus_per_node * 4 * stats.largest_module_params
            return max(build, pretrained_bytes(ctx)) if ctx.options.init_from else build
        return super().load_host_bytes_per_node(ctx)

    def load_fix(self, ctx: StrategyContext | None = None) -> str:
        """ZeRO-3 loading ``--init-from`` under zero.Init: what rank 0 holds is the checkpoint itself."""
        if (
            ctx is not None
            and ctx.options.init_from
            and self.stage == 3
            and family_of(ctx.profile.spec).zero_init
            and self.quantized_sizes(ctx) is None
        ):
            return (
                "rank 0 reads the whole checkpoint into host RAM while it copies it into the partitions: give node "
                "0 more host RAM, or save the checkpoint in 16 bits (half the bytes)"
            )
        return super().load_fix(ctx)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        (frozen, p), n = rule_of_thumb_split(ctx.profile.stats, ctx.profile.spec.adapter), ctx.world_size
        # A frozen LoRA base is replicated by stages 1-2 and sharded by stage 3, like the 16-bit weights.
        sharded = {
            1: frozen + 4 * p + 12 * p // n,
            2: frozen + 2 * p + 14 * p // n,
            3: (frozen + RULE_OF_THUMB_BYTES_PER_PARAM * p) // n,
        }
        if self.offload:
            return 2 * p if self.stage == 2 else 2 * p // n
        return sharded[self.stage]

    def ds_config(self, ctx: StrategyContext, row: PlannedRow) -> dict[str, object]:
        """The ds_config.json matching this estimate at ``row``'s data-parallel size and accumulation steps
        (``strategies.zero.ds_config.build_ds_config``)."""
        assert row.grad_accum_steps is not None, "a row that applies has its accumulation steps (evaluate_row)"
        return build_ds_config(ctx, self.stage, self.offload, row.dp_size, row.grad_accum_steps)

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU sends per optimizer step (``strategies.zero.timing.comm_bytes_per_step``)."""
        return timing.comm_bytes_per_step(ctx, self.stage, self.quantized_base, grad_accum_steps)

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """One optimizer step at ``row``'s accumulation steps (``strategies.zero.timing.step_time``); None for a GPU
        without a preset."""
        t = timing_of(ctx)
        if t is None:
            return None
        return timing.step_time(
            ctx, t, self.compute_time(ctx, t), row.grad_accum_steps or 1, self.stage, self.offload, self.quantized_base
        )

    script_loop = ("torch_steps.py", "zero.py")

    def script_variants(self, job: ScriptJob) -> dict[str, str]:
        """The model built for the engine (full weights, LoRA on a 16/32-bit base, QLoRA; under deepspeed.zero.Init
        where ZeRO-3 and the family allow it and the base is not quantized), where the client optimizer steps
        (offload: the CPU), the checkpoint (a LoRA one leaves the frozen base out) and, under ZeRO-3, the weights
        gathered for the export."""
        adapter = job.spec.adapter
        quantized = adapter is not None and adapter.quantize
        # transformers builds a quantized base without zero.Init (every rank loads it whole; quantized_sizes)
        init = self.stage == 3 and family_of(job.spec).zero_init and not quantized
        model = "qlora" if quantized else ("lora" if adapter else "full") + ("_init" if init else "")
        gathered = "zero3" if self.stage == 3 else "whole"
        return {
            "prepare_model": model,
            "optimizer_device": "offload" if self.offload else "device",
            "save_checkpoint": "lora" if adapter else "full",
            "load_checkpoint": "lora" if adapter else "full",
            "full_state_dict": gathered,
            "adapter_state_dict": gathered,
        }

    def script_constants(self, job: ScriptJob, family: ModelFamily) -> dict[str, object]:
        return {"DS_CONFIG_FILE": "ds_config.json"}

    def extra_files(self, job: ScriptJob) -> dict[str, str]:
        """ds_config.json (what the estimate assumed), and a hostfile for several nodes."""
        files = {"ds_config.json": json.dumps(job.ds_config, indent=2) + "\n"}
        if job.num_nodes > 1:
            files["hostfile"] = "".join(f"node-{i} slots={job.gpus_per_node}\n" for i in range(job.num_nodes))
        return files

    def deepspeed_estimate(self, ctx: StrategyContext) -> dict[str, int] | None:
        """DeepSpeed's own model-state estimate (``strategies.zero.memory.deepspeed_model_state_estimate``); None
        for ZeRO-1."""
        return deepspeed_model_state_estimate(ctx, self.stage, self.offload)
