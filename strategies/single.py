"""Plain training in one process: no wrapper, no launcher, no process group (``python train.py``).

Memory rule: the DDP rule without DDP's buckets (``strategies.ddp.replicated_memory`` with ``ddp=False``): weights,
optimizer states, and gradients only from the backward pass to ``zero_grad(set_to_none=True)`` (or across the
accumulation window). On one GPU it is what the recommender picks when it fits; with more GPUs it is the baseline
row ("fits on one GPU without distribution, or not"), compared at the same global batch (it accumulates the other
GPUs' share).
"""

from __future__ import annotations

from dataclasses import replace

from advisor.choices import Precision
from advisor.context import StrategyContext
from advisor.hardware import Hardware
from advisor.memory import RULE_OF_THUMB_BYTES_PER_PARAM, StrategyMemory, rule_of_thumb_split, weight_bytes
from advisor.timing.step import StepTime
from advisor.training_options import TrainingOptions

from .base import PlannedRow, Strategy, accumulated_step, optimizer_step_s, timing_of
from .ddp import replicated_memory
from .launchers import PYTHON


class Single(Strategy):
    name = "single"
    title = "Single GPU"
    framework = "torch"
    launcher = PYTHON
    script_loop = ("torch_steps.py", "single.py")
    script_parts = ("checkpoint_local.py",)  # one process: torch.save, no torch.distributed
    distributes = False
    comm_order = -1  # no communication at all: first among ties
    comm_pattern = "none (one process)"
    quantized_base = True  # QLoRA: bitsandbytes' 4/8-bit layers, checked on CPU here
    optimizer_in_backward_blocker = None  # torchtune's full_finetune_single_device optimizer_in_bwd
    unscripted_options = ()  # every memory option (the step in backward: templates/common.py's OptimizerInBackward)

    def dp_size(self, ctx: StrategyContext) -> int:
        return 1

    def verify_cluster(
        self, hw: Hardware, options: TrainingOptions, row: PlannedRow
    ) -> tuple[Hardware, TrainingOptions]:
        """One process: the verification runs one rank whatever ``--gpus`` says (the script starts no others)."""
        return replace(hw, gpus_per_node=1, num_nodes=1), options

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        return replicated_memory(ctx, micro_batch, ctx.profile.stats, dp_size=1, ddp=False)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        frozen, p = rule_of_thumb_split(ctx.profile.stats, ctx.profile.spec.adapter)
        return frozen + RULE_OF_THUMB_BYTES_PER_PARAM * p

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        return 0

    def load_host_bytes_per_node(self, ctx: StrategyContext) -> int:
        """One process builds the model on the CPU in fp32 (torch's default dtype) before moving it to the GPU (LoRA:
        the base in its held dtype; ``--init-from``: the pretrained weights loaded the same way, twice over for a
        ``torch.load``'ed state_dict, ``Strategy.load_host_bytes_per_node``): one GPU's share of the base rule."""
        return super().load_host_bytes_per_node(ctx) // ctx.hardware.gpus_per_node

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """Time rule: ``row.grad_accum_steps`` micro-steps of forward + backward (the roofline of the autocast
        trace, as DDP's), then the optimizer step (fused AdamW / foreach SGD over the full states at HBM bandwidth;
        fp16 adds GradScaler's unscale). No communication."""
        t = timing_of(ctx)
        if t is None:
            return None
        opts, stats = ctx.options, ctx.profile.stats
        ga = row.grad_accum_steps or 1
        c = self.compute_time(ctx, t)
        w = weight_bytes(stats, ctx.profile.spec.adapter, self.trace_mode(opts.precision)).trainable_elem
        opt = optimizer_step_s(
            ctx, t, stats.num_trainable, w, w, w, extra=2 * w if opts.precision == Precision.FP16 else 0
        )
        return accumulated_step(
            ctx,
            t,
            c,
            ga,
            comm_s=0.0,
            exposed_comm_s=0.0,
            optimizer_s=opt,
            overlap="nothing to overlap: one process",
        )
