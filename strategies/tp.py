"""Tensor parallelism (torch.distributed.tensor.parallel) inside one NVLink node, optionally times
data parallelism across the rest of the GPUs (a 2-D device mesh: TP inside, DP outside).

Memory rule: each rank holds one shard of every attention/MLP projection (heads and MLP width
divided by the TP degree, Megatron-LM paper, Shoeybi et al. 2019, section 3), one vocabulary shard of the
LM head and of the input embedding (Megatron-LM's VocabParallelEmbedding and vocab-parallel
cross-entropy, ibid. section 3 "output embedding"; torchtitan's Llama plan: the head ColwiseParallel with its
output kept sharded on the vocab dim and ``loss_parallel()``), and a replica of the norms. The trace builds
exactly that shard (advisor.models.hf_config with ``tp_degree``: heads, MLP width and vocabulary divided), so
per-rank weights, gradients, optimizer states and activations (the logits: ceil(V / t) of them) are those of
the shard. The generated script all-reduces gradients across TP groups by hand (no DDP buckets).

The embedding is sharded on its hidden dim (``ColwiseParallel``, output all-gathered) when it has its own
weight, on its vocab dim (``RowwiseParallel``, output all-reduced) when it is tied to the head, which must be
vocab-sharded. Either way a rank holds 1/t of it. torch's DTensor has no vocab-sharded strategy for the
embedding's backward (``embedding_dense_backward``): a row-sharded embedding's weight gradient comes out whole
(Replicate; measured on 2 gloo ranks, torch 2.14) before it is added into the head's sharded gradient, so a
tied model holds one full V x h gradient for a moment at the end of backward (``end_of_backward_bytes``).
"""

from __future__ import annotations

from dataclasses import replace

from advisor.choices import Precision
from advisor.context import StrategyContext
from advisor.errors import AdvisorError
from advisor.hardware import Hardware
from advisor.memory import (
    RULE_OF_THUMB_BYTES_PER_PARAM,
    StrategyMemory,
    bytes_per_element,
)
from advisor.models.families import ModelFamily
from advisor.models.limits import as_int
from advisor.models.tp_plan import ties_embeddings
from advisor.timing.comm import Fabric
from advisor.timing.step import FOREACH_FACTOR, Collective, StepTime
from advisor.training_options import TrainingOptions

from .base import DCP_IMPORTS, PlannedRow, ScriptJob, Strategy, accumulated_step, fabric_of, optimizer_step_s, timing_of
from .ddp import replicated_memory


def vocab_shape(ctx: StrategyContext) -> tuple[bool, int, int]:
    """(tied, vocab, hidden) of ``ctx``'s model: whether the LM head shares the input embedding's weight
    (``advisor.models.tp_plan.ties_embeddings``: the config's ``tie_word_embeddings``, else its class's default)."""
    spec = ctx.profile.spec
    cfg = spec.config or {}
    return (
        ties_embeddings(spec.model_type, cfg),
        as_int(cfg.get("vocab_size") or 0),
        as_int(cfg.get("hidden_size") or 0),
    )


# Vocab-parallel cross-entropy: three all-reduces of one fp32 value per token in forward (the row maximum, the sum
# of exponentials and the target's logit; Megatron-LM megatron/core/tensor_parallel/cross_entropy.py
# VocabParallelCrossEntropy.forward; torch/distributed/tensor/parallel/loss.py _log_softmax and _nll_loss_forward),
# none in backward (each rank's softmax minus one-hot is local).
CE_ALL_REDUCES = 3
CE_BYTES_PER_TOKEN = 4


class TensorParallel(Strategy):
    comm_order = 3
    lora_blocker = (
        "tensor parallel shards the base's linear layers as DTensors, which peft's LoRA layers do not "
        "wrap here: use single, ddp, fsdp2 or ZeRO for LoRA"
    )
    client_optimizers = False  # bitsandbytes' and Adafactor's steps on DTensor shards are not verified
    unscripted_options = (
        *Strategy.unscripted_options,
        ("--chunked-cross-entropy", "computes a vocab-parallel loss (loss_parallel over the sharded logits)"),
    )
    script_loop = ("torch_steps.py", "tp.py")
    script_imports = (
        *DCP_IMPORTS,
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.tensor import DTensor",
        "from torch.distributed.tensor.parallel import loss_parallel",
    )

    def script_variants(self, job: ScriptJob) -> dict[str, str]:
        # Full weights only (LoRA does not apply: lora_blocker): in bf16 throughout under pure bf16.
        return {"prepare_model": "pure_bf16" if job.precision == Precision.PURE_BF16 else "full"}

    uses_tp_degree = True
    comm_pattern = (
        "all-reduce of the activations twice per block in forward and in backward (tensor parallel), the "
        "vocab-parallel embedding, LM head and cross-entropy collectives, "
        "plus a gradient all-reduce across the data-parallel groups"
    )

    def __init__(self, with_dp: bool) -> None:
        self.with_dp = with_dp
        self.name = "tp_dp" if with_dp else "tp"
        self.title = "TP x DP" if with_dp else "Tensor parallel"

    def degree(self, ctx: StrategyContext) -> int:
        return ctx.hardware.gpus_per_node if not self.with_dp and not ctx.options.tp_degree else ctx.tp_degree()

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        spec = ctx.profile.spec
        if spec.tp_blocker:
            return f"{spec.tp_blocker}; prefer lower precision, activation checkpointing and ZeRO"
        # Over PCIe TP applies: its activation all-reduces are timed and ranked like any other
        # strategy's, and the recommender warns (``pcie_warning``). Across nodes it never applies (below).
        t = self.degree(ctx)
        cfg = spec.config or {}
        heads = as_int(cfg.get("num_attention_heads") or 0)
        kv = as_int(cfg.get("num_key_value_heads") or heads)
        if t < 2:
            if ctx.hardware.gpus_per_node >= 2:
                return (
                    f"no TP degree of 2 or more divides both the {heads} attention heads / {kv} key/value heads "
                    f"and the {ctx.hardware.gpus_per_node} GPUs per node (give --tp-degree)"
                )
            return "needs at least 2 GPUs in one node"
        if t > ctx.hardware.gpus_per_node:
            return f"TP degree {t} exceeds the {ctx.hardware.gpus_per_node} GPUs per node (never TP across nodes)"
        if heads % t or kv % t:
            fit = [d for d in range(2, t) if heads % d == 0 and kv % d == 0]
            return f"TP degree {t} must divide both the {heads} attention heads and the {kv} key/value heads" + (
                f": use --tp-degree {fit[-1]}" if fit else ""
            )
        if as_int(cfg.get("intermediate_size") or 0) % t:
            return f"TP degree {t} does not divide the MLP width {cfg.get('intermediate_size')}"
        if self.with_dp:
            if ctx.world_size % t or ctx.world_size // t < 2:
                return f"TP x DP needs a multiple (>= 2x) of the TP degree {t} GPUs; there are {ctx.world_size}"
        elif ctx.hardware.num_nodes > 1 or ctx.world_size != t:
            return (
                f"pure TP runs one TP group of exactly {t} GPUs on one node; for {ctx.world_size} GPUs use tp_dp "
                "(TP inside each group, data parallel across them)"
            )
        return None

    def dp_size(self, ctx: StrategyContext) -> int:
        return ctx.world_size // self.degree(ctx) if self.with_dp else 1

    def link_warning(self, ctx: StrategyContext) -> str | None:
        """A warning for this strategy on ``ctx``'s links (None: none): TP over PCIe all-reduces activations
        twice per block in forward and in backward over the slow link (Megatron-LM, Shoeybi et al. 2019, keeps its
        tensor-parallel groups inside one NVSwitch node)."""
        if ctx.hardware.interconnect == "nvlink":
            return None
        return (
            f"{self.title} over PCIe: the activation all-reduces (2 per block in forward, 2 in backward) cross "
            "PCIe on the critical path; the field's rule is tensor parallelism only inside an NVLink node"
        )

    # TP degrees of the usual node sizes (GPUs per node); another --gpus asks for one of them.
    WHAT_IF_DEGREES = (2, 4, 8)

    def what_if_traces(self, ctx: StrategyContext) -> list[tuple[str, int]]:
        """The shards another GPU count would trace: each of 2, 4 and 8 that divides the heads, the
        key/value heads and the MLP width (none for a model without a TP plan)."""
        spec = ctx.profile.spec
        if not spec.tp_capable:
            return []
        cfg = spec.config or {}
        heads = as_int(cfg.get("num_attention_heads") or 0)
        kv = as_int(cfg.get("num_key_value_heads") or heads)
        ffn = as_int(cfg.get("intermediate_size") or 0)
        mode = self.trace_mode(ctx.options.precision)
        return [(mode, t) for t in self.WHAT_IF_DEGREES if heads and not heads % t and not kv % t and not ffn % t]

    def script_constants(self, job: ScriptJob, family: ModelFamily) -> dict[str, object]:
        return {"TP_DEGREE": job.tp_degree}

    def verify_cluster(
        self, hw: Hardware, options: TrainingOptions, row: PlannedRow
    ) -> tuple[Hardware, TrainingOptions]:
        """Keep the planned TP degree when this machine's ranks divide it, else 2; pure TP runs on
        exactly one TP group, TP x DP needs at least two.

        Raises:
            AdvisorError: too few ranks here for TP x DP.
        """
        t = row.tp_degree if row.applicable else 2
        t = t if hw.num_gpus % t == 0 and t <= hw.num_gpus else 2
        if not self.with_dp:
            hw = replace(hw, gpus_per_node=t)
        elif hw.num_gpus // t < 2:
            raise AdvisorError(f"tp_dp needs at least {2 * t} ranks to verify; this machine runs {hw.num_gpus}")
        return hw, replace(options, tp_degree=t)

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        t = self.degree(ctx)
        tied, vocab, hidden = vocab_shape(ctx)
        # A tied, vocab-sharded embedding's weight gradient is computed whole (module docstring), in the gradients'
        # dtype (fp32 under autocast, whose weights are fp32; bf16 under pure bf16).
        whole = vocab * hidden * bytes_per_element(ctx.options.precision, "grads") if tied else 0
        # torch's loss_parallel (torch/distributed/tensor/parallel/loss.py _log_softmax: x - max, exp, sum, all-reduce,
        # log, subtract, each materialised) holds one fp32 copy of the rank's ceil(V / t) logits per token more than
        # the fused cross-entropy the shard's trace runs, at forward's loss and at its backward (measured with
        # advisor.measure.CpuPeakMeter on a 1-rank mesh, 1024 x 4000 logits: forward 2.0 vs 1.0 copies, backward
        # 3.0 vs 2.0; tests/test_tp_plan.py); the 16-bit head's logits are upcast to fp32 by the loss.
        tokens = (ctx.profile.spec.seq_len or 1) * micro_batch
        logits = tokens * -(-vocab // t) * 4 if vocab else 0
        return replicated_memory(
            ctx,
            micro_batch,
            ctx.profile.tp_stats(t),
            tp_degree=t,
            dp_size=self.dp_size(ctx),
            ddp=False,
            end_of_backward_bytes=whole,
            loss_extra_bytes=logits,
        )

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        return RULE_OF_THUMB_BYTES_PER_PARAM * ctx.profile.stats.num_params // self.degree(ctx)

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """Time rule. Compute: the roofline of one TP rank's shard (the trace at the TP degree: heads, MLP
        width and vocabulary divided, so the LM head's matmul and the cross-entropy run on V / t logits; norms
        replicated). Tensor-parallel all-reduces (Megatron-LM paper, Shoeybi
        et al. 2019, section 3: f/g operators): per block one after the attention output projection and one after
        the MLP down projection in forward, one for each of their column-parallel inputs in backward, each of
        s x b x h activations in the compute dtype (16-bit under autocast); activation checkpointing's recompute
        runs the forward's two again. Vocab parallelism adds, per micro-step, the embedding output's all-gather (tied:
        all-reduce), the LM head's input-gradient all-reduce of s x b x h, and the vocab-parallel cross-entropy's
        three all-reduces of one fp32 per token (``CE_ALL_REDUCES``). They sit between dependent matmuls: on the
        critical path, all exposed.
        TP x DP adds the template's hand-written gradient all-reduce across the data-parallel group at the
        accumulation boundary, one per parameter tensor after backward (nothing left to overlap). Optimizer: the
        template's foreach AdamW (fused kernels do not take DTensors) over the shard."""
        t = timing_of(ctx)
        if t is None:
            return None
        hw, opts, spec = ctx.hardware, ctx.options, ctx.profile.spec
        deg, ga = self.degree(ctx), row.grad_accum_steps or 1
        c = self.compute_time(ctx, t, deg)
        cfg = spec.config or {}
        blocks = as_int(cfg.get("num_hidden_layers") or 0)
        hidden = as_int(cfg.get("hidden_size") or 0)
        act = 4 if opts.precision == Precision.FP32 else 2
        nbytes = (spec.seq_len or 1) * ctx.micro_batch_size * hidden * act
        per_block = 4 + (2 if opts.activation_checkpointing else 0)
        tp_fabric = Fabric.from_preset(
            t.preset, deg, 1, interconnect=hw.interconnect, link_busbw_gbps=hw.link_busbw_gbps
        )
        if hw.calibration is not None:  # a CPU verification run: gloo's measured latency (advisor.timing.calibrate)
            tp_fabric = hw.calibration.fabric(tp_fabric)
        one = tp_fabric.time_s("all_reduce", nbytes)
        calls = per_block * blocks
        tp_s = ga * calls * one
        coll = [
            Collective(
                f"activation all-reduce ({per_block} per block: 2 forward, 2 backward"
                + (", 2 recompute" if per_block > 4 else "")
                + ")",
                "all_reduce",
                "tensor-parallel",
                nbytes,
                ga * calls,
                tp_s,
                tp_s,
                passes=ga * calls,
            )
        ]
        # Vocab parallelism, once per micro-step, all on the critical path: the embedding's output
        # gathered whole (all-gather of its hidden shards, or all-reduce of the vocab shards' partial sums when it is
        # tied to the head), the head's input gradient all-reduced in backward (ColwiseParallel's g operator), and
        # the vocab-parallel cross-entropy's small all-reduces (``CE_ALL_REDUCES``).
        tied, _, _ = vocab_shape(ctx)
        embed_kind = "all_reduce" if tied else "all_gather"
        ce_bytes = (spec.seq_len or 1) * ctx.micro_batch_size * CE_BYTES_PER_TOKEN
        vocab_parts = (
            (
                f"embedding output {'all-reduce (vocab shards)' if tied else 'all-gather (hidden shards)'}",
                embed_kind,
                nbytes,
                1,
            ),
            ("LM head input-gradient all-reduce (backward)", "all_reduce", nbytes, 1),
            (
                "vocab-parallel cross-entropy all-reduces (max, sum of exponentials, target logit)",
                "all_reduce",
                ce_bytes,
                CE_ALL_REDUCES,
            ),
        )
        for what, kind, size, per in vocab_parts:
            secs = ga * per * tp_fabric.time_s(kind, size)
            coll.append(Collective(what, kind, "tensor-parallel", size, ga * per, secs, secs, passes=ga * per))
            tp_s += secs
        shard = ctx.profile.tp_stats(deg)
        g = bytes_per_element(opts.precision, "grads")
        dp_s = 0.0
        dp = self.dp_size(ctx)
        if dp > 1:
            fabric = fabric_of(ctx, t, max(1, hw.gpus_per_node // deg), hw.num_nodes, concurrent_groups=deg)
            tensors = max(1, shard.num_param_tensors)
            dp_s = tensors * fabric.time_s("all_reduce", shard.num_trainable * g // tensors)
            coll.append(
                Collective(
                    f"gradient all-reduce across the data-parallel group ({tensors} tensors)",
                    "all_reduce",
                    "data-parallel",
                    shard.num_trainable * g,
                    tensors,
                    dp_s,
                    dp_s,
                )
            )
        w = bytes_per_element(opts.precision, "weights")
        opt = optimizer_step_s(
            ctx,
            t,
            shard.num_trainable,
            w,
            g,
            w,
            factor=FOREACH_FACTOR,
            extra=2 * g if opts.precision == Precision.FP16 else 0,
        )
        return accumulated_step(
            ctx,
            t,
            c,
            ga,
            comm_s=tp_s + dp_s,
            exposed_comm_s=tp_s + dp_s,
            optimizer_s=opt,
            overlap="none: the activation all-reduces are on the critical path; the data-parallel "
            "gradient all-reduce runs after backward",
            collectives=tuple(coll),
        )

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU sends per optimizer step: the activation all-reduces of every micro-step (2(t-1)/t of
        s x b x h each, 4 per block, 6 with recompute), the vocab-parallel embedding, head and cross-entropy
        collectives of every micro-step, plus, for TP x DP, the gradient all-reduce of the shard across the
        data-parallel group."""
        deg, opts, spec = self.degree(ctx), ctx.options, ctx.profile.spec
        cfg = spec.config or {}
        act = 4 if opts.precision == Precision.FP32 else 2
        nbytes = (spec.seq_len or 1) * ctx.micro_batch_size * as_int(cfg.get("hidden_size") or 0) * act
        calls = (4 + (2 if opts.activation_checkpointing else 0)) * as_int(cfg.get("num_hidden_layers") or 0)
        ga = max(1, grad_accum_steps)
        total = ga * calls * 2 * (deg - 1) * nbytes // max(1, deg)
        # Vocab parallelism (``step_time``): the embedding's output (all-gather: (t-1)/t of it; tied: all-reduce),
        # the head's input-gradient all-reduce and the cross-entropy's three all-reduces of 4 bytes per token.
        tied, _, _ = vocab_shape(ctx)
        ce_bytes = (spec.seq_len or 1) * ctx.micro_batch_size * CE_BYTES_PER_TOKEN
        embed = (2 if tied else 1) * (deg - 1) * nbytes // max(1, deg)
        total += ga * (embed + 2 * (deg - 1) * (nbytes + CE_ALL_REDUCES * ce_bytes) // max(1, deg))
        dp = self.dp_size(ctx)
        if dp > 1:
            g = bytes_per_element(opts.precision, "grads")
            total += 2 * (dp - 1) * ctx.profile.tp_stats(deg).num_trainable * g // dp
        return total
