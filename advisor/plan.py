"""The one pure entry point: ``plan(PlanInputs) -> Plan``. The CLI, the Streamlit page and bench only
parse input, call this and render the result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from strategies import PINNED, planned_strategies

from .applied_options import apply_options, refuse_accumulation, script_note
from .cache import open_cache
from .choices import Attention, Device, Dtype, Precision, Quant, TraceMode
from .context import StrategyContext
from .errors import AdvisorError
from .explain import tokens_per_sample
from .flag_notes import flag_notes
from .free_text import lora_targets
from .hardware import Hardware, resolve_hardware, with_gpu_calibration
from .invariants import enforce
from .ladder import Ladder, ladder_for_plan
from .layout_search import LayoutCandidate, PlannedKey, search_for_plan
from .memory import trace_mode
from .models import AdapterSpec, ModelSpec, family_of, resolve_source
from .models.adapters import default_targets
from .models.limits import HIDDEN_KEYS, as_int, config_get
from .profile import ModelProfile, attention_dropout, build_profile
from .recommend import choose_micro_batch, recommend
from .rows import (
    Recommendation,
    StrategyRow,
    batch_ranks,
    evaluate_row,
    gpus_used,
    one_gpu_step_times,
    single_gpu_step_s,
    with_speedup,
)
from .schema import PlanInputs, validate
from .training_options import LORA_ALPHA, LORA_DROPOUT, TrainingOptions
from .units import counted, fmt_count
from .variants import alternatives, checkpointed, checkpointing_not_needed

if TYPE_CHECKING:
    from strategies.base import Strategy

# GPUs on which FlashAttention-2 runs (compute capability >= 8.0, FlashAttention README).
_FLASH_GPUS = (
    "a100",
    "h100",
    "h200",
    "a10",
    "l4",
    "rtx3090",
    "rtx4090",
    "3090",
    "4090",
    "l40",
    "a6000",
    "6000ada",
    "b200",
)


@dataclass
class Plan:
    inputs: PlanInputs
    spec: ModelSpec
    profile: ModelProfile
    hardware: Hardware
    options: TrainingOptions  # with defaults resolved (micro-batch size)
    attention: Attention  # the kernel assumed, resolved from "auto"
    device: Device
    rows: list[StrategyRow]
    recommendation: Recommendation
    warnings: list[str]
    # The ladder of memory savings (advisor.ladder): with --ladder, or when nothing fits a GPU plan; else None.
    ladder: Ladder | None = None
    # The layout search (advisor.layout_search), fastest first: with --top on a GPU plan; else None.
    layouts: list[LayoutCandidate] | None = None

    def row(self, name: str) -> StrategyRow:
        """Raises KeyError for a strategy the plan has no row for."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def planned_key(self) -> PlannedKey | None:
        """The recommended row as the layout search names its candidates (``advisor.layout_search.PlannedKey``);
        None when nothing is recommended."""
        name = self.recommendation.strategy
        if not name:
            return None
        r = self.row(name)
        pp = (self.options.pp_degree or 1) if r.strategy in PINNED else 1  # only the pipeline row has stages
        return (name, r.tp_degree, pp, self.options.micro_batch_size or 1, self.options.activation_checkpointing)

    def context(self) -> StrategyContext:
        return StrategyContext(self.profile, self.hardware, self.options, self.device)

    @property
    def model_mode(self) -> TraceMode:
        """The trace mode of the model-level figures (activations per sample, FLOPs, attention label):
        the precision as autocast-style scripts run it (``advisor.memory.trace_mode``)."""
        return trace_mode(self.options.precision, casts_weights=False)


def resolve_attention(
    choice: Attention, device: Device, gpu_name: str, precision: Precision, dropout: float = 0.0
) -> Attention:
    """``auto`` -> the kernel PyTorch SDPA would pick on the target: FlashAttention-2 for half
    precision on Ampere or newer; the memory-efficient kernel otherwise on CUDA (also O(s) memory);
    on CPU the fused flash kernel (engineering notes: CPU SDPA keeps only outputs and log-sum-exp),
    except with attention dropout, where CPU SDPA falls back to the math path and keeps the s x s
    probabilities and the dropout mask (measured: gpt2 at seq 1024 peaks at 5305 MiB on CPU; the
    math-kernel estimate is 5305 MiB, the fused one 3686 MiB)."""
    if choice != Attention.AUTO:
        return choice
    if device == Device.CPU:
        return Attention.MATH if dropout > 0 else Attention.FLASH
    name = gpu_name.lower().replace(" ", "").replace("-", "")
    if precision != Precision.FP32 and any(g in name for g in _FLASH_GPUS):
        return Attention.FLASH
    return Attention.MEM_EFFICIENT


# Pure bf16 keeps no fp32 master weights: bf16 has 8 significant bits, so a weight moves only by an update of at least
# half its spacing, 2**-9 of its size; Zamirai et al. 2020 ("Revisiting BFloat16 Training", section 3) show the lost
# updates and fix them with stochastic rounding or Kahan summation.
PURE_BF16_NOTE = (
    "--precision pure-bf16: no fp32 master weights, so an update smaller than about 0.2% of a weight "
    "(half a bf16 step) rounds away; at a fine-tuning learning rate (1e-5 to 1e-4) most AdamW updates "
    "are lost (Zamirai et al. 2020): use bf16 mixed precision, or Kahan summation / stochastic rounding"
)


def resolve_precision(opts: TrainingOptions, hw: Hardware) -> tuple[TrainingOptions, list[str]]:
    """The precision to plan: the user's, else bf16 mixed precision, or fp16 mixed precision on a GPU
    without bf16 tensor cores (V100, T4: compute capability below 8.0; NVIDIA's Volta and Turing
    whitepapers list fp16 tensor cores only), with a note saying so.

    Raises:
        AdvisorError: bf16 or pure-bf16 asked for on a GPU known to lack bf16.
    """
    if opts.precision is None:
        if hw.supports_bf16 is False:
            return replace(opts, precision=Precision.FP16), [
                f"{hw.gpu_name} has no bf16 tensor cores: planning fp16 mixed precision (with loss scaling)"
            ]
        return replace(opts, precision=Precision.BF16), []
    if opts.precision.uses_bf16 and hw.supports_bf16 is False:
        raise AdvisorError(
            f"--precision {opts.precision}: {hw.gpu_name} has no bf16 tensor cores (bf16 needs "
            "compute capability 8.0, Ampere or newer): use --precision fp16 or fp32"
        )
    return opts, []


def resolve_adapter(opts: TrainingOptions, spec: ModelSpec) -> tuple[ModelSpec, TrainingOptions, list[str]]:
    """``--lora-rank`` and its flags as ``spec.adapter`` (``advisor.models.AdapterSpec``), with the notes the
    output gives: what the frozen base is held in, and for QLoRA that ``prepare_model_for_kbit_training`` turns on
    activation checkpointing by default (``use_gradient_checkpointing=True``), which the plan then models.

    Raises:
        AdvisorError: LoRA on a vision or custom model without ``--lora-targets`` (peft has no default targets
            for them), or ``--quantize`` on a model transformers does not load (bitsandbytes quantizes in
            ``from_pretrained``).
    """
    if opts.lora_rank is None:
        return spec, opts, []
    targets = lora_targets(opts.lora_targets) or (default_targets(spec.model_type) if spec.is_transformer else ())
    if not targets:
        what = f"{spec.family} models" if not spec.is_transformer else f"model type {spec.model_type}"
        raise AdvisorError(
            f"--lora-rank on {spec.name}: peft has no default LoRA targets for {what}; give "
            "--lora-targets with module names (for example fc,conv1) or all-linear"
        )
    if opts.quantize and not spec.is_transformer:
        raise AdvisorError(
            f"--quantize needs a transformers model (bitsandbytes quantizes the base as "
            f"from_pretrained loads it); {spec.name} is a {spec.family} model: drop --quantize"
        )
    compute = opts.bnb_compute_dtype or (opts.precision or Precision.BF16).compute_dtype  # unresolved: as bf16
    adapter = AdapterSpec(
        rank=opts.lora_rank,
        alpha=LORA_ALPHA if opts.lora_alpha is None else opts.lora_alpha,
        dropout=LORA_DROPOUT if opts.lora_dropout is None else opts.lora_dropout,
        targets=targets,
        dtype=opts.lora_dtype,
        quantize=opts.quantize,
        double_quant=opts.double_quant,
        compute_dtype=compute,
    )
    notes = []
    hidden = as_int(config_get(spec.config or {}, HIDDEN_KEYS, 0) or 0) if spec.is_transformer else 0
    if hidden and 2 * opts.lora_rank >= hidden:  # r x d + d x r adapter parameters (Hu et al. 2021, section 4.1)
        notes.append(
            f"--lora-rank {opts.lora_rank} is at least half the hidden size {hidden}: each adapted {hidden} x {hidden} "
            f"weight gets {2 * opts.lora_rank * hidden:,} adapter parameters against its own {hidden**2:,}; LoRA "
            "ranks are usually 8-64"
        )
    if opts.quantize:
        bits = "8" if opts.quantize == Quant.INT8 else "4"
        notes.append(
            f"QLoRA: the frozen base's linear layers are held in {bits} bits ({opts.quantize}"
            f"{', double quantization' if opts.double_quant else ''}, computing in {compute}); "
            "prepare_model_for_kbit_training keeps every other parameter (embeddings, norms, LM head) in fp32"
        )
        if not opts.activation_checkpointing:
            notes.append(
                "QLoRA: planned with activation checkpointing on, as prepare_model_for_kbit_training turns "
                "it on by default (use_gradient_checkpointing=True); the generated script checkpoints the "
                "blocks itself (non-reentrant)"
            )
            opts = replace(opts, activation_checkpointing=True)
    elif opts.precision in (Precision.BF16, Precision.FP16, Precision.PURE_BF16):
        half = Dtype.FP16 if opts.precision == Precision.FP16 else Dtype.BF16
        notes.append(
            f"LoRA: the frozen base is held in {half} (from_pretrained(..., dtype={half})); the adapters, "
            "their gradients and optimizer states are sized in the dtype each strategy keeps them in"
        )
    return replace(spec, adapter=adapter), opts, notes


def plan(inputs: PlanInputs, device: Device = Device.CUDA, hardware: Hardware | None = None) -> Plan:
    """Resolve the model and hardware, trace, size every strategy, recommend one. A GPU plan is timed with this
    machine's stored calibration of its GPU where there is one (``advisor.hardware.with_gpu_calibration``).

    Args:
        device: "cuda" to plan for GPUs; "cpu" to estimate a CPU verification run (no CUDA
            context or NCCL buffers, the CPU attention kernel and optimizer loop).
        hardware: use this instead of resolving it from ``inputs`` (verification runs).

    Raises:
        AdvisorError: any bad input, with a one-line message.
    """
    validate(inputs)
    opts = inputs.training
    spec = resolve_source(inputs.source)
    hw = hardware or resolve_hardware(inputs.cluster)
    if opts.tp_degree and opts.tp_degree > hw.gpus_per_node:
        raise AdvisorError(
            f"--tp-degree {opts.tp_degree} exceeds the {hw.gpus_per_node} GPUs per node: "
            "tensor parallelism stays inside one node"
        )
    if opts.tp_degree and hw.num_gpus % opts.tp_degree:
        raise AdvisorError(
            f"--tp-degree {opts.tp_degree} does not divide {hw.num_gpus} GPUs "
            f"({hw.gpus_per_node} per node x {counted(hw.num_nodes, 'node')})"
        )
    opts, precision_notes = resolve_precision(opts, hw)
    precision = opts.precision
    assert precision is not None, "resolve_precision resolves it"
    spec, opts, adapter_notes = resolve_adapter(opts, spec)
    precision_notes += adapter_notes
    family = family_of(spec)
    cache = open_cache(inputs.use_cache)
    if device == Device.CUDA:  # this machine's calibration of the GPU, when one is stored (advisor calibrate)
        hw = with_gpu_calibration(hw, precision, cache)
    micro_batch = opts.micro_batch_size or family.default_micro_batch
    opts = replace(opts, micro_batch_size=micro_batch)
    ranks = batch_ranks(opts, hw.num_gpus)
    per_step = micro_batch * ranks
    # With --top the search sizes every layout whose data-parallel size splits the batch; the rows that cannot are
    # n/a with the reason (advisor.rows.evaluate_row).
    if opts.global_batch_size and opts.global_batch_size % per_step and not opts.top:
        over = f"{hw.num_gpus} GPUs" if ranks == hw.num_gpus else f"{ranks} data-parallel ranks (GPUs / tp x pp)"
        raise AdvisorError(
            f"--global-batch-size {opts.global_batch_size} is not a multiple of micro-batch "
            f"{opts.micro_batch_size} x {over} = {per_step}: use a multiple of {per_step}"
            + (", another --micro-batch-size" if opts.global_batch_size % ranks == 0 else "")
            + ", or fewer data-parallel ranks: a tensor- or pipeline-parallel degree (the layout search tries them)"
        )
    dropout = attention_dropout(spec, cache) if device == Device.CPU else 0.0
    attention = resolve_attention(opts.attention, device, hw.gpu_name, precision, dropout)
    # oneDNN's convolution scratch exists only in CPU runs (cuDNN has none of it): GPU plans ignore the field.
    scratch_threads = hw.cpu_conv_scratch_threads if device == Device.CPU else 0
    profile = build_profile(
        spec, attention, opts.activation_checkpointing, cache=cache, cpu_conv_scratch_threads=scratch_threads
    )
    ctx = StrategyContext(profile, hw, opts, device)
    strategies = planned_strategies(opts)
    # the rows the user asked for by a degree: one of them must apply (PP x ZeRO-1 is n/a alone at 1 replica)
    pinned = [s.fine_tuning_blocker(ctx) or s.not_applicable(ctx) for s in PINNED if s.pinned(opts)]
    if pinned and all(pinned):
        raise AdvisorError(str(pinned[0]))
    rows = [evaluate_row(s, ctx, inputs.compare) for s in strategies]
    if not any(r.applicable for r in rows):
        reasons = list(dict.fromkeys(r.reason for r in rows if r.reason is not None))  # each row has its reason
        raise AdvisorError(
            "no strategy applies to these choices ("
            + "; ".join(reasons[:3])
            + (
                "): change --global-batch-size or --micro-batch-size"
                if any("--global-batch-size" in r for r in reasons)
                else "): change --framework or --precision"
            )
        )
    mb_note, asked_micro_batch = None, opts.micro_batch_size  # the user's, else the family's default
    if inputs.training.micro_batch_size is None and device == Device.CUDA:
        # Unless the user set it, the micro-batch with the best throughput among those that fit.
        chosen = choose_micro_batch(ctx, rows)
        if chosen is not None:
            mb_note = chosen[1]
            if chosen[0] != opts.micro_batch_size:
                mb_note += f" (advisor's default for {spec.family} models is {opts.micro_batch_size})"
                if opts.global_batch_size is None:
                    mb_note += (
                        "; without --global-batch-size the global batch grows with it: pass --global-batch-size "
                        "(and --micro-batch-size) to keep your recipe's batch size and learning rate"
                    )
                opts = replace(opts, micro_batch_size=chosen[0])
                ctx = StrategyContext(profile, hw, opts, device)
                hints = {r.name: r.max_micro_batch_size for r in rows}
                rows = [evaluate_row(s, ctx, inputs.compare, hints.get(s.name)) for s in strategies]
    refuse_accumulation(opts, rows)
    rows = apply_options(ctx, rows, cache, scratch_threads)  # the memory options the user passed, by the ladder's rules
    if not any(r.applicable for r in rows):
        reasons = list(dict.fromkeys(r.reason for r in rows if r.reason is not None))
        raise AdvisorError("no strategy takes these options (" + "; ".join(reasons[:3]) + ")")
    _add_speedups(ctx, rows, strategies)
    mode = trace_mode(precision, casts_weights=False)
    warnings = list(spec.warnings) + list(hw.warnings) + precision_notes
    if attention == Attention.FLASH and resolve_attention(Attention.AUTO, device, hw.gpu_name, precision) != attention:
        warnings.append(
            f"--attention flash: FlashAttention needs an Ampere or newer GPU and 16-bit inputs, and PyTorch's SDPA "
            f"picks the memory-efficient kernel on {hw.gpu_name} with {precision}: planned as flash, as asked "
            "(forcing the flash backend there raises 'No available kernel')"
        )
    if opts.activation_checkpointing and profile.activations(mode).checkpointed_blocks == 0:
        warnings.append(f"{spec.name} has no repeated blocks to checkpoint: activation checkpointing changes nothing")
    warnings += flag_notes(opts, profile, rows, mode)
    warnings += script_note(opts)
    adapter = spec.adapter
    unquantized = profile.stats.num_frozen - profile.stats.quantized_numel
    if adapter is not None and adapter.quantize and unquantized > 0.25 * profile.stats.num_frozen:
        warnings.append(
            f"--quantize {adapter.quantize}: bitsandbytes quantizes nn.Linear layers only; "
            f"{fmt_count(unquantized)} of the {fmt_count(profile.stats.num_frozen)} frozen parameters "
            "(embeddings, norms, the LM head, a mixture of experts' fused expert weights) stay in fp32, "
            "so the quantized base saves less here"
        )
    if opts.precision == Precision.PURE_BF16:
        warnings.append(PURE_BF16_NOTE)
    if opts.optimizer.is_paged:
        warnings.append(
            f"--optimizer {opts.optimizer}: bitsandbytes keeps its states (of 100,000 elements or more) in "
            "CUDA unified memory (cudaMallocManaged, bitsandbytes.functional.get_paged), whose pages move "
            "to host RAM under memory pressure; sized here as resident on the GPU, and "
            "torch.cuda.max_memory_allocated does not count them"
        )
    rec = recommend(
        ctx,
        rows,
        checkpointed(ctx, rows, strategies, cache, scratch_threads, mode),
        alternatives(ctx, rows, strategies, cache, scratch_threads, asked_micro_batch),
    )
    rec.micro_batch_size, rec.micro_batch_note = opts.micro_batch_size, mb_note
    if inputs.training.activation_checkpointing and device == Device.CUDA and rec.strategy is not None:
        hint = checkpointing_not_needed(
            ctx, next(r for r in rows if r.name == rec.strategy), rows, cache, scratch_threads
        )
        if hint:
            warnings.append(hint)
    if mb_note and rec.strategy is not None:
        rec.reasons.append(mb_note)
    ladder = ladder_for_plan(ctx, rows, cache, scratch_threads, rec) if device == Device.CUDA else None
    warnings += _budget_warnings(opts, ctx)
    layouts = None
    if opts.top and device == Device.CUDA:
        layouts = search_for_plan(ctx, cache, scratch_threads, inputs.training.micro_batch_size)
    if inputs.use_cache:  # what-if questions (another --gpus) then find their traces in the cache
        for traced, tp in {t for s in strategies for t in s.what_if_traces(ctx)}:
            profile.activations(TraceMode(traced), tp)  # (Strategy.what_if_traces names the mode as its value)
            profile.tp_stats(tp)
    result = Plan(
        inputs=inputs,
        spec=spec,
        profile=profile,
        hardware=hw,
        options=opts,
        attention=attention,
        device=device,
        rows=rows,
        recommendation=rec,
        warnings=warnings,
        ladder=ladder,
        layouts=layouts,
    )
    enforce(result)
    return result


def _add_speedups(ctx: StrategyContext, rows: list[StrategyRow], strategies: Sequence[Strategy]) -> None:
    """Each timed row's speed-up over one GPU of this kind at the same global batch (by accumulation) and its
    scaling efficiency, all rows against one baseline: the fastest recipe that fits one GPU
    (``advisor.rows.one_gpu_step_times``, ``single_gpu_step_s``; None when one GPU cannot hold the model)."""
    baselines: dict[int, float | None] = {}
    for r in rows:
        if r.time is None or not r.global_batch_size:
            continue
        if r.global_batch_size not in baselines:
            baselines[r.global_batch_size] = single_gpu_step_s(one_gpu_step_times(strategies, ctx, r.global_batch_size))
        r.time = with_speedup(r.time, baselines[r.global_batch_size], gpus_used(r, ctx.hardware.num_gpus))


def training_budget(opts: TrainingOptions, ctx: StrategyContext, r: StrategyRow) -> dict[str, float | None] | None:
    """Hours, GPU-hours and cost of the whole training run from --train-tokens, --train-samples or --epochs x
    --dataset-size (None when none was given): optimizer steps = samples / global batch, each ``step_s``."""
    samples = None
    if opts.train_tokens is not None:
        tokens = tokens_per_sample(ctx)
        samples = opts.train_tokens / tokens if tokens else None
    elif opts.train_samples is not None:
        samples = float(opts.train_samples)
    elif opts.epochs is not None and opts.dataset_size is not None:
        samples = opts.epochs * opts.dataset_size
    if samples is None and opts.train_tokens is None:
        return None
    if samples is None or r.time is None or not r.global_batch_size:
        return {"train_hours": None, "gpu_hours": None, "cost": None}
    hours = samples / r.global_batch_size * r.time.step_s / 3600
    gpu_hours = hours * gpus_used(r, ctx.hardware.num_gpus)
    cost = gpu_hours * opts.gpu_hour_price if opts.gpu_hour_price is not None else None
    return {"train_hours": hours, "gpu_hours": gpu_hours, "cost": cost}


def _budget_warnings(opts: TrainingOptions, ctx: StrategyContext) -> list[str]:
    if opts.train_tokens is not None and tokens_per_sample(ctx) is None:
        return [
            f"--train-tokens needs a language model: {ctx.profile.spec.name} has no tokens per sample; give "
            "--train-samples or --epochs with --dataset-size"
        ]
    if (
        opts.gpu_hour_price is not None
        and opts.train_tokens is None
        and opts.train_samples is None
        and opts.epochs is None
    ):
        return [
            "--gpu-hour-price needs a training budget (--train-tokens, --train-samples or --epochs with "
            "--dataset-size) to price"
        ]
    return []
