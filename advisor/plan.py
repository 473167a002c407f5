"""The one pure entry point: ``plan(PlanInputs) -> Plan``. The CLI and the Streamlit page only parse
input, call this and render the result."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .errors import AdvisorError
from .hardware import Hardware, resolve_hardware
from .memory import StrategyMemory
from .models import ModelSpec, resolve_model
from .options import StrategyContext, TrainingOptions
from .profile import ModelProfile, build_profile

SCHEMA_VERSION = 1
MAX_SEARCH_MICRO_BATCH = 1 << 16
# GPUs on which FlashAttention-2 runs (compute capability >= 8.0, FlashAttention README).
_FLASH_GPUS = ("a100", "h100", "h200", "a10", "l4", "rtx3090", "rtx4090", "3090", "4090", "l40", "a6000", "b200")


@dataclass(frozen=True)
class PlanInputs:
    """Everything the user chose. Exactly one model source: ``model`` (name), ``config_path``,
    ``config_dict`` (pasted JSON, already parsed) or ``model_factory``."""

    model: str | None = None
    config_path: str | None = None
    config_dict: dict | None = None
    config_source: str | None = None  # where config_dict came from (an uploaded file's name), for messages
    model_factory: str | None = None
    input_shape: tuple[int, ...] | None = None  # per-sample input of a --model-factory model
    seq_len: int | None = None
    image_size: int | None = None
    training: TrainingOptions = field(default_factory=TrainingOptions)
    gpu: str | None = None
    gpu_mem_gib: float | None = None
    gpus: int | None = None
    nodes: int = 1
    interconnect: str | None = None
    network: str | None = None
    host_mem_gib: float | None = None
    compare: bool = False
    detect_hardware: bool = True


@dataclass
class StrategyRow:
    name: str
    title: str
    applicable: bool
    reason: str | None = None
    fits: bool = False
    memory: StrategyMemory | None = None
    rule_of_thumb_bytes: int | None = None  # after the safety factor
    rule_of_thumb_fits: bool | None = None
    max_micro_batch_size: int = 0
    dp_size: int = 0
    tp_degree: int = 1
    grad_accum_steps: int | None = None
    global_batch_size: int | None = None
    comm_bytes_per_step: int = 0
    deepspeed_estimate: dict[str, int] | None = None
    learning_rate: float | None = None


@dataclass
class Recommendation:
    strategy: str | None
    reasons: list[str]
    warnings: list[str] = field(default_factory=list)
    min_gpus: int | None = None
    min_nodes: int | None = None
    offload_host_bytes_per_node: int | None = None


@dataclass
class Plan:
    inputs: PlanInputs
    spec: ModelSpec
    profile: ModelProfile
    hardware: Hardware
    options: TrainingOptions  # with defaults resolved (micro-batch size)
    attention: str  # the kernel assumed, resolved from "auto"
    device: str
    rows: list[StrategyRow]
    recommendation: Recommendation
    warnings: list[str]

    def row(self, name: str) -> StrategyRow:
        return next(r for r in self.rows if r.name == name)

    def context(self) -> StrategyContext:
        return StrategyContext(self.profile, self.hardware, self.options, self.device)


def attention_dropout(spec: ModelSpec) -> float:
    """The attention-probability dropout of a transformers config (its class default when unset)."""
    if not spec.is_transformer:
        return 0.0
    from .models import hf_config

    config = hf_config(spec)
    for key in ("attn_pdrop", "attention_probs_dropout_prob", "attention_dropout"):
        value = getattr(config, key, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def resolve_attention(choice: str, device: str, gpu_name: str, precision: str, dropout: float = 0.0) -> str:
    """``auto`` -> the kernel PyTorch SDPA would pick on the target: FlashAttention-2 for half
    precision on Ampere or newer; the memory-efficient kernel otherwise on CUDA (also O(s) memory);
    on CPU the fused flash kernel (engineering notes: CPU SDPA keeps only outputs and log-sum-exp),
    except with attention dropout, where CPU SDPA falls back to the math path and keeps the s x s
    probabilities and the dropout mask (measured: gpt2 at seq 1024 peaks at 5305 MiB on CPU; the
    math-kernel estimate is 5305 MiB, the fused one 3686 MiB)."""
    if choice != "auto":
        return choice
    if device == "cpu":
        return "math" if dropout > 0 else "flash"
    name = gpu_name.lower().replace(" ", "").replace("-", "")
    if precision != "fp32" and any(g in name for g in _FLASH_GPUS):
        return "flash"
    return "mem-efficient"


def default_micro_batch(spec: ModelSpec) -> int:
    return 1 if spec.is_transformer else 32


def plan(inputs: PlanInputs, device: str = "cuda", hardware: Hardware | None = None) -> Plan:
    """Resolve the model and hardware, trace, size every strategy, recommend one.

    Args:
        device: "cuda" to plan for GPUs; "cpu" to estimate a CPU verification run (no CUDA
            context or NCCL buffers, the CPU attention kernel and optimizer loop).
        hardware: use this instead of resolving it from ``inputs`` (verification runs).

    Raises:
        AdvisorError: any bad input, with a one-line message.
    """
    from strategies import STRATEGIES  # strategies depend on advisor's lower layers, not on plan

    opts = inputs.training
    opts.validate()
    spec = resolve_model(inputs.model, config_path=inputs.config_path, config_dict=inputs.config_dict,
                         config_source=inputs.config_source, factory=inputs.model_factory, seq_len=inputs.seq_len, image_size=inputs.image_size,
                         input_shape=inputs.input_shape)
    if inputs.seq_len is not None and not spec.is_transformer:
        raise AdvisorError(f"--seq-len applies to transformer models; {spec.name} takes --image-size")
    if inputs.image_size is not None and spec.is_transformer:
        raise AdvisorError(f"--image-size applies to vision models; {spec.name} takes --seq-len")
    hw = hardware or resolve_hardware(gpu=inputs.gpu, gpu_mem_gib=inputs.gpu_mem_gib, gpus=inputs.gpus,
                                      nodes=inputs.nodes, interconnect=inputs.interconnect,
                                      network=inputs.network, host_mem_gib=inputs.host_mem_gib,
                                      detect=inputs.detect_hardware)
    if opts.tp_degree and opts.tp_degree > hw.gpus_per_node:
        raise AdvisorError(f"--tp-degree {opts.tp_degree} exceeds the {hw.gpus_per_node} GPUs per node: "
                           "tensor parallelism stays inside one node")
    if opts.tp_degree and hw.num_gpus % opts.tp_degree:
        raise AdvisorError(f"--tp-degree {opts.tp_degree} does not divide {hw.num_gpus} GPUs "
                           f"({hw.gpus_per_node} per node x {hw.num_nodes} nodes)")
    attention = resolve_attention(opts.attention, device, hw.gpu_name, opts.precision,
                                  attention_dropout(spec) if device == "cpu" else 0.0)
    opts = replace(opts, micro_batch_size=opts.micro_batch_size or default_micro_batch(spec))
    per_step = opts.micro_batch_size * hw.num_gpus
    if opts.global_batch_size and opts.global_batch_size % per_step:
        raise AdvisorError(f"--global-batch-size {opts.global_batch_size} is not a multiple of micro-batch "
                           f"{opts.micro_batch_size} x {hw.num_gpus} GPUs = {per_step}: use a multiple of {per_step} "
                           "or another --micro-batch-size")
    profile = build_profile(spec, attention, opts.activation_checkpointing)
    ctx = StrategyContext(profile, hw, opts, device)
    rows = [_evaluate(s, ctx, inputs.compare) for s in STRATEGIES]
    warnings = list(spec.warnings) + list(hw.warnings)
    if opts.activation_checkpointing and profile.activations(_any_mode(opts.precision)).checkpointed_blocks == 0:
        warnings.append(f"{spec.name} has no repeated blocks to checkpoint: activation checkpointing changes nothing")
    warnings += _ignored_flags(opts, profile, rows)
    from .recommend import recommend

    rec = recommend(ctx, rows, STRATEGIES)
    return Plan(inputs=inputs, spec=spec, profile=profile, hardware=hw, options=opts, attention=attention,
                device=device, rows=rows, recommendation=rec, warnings=warnings)


def _ignored_flags(opts: TrainingOptions, profile, rows: list) -> list[str]:
    """Flags the user set that cannot change this model's answer: said, not silently dropped."""
    out = []
    act = profile.activations(_any_mode(opts.precision))
    if opts.attention != "auto" and not act.uses_sdpa:
        out.append(f"--attention {opts.attention} changes nothing: {profile.spec.name} calls no "
                   "scaled-dot-product attention")
    elif opts.attention != "auto" and act.attention.startswith("eager"):
        out.append(f"--attention {opts.attention} changes nothing: {profile.spec.name} runs its own (eager) "
                   "attention, which keeps the s x s scores")
    tp = [r for r in rows if r.name in ("tp", "tp_dp")]
    if opts.tp_degree and tp and not any(r.applicable for r in tp):
        out.append(f"--tp-degree {opts.tp_degree} is not used: {tp[0].reason}")
    return out


def _any_mode(precision: str) -> str:
    return "fp32" if precision == "fp32" else "half" if precision == "pure-bf16" else "autocast"


def fits(memory: StrategyMemory, hw: Hardware) -> bool:
    """Device total within the usable GPU memory and offload within host RAM."""
    host_ok = memory.host_bytes_per_node <= hw.host_mem_bytes or hw.host_mem_bytes == 0
    return memory.device_total <= hw.gpu_memory_bytes and host_ok


def max_micro_batch(strategy, ctx: StrategyContext) -> int:
    """Largest micro-batch whose device total fits the GPU (0 when even 1 does not). Doubling then
    bisection; device total is non-decreasing in the micro-batch."""
    limit = ctx.hardware.gpu_memory_bytes

    def ok(b: int) -> bool:
        return strategy.memory(ctx, b).device_total <= limit

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_SEARCH_MICRO_BATCH and ok(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_SEARCH_MICRO_BATCH:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _evaluate(strategy, ctx: StrategyContext, compare: bool) -> StrategyRow:
    row = StrategyRow(name=strategy.name, title=strategy.title, applicable=True)
    reason = strategy.not_applicable(ctx)
    if reason:
        row.applicable, row.reason = False, reason
        return row
    opts, hw = ctx.options, ctx.hardware
    row.memory = strategy.memory(ctx, opts.micro_batch_size)
    row.fits = fits(row.memory, hw)
    rule = int(strategy.rule_of_thumb_bytes(ctx) * opts.safety_factor)
    row.rule_of_thumb_bytes, row.rule_of_thumb_fits = rule, rule <= hw.gpu_memory_bytes
    row.max_micro_batch_size = max_micro_batch(strategy, ctx)
    row.dp_size = strategy.dp_size(ctx)
    row.tp_degree = hw.num_gpus // row.dp_size if row.dp_size else 1
    row.comm_bytes_per_step = strategy.comm_bytes_per_step(ctx)
    per_step = opts.micro_batch_size * row.dp_size
    target = opts.global_batch_size or per_step
    row.grad_accum_steps = max(1, -(-target // per_step))
    row.global_batch_size = row.grad_accum_steps * per_step
    if opts.base_lr is not None:
        # Linear scaling rule (Goyal et al. 2017; field notes 000 section 3.4): lr x (global / base).
        row.learning_rate = opts.base_lr * row.global_batch_size / opts.base_batch_size
    if compare and strategy.name.startswith("zero") and strategy.name != "zero1":
        row.deepspeed_estimate = deepspeed_model_states(strategy, ctx)
    return row


def deepspeed_model_states(strategy, ctx: StrategyContext) -> dict[str, int]:
    """DeepSpeed's own model-state estimators (non-printing functions), for comparison.

    ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``;
    they assume fp16/bf16 + Adam and ignore activations and buffers.
    """
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    stats, hw = ctx.profile.stats, ctx.hardware
    if strategy.name.startswith("zero2"):
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        cpu, gpu = estimate_zero2_model_states_mem_needs(stats.num_params, hw.gpus_per_node, hw.num_nodes,
                                                         cpu_offload=strategy.offload)
    else:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(stats.num_params, stats.largest_module_params,
                                                            hw.gpus_per_node, hw.num_nodes,
                                                            cpu_offload=strategy.offload,
                                                            cpu_offload_params=strategy.offload)
    return {"gpu_bytes": int(gpu), "host_bytes_per_node": int(cpu)}


def plan_to_dict(p: Plan) -> dict[str, Any]:
    """The ``--json`` document (schema in README.md)."""
    prof, hw, opts = p.profile, p.hardware, p.options
    act = prof.activations(_any_mode(opts.precision))
    model = {
        "name": p.spec.name,
        "family": p.spec.family,
        "source": p.spec.source,
        "num_params": prof.stats.num_params,
        "num_trainable_params": prof.stats.num_trainable,
        "num_frozen_params": prof.stats.num_frozen,
        "buffer_bytes": prof.stats.buffer_bytes,
        "activation_bytes_per_sample": act.activation_bytes_per_sample,
        "activation_bytes": act.at(opts.micro_batch_size).activations,
        "flops_per_sample": prof.flops_per_sample(_any_mode(opts.precision)),
        "seq_len": p.spec.seq_len,
        "input_shape": list(p.spec.input_shape) if p.spec.input_shape else None,
        "attention": act.attention,
    }
    hardware = {
        "gpu_name": hw.gpu_name,
        "gpu_memory_bytes": hw.gpu_memory_bytes,
        "gpus_per_node": hw.gpus_per_node,
        "num_nodes": hw.num_nodes,
        "num_gpus": hw.num_gpus,
        "interconnect": hw.interconnect,
        "network": hw.network,
        "host_mem_bytes": hw.host_mem_bytes,
        "sources": dict(hw.sources),
    }
    strategies = []
    for r in p.rows:
        d: dict[str, Any] = {"name": r.name, "title": r.title, "applicable": r.applicable}
        if not r.applicable:
            d["reason"] = r.reason
            strategies.append(d)
            continue
        m = r.memory
        d.update(
            fits=r.fits,
            per_gpu_bytes=m.peak.as_dict() | {"device_total": m.device_total},
            peak_phase=m.peak.phase,
            model_state_bytes=m.model_state_bytes,
            device_overhead_bytes={"cuda_context": m.overhead.cuda_context, "communicator": m.overhead.communicator,
                                   "fragmentation": m.overhead.fragmentation},
            rule_of_thumb_bytes=r.rule_of_thumb_bytes,
            rule_of_thumb_fits=r.rule_of_thumb_fits,
            max_micro_batch_size=r.max_micro_batch_size,
            host_bytes_per_node=m.host_bytes_per_node,
            data_parallel_size=r.dp_size,
            tp_degree=r.tp_degree,
            gradient_accumulation_steps=r.grad_accum_steps,
            global_batch_size=r.global_batch_size,
            comm_bytes_per_step=r.comm_bytes_per_step,
        )
        if r.learning_rate is not None:
            d["learning_rate"] = r.learning_rate
        if r.deepspeed_estimate is not None:
            d["deepspeed_estimate"] = r.deepspeed_estimate
        strategies.append(d)
    rec = p.recommendation
    recommendation: dict[str, Any] = {"strategy": rec.strategy, "reasons": rec.reasons, "warnings": rec.warnings}
    if rec.strategy is None:
        recommendation.update(min_gpus=rec.min_gpus, min_nodes=rec.min_nodes,
                              offload_host_bytes_per_node=rec.offload_host_bytes_per_node)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": model,
        "hardware": hardware,
        "training": {
            "precision": opts.precision,
            "optimizer": opts.optimizer,
            "micro_batch_size": opts.micro_batch_size,
            "global_batch_size": opts.global_batch_size,
            "activation_checkpointing": opts.activation_checkpointing,
            "safety_factor": opts.safety_factor,
            "device": p.device,
        },
        "strategies": strategies,
        "recommendation": recommendation,
        "warnings": p.warnings,
    }
