"""The recommender: among strategies that fit, the fastest per optimizer step at the same global batch
(``StrategyRow.time``, the strategies' time rules). Step times within ``TIE`` of the fastest are ties, which the
tie order decides (least communication first: DDP, then ZeRO-1/2, then ZeRO-3 and FSDP2, then TP, then offload;
``advisor.candidates.pick``), then the lower device total; rows without a time (a GPU with no preset) fall back
to that order alone. Unless the user set the micro-batch, ``choose_micro_batch`` picks the one with the best
throughput among those that fit. When nothing fits: the cheaper fixes, then the smallest ZeRO-3 cluster that
would. The reasons and warnings are worded in ``advisor.explain``; the rules are in docs/decisions.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .candidates import Alternative, Checkpointed, eligible, fastest_fitting, pick, samples_per_s, sized
from .context import StrategyContext
from .explain import (
    HEADROOM_WARN,
    baseline_reason,
    cluster_warnings,
    fit_reasons,
    fit_warnings,
    memory_parts_text,
)
from .lora_text import alternative_reason
from .rows import Recommendation, StrategyRow, batch_ranks, fit_verdict, fits, max_micro_batch, time_at
from .units import fmt_gib, fmt_rate

if TYPE_CHECKING:
    from strategies.base import Strategy

MAX_GPUS_SEARCHED = 4096
GPUS_PER_NODE_SEARCHED = 8  # the usual node (DGX/HGX); a larger --gpus is kept
# Micro-batches whose throughput is within 2% of the best count as the best: the smallest of them is chosen.
MB_TIE = 0.02


def recommend(
    ctx: StrategyContext,
    rows: list[StrategyRow],
    checkpointed: Checkpointed | None = None,
    alternatives: tuple[Alternative, ...] = (),
) -> Recommendation:
    """The strategy to use among ``rows`` (each carries its ``Strategy``), with reasons and warnings.

    Order: the strategies' own ``comm_order`` (least communication first), ties by lower device total.
    ``checkpointed``: the rows with activation checkpointing on, to name that fix (with its figures)
    before offload or a larger cluster. ``alternatives``: full fine-tuning beside a LoRA plan (one reason with
    both totals), or LoRA / QLoRA when nothing fits (named with their figures before any larger cluster).
    """
    hw, opts = ctx.hardware, ctx.options
    baseline = baseline_reason(ctx, rows)
    rows = eligible(rows, hw.num_gpus)
    fitting = [r for r in rows if r.applicable and r.fits is True]
    warnings = cluster_warnings(ctx, timed=any(r.time is not None for r in fitting))
    if not fitting:
        rec = _nothing_fits(ctx, rows, warnings, checkpointed)
        if baseline:
            rec.reasons.insert(1, baseline)
        # LoRA / QLoRA when full fine-tuning fits nowhere (full fine-tuning is no way out of a LoRA plan that does
        # not fit)
        rec.reasons[1:1] = [alternative_reason(ctx, a) for a in alternatives if a.ctx.profile.spec.adapter is not None]
        return rec
    best = pick(fitting)
    reasons = fit_reasons(ctx, rows, best, fitting, baseline, alternatives)
    warnings += fit_warnings(ctx, rows, best, checkpointed)
    return Recommendation(
        strategy=best.name, reasons=reasons, warnings=warnings, micro_batch_size=opts.micro_batch_size
    )


def choose_micro_batch(ctx: StrategyContext, rows: list[StrategyRow]) -> tuple[int, str] | None:
    """The micro-batch with the best throughput (samples per second at the global batch it gives) among those at
    which some strategy surely fits, preferring those that leave ``HEADROOM_WARN`` of the GPU's memory free; within
    ``MB_TIE`` of the best, the smallest. Candidates: powers of two up to the largest micro-batch any strategy fits,
    and each strategy's largest (with and without the headroom); with --global-batch-size only those that divide it.
    At each micro-batch the strategy is the one ``recommend`` would pick there (``pick``). (micro-batch, a note
    with the figures), or None when nothing fits or nothing can be timed."""
    hw, opts = ctx.hardware, ctx.options
    applicable = [r for r in eligible(rows, hw.num_gpus) if r.applicable and r.max_micro_batch_size > 0]
    # One GPU: the micro-batch of plain training when it fits at all (``pick`` prefers it; a larger micro-batch
    # only another row fits would trade it for a framework).
    plain = [r for r in applicable if not r.strategy.distributes]
    if plain and hw.num_gpus == 1:
        applicable = plain
    largest = max((r.max_micro_batch_size for r in applicable), default=0)
    ranks = batch_ranks(opts, hw.num_gpus)
    if largest < 1:
        return None
    candidates = {1 << i for i in range(largest.bit_length()) if 1 << i <= largest}
    candidates |= {r.max_micro_batch_size for r in applicable}
    if opts.global_batch_size:
        candidates = {b for b in candidates if opts.global_batch_size % (b * ranks) == 0}
    room_limit = int(HEADROOM_WARN * hw.gpu_memory_bytes)
    trial_hw = replace(ctx, hardware=replace(hw, gpu_memory_bytes=room_limit))
    candidates |= {max_micro_batch(r.strategy, trial_hw, None) for r in applicable} - {0}
    if opts.global_batch_size:
        candidates = {b for b in candidates if opts.global_batch_size % (b * ranks) == 0}
    found: dict[int, tuple[float, bool, str]] = {}  # micro-batch -> (samples/s, leaves headroom, strategy title)
    for b in sorted(candidates):
        trial = replace(ctx, options=replace(opts, micro_batch_size=b))
        fitting = []
        for r in applicable:
            if r.max_micro_batch_size < b or (opts.global_batch_size and opts.global_batch_size % (b * r.dp_size)):
                continue
            mem = r.strategy.memory(trial, b)
            if fit_verdict(mem, hw, r.load_host_bytes_per_node)[0] is not True:
                continue
            t, shadow = time_at(r.strategy, ctx, r, b)
            if t is not None and t.step_s:
                fitting.append(replace(shadow, time=t, memory=mem))
        if fitting:  # the row the recommender would pick at this micro-batch, and its throughput
            row = pick(fitting)
            found[b] = (samples_per_s(row), sized(row).device_total <= room_limit, row.title)
    if not found:
        return None
    pool = {b: v for b, v in found.items() if v[1]} or found
    best_rate = max(v[0] for v in pool.values())
    chosen = min(b for b, v in pool.items() if v[0] >= best_rate * (1 - MB_TIE))
    top = max(found)
    fastest = max(pool, key=lambda b: pool[b][0])
    room = f" with {100 * (1 - HEADROOM_WARN):.0f}% of the GPU's memory left free" if pool is not found else ""
    note = (
        f"micro-batch {chosen} per GPU gives the best throughput that fits{room} ({fmt_rate(pool[chosen][0])} "
        f"samples/s, {pool[chosen][2]}"
        + (f"; {fastest} gains less than {100 * MB_TIE:.0f}%)" if fastest != chosen else ")")
    )
    if top != chosen:
        note += (
            f"; the largest that fits any strategy, {top} ({found[top][2]}), gives {fmt_rate(found[top][0])} samples/s"
        )
    return chosen, note


def _cluster_that_fits(ctx: StrategyContext, strategy: Strategy) -> tuple[int, int] | None:
    """(GPUs per node, nodes) of the smallest cluster of this GPU on which ``strategy`` fits at the
    micro-batch: more GPUs in the node first (up to 8, or the node's own count), then nodes of that
    size (doubling, then refined). None when even ``MAX_GPUS_SEARCHED`` GPUs do not fit."""
    hw, b = ctx.hardware, ctx.micro_batch_size

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


def _smallest_cluster(
    ctx: StrategyContext, rows: list[StrategyRow], search_ctx: StrategyContext, search_rows: list[StrategyRow]
) -> tuple[StrategyRow | None, StrategyContext, tuple[int, int] | None]:
    """The row that shards everything on the GPU (ZeRO-3, FSDP2; no offload) and the context (as planned, else with
    activation checkpointing when ``search_ctx`` has it on) that fit the fewest GPUs (``_cluster_that_fits``), with
    that cluster: fewest GPUs first, then without checkpointing, then the least communication. (None, search_ctx,
    None) when no such row applies; (the first such row, search_ctx, None) when none fits even the largest searched."""
    tries = [(ctx, rows)] + ([(search_ctx, search_rows)] if search_ctx is not ctx else [])
    found = []
    for c, rs in tries:
        for r in rs:
            if r.applicable and _shards_all_on_gpu(r):
                cluster = _cluster_that_fits(c, r.strategy)
                if cluster is not None:
                    found.append((cluster[0] * cluster[1], c is not ctx, r.strategy.comm_order, r, c, cluster))
    if found:
        *_, r, c, cluster = min(found, key=lambda f: f[:3])
        return r, c, cluster
    return next((r for r in search_rows if r.applicable and _shards_all_on_gpu(r)), None), search_ctx, None


def _shards_all_on_gpu(r: StrategyRow) -> bool:
    """The row shards everything and keeps it on the GPU (ZeRO-3, FSDP2): what more GPUs scale."""
    return r.strategy.shards_everything and not r.strategy.offload


def _nothing_fits(
    ctx: StrategyContext, rows: list[StrategyRow], warnings: list[str], checkpointed: Checkpointed | None
) -> Recommendation:
    """No row fits: the cheaper fixes first, each with its figures (activation checkpointing, then CPU
    offload), then the smallest cluster on which the strategy that shards everything would fit."""
    hw, opts = ctx.hardware, ctx.options
    mb = ctx.micro_batch_size
    short_host = [r for r in rows if r.applicable and r.fits is not True and r.short_of != "GPU memory"]
    # Rows short of host RAM (or with it unknown) fit the GPU: they are named with their reason below, not here.
    short_gpu = [r for r in rows if r.applicable and r.memory and r not in short_host]
    if short_gpu:
        first = (
            "no strategy fits: "
            + "; ".join(f"{r.title} {fmt_gib(sized(r).device_total)}" for r in short_gpu)
            + f" per GPU vs {fmt_gib(hw.gpu_memory_bytes)} available"
        )
        if short_host:
            first += f"; {', '.join(r.title for r in short_host)} fit the GPU (host RAM below)"
    else:
        first = "no strategy is known to fit: every row needs host RAM that is short or unknown (below)"
    reasons = [first]
    for r in short_host:
        reasons.append(f"{r.title}: {r.fit_note}")
    search_ctx, search_rows = ctx, rows
    # Rows that fit the GPU at a smaller micro-batch only (one that fits at this one is short of host RAM instead)
    smaller = [r for r in rows if r.applicable and 1 <= r.max_micro_batch_size < mb]
    if mb > 1 and smaller:
        # Without offload first (offload's largest micro-batch counts GPU memory only), then the largest.
        r = max(smaller, key=lambda r: (not r.strategy.offload, r.max_micro_batch_size, -r.strategy.comm_order))
        reasons.append(
            f"at micro-batch {opts.micro_batch_size} nothing fits; lower --micro-batch-size: {r.title} fits "
            f"up to micro-batch {r.max_micro_batch_size} (reach the global batch by gradient accumulation)"
        )
        return Recommendation(strategy=None, reasons=reasons, warnings=warnings)
    if checkpointed is not None:
        fix = fastest_fitting(eligible(checkpointed.rows, hw.num_gpus))
        if fix is not None:
            reasons.append(
                f"turn on activation checkpointing (--activation-checkpointing): {fix.title} then fits, "
                f"{fmt_gib(sized(fix).device_total)} of {fmt_gib(hw.gpu_memory_bytes)} per GPU"
            )
            return Recommendation(strategy=None, reasons=reasons, warnings=warnings)
        maybe = [r for r in checkpointed.rows if r.applicable and r.fits is None]
        with_memory = [r for r in checkpointed.rows if r.applicable and r.memory]
        if maybe:
            r = min(maybe, key=lambda r: (r.strategy.comm_order, sized(r).device_total))
            reasons.append(
                f"with activation checkpointing (--activation-checkpointing) {r.title} needs "
                f"{fmt_gib(sized(r).device_total)} per GPU and {fmt_gib(sized(r).host_bytes_per_node)} of "
                "host RAM per node: it fits if the nodes have that RAM (give --host-mem to check)"
            )
        elif with_memory:
            low = min(with_memory, key=lambda r: sized(r).device_total)
            # the smallest may fit the GPU and lack host RAM (offload): "would still need 5.46 GiB per GPU" read as
            # a GPU shortfall
            still = (
                f"would still need {fmt_gib(sized(low).device_total)} per GPU"
                if low.short_of == "GPU memory"
                else f"fits the GPU ({fmt_gib(sized(low).device_total)} per GPU) but "
                + ("the host RAM is unknown" if low.short_of == "host RAM unknown" else "not the host RAM")
            )
            reasons.append(
                f"activation checkpointing alone is not enough: the smallest, {low.title}, {still} ({low.fit_note})"
            )
        search_ctx, search_rows = checkpointed.ctx, eligible(checkpointed.rows, hw.num_gpus)
    off = next(
        (r for r in search_rows if r.applicable and r.memory and r.strategy.shards_everything and r.strategy.offload),
        None,
    )
    host = sized(off).host_bytes_per_node if off else None
    if off is not None and all(o.name != off.name for o in short_host):
        where = hw.sources.get("host_mem_bytes", "")
        have = (
            "host RAM unknown: give --host-mem"
            if hw.host_mem_bytes is None
            else f"have {fmt_gib(hw.host_mem_bytes)}, {where}"
            + ("; pass --host-mem for the target nodes' RAM" if where.startswith("detected") else "")
        )
        reasons.append(
            f"{off.title} would need {fmt_gib(sized(off).host_bytes_per_node)} of host RAM per node "
            f"({have}) and {fmt_gib(sized(off).device_total)} per GPU"
        )
    need, search_ctx, found = _smallest_cluster(ctx, rows, search_ctx, search_rows)
    min_gpus = min_nodes = None
    with_ac = " with activation checkpointing" if search_ctx is not ctx else ""
    if need is None:
        blocked = next((r for r in rows if _shards_all_on_gpu(r)), None)
        if blocked is not None:
            adapter = ctx.profile.spec.adapter
            if adapter is not None and adapter.quantize:  # the quantized base is what keeps ZeRO-3 / FSDP2 out
                reasons.append(
                    f"more GPUs do not shard a {adapter.quantize} base here ({blocked.title} does not "
                    f"apply: {blocked.reason}); drop --quantize to shard a 16-bit base with ZeRO-3 or FSDP2 "
                    "across more GPUs, or use a GPU with more memory"
                )
            else:
                reasons.append(f"more GPUs would not help here: {blocked.title} does not apply ({blocked.reason})")
    else:
        if found is not None:
            per_node, min_nodes = found
            min_gpus = per_node * min_nodes
            where = "in one node" if min_nodes == 1 else f"{min_nodes} nodes of {per_node}"
            reasons.append(f"{need.title}{with_ac} would fit on {min_gpus} x {hw.gpu_name} ({where})")
            if min_nodes > 1:
                reasons.append(
                    "across nodes the field's answer for models this large is data parallel x ZeRO x "
                    "pipeline parallelism: pin a pipeline with --pp N (and --tp-degree inside a node) to size that "
                    "layout (an estimate beside these rows; only PP x DP scripts are written)"
                )
        else:
            lower = " or lower the micro-batch" if mb > 1 else ""
            fixes = (
                f"shorten the sequence{lower}"
                if search_ctx is not ctx or opts.activation_checkpointing
                else "turn on activation checkpointing or shorten the sequence"
            )
            # What more GPUs do not shrink: the row at the largest cluster searched, less its sharded model states.
            big = replace(
                search_ctx,
                hardware=replace(
                    hw, gpus_per_node=GPUS_PER_NODE_SEARCHED, num_nodes=MAX_GPUS_SEARCHED // GPUS_PER_NODE_SEARCHED
                ),
            )
            floor = need.strategy.memory(big, mb)
            if floor.peak.phase.startswith("loading"):  # the whole base on every rank before it is partitioned
                fixes = (
                    "transformers loads a quantized base whole on every GPU, without zero.Init, before "
                    "DeepSpeed partitions it: drop --quantize (ZeRO-3 then partitions a 16-bit base as it builds) "
                    "or use a GPU with more memory"
                )
            reasons.append(
                f"even {MAX_GPUS_SEARCHED} GPUs with {need.title}{with_ac} do not fit at micro-batch "
                f"{opts.micro_batch_size}: what more GPUs do not shrink ({memory_parts_text(floor)}; "
                f"{fmt_gib(floor.device_total)} per GPU in all, at the peak: {floor.peak.phase}) exceeds "
                f"one GPU's {fmt_gib(hw.gpu_memory_bytes)}; {fixes}"
            )
    return Recommendation(
        strategy=None,
        reasons=reasons,
        warnings=warnings,
        min_gpus=min_gpus,
        min_nodes=min_nodes,
        min_cluster_flags="--activation-checkpointing" if with_ac and min_gpus else "",
        offload_host_bytes_per_node=host,
    )
