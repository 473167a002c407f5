"""Tensor parallelism (torch.distributed.tensor.parallel) inside one NVLink node, optionally times
data parallelism across the rest of the GPUs (a 2-D device mesh: TP inside, DP outside).

Memory rule: each rank holds one shard of every attention/MLP projection (heads and MLP width
divided by the TP degree, Megatron-LM paper, Shoeybi et al. 2019, section 3) and a replica of
the embeddings and norms. The trace builds exactly that shard (advisor.models.hf_config with
``tp_degree``), so per-rank weights, gradients, optimizer states and activations are those of
the shard. The generated script all-reduces gradients across TP groups by hand (no DDP buckets).
"""

from __future__ import annotations

from dataclasses import replace

from advisor.context import StrategyContext
from advisor.errors import AdvisorError
from advisor.hardware import Hardware
from advisor.memory import RULE_OF_THUMB_BYTES_PER_PARAM, StrategyMemory
from advisor.schema import TrainingOptions

from .base import Strategy
from .ddp import replicated_memory


class TensorParallel(Strategy):
    comm_order = 3
    template = "tp.py"
    uses_tp_degree = True
    comm_pattern = ("all-reduce of the activations twice per block in forward and in backward (tensor parallel), "
                    "plus a gradient all-reduce across the data-parallel groups")

    def __init__(self, with_dp: bool) -> None:
        self.with_dp = with_dp
        self.name = "tp_dp" if with_dp else "tp"
        self.title = "TP x DP" if with_dp else "Tensor parallel"

    def degree(self, ctx: StrategyContext) -> int:
        return ctx.hardware.gpus_per_node if not self.with_dp and not ctx.options.tp_degree else ctx.tp_degree()

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        spec = ctx.profile.spec
        if not spec.tp_capable:
            kind = "a CNN/vision model" if spec.family == "vision" else f"architecture {spec.model_type or spec.family}"
            return (f"{kind} has no tensor-parallel plan here (only llama/mistral/qwen2 attention+MLP blocks); "
                    "prefer lower precision, activation checkpointing and ZeRO")
        if ctx.hardware.interconnect != "nvlink":
            return "tensor parallelism all-reduces activations twice per layer and needs NVLink inside the node; these GPUs use PCIe"
        t = self.degree(ctx)
        cfg = spec.config or {}
        heads = int(cfg.get("num_attention_heads") or 0)
        kv = int(cfg.get("num_key_value_heads") or heads)
        if t < 2:
            return "needs at least 2 GPUs in one node"
        if t > ctx.hardware.gpus_per_node:
            return f"TP degree {t} exceeds the {ctx.hardware.gpus_per_node} GPUs per node (never TP across nodes)"
        if heads % t or kv % t:
            return f"TP degree {t} does not divide {heads} attention heads and {kv} key/value heads"
        if int(cfg.get("intermediate_size") or 0) % t:
            return f"TP degree {t} does not divide the MLP width {cfg.get('intermediate_size')}"
        if self.with_dp:
            if ctx.world_size % t or ctx.world_size // t < 2:
                return f"TP x DP needs a multiple (>= 2x) of the TP degree {t} GPUs; there are {ctx.world_size}"
        elif ctx.hardware.num_nodes > 1 or ctx.world_size != t:
            return f"pure TP uses exactly one node's {t} GPUs; use tp_dp for {ctx.world_size} GPUs"
        return None

    def dp_size(self, ctx: StrategyContext) -> int:
        return ctx.world_size // self.degree(ctx) if self.with_dp else 1

    # TP degrees of the usual node sizes (GPUs per node); another --gpus asks for one of them.
    WHAT_IF_DEGREES = (2, 4, 8)

    def what_if_traces(self, ctx: StrategyContext) -> list[tuple[str, int]]:
        """The shards another GPU count would trace: each of 2, 4 and 8 that divides the heads, the
        key/value heads and the MLP width (none for a model without a TP plan)."""
        spec = ctx.profile.spec
        if not spec.tp_capable:
            return []
        cfg = spec.config or {}
        heads = int(cfg.get("num_attention_heads") or 0)
        kv = int(cfg.get("num_key_value_heads") or heads)
        ffn = int(cfg.get("intermediate_size") or 0)
        mode = self.trace_mode(ctx.options.precision)
        return [(mode, t) for t in self.WHAT_IF_DEGREES if heads and not heads % t and not kv % t and not ffn % t]

    def script_constants(self, job, family) -> dict:
        return {"TP_DEGREE": job.tp_degree}

    def verify_cluster(self, hw: Hardware, options: TrainingOptions, row) -> tuple[Hardware, TrainingOptions]:
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
        return replicated_memory(ctx, micro_batch, ctx.profile.tp_stats(t), tp_degree=t, dp_size=self.dp_size(ctx),
                                 ddp=False)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        return RULE_OF_THUMB_BYTES_PER_PARAM * ctx.profile.stats.num_params // self.degree(ctx)
