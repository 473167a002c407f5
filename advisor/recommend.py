"""The recommender: among strategies that fit, the fastest per optimizer step at the same global batch
(``StrategyRow.time``, the strategies' time rules; issue 13). Step times within ``TIE`` of the fastest are
ties, which the field notes' order decides (004 sections 1.3, 2 and 7: least communication first: DDP, then
ZeRO-1/2, then ZeRO-3, then TP, then offload), then the lower device total; rows without a time (a GPU with
no preset) fall back to that order alone. Unless the user set the micro-batch, ``choose_micro_batch`` picks the
one with the best throughput among those that fit. Gives reasons with numbers and the field notes' warnings
(a quantified one when N GPUs give less than half the ideal speed-up); when nothing fits, the smallest ZeRO-3
cluster that would.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .context import StrategyContext
from .gpu_presets import SLOW_NETWORKS
from .memory import StrategyMemory
from .rows import FRAMEWORK_NAMES, Recommendation, StrategyRow, evaluate_row, fit_verdict, fits, max_micro_batch, time_at
from .units import fmt_count, fmt_gib, fmt_rate, fmt_s

TINY_MODEL_PARAMS = 20_000_000  # field notes 004 section 7: tiny models gain little from distributing
MAX_GPUS_SEARCHED = 4096
GPUS_PER_NODE_SEARCHED = 8  # the usual node (DGX/HGX); a larger --gpus is kept
# Above this share of the GPU's memory the chosen plan gets a warning: the caching allocator's
# fragmentation is not in the estimate (PyTorch CUDA semantics docs, "memory management").
HEADROOM_WARN = 0.90
# Step times within 10% of the fastest are ties: the time model cannot tell them apart (bench/TIME.md: its errors
# against the published runs reach 21%; 2-4% separate autocast's fp32 residual stream from a 16-bit module on the
# same model, a precision detail, not the strategy; and the terms that separate replicating from sharding when both
# fit, the exposed last reduction and the sharded optimizer step, are the least measured: resnet50 on 4 x RTX4090
# models FSDP2 7% faster than DDP while torch's per-unit hooks are not modelled), so the field notes' order decides
# among them (least communication first: DDP before sharding), then the device total.
TIE = 0.10
# Micro-batches whose throughput is within 2% of the best count as the best: the smallest of them is chosen.
MB_TIE = 0.02


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "?"


@dataclass(frozen=True)
class Checkpointed:
    """The same plan with activation checkpointing on (what the cheapest fix would give), evaluated by
    the planner when it is off and the model has blocks to checkpoint."""

    ctx: StrategyContext
    rows: list[StrategyRow]


@dataclass(frozen=True)
class Alternative:
    """The same plan trained another way, evaluated by the planner to compare: full fine-tuning beside a LoRA
    plan, or LoRA / QLoRA when full fine-tuning fits nowhere. ``label``: how the reasons name it."""

    label: str
    ctx: StrategyContext
    rows: list[StrategyRow]


def recommend(ctx: StrategyContext, rows: list[StrategyRow],
              checkpointed: Checkpointed | None = None, alternatives: tuple[Alternative, ...] = ()) -> Recommendation:
    """The strategy to use among ``rows`` (each carries its ``Strategy``), with reasons and warnings.

    Order: the strategies' own ``comm_order`` (least communication first), ties by lower device total.
    ``checkpointed``: the rows with activation checkpointing on, to name that fix (with its figures)
    before offload or a larger cluster. ``alternatives``: full fine-tuning beside a LoRA plan (one reason with
    both totals), or LoRA / QLoRA when nothing fits (named with their figures before any larger cluster).
    """
    hw, opts = ctx.hardware, ctx.options
    baseline = _baseline_reason(ctx, rows)
    rows = eligible(rows, hw.num_gpus)
    fitting = [r for r in rows if r.applicable and r.fits is True]
    warnings = _warnings(ctx, timed=any(r.time is not None for r in fitting))
    if not fitting:
        rec = _nothing_fits(ctx, rows, warnings, checkpointed)
        if baseline:
            rec.reasons.insert(1, baseline)
        # LoRA / QLoRA when full fine-tuning fits nowhere (full fine-tuning is no way out of a LoRA plan that does not fit)
        rec.reasons[1:1] = [_alternative_reason(ctx, a) for a in alternatives if a.ctx.profile.spec.adapter is not None]
        return rec
    order = {r.name: r.strategy.comm_order for r in rows}
    best = _pick(fitting)
    cap = hw.gpu_memory_bytes
    reasons = [f"{best.title} fits: {fmt_gib(best.memory.device_total)} of {fmt_gib(cap)} per GPU "
               f"({_pct(best.memory.device_total, cap)}) at micro-batch {opts.micro_batch_size}, "
               f"peak allocated {fmt_gib(best.memory.peak.total)} in the {best.memory.peak.phase}"]
    cheaper = [r for r in rows if r.applicable and order[r.name] < order[best.name] and r.fits is not True]
    if cheaper:
        worst = min(cheaper, key=lambda r: order[r.name])
        if worst.short_of != "GPU memory":
            reasons.append(f"{worst.title} does not surely fit: {worst.fit_note}")
        elif hw.num_gpus == 1:  # nothing is sharded on one GPU
            reasons.append(f"{worst.title} does not fit ({worst.fit_note})")
        else:
            reasons.append(f"{worst.title} does not fit ({worst.fit_note}); {best.title} shards what {worst.title} "
                           "replicates")
    elif order[best.name] == min(order.values()) and best.time is None and best.strategy.distributes:
        reasons.append(f"the model states and activations fit on one GPU, so plain data parallel ({best.title}) has "
                       "the least communication; ZeRO would only add sharding traffic")
    if not best.strategy.distributes:
        reasons.append(f"one GPU: plain training in one process ({best.title}: no wrapper, no launcher, no gradient "
                       "buckets); sharding or offload only when it does not fit")
    if baseline:
        reasons.append(baseline)
    # A LoRA plan beside full fine-tuning; a full fine-tuning that fits only with offload beside LoRA / QLoRA.
    reasons += [_versus_full(ctx, best, a) if a.ctx.profile.spec.adapter is None else _alternative_reason(ctx, a)
                for a in alternatives]
    reasons += _time_reasons(ctx, best, fitting)
    sharded = _frameworks_compared(fitting) if hw.num_gpus > 1 else None
    if sharded:
        reasons.append(sharded)
    link = hw.interconnect if hw.num_nodes == 1 else f"{hw.interconnect} inside nodes, {hw.network} between"
    if hw.num_gpus > 1:
        reasons.append(f"communication: about {fmt_gib(best.comm_bytes_per_step)} sent per GPU per step over {link}")
    steps = "step" if best.grad_accum_steps == 1 else "steps"
    reasons.append(f"batch: micro-batch {opts.micro_batch_size} x data-parallel size {best.dp_size} x "
                   f"{best.grad_accum_steps} accumulation {steps} = global batch {best.global_batch_size}; "
                   f"the largest micro-batch that fits is {best.max_micro_batch_size} per GPU")
    if best.learning_rate is not None:
        reasons.append(f"learning rate {best.learning_rate:.4g} by the linear scaling rule "
                       f"({opts.base_lr:g} at batch {opts.base_batch_size} -> global {best.global_batch_size}); "
                       "reach it at the end of a linear warmup (e.g. 5 epochs), then decay")
    if best.memory.device_total > HEADROOM_WARN * cap:
        warnings.append(f"{best.title} uses {_pct(best.memory.device_total, cap)} of the GPU's memory: allocator "
                        "fragmentation or a longer sample can run out; leave headroom ("
                        + ", or ".join(([] if opts.micro_batch_size <= 1 else ["a smaller micro-batch"])
                                       + ([] if opts.activation_checkpointing else ["--activation-checkpointing"])
                                       or ["a shorter sequence or a GPU with more memory"]) + ")")
    if best.strategy.offload and checkpointed is not None:
        faster = _fastest_fitting(eligible(checkpointed.rows, hw.num_gpus), offload=False)
        if faster is not None:
            warnings.append(f"offload is slow: with --activation-checkpointing, {faster.title} fits without offload "
                            f"({fmt_gib(faster.memory.device_total)} of {fmt_gib(cap)} per GPU)")
    if ctx.profile.spec.family == "vision" and order[best.name] > min(order.values()):
        warnings.append("for CNNs prefer lower precision, activation checkpointing and gradient accumulation "
                        "before model parallelism")
    link = best.strategy.link_warning(ctx)
    if link:
        warnings.append(link)
    scaling = _scaling_warning(ctx, best) or _fewer_nodes_warning(ctx, rows, best)
    if scaling:
        warnings.append(scaling)
    if best.time is not None:
        warnings.append("step times model compute, communication and the optimizer step; data loading is not "
                        "modelled (a slow input pipeline lowers every figure)")
        borrowed = _borrowed_efficiency(ctx)
        if borrowed:
            warnings.append(borrowed)
    return Recommendation(strategy=best.name, reasons=reasons, warnings=warnings,
                          micro_batch_size=opts.micro_batch_size)


def _borrowed_efficiency(ctx: StrategyContext) -> str | None:
    """A warning when this GPU's generation has no public measurement fitted and its step times use another
    generation's efficiencies (``advisor.timing.compute.EFFICIENCY``; the JSON's ``efficiency_source``)."""
    from .timing.compute import BORROWED_BAND, GENERATION, efficiency_for, preset_for_gpu

    hw, opts = ctx.hardware, ctx.options
    if hw.calibration is not None or opts.mfu is not None or opts.bandwidth_efficiency is not None:
        return None
    preset = preset_for_gpu(hw.gpu_name, hw.gpu_memory_bytes)
    if preset is None:
        return None
    eff = efficiency_for(preset)
    if not eff.source.startswith("no public measurement fitted"):
        return None
    generation = GENERATION.get(preset.name.lower(), "this generation")
    band = BORROWED_BAND.get(generation)
    error = (f"against {band[2]} the throughput they give lands between {100 * (1 - band[0]):.0f}% low and "
             f"{100 * (band[1] - 1):.0f}% high" if band else "how far off that is has not been checked against any "
             "published run")
    return (f"{preset.name} ({generation}) has no published run fitted here: its step times use another "
            f"generation's efficiencies (compute {eff.compute:.2f}, bandwidth {eff.bandwidth:.2f}; "
            f"bench/TIME.md); {error}; --mfu and --bandwidth-efficiency set them")


OVERHEAD_NAME = "CUDA context, communicator buffers and allocator fragmentation"


def memory_parts(m: StrategyMemory) -> list[tuple[str, int]]:
    """The named parts of ``m.device_total``: the peak's (``Breakdown.named_parts``) and the device overhead."""
    return m.peak.named_parts() + ([(OVERHEAD_NAME, m.overhead.total)] if m.overhead.total else [])


def memory_parts_text(m: StrategyMemory) -> str:
    """``weights 1.00 GiB, activations 0.50 GiB, ...``: every part of ``m.device_total`` (they sum to it)."""
    return ", ".join(f"{name} {fmt_gib(n)}" for name, n in memory_parts(m))


def adapter_text(ctx: StrategyContext) -> str:
    """``LoRA rank 16 on all linear layers: 40.0M trainable parameters`` (QLoRA names its base) for ``ctx``'s
    plan; "" for full fine-tuning."""
    a = ctx.profile.spec.adapter
    if a is None:
        return ""
    return f"QLoRA ({_quantized_text(a)}) {_rank_text(ctx)}" if a.quantize else f"LoRA {_rank_text(ctx)}"


def _rank_text(ctx: StrategyContext) -> str:
    """``rank 16 on q_proj,v_proj: 8.39M trainable parameters``."""
    a = ctx.profile.spec.adapter
    where = "all linear layers" if a.targets == ("all-linear",) else a.targets_text
    return f"rank {a.rank} on {where}: {fmt_count(ctx.profile.stats.num_trainable)} trainable parameters"


def _quantized_text(a) -> str:
    return f"{a.quantize}{' + double quantization' if a.double_quant else ''}"


def _adapter_detail(ctx: StrategyContext) -> str:
    """``adapter_text`` for a sentence that names LoRA / QLoRA already: ``nf4, rank 16 on q_proj,v_proj: 8.39M
    trainable parameters``."""
    a = ctx.profile.spec.adapter
    return f"{_quantized_text(a)}, {_rank_text(ctx)}" if a.quantize else _rank_text(ctx)


def _cluster_text(hw) -> str:
    return f"{hw.num_gpus} x {hw.gpu_name}"


def _versus_full(ctx: StrategyContext, best: StrategyRow, full: Alternative) -> str:
    """LoRA beside full fine-tuning: ``... fits DDP on 4 x RTX4090 (17.94 GiB per GPU), where full fine-tuning would
    need ZeRO-3 (7.83 GiB)`` / ``does not fit on this cluster (the smallest: ...)``."""
    hw = ctx.hardware
    head = (f"{adapter_text(ctx)}; fits {best.title} on {_cluster_text(hw)} ({fmt_gib(best.memory.device_total)} per "
            "GPU)")
    fit = _fastest_fitting(eligible(full.rows, hw.num_gpus))
    if fit is None:
        sized = [r for r in eligible(full.rows, hw.num_gpus) if r.applicable and r.memory and not r.strategy.offload]
        low = min(sized, key=lambda r: r.memory.device_total) if sized else None
        tail = (f" (the smallest without offload: {low.title}, {fmt_gib(low.memory.device_total)} per GPU)"
                if low else "")
        return f"{head}, where {full.label} does not fit on this cluster{tail}"
    if fit.name == best.name:
        return f"{head}; {full.label} would fit it too ({fmt_gib(fit.memory.device_total)} per GPU)"
    return (f"{head}; {full.label} fits here too, fastest with {fit.title} ({fmt_gib(fit.memory.device_total)} per "
            "GPU)")


def _alternative_reason(ctx: StrategyContext, alt: Alternative) -> str:
    """Nothing fits with full fine-tuning: what LoRA / QLoRA would need, with the figures."""
    hw = ctx.hardware
    text = _adapter_detail(alt.ctx)
    fit = _fastest_fitting(eligible(alt.rows, hw.num_gpus), offload=False)
    if fit is not None:
        return (f"fine-tune with {alt.label} instead ({text}): {fit.title} then fits without offload, "
                f"{fmt_gib(fit.memory.device_total)} of {fmt_gib(hw.gpu_memory_bytes)} per GPU")
    sized = [r for r in eligible(alt.rows, hw.num_gpus) if r.applicable and r.memory and not r.strategy.offload]
    if not sized:
        return f"{alt.label} ({text}) does not apply here either"
    low = min(sized, key=lambda r: r.memory.device_total)
    return (f"{alt.label} ({text}) would not fit either: the smallest without offload, {low.title}, needs "
            f"{fmt_gib(low.memory.device_total)} per GPU")


def eligible(rows: list[StrategyRow], gpus: int) -> list[StrategyRow]:
    """The rows the recommender chooses among on ``gpus`` GPUs: with several GPUs, only those that distribute
    (one process, ``single``, is then the baseline row, not a choice)."""
    return rows if gpus == 1 else [r for r in rows if r.strategy.distributes]


def _frameworks_compared(fitting: list[StrategyRow]) -> str | None:
    """Where full sharding fits in two frameworks (FSDP2 and ZeRO-3), how their memory differs, with both figures."""
    full = [r for r in fitting if r.strategy.shards_everything and not r.strategy.offload]
    by_fw = {}
    for r in full:
        by_fw.setdefault(r.strategy.framework, r)
    if len(by_fw) < 2:
        return None
    a, b = sorted(by_fw.values(), key=lambda r: r.memory.device_total)[:2]
    return (f"{a.title} and {b.title} both shard everything: {a.title} needs {fmt_gib(a.memory.device_total)} per GPU "
            f"(model states {fmt_gib(a.memory.model_state_bytes)}), {b.title} {fmt_gib(b.memory.device_total)} (model "
            f"states {fmt_gib(b.memory.model_state_bytes)}); {a.title} runs on {_fw(a)}, {b.title} on {_fw(b)}")


def _fw(r: StrategyRow) -> str:
    return FRAMEWORK_NAMES.get(r.strategy.framework, r.strategy.framework)


def _baseline_reason(ctx: StrategyContext, rows: list[StrategyRow]) -> str | None:
    """With several GPUs: whether the model trains on one GPU without distribution, with the figures."""
    if ctx.hardware.num_gpus == 1:
        return None
    plain = next((r for r in rows if not r.strategy.distributes and r.applicable and r.memory), None)
    if plain is None:
        return None
    cap = ctx.hardware.gpu_memory_bytes
    figures = (f"{fmt_gib(plain.memory.device_total)} of {fmt_gib(cap)} at micro-batch {ctx.options.micro_batch_size}"
               f", {plain.grad_accum_steps} accumulation steps to the same global batch")
    if plain.fits is True:
        return f"without distribution it fits on one GPU ({plain.title}: {figures})"
    return f"without distribution it does not fit on one GPU ({plain.title}: {figures})"


def _pick(fitting: list[StrategyRow]) -> StrategyRow:
    """The fastest of ``fitting``; step times within ``TIE`` are ties, decided by the field notes' order, then the
    lower device total. Rows without a time fall back to that order (module docstring). Plain one-process training
    (``Strategy.distributes`` False, only among ``eligible`` rows on one GPU) wins whenever it fits: on one GPU the
    others only add a wrapper (DeepSpeed's 16-bit module can time a few per cent faster than autocast, not a reason
    to take on a framework)."""
    plain = [r for r in fitting if not r.strategy.distributes]
    if plain:
        fitting = plain
    timed = [r for r in fitting if r.time is not None and r.time.step_s > 0]
    pool = fitting
    if timed:
        fastest = min(r.time.step_s for r in timed)
        pool = [r for r in timed if r.time.step_s <= fastest * (1 + TIE)]
    return min(pool, key=lambda r: (r.strategy.comm_order, r.memory.device_total))


def tokens_per_sample(ctx: StrategyContext) -> int | None:
    """Tokens in one sample for a language model (its sequence length); None for vision and custom models."""
    spec = ctx.profile.spec
    return spec.seq_len if spec.seq_len and spec.family not in ("vision", "custom") else None


def _throughput(ctx: StrategyContext, r: StrategyRow) -> str:
    """'871K tokens/s' (language models) or '2.31K samples/s', at the row's global batch."""
    per = r.global_batch_size / r.time.step_s
    tokens = tokens_per_sample(ctx)
    return f"{fmt_rate(per * tokens)} tokens/s" if tokens else f"{fmt_rate(per)} samples/s"


_MODE_WORDS = {"autocast": "autocast over fp32 weights", "half": "a 16-bit module", "fp32": "fp32"}


def _why_slower(slow: StrategyRow, fast: StrategyRow, precision: str) -> str:
    """Why ``slow`` takes longer than ``fast``, in figures."""
    a, b = slow.time, fast.time
    if a.exposed_comm_s - b.exposed_comm_s >= max(a.compute_s - b.compute_s, a.optimizer_s - b.optimizer_s):
        passes = " + ".join(f"{c.passes} {c.kind.replace('_', '-')}{'s' if c.passes != 1 else ''}"
                            for c in a.collectives if c.group != "host")
        return (f"it sends {fmt_gib(slow.comm_bytes_per_step)} per GPU per step" + (f" in {passes}" if passes else "")
                + f", {fmt_s(a.exposed_comm_s)} of it not hidden by compute, vs {fmt_gib(fast.comm_bytes_per_step)} "
                f"and {fmt_s(b.exposed_comm_s)}")
    if a.compute_s - b.compute_s >= a.optimizer_s - b.optimizer_s:
        ma, mb = slow.strategy.trace_mode(precision), fast.strategy.trace_mode(precision)
        modes = f": {_MODE_WORDS.get(ma, ma)} vs {_MODE_WORDS.get(mb, mb)}" if ma != mb else ""
        return f"compute {fmt_s(a.compute_s)} vs {fmt_s(b.compute_s)} per step{modes}"
    return f"optimizer step {fmt_s(a.optimizer_s)} vs {fmt_s(b.optimizer_s)}"


def _time_reasons(ctx: StrategyContext, best: StrategyRow, fitting: list[StrategyRow]) -> list[str]:
    """The chosen row's step time, throughput and MFU, and how much longer the others that fit take (issue 13)."""
    t = best.time
    if t is None:
        return []
    link = ctx.hardware.interconnect if ctx.hardware.num_nodes == 1 else f"{ctx.hardware.network} between nodes"
    mfu = f", MFU {100 * t.mfu:.0f}%" if t.mfu is not None else ""
    fastest = all(r.time is None or r.time.step_s >= t.step_s for r in fitting)
    out = [f"{best.title} {'is the fastest that fits' if fastest else 'takes'}: {fmt_s(t.step_s)} per optimizer step at global batch "
           f"{best.global_batch_size} ({_throughput(ctx, best)}{mfu}; compute {fmt_s(t.compute_s)}, communication "
           f"not hidden {fmt_s(t.exposed_comm_s)}, optimizer {fmt_s(t.optimizer_s)})"]
    others = sorted((r for r in fitting if r is not best and r.time is not None and r.time.step_s > 0),
                    key=lambda r: r.time.step_s)
    # The fastest of the others and the slowest that keeps its model states on the GPU: the range of the choice.
    on_gpu = [r for r in others[1:] if not r.strategy.offload and r.time.step_s != others[0].time.step_s]
    shown = others[:1] + on_gpu[-1:]
    for r in shown:
        ratio = r.time.step_s / t.step_s
        if ratio < 1 + TIE:
            if r.strategy.comm_order != best.strategy.comm_order:
                why = "by the field notes' order (least communication first)"
            elif r.memory.device_total != best.memory.device_total:
                why = (f"for its lower device total ({fmt_gib(best.memory.device_total)} against "
                       f"{fmt_gib(r.memory.device_total)})")
            else:  # the same order and memory: the registry's order decides (``_pick``'s min keeps the first)
                why = (f"as the first listed (the same field-notes order and the same "
                       f"{fmt_gib(best.memory.device_total)} per GPU)")
            out.append(f"{r.title} is as fast within {100 * TIE:.0f}% ({fmt_s(r.time.step_s)} per step); "
                       f"{best.title} is preferred {why}")
        else:
            out.append(f"{r.title} over {link} would take {ratio:.2f}x longer per step ({fmt_s(r.time.step_s)}: "
                       f"{_why_slower(r, best, ctx.options.precision)})")
    return out


def _scaling_warning(ctx: StrategyContext, best: StrategyRow) -> str | None:
    """When the GPUs give less than half the ideal speed-up over one GPU (at the same global batch), the figures
    and the better option (field notes 004 section 7: a 2B model got only 1.6x on 8 GPUs over slow links)."""
    t, hw = best.time, ctx.hardware
    n = hw.num_gpus
    if t is None or n < 2 or t.speedup_vs_single_gpu is None or t.speedup_vs_single_gpu >= n / 2:
        return None
    link = hw.interconnect if hw.num_nodes == 1 else f"{hw.network} between nodes"
    if t.speedup_vs_single_gpu < 1:
        better = "one GPU alone is faster: do not distribute this model on this cluster"
    elif t.exposed_comm_s >= t.compute_s:
        better = ("communication dominates: fewer GPUs (or nodes), a faster link, or a larger micro-batch "
                  "(more compute per byte sent)")
    else:
        better = "a larger micro-batch (more compute per step) or fewer GPUs"
    share = 100 * t.scaling_efficiency
    return (f"{n} GPUs give only {t.speedup_vs_single_gpu:.2f}x the speed of one GPU ({share:.0f}% "
            f"of the ideal {n}x): {fmt_s(t.exposed_comm_s)} of each {fmt_s(t.step_s)} step is communication over "
            f"{link} that compute does not hide; {better}")


def _fewer_nodes_warning(ctx: StrategyContext, rows: list[StrategyRow], best: StrategyRow) -> str | None:
    """Several nodes whose samples per second are under half of ``nodes`` x one node's (the fastest strategy that
    fits one node of the same GPUs, at the same micro-batch): the figures and the advice to use fewer nodes or a
    faster network. For models one GPU cannot hold, where ``_scaling_warning`` has no single-GPU baseline."""
    hw = ctx.hardware
    if hw.num_nodes < 2 or best.time is None or not best.time.step_s:
        return None
    one = replace(ctx, hardware=replace(hw, num_nodes=1))
    # every strategy, also those that do not apply across nodes (TP stays inside one node): one node may run them
    candidates = [evaluate_row(r.strategy, one, False) for r in eligible(rows, hw.gpus_per_node)
                  if r.strategy is not None]
    timed = [r for r in candidates if r.applicable and r.fits is True and r.time is not None and r.time.step_s]
    if not timed:
        return None
    node = max(timed, key=lambda r: r.global_batch_size / r.time.step_s)
    per_s = best.global_batch_size / best.time.step_s
    node_per_s = node.global_batch_size / node.time.step_s
    if per_s >= hw.num_nodes * node_per_s / 2:
        return None
    return (f"{hw.num_nodes} nodes over {hw.network} train {per_s:.3g} samples/s, against {node_per_s:.3g} on one node "
            f"of {hw.gpus_per_node} ({node.title}): {per_s / node_per_s:.2f}x for {hw.num_nodes}x the GPUs; use one "
            "node, or a faster network between nodes")


def choose_micro_batch(ctx: StrategyContext, rows: list[StrategyRow]) -> tuple[int, str] | None:
    """The micro-batch with the best throughput (samples per second at the global batch it gives) among those at
    which some strategy surely fits, preferring those that leave ``HEADROOM_WARN`` of the GPU's memory free; within
    ``MB_TIE`` of the best, the smallest. Candidates: powers of two up to the largest micro-batch any strategy fits,
    and each strategy's largest (with and without the headroom); with --global-batch-size only those that divide it.
    At each micro-batch the strategy is the one ``recommend`` would pick there (``_pick``). (micro-batch, a note
    with the figures), or None when nothing fits or nothing can be timed."""
    hw, opts = ctx.hardware, ctx.options
    applicable = [r for r in eligible(rows, hw.num_gpus) if r.applicable and r.max_micro_batch_size > 0]
    # One GPU: the micro-batch of plain training when it fits at all (``_pick`` prefers it; a larger micro-batch
    # only another row fits would trade it for a framework).
    plain = [r for r in applicable if not r.strategy.distributes]
    if plain and hw.num_gpus == 1:
        applicable = plain
    largest = max((r.max_micro_batch_size for r in applicable), default=0)
    if largest < 1:
        return None
    candidates = {1 << i for i in range(largest.bit_length()) if 1 << i <= largest}
    candidates |= {r.max_micro_batch_size for r in applicable}
    if opts.global_batch_size:
        candidates = {b for b in candidates if opts.global_batch_size % (b * hw.num_gpus) == 0}
    room_limit = int(HEADROOM_WARN * hw.gpu_memory_bytes)
    trial_hw = replace(ctx, hardware=replace(hw, gpu_memory_bytes=room_limit))
    candidates |= {max_micro_batch(r.strategy, trial_hw, None) for r in applicable} - {0}
    if opts.global_batch_size:
        candidates = {b for b in candidates if opts.global_batch_size % (b * hw.num_gpus) == 0}
    found: dict[int, tuple[float, bool, str]] = {}  # micro-batch -> (samples/s, leaves headroom, strategy title)
    for b in sorted(candidates):
        trial = replace(ctx, options=replace(opts, micro_batch_size=b))
        fitting = []
        for r in applicable:
            if r.max_micro_batch_size < b:
                continue
            mem = r.strategy.memory(trial, b)
            if fit_verdict(mem, hw, r.load_host_bytes_per_node)[0] is not True:
                continue
            t, shadow = time_at(r.strategy, ctx, r, b)
            if t is not None and t.step_s:
                fitting.append(replace(shadow, time=t, memory=mem))
        if fitting:  # the row the recommender would pick at this micro-batch, and its throughput
            pick = _pick(fitting)
            found[b] = (pick.global_batch_size / pick.time.step_s, pick.memory.device_total <= room_limit, pick.title)
    if not found:
        return None
    pool = {b: v for b, v in found.items() if v[1]} or found
    best_rate = max(v[0] for v in pool.values())
    chosen = min(b for b, v in pool.items() if v[0] >= best_rate * (1 - MB_TIE))
    top = max(found)
    fastest = max(pool, key=lambda b: pool[b][0])
    room = f" with {100 * (1 - HEADROOM_WARN):.0f}% of the GPU's memory left free" if pool is not found else ""
    note = (f"micro-batch {chosen} per GPU gives the best throughput that fits{room} ({fmt_rate(pool[chosen][0])} "
            f"samples/s, {pool[chosen][2]}" + (f"; {fastest} gains less than {100 * MB_TIE:.0f}%)" if fastest != chosen
                                               else ")"))
    if top != chosen:
        note += f"; the largest that fits any strategy, {top} ({found[top][2]}), gives {fmt_rate(found[top][0])} samples/s"
    return chosen, note


def _fastest_fitting(rows: list[StrategyRow], offload: bool | None = None) -> StrategyRow | None:
    """The row the recommender would take among ``rows`` that surely fit (``offload``: only rows that
    do, or do not, offload; None: any)."""
    ok = [r for r in rows if r.applicable and r.fits is True and (offload is None or r.strategy.offload == offload)]
    return _pick(ok) if ok else None


def _warnings(ctx: StrategyContext, timed: bool = False) -> list[str]:
    """The field notes' warnings about the cluster and the model; ``timed``: the plan has step times, whose
    quantified scaling warning (``_scaling_warning``) replaces the prose one about slow networks."""
    hw, stats = ctx.hardware, ctx.profile.stats
    out = []
    if hw.num_nodes > 1 and hw.network in SLOW_NETWORKS and not timed:
        out.append(f"{hw.network} between nodes is a bottleneck: communication can cost more than compute "
                   "(a 2B model has been seen to get only 1.6x on 8 GPUs over such links); expect poor scaling")
    if stats.num_params < TINY_MODEL_PARAMS and hw.num_gpus > 1:
        out.append(f"the model is small ({stats.num_params / 1e6:.1f}M parameters): unless the data is large, "
                   "distributing may gain little (gradient sync and data loading dominate)")
    if hw.num_nodes == 1 and hw.interconnect == "pcie" and hw.num_gpus > 1:
        out.append("PCIe between GPUs (about 32 GB/s): all-reduce is slower than over NVLink; scaling will be "
                   "below linear")
    return out


def _cluster_that_fits(ctx: StrategyContext, strategy) -> tuple[int, int] | None:
    """(GPUs per node, nodes) of the smallest cluster of this GPU on which ``strategy`` fits at the
    micro-batch: more GPUs in the node first (up to 8, or the node's own count), then nodes of that
    size (doubling, then refined). None when even ``MAX_GPUS_SEARCHED`` GPUs do not fit."""
    hw, b = ctx.hardware, ctx.options.micro_batch_size

    def ok(per_node: int, nodes: int) -> bool:
        trial = replace(ctx, hardware=replace(hw, gpus_per_node=per_node, num_nodes=nodes))
        return fits(strategy.memory(trial, b), trial.hardware)

    per_node = hw.gpus_per_node
    while per_node < GPUS_PER_NODE_SEARCHED and hw.num_nodes == 1:
        per_node *= 2
        if ok(min(per_node, GPUS_PER_NODE_SEARCHED), 1):
            return min(per_node, GPUS_PER_NODE_SEARCHED), 1
    per_node = max(per_node, hw.gpus_per_node) if hw.num_nodes == 1 else hw.gpus_per_node
    per_node = min(per_node, max(GPUS_PER_NODE_SEARCHED, hw.gpus_per_node))
    nodes = hw.num_nodes
    while nodes * per_node <= MAX_GPUS_SEARCHED:
        if ok(per_node, nodes):
            lo = max(hw.num_nodes, nodes // 2)
            return per_node, next(n for n in range(lo, nodes + 1) if ok(per_node, n))
        nodes *= 2
    return None


def _nothing_fits(ctx: StrategyContext, rows: list[StrategyRow], warnings: list[str],
                  checkpointed: Checkpointed | None) -> Recommendation:
    """No row fits: the cheaper fixes first, each with its figures (activation checkpointing, then CPU
    offload), then the smallest cluster on which the strategy that shards everything would fit."""
    hw, opts = ctx.hardware, ctx.options
    reasons = ["no strategy fits: " + "; ".join(
        f"{r.title} {fmt_gib(r.memory.device_total)}" for r in rows if r.applicable and r.memory)
        + f" per GPU vs {fmt_gib(hw.gpu_memory_bytes)} available"]
    short_host = [r for r in rows if r.applicable and r.fits is not True and r.short_of != "GPU memory"]
    for r in short_host:
        reasons.append(f"{r.title}: {r.fit_note}")
    search_ctx, search_rows = ctx, rows
    smaller = [r for r in rows if r.applicable and r.max_micro_batch_size >= 1]
    if opts.micro_batch_size > 1 and smaller:
        # Without offload first (offload's largest micro-batch counts GPU memory only), then the largest.
        r = max(smaller, key=lambda r: (not r.strategy.offload, r.max_micro_batch_size, -r.strategy.comm_order))
        reasons.append(f"at micro-batch {opts.micro_batch_size} nothing fits; lower --micro-batch-size: {r.title} fits "
                       f"up to micro-batch {r.max_micro_batch_size} (reach the global batch by gradient accumulation)")
        return Recommendation(strategy=None, reasons=reasons, warnings=warnings)
    if checkpointed is not None:
        fix = _fastest_fitting(eligible(checkpointed.rows, hw.num_gpus))
        if fix is not None:
            reasons.append(f"turn on activation checkpointing (--activation-checkpointing): {fix.title} then fits, "
                           f"{fmt_gib(fix.memory.device_total)} of {fmt_gib(hw.gpu_memory_bytes)} per GPU")
            return Recommendation(strategy=None, reasons=reasons, warnings=warnings)
        maybe = [r for r in checkpointed.rows if r.applicable and r.fits is None]
        sized = [r for r in checkpointed.rows if r.applicable and r.memory]
        if maybe:
            r = min(maybe, key=lambda r: (r.strategy.comm_order, r.memory.device_total))
            reasons.append(f"with activation checkpointing (--activation-checkpointing) {r.title} needs "
                           f"{fmt_gib(r.memory.device_total)} per GPU and {fmt_gib(r.memory.host_bytes_per_node)} of "
                           "host RAM per node: it fits if the nodes have that RAM (give --host-mem to check)")
        elif sized:
            low = min(sized, key=lambda r: r.memory.device_total)
            reasons.append(f"activation checkpointing alone is not enough: the smallest, {low.title}, would still "
                           f"need {fmt_gib(low.memory.device_total)} per GPU ({low.fit_note})")
        search_ctx, search_rows = checkpointed.ctx, eligible(checkpointed.rows, hw.num_gpus)
    off = next((r for r in search_rows if r.applicable and r.memory and r.strategy.shards_everything
                and r.strategy.offload), None)
    host = off.memory.host_bytes_per_node if off else None
    if off is not None and all(o.name != off.name for o in short_host):
        where = hw.sources.get("host_mem_bytes", "")
        have = ("host RAM unknown: give --host-mem" if hw.host_mem_bytes is None else
                f"have {fmt_gib(hw.host_mem_bytes)}, {where}"
                + ("; pass --host-mem for the target nodes' RAM" if where.startswith("detected") else ""))
        reasons.append(f"{off.title} would need {fmt_gib(host)} of host RAM per node ({have}) and "
                       f"{fmt_gib(off.memory.device_total)} per GPU")
    need = next((r for r in search_rows if r.applicable and r.strategy.shards_everything and not r.strategy.offload),
                None)
    min_gpus = min_nodes = None
    with_ac = " with activation checkpointing" if search_ctx is not ctx else ""
    if need is None:
        blocked = next((r for r in rows if r.strategy.shards_everything and not r.strategy.offload), None)
        if blocked is not None:
            adapter = ctx.profile.spec.adapter
            if adapter is not None and adapter.quantize:  # the quantized base is what keeps ZeRO-3 / FSDP2 out
                reasons.append(f"more GPUs do not shard a {adapter.quantize} base here ({blocked.title} does not apply: "
                               f"{blocked.reason}); drop --quantize to shard a 16-bit base with ZeRO-3 or FSDP2 across "
                               "more GPUs, or use a GPU with more memory")
            else:
                reasons.append(f"more GPUs would not help here: {blocked.title} does not apply ({blocked.reason})")
    else:
        found = _cluster_that_fits(search_ctx, need.strategy)
        if found is not None:
            per_node, min_nodes = found
            min_gpus = per_node * min_nodes
            where = "in one node" if min_nodes == 1 else f"{min_nodes} nodes of {per_node}"
            reasons.append(f"{need.title}{with_ac} would fit on {min_gpus} x {hw.gpu_name} ({where})")
            if min_nodes > 1:
                reasons.append("across nodes the field's answer for models this large is data parallel x ZeRO x "
                               "pipeline parallelism; pipeline parallelism is out of scope for this tool")
        else:
            lower = " or lower the micro-batch" if opts.micro_batch_size > 1 else ""
            fixes = f"shorten the sequence{lower}" if search_ctx is not ctx or \
                opts.activation_checkpointing else "turn on activation checkpointing or shorten the sequence"
            # What more GPUs do not shrink: the row at the largest cluster searched, less its sharded model states.
            big = replace(search_ctx, hardware=replace(hw, gpus_per_node=GPUS_PER_NODE_SEARCHED,
                                                       num_nodes=MAX_GPUS_SEARCHED // GPUS_PER_NODE_SEARCHED))
            floor = need.strategy.memory(big, opts.micro_batch_size)
            if floor.peak.phase.startswith("loading"):  # the whole base on every rank before it is partitioned
                fixes = ("transformers loads a quantized base whole on every GPU, without zero.Init, before DeepSpeed "
                         "partitions it: drop --quantize (ZeRO-3 then partitions a 16-bit base as it builds) or use a GPU "
                         "with more memory")
            reasons.append(f"even {MAX_GPUS_SEARCHED} GPUs with {need.title}{with_ac} do not fit at micro-batch "
                           f"{opts.micro_batch_size}: what more GPUs do not shrink ({memory_parts_text(floor)}; "
                           f"{fmt_gib(floor.device_total)} per GPU in all, at the peak: {floor.peak.phase}) exceeds one GPU's "
                           f"{fmt_gib(hw.gpu_memory_bytes)}; {fixes}")
    return Recommendation(strategy=None, reasons=reasons, warnings=warnings, min_gpus=min_gpus,
                          min_nodes=min_nodes, offload_host_bytes_per_node=host)
