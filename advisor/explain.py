"""The recommendation in words: the reasons (with figures) for the strategy ``advisor.recommend`` takes, and the
warnings about the cluster, the model and the chosen plan. Every function here builds sentences from rows the
planner sized; which row is taken is decided in ``advisor.recommend`` and ``advisor.candidates``. The rules
behind the warnings (slow networks, tiny models, PCIe, poor scaling, fewer nodes) are in docs/decisions.md.
"""

from __future__ import annotations

from dataclasses import replace

from .candidates import TIE, Alternative, Checkpointed, eligible, fastest_fitting, samples_per_s, sized, timed
from .choices import Precision
from .context import StrategyContext
from .gpu_presets import SLOW_NETWORKS
from .lora_text import alternative_reason, versus_full
from .memory import StrategyMemory
from .rows import FRAMEWORK_NAMES, StrategyRow, evaluate_row, max_micro_batch_text
from .training_options import TrainingOptions
from .units import fmt_gib, fmt_rate, fmt_s

# Below this many parameters, a warning that distributing may gain little: gradient sync and data loading dominate
# a small model's step (docs/decisions.md, "tiny models").
TINY_MODEL_PARAMS = 20_000_000
# Above this share of the GPU's memory the chosen plan gets a warning: the caching allocator's
# fragmentation is not in the estimate (PyTorch CUDA semantics docs, "memory management").
HEADROOM_WARN = 0.90
# Beyond this many GPUs a plan gets a warning that no published training run was that large: Llama 3 405B trained
# on 16,384 H100s (Llama Team 2024, "The Llama 3 Herd of Models", section 3.3, table 4), the largest with its
# parallel layout published; the time model's communication terms were never checked near it.
LARGEST_PUBLISHED_GPUS = 16_384
# PCIe 5.0 x16: 32 GT/s x 16 lanes with 128b/130b encoding, about 64 GB/s in each direction (PCI-SIG, PCIe 5.0 base
# specification); no all-reduce over PCIe exceeds it.
PCIE5_X16_GBPS = 64.0
OVERHEAD_NAME = "CUDA context, communicator buffers and allocator fragmentation"
_MODE_WORDS = {"autocast": "autocast over fp32 weights", "half": "a 16-bit module", "fp32": "fp32"}


def fit_reasons(
    ctx: StrategyContext,
    rows: list[StrategyRow],
    best: StrategyRow,
    fitting: list[StrategyRow],
    baseline: str | None,
    alternatives: tuple[Alternative, ...],
) -> list[str]:
    """The reasons for ``best``, taken among ``fitting`` (the ``eligible`` ``rows`` that surely fit): its memory, the
    cheaper strategy that does not fit, the one-GPU baseline (``baseline_reason``), the ``alternatives``, the step
    times, the frameworks compared, the communication, the batch and the learning rate, in that order."""
    hw, opts = ctx.hardware, ctx.options
    order = {r.name: r.strategy.comm_order for r in rows}
    cap, mem = hw.gpu_memory_bytes, sized(best)
    reasons = [
        f"{best.title} fits: {fmt_gib(mem.device_total)} of {fmt_gib(cap)} per GPU "
        f"({_pct(mem.device_total, cap)}) at micro-batch {opts.micro_batch_size}, "
        f"peak allocated {fmt_gib(mem.peak.total)} in the {mem.peak.phase}"
    ]
    cheaper = [r for r in rows if r.applicable and order[r.name] < order[best.name] and r.fits is not True]
    if cheaper:
        worst = min(cheaper, key=lambda r: order[r.name])
        # Where a smaller micro-batch fits, the verdict is this micro-batch's, not the strategy's.
        mb, smaller = opts.micro_batch_size, worst.max_micro_batch_size
        at = f" at micro-batch {mb}" if mb and 0 < smaller < mb else ""
        note = f"{worst.fit_note}; it fits at micro-batch {smaller} or below" if at else worst.fit_note
        if worst.short_of != "GPU memory":
            reasons.append(f"{worst.title} does not surely fit: {worst.fit_note}")
        elif hw.num_gpus == 1:  # nothing is sharded on one GPU
            reasons.append(f"{worst.title} does not fit{at} ({note})")
        else:
            reasons.append(
                f"{worst.title} does not fit{at} ({note}); {best.title} shards what {worst.title} replicates"
            )
    elif order[best.name] == min(order.values()) and best.time is None and best.strategy.distributes:
        reasons.append(
            f"the model states and activations fit on one GPU, so plain data parallel ({best.title}) has "
            "the least communication; ZeRO would only add sharding traffic"
        )
    if not best.strategy.distributes:
        reasons.append(
            f"one GPU: plain training in one process ({best.title}: no wrapper, no launcher, no gradient "
            "buckets); sharding or offload only when it does not fit"
        )
    if baseline:
        reasons.append(baseline)
    # A LoRA plan beside full fine-tuning; a full fine-tuning that fits only with offload beside LoRA / QLoRA.
    reasons += [
        versus_full(ctx, best, a) if a.ctx.profile.spec.adapter is None else alternative_reason(ctx, a)
        for a in alternatives
    ]
    reasons += _time_reasons(ctx, best, fitting)
    sharded = _frameworks_compared(fitting) if hw.num_gpus > 1 else None
    if sharded:
        reasons.append(sharded)
    link = hw.interconnect if hw.num_nodes == 1 else f"{hw.interconnect} inside nodes, {hw.network} between"
    if hw.num_gpus > 1:
        reasons.append(f"communication: about {fmt_gib(best.comm_bytes_per_step)} sent per GPU per step over {link}")
    steps = "step" if best.grad_accum_steps == 1 else "steps"
    largest = (
        f"the largest micro-batch that fits {_without_options(opts)}is "
        f"{max_micro_batch_text(best.max_micro_batch_size)} per GPU"
    )
    if opts.memory_options and best.max_micro_batch_size < 1:  # it fits with them: "is 0" read as not fitting
        largest = (
            f"micro-batch {opts.micro_batch_size} fits with the memory options, none without them (the largest "
            "micro-batch is searched without them)"
        )
    reasons.append(
        f"batch: micro-batch {opts.micro_batch_size} x data-parallel size {best.dp_size} x "
        f"{best.grad_accum_steps} accumulation {steps} = global batch {best.global_batch_size}; {largest}"
    )
    if best.learning_rate is not None:
        reasons.append(
            f"learning rate {best.learning_rate:.4g} by the linear scaling rule "
            f"({opts.base_lr:g} at batch {opts.base_batch_size} -> global {best.global_batch_size}); "
            "reach it at the end of a linear warmup (e.g. 5 epochs), then decay"
        )
    return reasons


def _without_options(opts: TrainingOptions) -> str:
    """``"without the memory options "`` when any is passed: the micro-batch search sizes the rows without them
    (``advisor.applied_options`` applies them at the plan's micro-batch only), so a row that fits with them can read
    0 there."""
    return "without the memory options (the search does not apply them) " if opts.memory_options else ""


def fit_warnings(
    ctx: StrategyContext, rows: list[StrategyRow], best: StrategyRow, checkpointed: Checkpointed | None
) -> list[str]:
    """The warnings about the chosen ``best`` among the ``eligible`` ``rows``: memory headroom, slow offload, CNNs
    before model parallelism, the strategy's link, poor scaling or too many nodes, the modelled step time and
    borrowed efficiencies, in that order."""
    hw, opts = ctx.hardware, ctx.options
    order = {r.name: r.strategy.comm_order for r in rows}
    cap, mb = hw.gpu_memory_bytes, ctx.micro_batch_size
    warnings: list[str] = []
    if sized(best).device_total > HEADROOM_WARN * cap:
        warnings.append(
            f"{best.title} uses {_pct(sized(best).device_total, cap)} of the GPU's memory: allocator "
            "fragmentation or a longer sample can run out; leave headroom ("
            + ", or ".join(
                ([] if mb <= 1 else ["a smaller micro-batch"])
                + ([] if opts.activation_checkpointing else ["--activation-checkpointing"])
                or ["a shorter sequence or a GPU with more memory"]
            )
            + ")"
        )
    if best.strategy.offload and checkpointed is not None:
        faster = fastest_fitting(eligible(checkpointed.rows, hw.num_gpus), offload=False)
        if faster is not None:
            warnings.append(
                f"offload is slow: with --activation-checkpointing, {faster.title} fits without offload "
                f"({fmt_gib(sized(faster).device_total)} of {fmt_gib(cap)} per GPU)"
            )
    if ctx.profile.spec.family == "vision" and order[best.name] > min(order.values()):
        warnings.append(
            "for vision models prefer lower precision, activation checkpointing and gradient accumulation "
            "before model parallelism"
        )
    link = best.strategy.link_warning(ctx)
    if link:
        warnings.append(link)
    scaling = _scaling_warning(ctx, best) or _fewer_nodes_warning(ctx, rows, best)
    if scaling:
        warnings.append(scaling)
    if best.time is not None:
        warnings.append(
            "step times model compute, communication and the optimizer step; data loading is not "
            "modelled (a slow input pipeline lowers every figure)"
        )
        borrowed = _borrowed_efficiency(ctx)
        if borrowed:
            warnings.append(borrowed)
    return warnings


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "?"


def _borrowed_efficiency(ctx: StrategyContext) -> str | None:
    """A warning when this GPU's generation has too few published runs for all its compute-model constants to be
    fitted: its GEMM share is fitted, the rest borrowed from another generation (``advisor.timing.gpu_model.MODELS``;
    the JSON's ``efficiency_source``). The step times' error band says how far off the fitted ones land."""
    from .timing.compute import generation_of as generation
    from .timing.compute import is_borrowed, model_for, preset_for_gpu

    hw, opts = ctx.hardware, ctx.options
    if hw.calibration is not None or hw.gpu_model is not None:
        return None
    if opts.mfu is not None or opts.bandwidth_efficiency is not None:
        return None
    preset = preset_for_gpu(hw.gpu_name, hw.gpu_memory_bytes)
    if preset is None:
        return None
    model = model_for(preset)
    if not is_borrowed(model):
        return None
    return (
        f"{preset.name} ({generation(preset)}) has few published runs fitted here: its GEMM share "
        f"({model.gemm:.2f}) is fitted to them, its other constants are another generation's (bandwidth "
        f"{model.bandwidth:.2f}; advisor/timing/gpu_model.py), so its step times are less certain than the "
        "error band says; `advisor calibrate` on that GPU, or --mfu and --bandwidth-efficiency, set them"
    )


def memory_parts(m: StrategyMemory) -> list[tuple[str, int]]:
    """The named parts of ``m.device_total``: the peak's (``Breakdown.named_parts``) and the device overhead."""
    return m.peak.named_parts() + ([(OVERHEAD_NAME, m.overhead.total)] if m.overhead.total else [])


def memory_parts_text(m: StrategyMemory) -> str:
    """``weights 1.00 GiB, activations 0.50 GiB, ...``: every part of ``m.device_total`` (they sum to it)."""
    return ", ".join(f"{name} {fmt_gib(n)}" for name, n in memory_parts(m))


def _frameworks_compared(fitting: list[StrategyRow]) -> str | None:
    """Where full sharding fits in two frameworks (FSDP2 and ZeRO-3), how their memory differs, with both figures."""
    full = [r for r in fitting if r.strategy.shards_everything and not r.strategy.offload]
    by_fw: dict[str, StrategyRow] = {}
    for r in full:
        by_fw.setdefault(r.strategy.framework, r)
    if len(by_fw) < 2:
        return None
    a, b = sorted(by_fw.values(), key=lambda r: sized(r).device_total)[:2]
    ma, mb = sized(a), sized(b)
    return (
        f"{a.title} and {b.title} both shard everything: {a.title} needs {fmt_gib(ma.device_total)} per GPU "
        f"(model states {fmt_gib(ma.model_state_bytes)} over the step, gradient shards included), {b.title} "
        f"{fmt_gib(mb.device_total)} (model states {fmt_gib(mb.model_state_bytes)}); {a.title} runs on {_fw(a)}, "
        f"{b.title} on {_fw(b)}"
    )


def _fw(r: StrategyRow) -> str:
    return FRAMEWORK_NAMES.get(r.strategy.framework, r.strategy.framework)


def baseline_reason(ctx: StrategyContext, rows: list[StrategyRow]) -> str | None:
    """With several GPUs: whether the model trains on one GPU without distribution, with the figures."""
    if ctx.hardware.num_gpus == 1:
        return None
    plain = next((r for r in rows if not r.strategy.distributes and r.applicable and r.memory), None)
    if plain is None:
        return None
    cap = ctx.hardware.gpu_memory_bytes
    figures = (
        f"{fmt_gib(sized(plain).device_total)} of {fmt_gib(cap)} at micro-batch {ctx.options.micro_batch_size}"
        f", {plain.grad_accum_steps} accumulation steps to the same global batch"
    )
    if plain.fits is True:
        return f"without distribution it fits on one GPU ({plain.title}: {figures})"
    return f"without distribution it does not fit on one GPU ({plain.title}: {figures})"


def tokens_per_sample(ctx: StrategyContext) -> int | None:
    """Tokens in one sample for a language model (its sequence length); None for vision and custom models."""
    spec = ctx.profile.spec
    return spec.seq_len if spec.seq_len and spec.family not in ("vision", "custom") else None


def _throughput(ctx: StrategyContext, r: StrategyRow) -> str:
    """'871K tokens/s' (language models) or '2.31K samples/s', at the row's global batch."""
    per = samples_per_s(r)
    tokens = tokens_per_sample(ctx)
    return f"{fmt_rate(per * tokens)} tokens/s" if tokens else f"{fmt_rate(per)} samples/s"


def _why_slower(slow: StrategyRow, fast: StrategyRow, precision: Precision | None) -> str:
    """Why ``slow`` takes longer than ``fast`` (both timed), in figures."""
    a, b = timed(slow), timed(fast)
    if a.exposed_comm_s - b.exposed_comm_s >= max(a.compute_s - b.compute_s, a.optimizer_s - b.optimizer_s):
        pcie = sum(c.nbytes * c.passes for c in a.collectives if c.group == "host")
        if pcie and not slow.comm_bytes_per_step:  # offload on one GPU: its copies cross PCIe, not a GPU link
            return (
                f"it copies {fmt_gib(pcie)} between the GPU and host RAM per step over PCIe, "
                f"{fmt_s(a.exposed_comm_s)} of it not hidden by compute, vs {fmt_s(b.exposed_comm_s)}"
            )
        passes = " + ".join(
            f"{c.passes} {c.kind.replace('_', '-')}{'s' if c.passes != 1 else ''}"
            for c in a.collectives
            if c.group != "host"
        )
        return (
            f"it sends {fmt_gib(slow.comm_bytes_per_step)} per GPU per step"
            + (f" in {passes}" if passes else "")
            + f", {fmt_s(a.exposed_comm_s)} of it not hidden by compute, vs {fmt_gib(fast.comm_bytes_per_step)} "
            f"and {fmt_s(b.exposed_comm_s)}"
        )
    if a.compute_s - b.compute_s >= a.optimizer_s - b.optimizer_s:
        if slow.tp_degree > fast.tp_degree:
            # The TP trace is the sharded block's (advisor.trace, tp_degree): GEMMs 1/tp as wide, fewer tiles
            # per kernel, and the ops TP does not shard (norms, embeddings, the loss) repeated on every rank.
            why = (
                f": TP {slow.tp_degree} splits every GEMM {slow.tp_degree} ways (narrower, less efficient kernels) "
                "and repeats what it does not shard (norms, embeddings, the loss) on every rank"
            )
        else:
            ma, mb = slow.strategy.trace_mode(precision), fast.strategy.trace_mode(precision)
            parts = [f"{_MODE_WORDS.get(ma, ma)} vs {_MODE_WORDS.get(mb, mb)}"] if ma != mb else []
            if a.bubble_s > b.bubble_s:  # a pipeline's idle slots are in its compute time: name them first
                parts.insert(0, f"{fmt_s(a.bubble_s)} of it the pipeline's bubble (stages idle as it fills and drains)")
            why = ": " + "; ".join(parts) if parts else ""
        return f"compute {fmt_s(a.compute_s)} vs {fmt_s(b.compute_s)} per step{why}"
    return f"optimizer step {fmt_s(a.optimizer_s)} vs {fmt_s(b.optimizer_s)}"


def _time_reasons(ctx: StrategyContext, best: StrategyRow, fitting: list[StrategyRow]) -> list[str]:
    """The chosen row's step time, throughput and MFU, and how much longer the others that fit take."""
    t = best.time
    if t is None:
        return []
    link = ctx.hardware.interconnect if ctx.hardware.num_nodes == 1 else f"{ctx.hardware.network} between nodes"
    over = f" over {link}" if ctx.hardware.num_gpus > 1 else ""  # one GPU: no link between GPUs to name
    mfu = f", MFU {100 * t.mfu:.0f}%" if t.mfu is not None else ""
    fastest = all(r.time is None or r.time.step_s >= t.step_s for r in fitting)
    verb = "is the fastest that fits" if fastest else "takes"
    out = [
        f"{best.title} {verb}: {fmt_s(t.step_s)} per optimizer step at global batch "
        f"{best.global_batch_size} ({_throughput(ctx, best)}{mfu}; compute {fmt_s(t.compute_s)}, communication "
        f"not hidden {fmt_s(t.exposed_comm_s)}, optimizer {fmt_s(t.optimizer_s)})"
    ]
    others = sorted(
        (r for r in fitting if r is not best and r.time is not None and r.time.step_s > 0),
        key=lambda r: timed(r).step_s,
    )
    # The fastest of the others and the slowest that keeps its model states on the GPU: the range of the choice.
    on_gpu = [r for r in others[1:] if not r.strategy.offload and timed(r).step_s != timed(others[0]).step_s]
    shown = others[:1] + on_gpu[-1:]
    for r in shown:
        ratio = timed(r).step_s / t.step_s
        if ratio * (1 + TIE) < 1 and not best.strategy.distributes:  # one GPU's rule, not the tie band, chose it
            out.append(
                f"{r.title} would take {ratio:.2f}x the time per step ({fmt_s(timed(r).step_s)}: "
                f"{_why_slower(best, r, ctx.options.precision)}); {best.title} is preferred on one GPU (above)"
            )
        elif ratio < 1 + TIE:
            if r.strategy.comm_order != best.strategy.comm_order:
                why = "by the tie order (least communication first, see docs/decisions.md)"
            elif sized(r).device_total != sized(best).device_total:
                lo, hi = sized(best).device_total, sized(r).device_total
                digits = 2 if fmt_gib(lo) != fmt_gib(hi) else 4  # 0.84 against 0.84 GiB: more digits
                why = f"for its lower device total ({fmt_gib(lo, digits)} against {fmt_gib(hi, digits)})"
            else:  # the same order and memory: the registry's order decides (``pick``'s min keeps the first)
                why = (
                    f"as the first listed (the same tie order and the same {fmt_gib(sized(best).device_total)} per GPU)"
                )
            out.append(
                f"{r.title} is as fast within {100 * TIE:.0f}% ({fmt_s(timed(r).step_s)} per step); "
                f"{best.title} is preferred {why}"
            )
        else:
            out.append(
                f"{r.title}{over} would take {ratio:.2f}x longer per step ({fmt_s(timed(r).step_s)}: "
                f"{_why_slower(r, best, ctx.options.precision)})"
            )
    return out


def _scaling_warning(ctx: StrategyContext, best: StrategyRow) -> str | None:
    """When the GPUs give less than half the ideal speed-up over one GPU (at the same global batch), the figures
    and the better option (docs/decisions.md, "slow networks": communication a step cannot hide caps the speed-up)."""
    t, hw = best.time, ctx.hardware
    n = hw.num_gpus
    if t is None or n < 2 or t.speedup_vs_single_gpu is None or t.speedup_vs_single_gpu >= n / 2:
        return None
    link = hw.interconnect if hw.num_nodes == 1 else f"{hw.network} between nodes"
    if t.speedup_vs_single_gpu < 1:
        better = "one GPU alone is faster: do not distribute this model on this cluster"
    elif t.exposed_comm_s >= t.compute_s:
        better = (
            "communication dominates: fewer GPUs (or nodes), a faster link, or a larger micro-batch "
            "(more compute per byte sent)"
        )
    else:
        better = "a larger micro-batch (more compute per step) or fewer GPUs"
    assert t.scaling_efficiency is not None, "set with the speed-up (advisor.rows.with_speedup)"
    share = 100 * t.scaling_efficiency
    return (
        f"{n} GPUs give only {t.speedup_vs_single_gpu:.2f}x the speed of one GPU ({share:.0f}% "
        f"of the ideal {n}x): {fmt_s(t.exposed_comm_s)} of each {fmt_s(t.step_s)} step is communication over "
        f"{link} that compute does not hide; {better}"
    )


def _fewer_nodes_warning(ctx: StrategyContext, rows: list[StrategyRow], best: StrategyRow) -> str | None:
    """Several nodes whose samples per second are under half of ``nodes`` x one node's (the fastest strategy that
    fits one node of the same GPUs, at the same micro-batch): the figures and the advice to use fewer nodes or a
    faster network. For models one GPU cannot hold, where ``_scaling_warning`` has no single-GPU baseline."""
    hw = ctx.hardware
    if hw.num_nodes < 2 or best.time is None or not best.time.step_s:
        return None
    one = replace(ctx, hardware=replace(hw, num_nodes=1))
    # every strategy, also those that do not apply across nodes (TP stays inside one node): one node may run them
    candidates = [
        evaluate_row(r.strategy, one, False) for r in eligible(rows, hw.gpus_per_node) if r.strategy is not None
    ]
    fitting = [r for r in candidates if r.applicable and r.fits is True and r.time is not None and r.time.step_s]
    if not fitting:
        return None
    node = max(fitting, key=samples_per_s)
    per_s = samples_per_s(best)
    node_per_s = samples_per_s(node)
    if per_s >= hw.num_nodes * node_per_s / 2:
        return None
    return (
        f"{hw.num_nodes} nodes over {hw.network} train {per_s:.3g} samples/s, against {node_per_s:.3g} on one node "
        f"of {hw.gpus_per_node} ({node.title}): {per_s / node_per_s:.2f}x for {hw.num_nodes}x the GPUs; use one "
        "node, or a faster network between nodes"
    )


def cluster_warnings(ctx: StrategyContext, timed: bool = False) -> list[str]:
    """The warnings about the cluster and the model (docs/decisions.md: slow networks, tiny models, PCIe);
    ``timed``: the plan has step times, whose quantified scaling warning (``_scaling_warning``) replaces the prose
    one about slow networks."""
    hw, stats = ctx.hardware, ctx.profile.stats
    out = []
    if hw.num_nodes > 1 and hw.network in SLOW_NETWORKS and not timed:
        out.append(
            f"{hw.network} between nodes is a bottleneck: communication can cost more than compute "
            "(a 2B model has been seen to get only 1.6x on 8 GPUs over such links); expect poor scaling"
        )
    if stats.num_params < TINY_MODEL_PARAMS and hw.num_gpus > 1:
        out.append(
            f"the model is small ({stats.num_params / 1e6:.1f}M parameters): unless the data is large, "
            "distributing may gain little (gradient sync and data loading dominate)"
        )
    if hw.num_gpus > LARGEST_PUBLISHED_GPUS:
        out.append(
            f"{hw.num_gpus:,} GPUs is more than any published training run used (Llama 3 405B: "
            f"{LARGEST_PUBLISHED_GPUS:,} H100s): check --gpus and --nodes; the step times are extrapolated far "
            "beyond the measured runs"
        )
    if hw.num_nodes == 1 and hw.interconnect == "pcie" and hw.num_gpus > 1:
        # The bus bandwidth the plan used: the user's --link-bandwidth (or a calibration) over the nominal figure.
        busbw = hw.link_busbw_gbps
        if busbw is not None and busbw > PCIE5_X16_GBPS:
            out.append(
                f"an all-reduce bus bandwidth of {busbw:g} GB/s over PCIe is more than a PCIe 5.0 x16 link carries "
                f"({PCIE5_X16_GBPS:g} GB/s a direction): planned as given; check --interconnect and --link-bandwidth"
            )
        else:
            said = f"{busbw:g} GB/s all-reduce bus bandwidth" if busbw is not None else "about 32 GB/s"
            out.append(
                f"PCIe between GPUs ({said}): all-reduce is slower than over NVLink; scaling will be below linear"
            )
    return out
