"""The plan's variants the recommender weighs it against, each sized with one more trace: the same rows with
activation checkpointing on when the answer needs it (``checkpointed``), the hint that the checkpointing the user
turned on is not needed (``checkpointing_not_needed``), and the same model trained another way: full fine-tuning
beside LoRA, LoRA and QLoRA beside a full fine-tuning that fits nowhere (``alternatives``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from .cache import DiskCache, NullCache
from .candidates import Alternative, Checkpointed, eligible
from .choices import Precision, TraceMode
from .context import StrategyContext
from .errors import AdvisorError
from .explain import HEADROOM_WARN
from .models import AdapterSpec, recipe_adapter
from .profile import build_profile
from .rows import StrategyRow, evaluate_row, fit_verdict, time_at
from .units import fmt_s, gib

if TYPE_CHECKING:
    from strategies.base import Strategy


def checkpointed(
    ctx: StrategyContext,
    rows: list[StrategyRow],
    strategies: Sequence[Strategy],
    cache: DiskCache | NullCache,
    scratch_threads: int,
    mode: TraceMode,
) -> Checkpointed | None:
    """The rows with activation checkpointing on, when it is off, the model has blocks to checkpoint,
    and the answer needs it (nothing fits, or only with CPU offload): the recommender names that fix,
    with its figures, before offload or a larger cluster. One more trace, only in those cases."""
    opts = ctx.options
    fitting = [r for r in rows if r.applicable and r.fits is True]
    if opts.activation_checkpointing:
        return None
    if fitting and not all(r.strategy.offload for r in fitting):
        return None
    profile = build_profile(
        ctx.profile.spec, ctx.profile.attention, True, cache=cache, cpu_conv_scratch_threads=scratch_threads
    )
    if profile.activations(mode).checkpointed_blocks == 0:
        return None
    ac_ctx = StrategyContext(profile, ctx.hardware, replace(opts, activation_checkpointing=True), ctx.device)
    return Checkpointed(ac_ctx, [evaluate_row(s, ac_ctx, False) for s in strategies])


# Activation checkpointing is worth a hint to drop it when training without it is this much faster.
AC_HINT_SPEEDUP = 1.1


def checkpointing_not_needed(
    ctx: StrategyContext, best: StrategyRow, rows: list[StrategyRow], cache: DiskCache | NullCache, scratch_threads: int
) -> str | None:
    """The hint that activation checkpointing, which the user turned on, is not needed: some strategy fits
    without it at the recommended row's global batch (at the plan's micro-batch, else the largest that fits without
    it and divides the global batch, reaching it by accumulation) and is at least ``AC_HINT_SPEEDUP`` faster per
    optimizer step than the recommendation (no recompute of the forward: the trace's FLOPs without it). One more
    trace (usually cached: the common case). None when nothing fits without it faster, or there is nothing to time,
    and for QLoRA, which turns checkpointing on itself."""
    if best.time is None or not best.time.step_s or not best.global_batch_size:
        return None
    adapter = ctx.profile.spec.adapter
    if adapter is not None and adapter.quantize:  # QLoRA checkpoints without the flag (prepare_model_for_kbit_training)
        return None
    profile = build_profile(
        ctx.profile.spec, ctx.profile.attention, False, cache=cache, cpu_conv_scratch_threads=scratch_threads
    )
    opts = replace(ctx.options, activation_checkpointing=False, global_batch_size=best.global_batch_size)
    plain = StrategyContext(profile, ctx.hardware, opts, ctx.device)
    found = []  # (step time, title, micro-batch, the row at it, memory)
    for r in eligible(rows, ctx.hardware.num_gpus):
        if not r.applicable or r.strategy is None or r.strategy.offload:
            continue
        row = evaluate_row(r.strategy, plain, False)
        if not row.applicable or not row.dp_size or best.global_batch_size % row.dp_size:
            continue
        per_rank = best.global_batch_size // row.dp_size
        sizes = [b for b in range(min(row.max_micro_batch_size, ctx.micro_batch_size), 0, -1) if per_rank % b == 0]
        if not sizes:
            continue
        # the largest micro-batch that fits and leaves the headroom the recommender asks for (no advice to drop
        # checkpointing for a fill the plan itself would warn about: over 90% of the GPU)
        for b in sizes:
            memory = r.strategy.memory(replace(plain, options=replace(opts, micro_batch_size=b)), b)
            roomy = memory.device_total <= HEADROOM_WARN * ctx.hardware.gpu_memory_bytes
            if roomy and fit_verdict(memory, ctx.hardware, row.load_host_bytes_per_node)[0] is True:
                break
        else:
            continue
        t, shadow = time_at(r.strategy, plain, row, b)
        if t is not None and t.step_s and shadow.global_batch_size == best.global_batch_size:
            found.append((t.step_s, r.title, b, shadow, memory))
    if not found:
        return None
    step_s, title, b, shadow, memory = min(found, key=lambda f: f[0])
    if best.time.step_s < AC_HINT_SPEEDUP * step_s:
        return None
    assert shadow.grad_accum_steps is not None, "a timed row has its accumulation steps"
    batch = (
        f"micro-batch {b}"
        + (f" x {shadow.grad_accum_steps} accumulation steps" if shadow.grad_accum_steps > 1 else "")
        + f" (global batch {shadow.global_batch_size})"
    )
    return (
        f"activation checkpointing is on but not needed: {title} fits without it at {batch}, "
        f"{gib(memory.device_total):.2f} GiB of {gib(ctx.hardware.gpu_memory_bytes):.2f} GiB per GPU, and "
        f"takes {fmt_s(step_s)} per optimizer step instead of {best.title}'s {fmt_s(best.time.step_s)} with it "
        f"({100 * (best.time.step_s / step_s - 1):.0f}% faster: no recompute of the forward); drop "
        "--activation-checkpointing"
    )


# What the nothing-fits answer offers a full fine-tuning of a transformer: the ladder's LoRA and QLoRA adapters
# (``advisor.models.recipe_adapter``), so the answer names one recipe, and the two share their traces.
_LORA_OFFERS = (("LoRA", False), ("QLoRA", True))


def alternatives(
    ctx: StrategyContext,
    rows: list[StrategyRow],
    strategies: Sequence[Strategy],
    cache: DiskCache | NullCache,
    scratch_threads: int,
    asked_micro_batch: int | None = None,
) -> tuple[Alternative, ...]:
    """What the recommender compares the plan with (``advisor.candidates.Alternative``): a LoRA plan beside full
    fine-tuning of the same model on the same cluster at the same micro-batch (one more trace); a full fine-tuning
    of a transformer that fits nowhere without offload beside LoRA and QLoRA (``_LORA_OFFERS``) at
    ``asked_micro_batch`` (the user's, else the family's default: not the micro-batch chosen for an offload row,
    which a 24 GB GPU cannot hold without offload). Empty otherwise."""
    spec, opts = ctx.profile.spec, ctx.options

    def evaluate(
        adapter: AdapterSpec | None, checkpointing: bool, micro_batch: int | None = None
    ) -> tuple[StrategyContext, list[StrategyRow]]:
        profile = build_profile(
            replace(spec, adapter=adapter),
            ctx.profile.attention,
            checkpointing,
            cache=cache,
            cpu_conv_scratch_threads=scratch_threads,
        )
        alt_opts = replace(
            opts, activation_checkpointing=checkpointing, micro_batch_size=micro_batch or opts.micro_batch_size
        )
        alt = StrategyContext(profile, ctx.hardware, alt_opts, ctx.device)
        return alt, [evaluate_row(s, alt, False) for s in strategies]

    if spec.adapter is not None:
        label = "full fine-tuning" + (
            " (with activation checkpointing, as here)" if opts.activation_checkpointing else ""
        )
        return (Alternative(label, *evaluate(None, opts.activation_checkpointing)),)
    if not spec.is_transformer or any(r.applicable and r.fits is True and not r.strategy.offload for r in rows):
        return ()
    out = []
    compute = (opts.precision or Precision.BF16).compute_dtype
    for label, quantize in _LORA_OFFERS:
        try:  # QLoRA turns on activation checkpointing (prepare_model_for_kbit_training)
            out.append(
                Alternative(
                    label,
                    *evaluate(
                        recipe_adapter(compute, quantize),
                        opts.activation_checkpointing or quantize,
                        asked_micro_batch,
                    ),
                )
            )
        except AdvisorError:  # peft cannot wrap this model's linear layers
            return ()
    return tuple(out)
