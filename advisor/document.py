"""The plan as one JSON document: what ``--json`` prints and the Streamlit page reads (schema in README.md).

``plan_to_dict(Plan)`` builds it from a finished ``advisor.plan.Plan``; ``time_to_dict`` is one row's ``time``
object, which the CLI's table also reads. The TypedDicts below are the document's shape, key for key and in the
order the keys are written (the printed JSON keeps that order).
"""

from __future__ import annotations

import dataclasses
import time
from typing import NotRequired, TypedDict

from .explain import tokens_per_sample
from .ladder import ladder_doc
from .layout_search import layouts_doc
from .plan import Plan, training_budget
from .rows import StrategyRow, gpus_used
from .schema import echo
from .timing.error_band import ErrorBand, memory_band, time_band

SCHEMA_VERSION = 2


class ModelDoc(TypedDict):
    """``model``: what is trained, counted (parameters, bytes, FLOPs per sample) at the plan's micro-batch."""

    name: str
    family: str
    source: str
    num_params: int
    num_active_params: int  # per token: < num_params for a mixture of experts
    num_trainable_params: int
    num_frozen_params: int
    adapter: dict[str, object] | None  # AdapterSpec's fields (LoRA / QLoRA), None for full fine-tuning
    quantized_bytes: int
    buffer_bytes: int
    activation_bytes_per_sample: int
    activation_bytes: int
    flops_per_sample: int
    seq_len: int | None
    input_shape: list[int] | None
    attention: str


class HardwareDoc(TypedDict):
    """``hardware``: the cluster planned for, and where each figure came from (``sources``)."""

    gpu_name: str
    gpu_memory_bytes: int
    gpus_per_node: int
    num_nodes: int
    num_gpus: int
    interconnect: str
    network: str | None
    host_mem_bytes: int | None
    host_mem_state: str
    sources: dict[str, str]


class ErrorBandDoc(TypedDict):
    """An ``error_band``: the true figure lay within ``[figure x (1 + low), figure x (1 + high)]`` for at least 80%
    of the rows ``based_on`` names (``advisor.timing.error_band.ErrorBand``; low <= 0 <= high)."""

    low: float
    high: float
    based_on: str


class TimeDoc(TypedDict):
    """A row's ``time``: one optimizer step at the row's global batch (seconds, FLOPs and rates per GPU unless
    said), and with a training budget the whole run's hours and cost. ``error_band`` holds for ``step_s`` and
    every figure proportional to it (the hours, the cost; inverted, the rates)."""

    compute_s: float
    comm_s: float
    exposed_comm_s: float
    optimizer_s: float
    step_s: float
    micro_batch_size: int
    micro_steps: int
    samples_per_s: float | None
    samples_per_s_per_gpu: float | None
    tokens_per_s: float | None
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    model_flops_per_step: int
    flops_per_step: int
    speedup_vs_single_gpu: float | None
    scaling_efficiency: float | None
    overlap: str
    collectives: list[dict[str, object]]
    notes: list[str]
    error_band: ErrorBandDoc
    train_hours: NotRequired[float | None]
    gpu_hours: NotRequired[float | None]
    cost: NotRequired[float | None]


class DeviceOverheadDoc(TypedDict):
    cuda_context: int
    communicator: int
    fragmentation: int


class StrategyDoc(TypedDict):
    """One entry of ``strategies``: a row that does not apply has its ``reason`` (and ``time`` None) and none of
    the sizes; one that applies has every size and no ``reason``."""

    name: str
    title: str
    applicable: bool
    framework: str
    launcher: str
    reason: NotRequired[str | None]
    fits: NotRequired[bool | None]
    short_of: NotRequired[str | None]
    fit_note: NotRequired[str | None]
    load_host_bytes_per_node: NotRequired[int]
    per_gpu_bytes: NotRequired[dict[str, int]]
    memory_error_band: NotRequired[ErrorBandDoc]  # of per_gpu_bytes' total and device_total
    peak_phase: NotRequired[str]
    model_state_bytes: NotRequired[int]
    device_overhead_bytes: NotRequired[DeviceOverheadDoc]
    rule_of_thumb_bytes: NotRequired[int | None]
    rule_of_thumb_fits: NotRequired[bool | None]
    max_micro_batch_size: NotRequired[int]
    host_bytes_per_node: NotRequired[int]
    data_parallel_size: NotRequired[int]
    tp_degree: NotRequired[int]
    gradient_accumulation_steps: NotRequired[int | None]
    global_batch_size: NotRequired[int | None]
    comm_bytes_per_step: NotRequired[int]
    comm_pattern: NotRequired[str]
    time: TimeDoc | None
    learning_rate: NotRequired[float]
    deepspeed_estimate: NotRequired[dict[str, int]]
    memory_notes: NotRequired[list[str]]  # only where the rule has some (a pipeline row: every stage)
    estimate_only: NotRequired[str]  # why no script is emitted for the row (only where none is)


class RecommendationDoc(TypedDict):
    """``recommendation``: the strategy (None when nothing fits, with the smallest cluster that would)."""

    strategy: str | None
    reasons: list[str]
    warnings: list[str]
    micro_batch_size: int | None
    min_gpus: NotRequired[int | None]
    min_nodes: NotRequired[int | None]
    offload_host_bytes_per_node: NotRequired[int | None]


class TrainingDoc(TypedDict):
    precision: str | None
    optimizer: str
    micro_batch_size: int | None
    global_batch_size: int | None
    activation_checkpointing: bool
    safety_factor: float
    device: str


class TimingDoc(TypedDict):
    """``timing``: what the step times were computed with (TFLOP/s and GB/s of the GPU preset)."""

    gpu_preset: str
    peak_tflops: float
    hbm_gbps: float
    compute_efficiency: float
    bandwidth_efficiency: float
    efficiency_source: str
    source: str  # what the step times were timed with: "calibrated on this machine, <date> ..." or "preset ..."
    data_loading: str
    gpu_model: NotRequired[dict[str, object]]  # a GPU's compute-model constants (advisor.timing.gpu_model), its SMs


class PlanDoc(TypedDict):
    """The whole ``--json`` document."""

    schema_version: int
    inputs: dict[str, object]  # advisor.schema.echo: {group: {field: value}}
    model: ModelDoc
    hardware: HardwareDoc
    training: TrainingDoc
    strategies: list[StrategyDoc]
    recommendation: RecommendationDoc
    timing: TimingDoc | None
    warnings: list[str]
    # The memory-savings ladder (advisor.ladder.ladder_doc): with --ladder, or when nothing fits a GPU plan.
    ladder: NotRequired[list[dict[str, object]]]
    # The layout search (advisor.layout_search.layouts_doc), fastest first: with --top N on a GPU plan.
    layouts: NotRequired[list[dict[str, object]]]
    verify: NotRequired[dict[str, object]]  # added by the CLI after a --verify run


def time_to_dict(p: Plan, r: StrategyRow) -> TimeDoc | None:
    """A row's ``time`` object of the ``--json`` document (README, JSON schema); None when not timed."""
    t = r.time
    if t is None:
        return None
    ctx = p.context()
    assert r.global_batch_size is not None, "a timed row is sized at a global batch"
    per_s = r.global_batch_size / t.step_s if t.step_s else None
    tokens = tokens_per_sample(ctx)
    n = gpus_used(r, p.hardware.num_gpus)
    d: TimeDoc = {
        "compute_s": t.compute_s,
        "comm_s": t.comm_s,
        "exposed_comm_s": t.exposed_comm_s,
        "optimizer_s": t.optimizer_s,
        "step_s": t.step_s,
        "micro_batch_size": t.micro_batch,
        "micro_steps": t.micro_steps,
        "samples_per_s": per_s,
        "samples_per_s_per_gpu": per_s / n if per_s is not None else None,
        "tokens_per_s": per_s * tokens if per_s is not None and tokens else None,
        "tokens_per_s_per_gpu": per_s * tokens / n if per_s is not None and tokens else None,
        "mfu": t.mfu,
        "model_flops_per_step": t.model_flops,
        "flops_per_step": t.flops,
        "speedup_vs_single_gpu": t.speedup_vs_single_gpu,
        "scaling_efficiency": t.scaling_efficiency,
        "overlap": t.overlap,
        "collectives": [c.as_dict() for c in t.collectives],
        "notes": list(t.notes) + ["data loading is not modelled"],
        "error_band": band_doc(time_band_of(p, r.name)),
    }
    budget = training_budget(p.options, ctx, r)
    if budget is not None:  # always these three keys, in this order
        d["train_hours"], d["gpu_hours"], d["cost"] = budget["train_hours"], budget["gpu_hours"], budget["cost"]
    return d


def band_doc(band: ErrorBand) -> ErrorBandDoc:
    """An ``ErrorBand`` as the document's ``error_band`` object."""
    return {"low": band.low, "high": band.high, "based_on": band.based_on}


def time_band_of(p: Plan, strategy: str | None = None) -> ErrorBand:
    """The error band of the plan's step times for ``strategy`` (a row name; None: the GPU's band whatever the
    strategy) (``advisor.timing.error_band.time_band``: by the device, the GPU's generation or calibration, the
    model's workload, and whether the strategy offloads). With ``--mfu`` / ``--bandwidth-efficiency`` the band is
    still the fitted model's, and its ``based_on`` says so."""
    hw, opts = p.hardware, p.context().options
    offload = strategy is not None and p.row(strategy).strategy.offload
    band = time_band(
        p.device, hw.gpu_name, hw.gpu_memory_bytes, p.spec.family, p.spec.name, hw.gpu_model, offload=offload
    )
    if opts.mfu is not None or opts.bandwidth_efficiency is not None:
        band = dataclasses.replace(
            band,
            based_on=band.based_on + "; --mfu / --bandwidth-efficiency replaced fitted constants: this is the fitted "
            "model's band, not a measure of the values given",
        )
    return band


def memory_band_of(p: Plan) -> ErrorBand:
    """The error band of the plan's per-GPU memory figures (``advisor.timing.error_band.memory_band``)."""
    return memory_band(p.device)


def _model_doc(p: Plan) -> ModelDoc:
    prof, mb = p.profile, p.context().micro_batch_size
    act = prof.activations(p.model_mode)
    return {
        "name": p.spec.name,
        "family": p.spec.family,
        "source": p.spec.source,
        "num_params": prof.stats.num_params,
        "num_active_params": prof.stats.num_active_params,  # per token: < num_params for mixture of experts
        "num_trainable_params": prof.stats.num_trainable,
        "num_frozen_params": prof.stats.num_frozen,
        # LoRA / QLoRA: rank, alpha, dropout, targets, dtype, quantize, double_quant, compute_dtype
        "adapter": dataclasses.asdict(p.spec.adapter) if p.spec.adapter is not None else None,
        "quantized_bytes": prof.stats.quantized_bytes,
        "buffer_bytes": prof.stats.buffer_bytes,
        "activation_bytes_per_sample": act.activation_bytes_per_sample,
        "activation_bytes": act.at(mb).activations,
        "flops_per_sample": act.flops_per_sample,
        "seq_len": p.spec.seq_len,
        "input_shape": list(p.spec.input_shape) if p.spec.input_shape else None,
        "attention": act.attention,
    }


def _hardware_doc(p: Plan) -> HardwareDoc:
    hw = p.hardware
    return {
        "gpu_name": hw.gpu_name,
        "gpu_memory_bytes": hw.gpu_memory_bytes,
        "gpus_per_node": hw.gpus_per_node,
        "num_nodes": hw.num_nodes,
        "num_gpus": hw.num_gpus,
        "interconnect": hw.interconnect,
        "network": hw.network,
        "host_mem_bytes": hw.host_mem_bytes,
        "host_mem_state": hw.host_mem_state,
        "sources": dict(hw.sources),
    }


def _strategy_doc(p: Plan, r: StrategyRow) -> StrategyDoc:
    if not r.applicable:
        return {
            "name": r.name,
            "title": r.title,
            "applicable": r.applicable,
            "framework": r.strategy.framework,
            "launcher": r.strategy.launcher.name,
            "reason": r.reason,
            "time": None,
        }
    m = r.memory
    assert m is not None, "a row that applies is sized"
    d = StrategyDoc(
        name=r.name,
        title=r.title,
        applicable=r.applicable,
        framework=r.strategy.framework,
        launcher=r.strategy.launcher.name,
        fits=r.fits,
        short_of=r.short_of,
        fit_note=r.fit_note,
        load_host_bytes_per_node=r.load_host_bytes_per_node,
        per_gpu_bytes=m.peak.as_dict() | {"device_total": m.device_total},
        memory_error_band=band_doc(memory_band_of(p)),
        peak_phase=m.peak.phase,
        model_state_bytes=m.model_state_bytes,
        device_overhead_bytes={
            "cuda_context": m.overhead.cuda_context,
            "communicator": m.overhead.communicator,
            "fragmentation": m.overhead.fragmentation,
        },
        rule_of_thumb_bytes=r.rule_of_thumb_bytes,
        rule_of_thumb_fits=r.rule_of_thumb_fits,
        max_micro_batch_size=r.max_micro_batch_size,
        host_bytes_per_node=m.host_bytes_per_node,
        data_parallel_size=r.dp_size,
        tp_degree=r.tp_degree,
        gradient_accumulation_steps=r.grad_accum_steps,
        global_batch_size=r.global_batch_size,
        comm_bytes_per_step=r.comm_bytes_per_step,
        comm_pattern=r.strategy.comm_pattern,
        time=time_to_dict(p, r),
    )
    if r.learning_rate is not None:
        d["learning_rate"] = r.learning_rate
    if r.deepspeed_estimate is not None:
        d["deepspeed_estimate"] = r.deepspeed_estimate
    if m.notes:
        d["memory_notes"] = list(m.notes)
    if r.estimate_only:
        d["estimate_only"] = r.estimate_only
    return d


def _recommendation_doc(p: Plan) -> RecommendationDoc:
    rec = p.recommendation
    d: RecommendationDoc = {
        "strategy": rec.strategy,
        "reasons": rec.reasons,
        "warnings": rec.warnings,
        "micro_batch_size": rec.micro_batch_size,
    }
    if rec.strategy is None:
        d["min_gpus"], d["min_nodes"] = rec.min_gpus, rec.min_nodes
        d["offload_host_bytes_per_node"] = rec.offload_host_bytes_per_node
    return d


def timing_doc(p: Plan) -> TimingDoc | None:
    """What the step times were computed with (None: the GPU has no preset, so nothing is timed)."""
    from strategies.base import timing_of

    t = timing_of(p.context())
    if t is None:
        return None
    d: TimingDoc = {
        "gpu_preset": t.preset.name,
        "peak_tflops": t.peak_flops_per_s / 1e12,
        "hbm_gbps": t.preset.hbm_gbps,
        "compute_efficiency": t.efficiency.compute,
        "bandwidth_efficiency": t.efficiency.bandwidth,
        "efficiency_source": t.efficiency.source,
        "source": time_source(p, t.preset.name, t.efficiency.source),
        "data_loading": "not modelled",
    }
    if t.gpu_model is not None:  # a GPU's per-op model: its constants, their source and the SMs it divides by
        d["gpu_model"] = {**dataclasses.asdict(t.gpu_model), "sm_count": t.rates.sm_count}
    return d


def time_source(p: Plan, preset: str, efficiency_source: str) -> str:
    """Where the plan's step times come from, in one line: this machine's GPU calibration ("calibrated on this
    machine, <date> (...)", ``advisor calibrate``), its CPU's (a CPU verification run), a fit's trial constants
    (``Hardware.gpu_model``'s own source), or the GPU preset's fitted constants ("preset <name>: <source>")."""
    hw = p.hardware
    if hw.gpu_model is not None:
        return hw.gpu_model.source
    if hw.calibration is not None:
        cal = hw.calibration
        date = time.strftime("%Y-%m-%d", time.gmtime(cal.measured_at)) if cal.measured_at else "date unknown"
        return f"measured on this machine's CPU, {date} ({cal.cpu}, {cal.ranks} rank(s); advisor.timing.calibrate)"
    return f"preset {preset}: {efficiency_source}"


def plan_to_dict(p: Plan) -> PlanDoc:
    """The ``--json`` document (schema in README.md) of a finished plan, keys in print order."""
    opts = p.options
    doc: PlanDoc = {
        "schema_version": SCHEMA_VERSION,
        "inputs": echo(p.inputs),
        "model": _model_doc(p),
        "hardware": _hardware_doc(p),
        "training": {
            "precision": opts.precision,
            "optimizer": opts.optimizer,
            "micro_batch_size": opts.micro_batch_size,
            "global_batch_size": opts.global_batch_size,
            "activation_checkpointing": opts.activation_checkpointing,
            "safety_factor": opts.safety_factor,
            "device": p.device,
        },
        "strategies": [_strategy_doc(p, r) for r in p.rows],
        "recommendation": _recommendation_doc(p),
        "timing": timing_doc(p),
        "warnings": p.warnings,
    }
    if p.ladder is not None:
        doc["ladder"] = ladder_doc(p.ladder)
    if p.layouts is not None:
        doc["layouts"] = layouts_doc(p.layouts, p.options.top or 0, p.planned_key(), p.spec.tp_capable)
    return doc
