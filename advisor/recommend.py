"""The recommender: among strategies that fit, the one with the least communication per step
(field notes 004 sections 1.3, 2 and 7: DDP, then ZeRO-1/2, then ZeRO-3, then TP, then offload),
ties broken by the lower device total. Gives 2-4 reasons with numbers and the field notes'
warnings; when nothing fits, the smallest ZeRO-3 cluster that would.
"""

from __future__ import annotations

from dataclasses import replace

from .context import StrategyContext
from .gpu_presets import SLOW_NETWORKS
from .rows import Recommendation, StrategyRow, fits
from .units import fmt_gib

TINY_MODEL_PARAMS = 20_000_000  # field notes 004 section 7: tiny models gain little from distributing
MAX_GPUS_SEARCHED = 4096


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "?"


def recommend(ctx: StrategyContext, rows: list[StrategyRow]) -> Recommendation:
    """The strategy to use among ``rows`` (each carries its ``Strategy``), with reasons and warnings.

    Order: the strategies' own ``comm_order`` (least communication first), ties by lower device total.
    """
    hw, opts = ctx.hardware, ctx.options
    fitting = [r for r in rows if r.applicable and r.fits is True]
    warnings = _warnings(ctx)
    if not fitting:
        return _nothing_fits(ctx, rows, warnings)
    order = {r.name: r.strategy.comm_order for r in rows}
    best = min(fitting, key=lambda r: (order[r.name], r.memory.device_total))
    cap = hw.gpu_memory_bytes
    reasons = [f"{best.title} fits: {fmt_gib(best.memory.device_total)} of {fmt_gib(cap)} per GPU "
               f"({_pct(best.memory.device_total, cap)}) at micro-batch {opts.micro_batch_size}, "
               f"peak allocated {fmt_gib(best.memory.peak.total)} in the {best.memory.peak.phase}"]
    cheaper = [r for r in rows if r.applicable and order[r.name] < order[best.name] and not r.fits]
    if cheaper:
        worst = min(cheaper, key=lambda r: order[r.name])
        reasons.append(f"{worst.title} would need {fmt_gib(worst.memory.device_total)} per GPU, over the "
                       f"{fmt_gib(cap)} available; {best.title} shards what {worst.title} replicates")
    elif order[best.name] == min(order.values()):
        reasons.append(f"the model states and activations fit on one GPU, so plain data parallel ({best.title}) has "
                       "the least communication; ZeRO would only add sharding traffic")
    link = hw.interconnect if hw.num_nodes == 1 else f"{hw.interconnect} inside nodes, {hw.network} between"
    reasons.append(f"gradient traffic about {fmt_gib(best.comm_bytes_per_step)} per GPU per step over {link}")
    steps = "step" if best.grad_accum_steps == 1 else "steps"
    reasons.append(f"batch: micro-batch {opts.micro_batch_size} x data-parallel size {best.dp_size} x "
                   f"{best.grad_accum_steps} accumulation {steps} = global batch {best.global_batch_size}; "
                   f"the largest micro-batch that fits is {best.max_micro_batch_size} per GPU")
    if best.learning_rate is not None:
        reasons.append(f"learning rate {best.learning_rate:.4g} by the linear scaling rule "
                       f"({opts.base_lr:g} at batch {opts.base_batch_size} -> global {best.global_batch_size}); "
                       "reach it at the end of a linear warmup (e.g. 5 epochs), then decay")
    if best.strategy.offload and not opts.activation_checkpointing:
        warnings.append(_checkpointing_hint(rows, "offload is slow"))
    if ctx.profile.spec.family == "vision" and order[best.name] > min(order.values()):
        warnings.append("for CNNs prefer lower precision, activation checkpointing and gradient accumulation "
                        "before model parallelism")
    return Recommendation(strategy=best.name, reasons=reasons, warnings=warnings)


def _checkpointing_hint(rows: list, why: str) -> str:
    """Point at activation checkpointing when activations are a large share of the peak."""
    sized = [r for r in rows if r.applicable and r.memory and not r.strategy.offload]
    if not sized:
        return f"{why}: try --activation-checkpointing or a smaller micro-batch"
    r = min(sized, key=lambda r: r.memory.device_total)
    act = r.memory.peak.activations + r.memory.peak.other
    return (f"{why}: activations and temporaries are {fmt_gib(act)} of {r.title}'s {fmt_gib(r.memory.peak.total)} "
            "peak; --activation-checkpointing or a smaller micro-batch may make a faster strategy fit")


def _warnings(ctx: StrategyContext) -> list[str]:
    hw, stats = ctx.hardware, ctx.profile.stats
    out = []
    if hw.num_gpus == 1:
        out.append("one GPU: nothing to distribute across GPUs; a DDP script at world size 1 is plain "
                   "single-GPU training")
    if hw.num_nodes > 1 and hw.network in SLOW_NETWORKS:
        out.append(f"{hw.network} between nodes is a bottleneck: communication can cost more than compute "
                   "(a 2B model has been seen to get only 1.6x on 8 GPUs over such links); expect poor scaling")
    if stats.num_params < TINY_MODEL_PARAMS and hw.num_gpus > 1:
        out.append(f"the model is small ({stats.num_params / 1e6:.1f}M parameters): unless the data is large, "
                   "distributing may gain little (gradient sync and data loading dominate)")
    if hw.num_nodes == 1 and hw.interconnect == "pcie" and hw.num_gpus > 1:
        out.append("PCIe between GPUs (about 32 GB/s): all-reduce is slower than over NVLink; scaling will be "
                   "below linear")
    return out


def _nothing_fits(ctx: StrategyContext, rows: list[StrategyRow], warnings: list[str]) -> Recommendation:
    hw = ctx.hardware
    # The scale-out answer: the strategy that shards everything without offload (ZeRO-3).
    need = next((r for r in rows if r.applicable and r.strategy.shards_everything and not r.strategy.offload), None)
    zero3 = need.strategy if need is not None else None
    reasons = ["no strategy fits: " + "; ".join(
        f"{r.title} {fmt_gib(r.memory.device_total)}" for r in rows if r.applicable and r.memory)
        + f" per GPU vs {fmt_gib(hw.gpu_memory_bytes)} available"]
    min_gpus = min_nodes = None
    if need is not None:
        nodes = hw.num_nodes
        while nodes * hw.gpus_per_node <= MAX_GPUS_SEARCHED:
            trial = replace(ctx, hardware=replace(hw, num_nodes=nodes))
            if fits(zero3.memory(trial, ctx.options.micro_batch_size), trial.hardware):
                min_gpus, min_nodes = nodes * hw.gpus_per_node, nodes
                break
            nodes *= 2
        if min_nodes is not None and min_nodes > hw.num_nodes:
            lo = max(hw.num_nodes, min_nodes // 2)
            for n in range(lo, min_nodes + 1):  # refine between the last two doublings
                trial = replace(ctx, hardware=replace(hw, num_nodes=n))
                if fits(zero3.memory(trial, ctx.options.micro_batch_size), trial.hardware):
                    min_gpus, min_nodes = n * hw.gpus_per_node, n
                    break
    if min_gpus is not None:
        reasons.append(f"{need.title} would fit on {min_gpus} x {hw.gpu_name} ({min_nodes} node(s) of "
                       f"{hw.gpus_per_node})")
        if min_nodes > 1:
            reasons.append("across nodes the field's answer for models this large is data parallel x ZeRO x "
                           "pipeline parallelism; pipeline parallelism is out of scope for this tool")
    else:
        reasons.append(f"even {MAX_GPUS_SEARCHED} GPUs with ZeRO-3 do not fit at micro-batch "
                       f"{ctx.options.micro_batch_size}: activations alone exceed one GPU; turn on activation "
                       "checkpointing or shorten the sequence")
    off = next((r for r in rows if r.applicable and r.memory and r.strategy.shards_everything and r.strategy.offload),
               None)
    host = off.memory.host_bytes_per_node if off else None
    if off is not None:
        where = hw.sources.get("host_mem_bytes", "")
        have = ("host RAM unknown: give --host-mem" if hw.host_mem_bytes is None else
                f"have {fmt_gib(hw.host_mem_bytes)}, {where}"
                + ("; pass --host-mem for the target nodes' RAM" if where.startswith("detected") else ""))
        reasons.append(f"{off.title} would need {fmt_gib(host)} of host RAM per node ({have}) and "
                       f"{fmt_gib(off.memory.device_total)} per GPU")
    if not ctx.options.activation_checkpointing and ctx.profile.spec.is_transformer:
        warnings.append(_checkpointing_hint(rows, "nothing fits"))
    return Recommendation(strategy=None, reasons=reasons, warnings=warnings, min_gpus=min_gpus,
                          min_nodes=min_nodes, offload_host_bytes_per_node=host)
