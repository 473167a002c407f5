"""FSDP2 (``torch.distributed.fsdp.fully_shard``): PyTorch's own sharding of parameters, gradients and optimizer
states, one module parameterised by how it shards (four rows, one generated script):

* ``fsdp2``: every repeated block resharded after forward (gathered again in backward), like ZeRO-3;
* ``fsdp2_noreshard``: blocks keep their gathered parameters from forward to backward
  (``reshard_after_forward=False``), like ZeRO-2: more memory, one all-gather less per micro-step;
* ``fsdp2_offload``: ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer states in pinned host memory,
  the optimizer step on the CPU;
* ``hsdp``: several nodes as a 2-D mesh (replicate across nodes, shard inside a node): gathers stay on NVLink.

The rules live beside it: ``layout`` (the units, the dtypes), ``memory`` (what each rank allocates, phase by
phase) and ``timing`` (the bytes sent and the time rule).
"""

from __future__ import annotations

from advisor.choices import Device, FsdpGradSync, Precision
from advisor.context import StrategyContext
from advisor.memory import (
    RULE_OF_THUMB_BYTES_PER_PARAM,
    Breakdown,
    StrategyMemory,
    device_overhead,
    peak_of,
    rule_of_thumb_split,
    trace_mode,
    weight_bytes,
)
from advisor.models.families import ModelFamily
from advisor.timing.step import StepTime

from ..base import (
    DCP_IMPORTS,
    PlannedRow,
    ScriptJob,
    Strategy,
    pretrained_bytes,
    pretrained_copies,
    timing_of,
)
from . import timing
from .layout import Dtypes, dtypes
from .memory import step_phases


class FSDP2(Strategy):
    framework = "torch"
    template = "fsdp2.py"
    casts_weights = True  # MixedPrecisionPolicy runs the blocks on 16-bit parameters (no autocast): the half trace
    uses_fsdp_grad_sync = True
    client_optimizers = False  # bitsandbytes' and Adafactor's steps on DTensor shards are not verified
    optimizer_in_backward_blocker = None  # torchtune's full_finetune_distributed optimizer_in_bwd: each hook a shard
    hook_grads_sharded = True
    script_imports = (
        *DCP_IMPORTS,
        "from torch.distributed.device_mesh import init_device_mesh",
        (
            "from torch.distributed.fsdp import (\n    CPUOffloadPolicy,\n    FSDPModule,\n"
            "    MixedPrecisionPolicy,\n    fully_shard,\n)"
        ),
    )

    def __init__(self, reshard: bool = True, offload: bool = False, hybrid: bool = False) -> None:
        self.reshard, self.offload, self.hybrid = reshard, offload, hybrid
        self.name = "hsdp" if hybrid else "fsdp2" + ("_offload" if offload else "" if reshard else "_noreshard")
        self.title = (
            "HSDP (FSDP2 2-D)"
            if hybrid
            else "FSDP2" + (" + CPU offload" if offload else "" if reshard else " (no reshard)")
        )
        self.shards_everything = reshard and not hybrid
        # Ties in step time: after ZeRO's (FSDP2 moves what ZeRO-3 moves); offload last with ZeRO's offload.
        self.comm_order = 4 if offload else 2
        self.comm_pattern = (
            "all-gather of the parameters in forward"
            + (" and in backward" if reshard else "")
            + ", reduce-scatter of the gradients (fp32)"
            + (" inside each node, all-reduce of the shards across nodes" if hybrid else "")
            + ("; sharded states in host RAM over PCIe" if offload else "")
        )

    # --- where it applies -------------------------------------------------------------------------------------
    def not_applicable(self, ctx: StrategyContext) -> str | None:
        # fp16 applies: torch.amp.GradScaler unscales DTensor gradients and takes the found-inf flag's maximum over
        # the mesh (checked on 2 gloo ranks: an inf on one rank skips the step on both and halves the scale).
        if self.hybrid and ctx.hardware.num_nodes < 2:
            return "HSDP replicates across nodes: it needs at least 2 nodes (on one node use fsdp2)"
        return None

    def dtypes(self, ctx: StrategyContext) -> Dtypes:
        """``dtypes`` of this plan: the trainable parameters held as under autocast (LoRA adapters in fp32, peft's
        upcast, unless ``--lora-dtype``), the frozen base apart (``phases``)."""
        wb = weight_bytes(ctx.profile.stats, ctx.profile.spec.adapter, trace_mode(ctx.options.precision, False))
        return dtypes(ctx.options.precision, wb.trainable_elem)

    def shard_size(self, ctx: StrategyContext) -> int:
        """N: the ranks a parameter is sharded over (HSDP: one node's GPUs)."""
        return ctx.hardware.gpus_per_node if self.hybrid else ctx.world_size

    def sync_every(self, ctx: StrategyContext) -> bool:
        """Whether gradients are reduce-scattered on every micro-step (``--fsdp-grad-sync``)."""
        return ctx.options.fsdp_grad_sync != FsdpGradSync.LAST_MICRO_STEP

    # --- memory -----------------------------------------------------------------------------------------------
    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        """The largest of ``phases``; host RAM (offload): every rank's shards, gradients and optimizer states."""
        phases, states, host = self.phases(ctx, micro_batch)
        peak = peak_of(*phases)
        return StrategyMemory(
            peak=peak,
            overhead=device_overhead(ctx.device, peak.total, ctx.world_size),
            model_state_bytes=states,
            host_bytes_per_node=host,
        )

    def phases(self, ctx: StrategyContext, micro_batch: int) -> tuple[list[Breakdown], int, int]:
        """(forward, backward, end of backward, optimizer step breakdowns; model-state bytes on the GPU; host bytes
        per node) at ``micro_batch``, each term as ``strategies.fsdp2.memory.step_phases`` sources it."""
        return step_phases(self, ctx, micro_batch)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        (frozen, p), n = rule_of_thumb_split(ctx.profile.stats, ctx.profile.spec.adapter), self.shard_size(ctx)
        return 0 if self.offload else (frozen + RULE_OF_THUMB_BYTES_PER_PARAM * p) // n

    def load_host_bytes_per_node(self, ctx: StrategyContext) -> int:
        """The generated script builds the model on the meta device (no memory) and materialises only each rank's
        shards (``to_empty`` after ``fully_shard``): the rank's fp32 shards (offload: they stay there).

        Their values come from rank 0, which builds the model whole in host memory as the DDP and single-GPU scripts
        do (the same SEED gives the same initial weights; ``--init-from``: ``build_model(path)``,
        ``from_pretrained(path, dtype=torch.float32)`` or a ``torch.load``'ed state_dict beside the model; LoRA: the
        base in its held dtype) and broadcasts it into every rank's shards with
        ``torch.distributed.checkpoint.state_dict.set_model_state_dict(..., StateDictOptions(full_state_dict=True,
        broadcast_from_rank0=True))``, which sends it tensor by tensor from the GPU
        (``torch.distributed._state_dict_utils._broadcast_state_dict``): node 0 holds ``pretrained_copies`` x
        ``pretrained_bytes`` on top of its ranks' shards (the per-node figure is node 0's; the others keep the
        shards alone)."""
        stats = ctx.profile.stats
        shards = ctx.hardware.gpus_per_node * (-(-4 * stats.num_params // self.shard_size(ctx)) + stats.buffer_bytes)
        return shards + pretrained_copies(ctx) * pretrained_bytes(ctx)

    def load_fix(self, ctx: StrategyContext | None = None) -> str:
        what = (
            "the pretrained model" if ctx is not None and ctx.options.init_from else "the model (its initial weights)"
        )
        return (
            f"rank 0 holds a whole copy of {what} while it broadcasts it into the shards: give node 0 more host "
            "RAM (more GPUs per node shrink only the shards)"
        )

    # --- communication and time -------------------------------------------------------------------------------
    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU sends per optimizer step (``strategies.fsdp2.timing.comm_bytes_per_step``)."""
        return timing.comm_bytes_per_step(self, ctx, grad_accum_steps)

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """One optimizer step at ``row``'s accumulation steps (``strategies.fsdp2.timing.step_time``); None for a GPU
        without a preset."""
        t = timing_of(ctx)
        if t is None:
            return None
        return timing.step_time(self, ctx, t, self.compute_time(ctx, t), row.grad_accum_steps or 1)

    # --- the script -------------------------------------------------------------------------------------------
    script_loop = ("torch_steps.py", "fsdp2.py")

    def script_variants(self, job: ScriptJob) -> dict[str, str]:
        """The mesh (HSDP's 2-D one), the model built on meta (full, pure bf16 or LoRA), where the shards live
        (CPUOffloadPolicy's host memory) and the gradient sync (on the last accumulation micro-step only, where there
        are several, with ``--fsdp-grad-sync last-micro-step``)."""
        pure = job.precision == Precision.PURE_BF16
        model = "lora" if job.spec.adapter else "pure_bf16" if pure else "full"
        sync_last = job.fsdp_grad_sync == FsdpGradSync.LAST_MICRO_STEP and job.grad_accum_steps > 1
        return {
            "start": "hsdp" if self.hybrid else "fsdp",
            "precision_dtypes": "pure_bf16" if pure else "policy",
            "prepare_model": "lora" if job.spec.adapter else "full",
            "adapt_on_meta": model,
            "build_whole": model,
            "shard_placement": "offload" if self.offload else "device",
            "micro_step_context": "sync_last" if sync_last else "every",
        }

    def script_constants(self, job: ScriptJob, family: ModelFamily) -> dict[str, object]:
        # Blocks free their gathered parameters after forward and gather again in backward (ZeRO-3-like).
        consts: dict[str, object] = {"RESHARD_AFTER_FORWARD": self.reshard}
        if self.hybrid:  # 2-D mesh: replicate across nodes, shard inside a node
            consts["REPLICATE_DEGREE"] = job.num_nodes
        return consts

    def verify_blocker(self, device: Device) -> str | None:
        if self.hybrid and device == Device.CPU:
            return "hsdp needs several nodes; verify fsdp2 on one machine (the same script with REPLICATE_DEGREE 1)"
        return super().verify_blocker(device)
