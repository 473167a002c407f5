"""The interface every strategy module implements.

A strategy owns everything that differs between strategies: whether it applies (and why not), its
data-parallel size, its per-GPU memory rule, its share of the 16-bytes-per-parameter rule of thumb,
its communication volume and pattern, its time rule (``step_time``: compute, collectives with their sizes and
overlap, optimizer step), which traced step its precision runs, its launcher, script
template and extra files, and what verifying it needs. Code outside ``strategies/`` reads these
attributes; it never compares a strategy's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Protocol

from advisor import bnb_layout
from advisor.choices import Device, Precision, TraceMode
from advisor.context import StrategyContext
from advisor.gpu_presets import GpuPreset
from advisor.hardware import Hardware
from advisor.memory import StrategyMemory, bytes_per_element, states_per_element, trace_mode, weight_bytes
from advisor.models import ModelSpec, family_of
from advisor.models.families import ModelFamily
from advisor.timing.comm import Fabric
from advisor.timing.compute import (
    ComputeTime,
    Efficiency,
    Rates,
    gpu_rates,
    model_for,
    peak_precision,
    preset_for_gpu,
    rates,
)
from advisor.timing.gpu_model import GpuModel, with_flags
from advisor.timing.step import Collective, StepTime, fused_step_bytes
from advisor.training_options import TrainingOptions
from advisor.units import fmt_gib

from .launchers import TORCHRUN, Launcher
from .protocols import PlannedRow

# The imports of templates/checkpoint_dcp.py (and FSDP2's full state dicts); the renderer keeps the names a script uses.
DCP_IMPORTS = (
    "import torch.distributed.checkpoint as dcp",
    "from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, "
    "get_state_dict, set_state_dict",
)


class ScriptJob(Protocol):
    """What a strategy reads of the job its script is rendered for (``strategies.render.Job``, which imports this
    module): sizes per GPU."""

    @property
    def strategy(self) -> str: ...

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def precision(self) -> str: ...

    @property
    def optimizer(self) -> str: ...

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def grad_accum_steps(self) -> int: ...

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def dp_size(self) -> int: ...

    @property
    def tp_degree(self) -> int: ...

    @property
    def ds_config(self) -> dict[str, object] | None: ...

    @property
    def master_port(self) -> int: ...

    @property
    def fsdp_grad_sync(self) -> str: ...

    @property
    def pp_schedule(self) -> str | None: ...
    @property
    def pp_virtual_stages(self) -> int | None: ...

    @property
    def strategy_unit(self) -> Strategy: ...


@dataclass(frozen=True)
class Timing:
    """What every time rule reads: the GPU's preset (its peaks, bandwidths and links), the achieved rates
    (``Rates``: a GPU's carry its compute model, ``gpu_model``, and SM count; a calibrated CPU's are its measured
    rates), the shares of peak the JSON reports (``efficiency``: a GPU's GEMM and bandwidth shares) and the
    datasheet peak the MFU is measured against. ``gpu_model``: None for a calibrated CPU."""

    preset: GpuPreset
    efficiency: Efficiency
    rates: Rates
    peak_flops_per_s: float
    gpu_model: GpuModel | None = None


def timing_of(ctx: StrategyContext) -> Timing | None:
    """``Timing`` of ``ctx``'s GPU; None for a GPU without a preset (no peaks to time it with).

    A GPU is timed by ``ctx.hardware.gpu_model`` where one is set (a calibration of this GPU, or a fit's trial
    constants), else its generation's default (``advisor.timing.compute.model_for``); ``--mfu`` replaces its GEMM,
    convolution and attention shares and ``--bandwidth-efficiency`` its bandwidth share (``gpu_model.with_flags``).
    A calibrated CPU keeps its measured roofline rates (``CpuCalibration.extend``), the flags scaling them."""
    hw, opts = ctx.hardware, ctx.options
    cal = hw.calibration  # a CPU verification run: this machine's measured rates (advisor.timing.calibrate)
    preset = cal.preset() if cal is not None else preset_for_gpu(hw.gpu_name, hw.gpu_memory_bytes)
    if preset is None or not opts.precision:
        return None
    peak = (preset.peak_tflops(peak_precision(opts.precision, preset)) or preset.tflops_fp32 or 0.0) * 1e12
    if cal is None:
        model = with_flags(hw.gpu_model or model_for(preset), opts.mfu, opts.bandwidth_efficiency)
        eff = Efficiency(model.gemm, model.bandwidth, model.source)
        return Timing(preset, eff, gpu_rates(preset, opts.precision, model), peak, model)
    fitted = cal.efficiency()
    eff = Efficiency(
        opts.mfu if opts.mfu is not None else fitted.compute,
        opts.bandwidth_efficiency if opts.bandwidth_efficiency is not None else fitted.bandwidth,
        fitted.source
        if opts.mfu is None and opts.bandwidth_efficiency is None
        else "flags --mfu / --bandwidth-efficiency where given, else " + fitted.source,
    )
    r = rates(preset, opts.precision, eff.compute, eff.bandwidth)
    return Timing(preset, eff, cal.extend(r, opts.precision), peak)


def fabric_of(ctx: StrategyContext, t: Timing, gpus_per_node: int, nodes: int, concurrent_groups: int = 1) -> Fabric:
    """The fabric of one communicating group of ``gpus_per_node`` x ``nodes`` ranks on ``ctx``'s cluster
    (``Fabric.from_preset``; ``--link-bandwidth`` / ``--network-bandwidth`` override). ``concurrent_groups``
    groups communicate at once across the nodes' NICs (TP x DP's data-parallel groups): each gets its share."""
    hw = ctx.hardware
    # The preset's NIC count belongs to its typical network (DGX A100: 8 x HDR); on another network (a user's
    # 1 GbE or 100 GbE) one NIC per node is assumed.
    nics = None if hw.network in (None, t.preset.network) else 1
    f = Fabric.from_preset(
        t.preset,
        gpus_per_node,
        nodes,
        interconnect=hw.interconnect,
        network=hw.network,
        nics_per_node=nics,
        link_busbw_gbps=hw.link_busbw_gbps,
        network_gbps=hw.network_gbps,
    )
    if hw.calibration is not None:  # gloo's measured latency on a CPU verification run, not NCCL's model
        f = hw.calibration.fabric(f)
    return replace(f, inter_gbps=f.inter_gbps / concurrent_groups) if nodes > 1 and concurrent_groups > 1 else f


def optimizer_step_s(
    ctx: StrategyContext, t: Timing, numel: int, w: int, g: int, s: int, extra: int = 0, factor: float = 1.0
) -> float:
    """Seconds of the optimizer step over ``numel`` elements on the GPU: the bytes a fused step reads and writes
    (``advisor.timing.step.fused_step_bytes``: parameter ``w``, gradient ``g``, states of ``s``-byte elements) plus
    ``extra`` bytes per element, times ``factor`` (a foreach step's extra passes), at the achieved HBM
    bandwidth (HBM x the compute model's ``bandwidth`` share: ``Rates.bytes_per_s``)."""
    per = fused_step_bytes(w, g, states_per_element(ctx.options.optimizer, s)) + extra
    if t.rates.optimizer_bytes_per_s:  # a calibrated CPU: its measured AdamW step (its loop passes included)
        return numel * per / t.rates.optimizer_bytes_per_s
    return numel * per * factor / t.rates.bytes_per_s if t.rates.bytes_per_s else 0.0


def accumulated_step(
    ctx: StrategyContext,
    t: Timing,
    c: ComputeTime,
    ga: int,
    *,
    comm_s: float,
    exposed_comm_s: float,
    optimizer_s: float,
    overlap: str,
    collectives: tuple[Collective, ...] = (),
    host_s: float = 0.0,
    notes: tuple[str, ...] = (),
    stall_s: float = 0.0,
) -> StepTime:
    """``ga`` micro-steps of forward + backward ``c`` (compute, FLOPs) with the strategy's other terms (``StepTime``);
    ``stall_s``: the GPU waiting for the strategy's CPU work (ZeRO-3's hooks), in compute as eager dispatch is."""
    return StepTime(
        micro_batch=ctx.micro_batch_size,
        micro_steps=ga,
        compute_s=ga * c.total_s + stall_s,
        comm_s=comm_s,
        exposed_comm_s=exposed_comm_s,
        optimizer_s=optimizer_s,
        flops=ga * c.flops,
        model_flops=ga * c.model_flops,
        peak_flops_per_s=t.peak_flops_per_s,
        overlap=overlap,
        collectives=collectives,
        host_s=host_s,
        notes=notes,
    )


def pretrained_bytes(ctx: StrategyContext) -> int:
    """One copy of the model as a generated script loads ``--init-from``'s weights into it: every parameter in fp32
    (``from_pretrained(path, dtype=torch.float32)``; ``build_model()`` then ``load_state_dict`` for vision and
    custom models) and the buffers. LoRA: the frozen base alone, in the dtype it is held in (``from_pretrained(path,
    dtype=...)``, ``advisor.memory.weight_bytes``; the adapters are added after it is loaded), and the buffers."""
    stats, adapter = ctx.profile.stats, ctx.profile.spec.adapter
    if adapter is not None:
        return weight_bytes(stats, adapter, trace_mode(ctx.options.precision, False)).frozen + stats.buffer_bytes
    return 4 * stats.num_params + stats.buffer_bytes


def pretrained_copies(ctx: StrategyContext) -> int:
    """Copies of ``pretrained_bytes`` one process holds at once while it loads ``--init-from``'s weights: the family's
    (``ModelFamily.pretrained_copies``: 1 for transformers' ``from_pretrained``, which fills a meta-built model from
    the memory-mapped checkpoint; 2 for a ``torch.load``'ed state_dict, alive beside the model until
    ``load_state_dict`` has copied it). 1 without ``--init-from``, and under LoRA (the adapter rule: the base as
    ``from_pretrained(..., dtype=...)`` loads it)."""
    if not ctx.options.init_from or ctx.profile.spec.adapter is not None:
        return 1
    return family_of(ctx.profile.spec).pretrained_copies


class Strategy(ABC):
    name: str  # CLI / JSON name
    title: str  # human name
    framework: str = "torch"  # "torch" | "deepspeed": what the script needs installed
    launcher: Launcher = TORCHRUN
    template: str = "ddp.py"  # file in strategies/templates/
    # The tie order (docs/decisions.md): least communication first. The recommender ranks by step time and uses
    # this order for ties (advisor.candidates.TIE) and where nothing is timed.
    # 0 DDP; 1 ZeRO-1/2 (same volume as DDP); 2 ZeRO-3 (about 1.5x); 3 TP; 4 offload.
    comm_order: int = 0
    comm_pattern: str = ""  # one line: which collectives run, per step
    offload: bool = False  # model states (partly) in host RAM: needs host RAM, a GPU to verify
    # False: one process on one GPU (``single``): recommended only on a one-GPU cluster, else the baseline row.
    distributes: bool = True
    shards_everything: bool = False  # weights, gradients and optimizer states sharded (the scale-out answer)
    uses_tp_degree: bool = False  # reads --tp-degree
    uses_fsdp_grad_sync: bool = False  # reads --fsdp-grad-sync
    casts_weights: bool = False  # mixed precision by casting the module to 16 bits (DeepSpeed), not autocast
    estimate_only: str | None = None  # why no script is emitted (None: one is): ``estimate_only_for``'s default

    def estimate_only_for(self, ctx: StrategyContext) -> str | None:
        """Why no script is emitted for the row of ``ctx`` (None: one is): an estimate-only row is sized and timed,
        never recommended (``advisor.candidates.eligible``), and --emit / --verify refuse it with this line."""
        return self.estimate_only

    # Model-state sharding stage among the data-parallel strategies without offload: 0 DDP, 1-3 ZeRO
    # stages (None: not comparable that way). A higher stage never holds more model states.
    sharding_stage: int | None = None
    # Fine-tuning: None when LoRA adapters run under this strategy, else why not (one clause); whether a
    # bitsandbytes-quantized frozen base (QLoRA) is modelled and verified with it; whether optimizers other than
    # torch's (bitsandbytes', transformers' Adafactor) can step its parameters (DTensor shards: not verified).
    lora_blocker: str | None = None
    quantized_base: bool = False
    client_optimizers: bool = True
    # The optimizer step in backward (advisor.memory_options): None when per-parameter steps in a post-accumulate-grad
    # hook compose with this strategy, else why not; ``hook_grads_sharded``: each hook sees this rank's shard (FSDP2).
    optimizer_in_backward_blocker: str | None = "not wired here (torchtune pairs it with one GPU or FSDP2)"
    hook_grads_sharded: bool = False
    # (flag, why) per memory option the plan sizes on this row but its script does not write (strategies.render)
    unscripted_options: tuple[tuple[str, str], ...] = (("--optimizer-in-backward", "does not write it yet"),)

    def pinned(self, options: TrainingOptions) -> bool:
        """Whether a plan with ``options`` has a row for this strategy: always for the registered strategies; a row
        only a user's pin asks for (``strategies.PINNED``: ``--pp-degree``) says when."""
        return True

    def fine_tuning_blocker(self, ctx: StrategyContext) -> str | None:
        """Why this strategy does not apply to the plan's LoRA / QLoRA / optimizer choice (None: it does)."""
        adapter, opt = ctx.profile.spec.adapter, ctx.options.optimizer
        if adapter is not None and self.lora_blocker:
            return self.lora_blocker
        if adapter is not None and self.offload:
            states = bnb_layout.optimizer_state_bytes(opt, ctx.profile.stats.trainable_shapes, 4)
            return (
                f"with LoRA the optimizer states are the adapters' only ({fmt_gib(states)} in fp32): offloading "
                "them saves little and adds PCIe traffic; use the row without offload"
            )
        if adapter is not None and adapter.quantize and not self.quantized_base:
            return (
                f"a {adapter.quantize} base (bitsandbytes) is modelled and verified with single, ddp and (4-bit) "
                f"zero3; {self.name} with a quantized base is not (use ddp or zero3, or LoRA on a 16-bit base)"
            )
        if not opt.is_torch and not self.client_optimizers:  # torch.optim's: every strategy steps them
            return (
                f"--optimizer {opt} ({bnb_layout.optimizer_source(opt)}) is not verified on {self.title}'s "
                "DTensor shards: use adamw, or ddp / ZeRO with it"
            )
        return None

    def trace_mode(self, precision: Precision | None) -> TraceMode:
        """The traced step this strategy runs at ``precision`` (``advisor.memory.trace_mode``)."""
        return trace_mode(precision, self.casts_weights)

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        """``None`` when the strategy applies, else the reason in one sentence."""
        return None

    def dp_size(self, ctx: StrategyContext) -> int:
        """Data-parallel world size (the sampler's number of replicas)."""
        return ctx.world_size

    def tp_degree_of(self, ctx: StrategyContext) -> int:
        """Tensor-parallel degree of the row: the GPUs that are not data-parallel replicas (1 for one process)."""
        return ctx.world_size // self.dp_size(ctx) if self.distributes else 1

    @abstractmethod
    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        """Per-GPU bytes at ``micro_batch`` samples per GPU per step."""

    @abstractmethod
    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        """16 bytes per parameter, sharded as this strategy shards it (before the safety factor)."""

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU sends per optimizer step for gradients/parameters: DDP's ring all-reduce of the
        gradients sends 2(n-1)/n of them (nccl-tests PERFORMANCE.md), once per optimizer step (``no_sync()`` on the
        other micro-steps), in the dtype DDP reduces: the parameters' (fp32 under autocast, whose weights and
        gradients stay fp32; bf16 under pure bf16). 0 on one GPU (no collective runs)."""
        n = ctx.world_size
        grad_bytes = bytes_per_element(ctx.options.precision, "grads")
        return 2 * (n - 1) * ctx.profile.stats.num_trainable * grad_bytes // n

    def link_warning(self, ctx: StrategyContext) -> str | None:
        """A warning the recommender gives when it picks this strategy on ``ctx``'s links (None: none)."""
        return None

    def step_time(self, ctx: StrategyContext, row: PlannedRow) -> StepTime | None:
        """One optimizer step at ``row``'s global batch (``row.grad_accum_steps`` micro-steps of
        ``ctx.options.micro_batch_size``), each term sourced (``advisor.timing``); None: this strategy has no time
        rule, or the GPU no preset to time it with."""
        return None

    def compute_time(self, ctx: StrategyContext, t: Timing, tp_degree: int = 1) -> ComputeTime:
        """One micro-step's forward + backward on one GPU: the time model over the ops this strategy's trace runs
        (``ActivationProfile.compute_time``)."""
        act = ctx.profile.activations(self.trace_mode(ctx.options.precision), tp_degree)
        return act.compute_time(ctx.micro_batch_size, t.rates)

    def load_host_bytes_per_node(self, ctx: StrategyContext) -> int:
        """Host RAM per node while the emitted script builds the model: every rank calls
        ``build_model()`` on the CPU in fp32 (torch's default dtype; the templates move it to the GPU
        afterwards, which frees the CPU copy), so a node holds ``gpus_per_node`` full fp32 copies at once
        (4 bytes per parameter, plus the buffers).

        With ``--init-from`` every rank loads the pretrained weights the same way, on the CPU in fp32, before
        moving them to the GPU: ``pretrained_copies`` copies per rank (transformers' ``from_pretrained(path,
        dtype=torch.float32)``: one, ``PreTrainedModel._load_pretrained_model`` fills the meta-built model from the
        memory-mapped checkpoint; vision and custom models: two, the ``torch.load``'ed state_dict beside the model
        until ``load_state_dict`` has copied it in). LoRA keeps its rule with or without it: the base loads in its
        held dtype (``from_pretrained(..., dtype=...)``; QLoRA quantized as it loads)."""
        stats, adapter = ctx.profile.stats, ctx.profile.spec.adapter
        if adapter is not None:  # LoRA: the base loads in its held dtype (QLoRA quantized as it loads)
            frozen = weight_bytes(stats, adapter, trace_mode(ctx.options.precision, False)).frozen
            return ctx.hardware.gpus_per_node * (frozen + 4 * stats.num_trainable + stats.buffer_bytes)
        return ctx.hardware.gpus_per_node * pretrained_copies(ctx) * pretrained_bytes(ctx)

    def load_fix(self, ctx: StrategyContext | None = None) -> str:
        """What to change when the model does not fit host RAM while loading (one clause); ``ctx`` says whether the
        script loads ``--init-from``'s pretrained weights and which family it loads them for."""
        if ctx is not None and ctx.options.init_from:
            zero3 = (
                ", or ZeRO-3, where transformers' DeepSpeed integration has rank 0 alone read the checkpoint "
                "into the partitions"
                if family_of(ctx.profile.spec).zero_init
                else ""
            )
            return (
                "every rank loads its own fp32 copy of the pretrained weights: use FSDP2, where rank 0 alone "
                f"loads them and broadcasts them into the shards{zero3}"
            )
        return (
            "build the model on the meta device and load the checkpoint in 16 bits, or use ZeRO-3, whose "
            "deepspeed.zero.Init partitions the parameters as they are built"
        )

    def what_if_traces(self, ctx: StrategyContext) -> list[tuple[str, int]]:
        """Traces (trace mode, TP degree) this strategy would need if only the GPU count changed, beyond
        the ones this plan used: the planner makes them while the model's classes are loaded anyway, so a
        later what-if question reads them from the cache instead of tracing."""
        return []

    def ds_config(self, ctx: StrategyContext, row: PlannedRow) -> dict[str, object] | None:
        """The DeepSpeed config the script reads (None: the strategy is not DeepSpeed's)."""
        return None

    # Imports the strategy's template needs beyond common.py's (one statement per line).
    script_imports: tuple[str, ...] = ()
    # Shared template parts (strategies/templates/) rendered before the strategy's own template: how it writes and
    # reads resumable checkpoints (torch.distributed.checkpoint by default).
    script_parts: tuple[str, ...] = ("checkpoint_dcp.py",)

    # The shared training loop (templates/loop.py): the template modules with this strategy's functions for it
    # (``start``, ``wrap_model``, ``micro_step_context``, ...). Empty: the strategy's own ``template`` holds its main().
    script_loop: tuple[str, ...] = ()

    def script_variants(self, job: ScriptJob) -> dict[str, str]:
        """The variant (``strategies.pick``) of each of its template functions that has several, for ``job``."""
        return {}

    def script_constants(self, job: ScriptJob, family: ModelFamily) -> dict[str, object]:
        """Constants the strategy's template reads (JSON-like values), given the job and its model family."""
        return {}

    def extra_files(self, job: ScriptJob) -> dict[str, str]:
        """Files written beside train.py and launch.sh (name -> text)."""
        return {}

    def deepspeed_estimate(self, ctx: StrategyContext) -> dict[str, int] | None:
        """DeepSpeed's own model-state estimate for ``--compare`` (None where DeepSpeed has none)."""
        return None

    def verify_blocker(self, device: Device) -> str | None:
        """Why this strategy cannot be verified on ``device`` here (None: it can)."""
        if self.offload and device == Device.CPU:
            return (
                f"{self.name} offloads to host memory from a GPU; on a CPU-only machine use --emit to write "
                "the script and verify it where a GPU is present"
            )
        return None

    def rank_peak_bytes(self, ctx: StrategyContext, micro_batch: int) -> list[int] | None:
        return None  # each rank's estimated peak allocated bytes in rank order where ranks differ (None: the row's)

    def verify_cluster(
        self, hw: Hardware, options: TrainingOptions, row: PlannedRow
    ) -> tuple[Hardware, TrainingOptions]:
        """The cluster and options a verification on ``hw`` (this machine's ranks) runs with.

        Raises:
            AdvisorError: this machine cannot run the strategy.
        """
        return hw, options
