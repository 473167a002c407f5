"""LoRA and QLoRA in words: what the adapter is (``adapter_text``), and how a LoRA plan compares with full fine-tuning
of the same model (``versus_full``) or a full fine-tuning that fits nowhere with LoRA / QLoRA (``alternative_reason``),
with the figures of the rows ``advisor.plan`` sized for each (``advisor.candidates.Alternative``)."""

from __future__ import annotations

from .candidates import Alternative, eligible, fastest_fitting, sized
from .context import StrategyContext
from .hardware import Hardware
from .models import AdapterSpec, recipe_flags
from .rows import StrategyRow
from .units import fmt_count, fmt_gib


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
    assert a is not None, "a LoRA plan"
    where = "all linear layers" if a.targets == ("all-linear",) else a.targets_text
    return f"rank {a.rank} on {where}: {fmt_count(ctx.profile.stats.num_trainable)} trainable parameters"


def _quantized_text(a: AdapterSpec) -> str:
    return f"{a.quantize}{' + double quantization' if a.double_quant else ''}"


def _adapter_detail(ctx: StrategyContext) -> str:
    """``adapter_text`` for a sentence that names LoRA / QLoRA already: ``nf4, rank 16 on q_proj,v_proj: 8.39M
    trainable parameters``."""
    a = ctx.profile.spec.adapter
    assert a is not None, "a LoRA plan"
    return f"{_quantized_text(a)}, {_rank_text(ctx)}" if a.quantize else _rank_text(ctx)


def _cluster_text(hw: Hardware) -> str:
    return f"{hw.num_gpus} x {hw.gpu_name}"


def versus_full(ctx: StrategyContext, best: StrategyRow, full: Alternative) -> str:
    """LoRA beside full fine-tuning: ``... fits DDP on 4 x RTX4090 (17.94 GiB per GPU), where full fine-tuning would
    need ZeRO-3 (7.83 GiB)`` / ``does not fit on this cluster (the smallest: ...)``."""
    hw = ctx.hardware
    head = (
        f"{adapter_text(ctx)}; fits {best.title} on {_cluster_text(hw)} ({fmt_gib(sized(best).device_total)} per GPU)"
    )
    fit = fastest_fitting(eligible(full.rows, hw.num_gpus))
    if fit is None:
        small = [r for r in eligible(full.rows, hw.num_gpus) if r.applicable and r.memory and not r.strategy.offload]
        low = min(small, key=lambda r: sized(r).device_total) if small else None
        tail = (
            f" (the smallest without offload: {low.title}, {fmt_gib(sized(low).device_total)} per GPU)" if low else ""
        )
        return f"{head}, where {full.label} does not fit on this cluster{tail}"
    if fit.name == best.name:
        return f"{head}; {full.label} would fit it too ({fmt_gib(sized(fit).device_total)} per GPU)"
    return f"{head}; {full.label} fits here too, fastest with {fit.title} ({fmt_gib(sized(fit).device_total)} per GPU)"


def alternative_reason(ctx: StrategyContext, alt: Alternative) -> str:
    """Nothing fits with full fine-tuning: what LoRA / QLoRA would need, with the figures."""
    hw = ctx.hardware
    text = _adapter_detail(alt.ctx)
    fit = fastest_fitting(eligible(alt.rows, hw.num_gpus), offload=False)
    if fit is not None:
        a = alt.ctx.profile.spec.adapter
        flags = f" ({recipe_flags(bool(a.quantize))})" if a is not None and a.targets == ("all-linear",) else ""
        return (
            f"fine-tune with {alt.label} instead ({text}): {fit.title} then fits without offload, "
            f"{fmt_gib(sized(fit).device_total)} of {fmt_gib(hw.gpu_memory_bytes)} per GPU{flags}"
        )
    small = [r for r in eligible(alt.rows, hw.num_gpus) if r.applicable and r.memory and not r.strategy.offload]
    if not small:
        return f"{alt.label} ({text}) does not apply here either"
    low = min(small, key=lambda r: sized(r).device_total)
    return (
        f"{alt.label} ({text}) would not fit either: the smallest without offload, {low.title}, needs "
        f"{fmt_gib(sized(low).device_total)} per GPU"
    )
