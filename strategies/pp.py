"""Pipeline parallelism x DDP: the row a user asks for with ``--pp-degree N`` (``--pp N``), on the
layout TP (``--tp-degree``, default 1) inside a node, PP across, DDP the rest (``advisor.layout.Layout``), with the
schedule ``--pp-schedule`` names (default 1F1B, ``torch.distributed.pipelining.Schedule1F1B``; GPipe; interleaved
1F1B with ``--pp-virtual-stages`` chunks per rank). Without the pin there is no row (``pinned``), so
every other plan is unchanged. Its script (``templates/pp.py``, ``--strategy pp``) runs PP x DDP with
``torch.distributed.pipelining``'s manual ``PipelineStage``s; with ``--tp-degree`` above 1 the row is sized and timed
only (``script_blocker``).

Memory: ``strategies.pipeline.stages`` (every stage; the most-loaded is the row's peak, the others in the notes),
the data-parallel replicas holding the stage's states whole (the script averages the accumulated ``.grad`` tensors
by hand once the pipeline's backward is done, as TP x DP's does: no DDP buckets beside them).

Time: ``advisor.timing.pipeline.pipeline_time`` over the slowest stage's forward and backward (its blocks' share of
the one- and two-block traces' op times, ``strategies.pipeline.block_compute``), the p2p sends on the critical path
over the link the boundaries cross, TP's activation all-reduces on the stage's blocks (as ``strategies.tp`` times
them: 2 per block in forward and 2 in backward, 2 more with recompute; the vocab-parallel collectives are not
counted here), the gradient all-reduce of the stage across its data-parallel group (after the pipeline's backward,
not overlapped: the script all-reduces gradient by gradient; sized as ``strategies.ddp``'s buckets), and the fused
optimizer step over the
stage's states.

PP x ZeRO-1 (``PipelineParallel(zero_stage=1)``, the row ``pp_zero1``): Megatron-LM's distributed optimizer, the layout
of its published PP x TP runs (``--use-distributed-optimizer``): each data-parallel rank of a stage keeps 1/dp of the
stage's optimizer states and master weights (Rajbhandari et al. 2020, section 5.1, P_os), its gradients are
reduce-scattered and the updated weights all-gathered instead of one all-reduce (the same bytes on the wire: Megatron-LM
docs/source/api-guide/dist_optimizer.md), and the optimizer steps over 1/dp of the stage. Sized and timed only: the
emitted pipeline script runs PP x DDP.
"""

from __future__ import annotations

from dataclasses import replace

from advisor.choices import PipelineSchedule, Precision
from advisor.context import StrategyContext
from advisor.errors import AdvisorError
from advisor.hardware import Hardware
from advisor.layout import Layout
from advisor.memory import RULE_OF_THUMB_BYTES_PER_PARAM, Breakdown, StrategyMemory, device_overhead
from advisor.models.families import ModelFamily
from advisor.models.limits import as_int, layout_dims
from advisor.stage_memory import StageMemory, peak_stage
from advisor.timing.comm import Fabric, bucketed_allreduce, ddp_bucket_sizes
from advisor.timing.pipeline import p2p_bytes, p2p_s, pipeline_time
from advisor.timing.step import Collective, StepTime
from advisor.training_options import TrainingOptions
from advisor.units import fmt_gib

from .base import DCP_IMPORTS, PlannedRow, ScriptJob, Strategy, fabric_of, optimizer_step_s, timing_of
from .pipeline import activation_bytes, block_compute, stages

# What the script does not run (the row is still sized and timed): TP inside the stages, fp16's GradScaler.
PP_TP_BLOCKER = (
    "the pipeline script runs PP x DP only: PP x TP (--tp-degree above 1) is sized and timed, not emitted; "
    "use tp_dp, or --pp-degree without --tp-degree"
)
PP_ZERO1_BLOCKER = (
    "the pipeline script runs PP x DDP only: PP x ZeRO-1 (Megatron-LM's distributed optimizer) is sized and timed, "
    "not emitted; use --strategy pp"
)
PP_FP16_BLOCKER = (
    "the pipeline script trains in fp32, bf16 or pure-bf16: fp16's GradScaler would skip steps stage by stage; "
    "use --precision bf16"
)


class PipelineParallel(Strategy):
    """PP x DDP (``zero_stage`` 0, the row ``pp``) or PP x ZeRO-1 (1, ``pp_zero1``; module docstring)."""

    name = "pp"
    title = "PP x DDP"
    comm_order = 3

    def __init__(self, zero_stage: int = 0) -> None:
        if zero_stage not in (0, 1):
            raise ValueError(f"PipelineParallel models DDP (0) and ZeRO-1 (1) across its replicas, got {zero_stage}")
        self.zero_stage = zero_stage
        if zero_stage:
            self.name, self.title = "pp_zero1", "PP x ZeRO-1"

    uses_tp_degree = True
    lora_blocker = "LoRA with pipeline stages is not modelled here"
    client_optimizers = False
    unscripted_options = (
        *Strategy.unscripted_options,
        ("--chunked-cross-entropy", "computes the loss in the schedule, on the last stage's whole logits"),
        ("--selective-checkpointing", "does not write it into its stages yet"),
    )
    comm_pattern = (
        "point-to-point sends of each micro-batch's hidden states between pipeline stages, TP's activation "
        "all-reduces inside a stage, and a gradient all-reduce of each stage across its data-parallel group after "
        "the pipeline's backward"
    )

    def pinned(self, options: TrainingOptions) -> bool:
        return (options.pp_degree or 1) > 1  # --pp-degree 1 is no pipeline

    script_loop = ("torch_steps.py", "pp.py")
    script_imports = (
        *DCP_IMPORTS,
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B",
    )

    def script_variants(self, job: ScriptJob) -> dict[str, str]:
        return {"cast_weights": "pure_bf16" if job.precision == Precision.PURE_BF16 else "fp32"}

    def estimate_only_for(self, ctx: StrategyContext) -> str | None:
        """PP x TP and fp16 rows are sized and timed only (``script_blocker``)."""
        return self.script_blocker(self.layout(ctx).tp, ctx.options.precision or Precision.FP32)

    def script_blocker(self, tp_degree: int, precision: Precision) -> str | None:
        """Why the row's script cannot be written (None: it can): ZeRO-1 across the replicas, TP inside the stages,
        fp16."""
        if self.zero_stage:
            return PP_ZERO1_BLOCKER
        if tp_degree > 1:
            return PP_TP_BLOCKER
        return PP_FP16_BLOCKER if precision == Precision.FP16 else None

    def script_constants(self, job: ScriptJob, family: ModelFamily) -> dict[str, object]:
        """The pipeline's degree, schedule and model chunks per rank (``templates/pp.py``).

        Raises:
            AdvisorError: a layout or precision the script does not run (``script_blocker``).
        """
        why = self.script_blocker(job.tp_degree, Precision(job.precision))
        if why:
            raise AdvisorError(why)
        pp = job.gpus_per_node * job.num_nodes // max(1, job.dp_size)
        schedule = PipelineSchedule(job.pp_schedule or PipelineSchedule.ONE_F_ONE_B)
        virtual = (job.pp_virtual_stages or 2) if schedule.interleaved else 1
        return {"PP_DEGREE": pp, "PP_SCHEDULE": str(schedule), "PP_VIRTUAL_STAGES": virtual}

    def verify_cluster(
        self, hw: Hardware, options: TrainingOptions, row: PlannedRow
    ) -> tuple[Hardware, TrainingOptions]:
        """The planned pipeline degree on this machine's ranks (DDP the rest).

        Raises:
            AdvisorError: a row the script does not run (``script_blocker``, without TP, which the run drops: checked
                here, before the CPU calibration); the ranks here are not a multiple of the degree.
        """
        why = self.script_blocker(1, options.precision or Precision.FP32)
        if why:
            raise AdvisorError(f"cannot verify {self.name}: {why}")
        pp = options.pp_degree or 1
        if hw.num_gpus % pp:
            raise AdvisorError(
                f"pp needs a multiple of --pp-degree {pp} ranks to verify; this machine runs {hw.num_gpus}"
            )
        return hw, replace(options, tp_degree=None)

    def rank_peak_bytes(self, ctx: StrategyContext, micro_batch: int) -> list[int] | None:
        """The estimated peak of every rank, in rank order: its stage's (rank r is stage r // (dp x tp), the mesh
        [pp, dp] of the script)."""
        layout = self.layout(ctx)
        per_stage = [s.total for s in self.stages(ctx, micro_batch)]
        return [per_stage[r // (layout.dp * layout.tp)] for r in range(layout.world_size)]

    def schedule(self, ctx: StrategyContext) -> tuple[PipelineSchedule, int]:
        """(schedule, model chunks per rank): ``TrainingOptions.pipeline_schedule``."""
        return ctx.options.pipeline_schedule

    def layout(self, ctx: StrategyContext) -> Layout:
        """The row's layout: ``--pp-degree`` stages, ``--tp-degree`` (default 1) TP ranks, DDP replicas the rest
        (``Layout.validate``'s product rule is checked by ``not_applicable``)."""
        pp, tp = ctx.options.pp_degree or 1, ctx.options.tp_degree or 1
        return Layout(dp_replicate=max(1, ctx.world_size // (pp * tp)), tp=tp, pp=pp)

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        spec = ctx.profile.spec
        if not ctx.options.pp_degree:
            return "needs --pp-degree N"
        if spec.pp_blocker:
            return spec.pp_blocker
        heads, kv, layers = layout_dims(spec.config or {})
        try:
            layout = self.layout(ctx).validate(ctx.world_size, heads, kv, layers)
            if layers:
                layout.stage_blocks(layers, self.schedule(ctx)[1])
        except AdvisorError as err:
            return f"--pp-degree {ctx.options.pp_degree}: {err}"
        if self.zero_stage and self.layout(ctx).dp == 1:
            return "1 data-parallel rank per stage: ZeRO-1 has no replica to shard the optimizer states over (see pp)"
        schedule, pp = self.schedule(ctx)[0], self.layout(ctx).pp
        m = self._micro_batches(ctx, ctx.micro_batch_size)
        if schedule.interleaved and m % max(1, m // pp):
            # torch.distributed.pipelining.ScheduleInterleaved1F1B.__init__ raises the same
            return (
                f"interleaved 1F1B needs the {m} micro-batches per step to split into whole rounds of {pp} "
                f"(torch's ScheduleInterleaved1F1B: {m} % {max(1, m // pp)} != 0): change --global-batch-size"
            )
        return None

    def dp_size(self, ctx: StrategyContext) -> int:
        return self.layout(ctx).dp

    def tp_degree_of(self, ctx: StrategyContext) -> int:
        return self.layout(ctx).tp

    def _micro_batches(self, ctx: StrategyContext, micro_batch: int) -> int:
        """Micro-batches per optimizer step and pipeline: the global batch (--global-batch-size, else micro-batch x
        GPUs, as every row) over micro-batch x data-parallel size (``advisor.rows.evaluate_row``'s accumulation)."""
        target = ctx.options.global_batch_size or micro_batch * ctx.world_size
        return max(1, -(-target // (micro_batch * self.dp_size(ctx))))

    def stages(self, ctx: StrategyContext, micro_batch: int) -> list[StageMemory]:
        """Every stage's memory at ``micro_batch`` (``strategies.pipeline.stages`` at the row's ZeRO stage: 0 DDP)."""
        m = self._micro_batches(ctx, micro_batch)
        schedule, v = self.schedule(ctx)
        return stages(ctx, self.layout(ctx), schedule, self.zero_stage, m, virtual=v, micro_batch=micro_batch)

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        layout = self.layout(ctx)
        all_stages = self.stages(ctx, micro_batch)
        top = peak_stage(all_stages)
        peak = Breakdown(
            params=top.params,
            grads=top.grads,
            optimizer_states=top.optimizer_states,
            activations=top.activations,
            buffers=top.buffers,
            other=top.other,
            # the peak on a stage: its last warm-up forward, before the first backward frees a micro-batch
            phase=f"forward (stage {top.stage} of {layout.pp}, {self.schedule(ctx)[0]}: {top.in_flight:.3g} "
            "micro-batches in flight)",
        )

        def note(s: StageMemory) -> str:
            where = f"{s.blocks} blocks{' + embedding' if s.first else ''}{' + head' if s.last else ''}"
            flight = f"{s.in_flight:.3g} micro-batch{'' if s.in_flight == 1 else 'es'}"
            return (
                f"stage {s.stage}: {where}, {fmt_gib(s.total)} (model states {fmt_gib(s.model_states)}"
                f", activations {fmt_gib(s.activations)} for {flight} in flight, receive buffers "
                f"{fmt_gib(s.buffers)}, temporaries {fmt_gib(s.other)})"
            )

        notes = tuple(note(s) for s in all_stages)
        return StrategyMemory(
            peak=peak,
            overhead=device_overhead(ctx.device, peak.total, ctx.world_size),
            model_state_bytes=top.model_states,
            notes=notes,
        )

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        return RULE_OF_THUMB_BYTES_PER_PARAM * peak_stage(self.stages(ctx, ctx.micro_batch_size)).params_numel

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU of the busiest stage sends per step: 2 p2p messages per micro-batch (hidden states forward,
        their gradient backward), plus DDP's all-reduce of the stage's gradients (2(n-1)/n of them; ZeRO-1's
        reduce-scatter and all-gather send the same) and TP's activation all-reduces of the stage's blocks (2(t-1)/t
        of s x b x h each, 4 per block per micro-batch)."""
        layout, mb = self.layout(ctx), ctx.micro_batch_size
        m, v = max(1, grad_accum_steps), self.schedule(ctx)[1]
        top = peak_stage(self.stages(ctx, mb))
        message = self._message(ctx, mb)
        total = 2 * m * v * message if layout.pp > 1 else 0
        if layout.dp > 1:
            g = Precision.FP32.param_bytes if ctx.options.precision is None else ctx.options.precision.param_bytes
            total += 2 * (layout.dp - 1) * top.params_numel * g // layout.dp
        if layout.tp > 1:
            calls = (4 + (2 if ctx.options.activation_checkpointing else 0)) * top.blocks * m
            whole = (ctx.profile.spec.seq_len or 1) * mb * self._hidden(ctx) * activation_bytes(ctx)
            total += calls * 2 * (layout.tp - 1) * whole // layout.tp
        return total

    def _hidden(self, ctx: StrategyContext) -> int:
        return as_int((ctx.profile.spec.config or {}).get("hidden_size") or 0)

    def _message(self, ctx: StrategyContext, mb: int) -> int:
        return p2p_bytes(ctx.profile.spec.seq_len or 1, mb, self._hidden(ctx), activation_bytes(ctx))

    def _dp_collectives(self, grad_bytes: int, fabric: Fabric) -> list[Collective]:
        """The stage's gradient synchronisation across its data-parallel group, after the pipeline's backward and not
        overlapped (the script all-reduces gradient by gradient): DDP's bucketed all-reduce, or ZeRO-1's
        reduce-scatter of the gradients and all-gather of the updated weights in the same buckets."""
        if not self.zero_stage:
            ar = bucketed_allreduce(grad_bytes, fabric)
            what = f"gradient all-reduce of the stage across its data-parallel group ({len(ar.buckets)} bucket sizes)"
            calls = len(ar.buckets)
            return [Collective(what, "all_reduce", "data-parallel", grad_bytes, calls, ar.total_s, ar.total_s)]
        buckets = ddp_bucket_sizes(grad_bytes)  # the buckets bucketed_allreduce sends, without timing an all-reduce
        out = []
        for kind, what in (
            ("reduce_scatter", "gradient reduce-scatter of the stage across its data-parallel group"),
            ("all_gather", "all-gather of the stage's updated weights across its data-parallel group"),
        ):
            s = sum(fabric.time_s(kind, b) for b in buckets)
            out.append(Collective(what, kind, "data-parallel", grad_bytes, len(buckets), s, s))
        return out

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """Time rule (module docstring): the pipeline of ``row.grad_accum_steps`` micro-batches over the
        slowest stage, the p2p sends on its critical path, TP's activation all-reduces of the stage's blocks on
        every micro-batch, DDP's gradient all-reduce of the stage, the optimizer step over the stage's states."""
        t = timing_of(ctx)
        if t is None:
            return None
        hw, opts, mb = ctx.hardware, ctx.options, ctx.micro_batch_size
        layout, m = self.layout(ctx), row.grad_accum_steps or 1
        block, rest = block_compute(ctx, t.rates, layout.tp, mb)
        all_stages = self.stages(ctx, mb)
        times = [
            (
                s.blocks * block.fwd_s + (rest.fwd_s if s.last else 0.0),
                s.blocks * block.bwd_s + (rest.bwd_s if s.last else 0.0),
            )
            for s in all_stages
        ]
        fwd, bwd = max(times, key=sum)
        slowest = all_stages[times.index((fwd, bwd))]
        message = self._message(ctx, mb)
        fabric = fabric_of(ctx, t, hw.gpus_per_node, hw.num_nodes)
        crosses = layout.pp_crosses_nodes(hw.gpus_per_node)
        senders = min(hw.gpus_per_node, layout.world_size // layout.pp)
        one = p2p_s(message, fabric, crosses, senders) if layout.pp > 1 else 0.0
        schedule, v = self.schedule(ctx)
        pipe = pipeline_time(schedule, layout.pp, m, fwd, bwd, message, one, v)
        coll = []
        if layout.pp > 1:
            link = "the network" if crosses else "the node's links"
            coll.append(
                Collective(
                    f"p2p sends between stages over {link} ({pipe.p2p_sends} per step; "
                    f"{2 * (layout.pp * v - 1)} on the critical path)",
                    "p2p",
                    "pipeline-parallel",
                    message,
                    pipe.p2p_sends,
                    pipe.p2p_total_s,
                    pipe.p2p_exposed_s,
                    passes=pipe.p2p_sends,
                )
            )
        tp_s = 0.0
        if layout.tp > 1:
            per_block = 4 + (2 if opts.activation_checkpointing else 0)
            whole = (ctx.profile.spec.seq_len or 1) * mb * self._hidden(ctx) * activation_bytes(ctx)
            tp_fabric = Fabric.from_preset(
                t.preset, layout.tp, 1, interconnect=hw.interconnect, link_busbw_gbps=hw.link_busbw_gbps
            )
            if hw.calibration is not None:
                tp_fabric = hw.calibration.fabric(tp_fabric)
            calls = per_block * slowest.blocks * m
            tp_s = calls * tp_fabric.time_s("all_reduce", whole)
            coll.append(
                Collective(
                    f"activation all-reduce ({per_block} per block of the stage)",
                    "all_reduce",
                    "tensor-parallel",
                    whole,
                    calls,
                    tp_s,
                    tp_s,
                    passes=calls,
                )
            )
        g = Precision.FP32.param_bytes if opts.precision is None else opts.precision.param_bytes
        dp_total = dp_exposed = 0.0
        if layout.dp > 1:
            stage_ranks = layout.dp * layout.tp
            per_node = max(1, min(layout.dp, hw.gpus_per_node // layout.tp))
            nodes = max(1, layout.dp // per_node) if stage_ranks >= hw.gpus_per_node else 1
            dp_fabric = fabric_of(ctx, t, per_node, nodes, concurrent_groups=layout.tp)
            dp_coll = self._dp_collectives(slowest.params_numel * g, dp_fabric)
            coll += dp_coll
            dp_total = dp_exposed = sum(c.seconds for c in dp_coll)
        # ZeRO-1: each replica steps its 1/dp of the stage (P_os)
        shards = layout.dp if self.zero_stage else 1
        opt = optimizer_step_s(ctx, t, -(-peak_stage(all_stages).params_numel // shards), g, g, g)
        layers = sum(s.blocks for s in all_stages)
        flops = (layers * block.flops + rest.flops) * m // layout.pp
        model_flops = (layers * (block.flops - block.recompute_flops) + rest.flops - rest.recompute_flops) * m
        return StepTime(
            micro_batch=mb,
            micro_steps=m,
            compute_s=pipe.ideal_s + pipe.bubble_s,
            bubble_s=pipe.bubble_s,
            comm_s=pipe.p2p_total_s + tp_s + dp_total,
            exposed_comm_s=pipe.p2p_exposed_s + tp_s + dp_exposed,
            optimizer_s=opt,
            flops=flops,
            model_flops=model_flops // layout.pp,
            peak_flops_per_s=t.peak_flops_per_s,
            overlap=f"{schedule}: p2p sends overlap the next micro-batch's compute except on the critical path; "
            "TP's all-reduces are on it; the stage's gradients are all-reduced after the pipeline's backward",
            collectives=tuple(coll),
            notes=(
                f"pipeline bubble {pipe.bubble_fraction:.1%} of the compute ({schedule}: (p - 1) / "
                + (f"(v m) = {layout.pp - 1} / ({v} x {m})" if v > 1 else f"m = {layout.pp - 1} / {m}")
                + ", Narayanan et al. 2021), included in the compute time",
            ),
        )
