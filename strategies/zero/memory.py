"""ZeRO's memory rules: what DeepSpeed allocates per rank, phase by phase.

What DeepSpeed allocates per rank (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, DeepSpeed
0.19; N = data-parallel size, W = bytes of the model's weights: 2 for bf16/fp16, 4 for fp32,
P = parameters):

* weights: W*P (stages 1-2) or W*P/N plus the small "persistent" parameters (stage 3,
  ``stage3_param_persistence_threshold``) plus, in forward and backward, the gathered working set
  (prefetch bucket + the largest module's parameters, held twice while a coalesced all-gather is in
  flight, see ``gathered_bytes``);
* fp32 partition of the weights: 4*P/N. DeepSpeed clones it even when training in fp32
  (``single_partition_of_fp32_groups = ...clone().float()``);
* optimizer moments: 4*k*P/N (k = 2 for Adam);
* gradients: stages 1-2 hold none in forward; during backward stage 1 accumulates the full W*P
  gradients and stage 2 reduces bucket by bucket into a W*P/N partition; stage 3 keeps a W*P/N
  gradient partition from ``__init__`` on; at the step an fp32 gradient partition (4*P/N) is added;
* buffers: one contiguous-gradient reduce bucket (``reduce_bucket_size`` elements of W bytes):
  stages 1-2 allocate it at the first gradient of every backward and release it at its end,
  stage 3 once in ``__init__``.

The sizes are ``ZeroSizes`` (``strategies.zero.sizes.zero_sizes``; QLoRA's quantized base under ZeRO-3:
``QuantizedSizes``). The phases (which of these coexist with which activations) are in ``strategies.zero.phases``
(``stage12_phases``, ``stage3_phases``), each sourced to the DeepSpeed function that allocates or frees;
``zero_memory`` takes their largest. The ZeRO paper's idealised accounting (advisor.memory.zero_paper_model_states)
omits the fp32 gradient partition and the buckets; DeepSpeed's own estimator (``deepspeed_model_state_estimate``)
uses 2P + 18P/N for ZeRO-2.
"""

from __future__ import annotations

import os

from advisor.choices import Device, TraceMode
from advisor.context import StrategyContext
from advisor.memory import (
    Breakdown,
    StrategyMemory,
    dequantized_weight_bytes,
    device_overhead,
    optimizer_step_temp_bytes,
    peak_of,
    quantized_base_parts,
)

from ..ddp import grad_accum_steps
from .ds_config import bucket_elems
from .phases import stage3_phases, stage12_phases
from .sizes import QuantizedSizes, ZeroSizes, module_dtype_bytes, quantized_sizes, zero_sizes

# bitsandbytes quantizing a weight on the CPU (``Params4bit._quantize`` -> ``quantize_4bit``, backends/cpu): the fp32
# weight and the op's temporaries beyond its packed output, per element (measured here while from_pretrained loaded
# a 1024 x 1024 nf4 weight: 7,843,264 bytes beyond the loaded tensors and the mapped checkpoint).
CPU_QUANTIZE_BYTES_PER_ELEMENT = 8


def step_temp_bytes(ctx: StrategyContext, s: ZeroSizes) -> int:
    """DeepSpeed hands the torch optimizer one flat fp32 partition per parameter group
    (``single_partition_of_fp32_groups`` in stage_1_and_2.py, ``fp32_partitioned_groups_flat``
    in stage3.py), so the CPU Adam loop's temporaries are the size of the whole partition."""
    return optimizer_step_temp_bytes(ctx.options.optimizer, ctx.device, s.partition_numel, 4)


def zero_memory(
    ctx: StrategyContext, micro_batch: int, stage: int, offload: bool, quantized_base: bool, mode: TraceMode
) -> StrategyMemory:
    """Per-GPU bytes of ZeRO ``stage`` (1-3; ``offload``: optimizer states, and under stage 3 parameters, in host
    memory) at ``micro_batch`` samples per GPU, on the traced step of trace ``mode``: the largest of the step's
    phases (``stage12_phases``, ``stage3_phases``; QLoRA with ``quantized_base``: also the loading of the whole
    quantized base). Host bytes per node (offload): every rank's fp32 partition, moments and fp32 gradients
    (stage 3: and its weights)."""
    q = quantized_sizes(ctx, quantized_base)
    s = zero_sizes(ctx, stage, q)
    step = ctx.profile.activations(mode).at(micro_batch)
    optim = 0 if offload else s.master + s.moments
    # Offloaded ZeRO-3 keeps only the persistent small parameters resident on the GPU.
    params = s.weights
    if offload and stage == 3:
        params = ctx.profile.stats.persistent_params * module_dtype_bytes(ctx)
    if q is not None:
        # Activations: the traced step of this precision. Under bf16/fp16 that trace (shared with pure bf16's
        # single/DDP QLoRA) keeps the non-quantized frozen parameters in fp32, as prepare_model_for_kbit_training
        # does there; DeepSpeed holds them in 16 bits, so its embedding output and norms are sized high. QLoRA
        # adds one layer's dequantized weight in forward and in backward (as under DDP).
        stats, adapter = ctx.profile.stats, ctx.profile.spec.adapter
        fwd_dq, bwd_dq = (dequantized_weight_bytes(stats, adapter, ctx.device, ph) for ph in ("forward", "backward"))
        phases = stage3_phases(s, step, params, optim, offload, step_temp_bytes(ctx, s), (fwd_dq, bwd_dq))
        phases.append(_loading(ctx, s, q))
    elif stage == 3:
        phases = stage3_phases(s, step, params, optim, offload, step_temp_bytes(ctx, s))
    else:
        phases = stage12_phases(
            s,
            step,
            params,
            optim,
            stage,
            offload,
            step_temp_bytes(ctx, s),
            bucket_fills=bucket_elems(ctx)["reduce_bucket_size"] < ctx.profile.stats.num_trainable,
            accumulating=grad_accum_steps(ctx, ctx.world_size) > 1,
        )
    peak = peak_of(*phases)
    host = 0
    if offload:
        per_rank = s.master + s.moments + s.grads32
        if stage == 3:
            per_rank += s.weights
        host = per_rank * ctx.hardware.gpus_per_node
    states = params if offload else params + optim + s.grads16 + s.grads32
    return StrategyMemory(
        peak=peak,
        overhead=device_overhead(ctx.device, peak.total, ctx.world_size),
        model_state_bytes=states,
        host_bytes_per_node=host,
    )


def _loading(ctx: StrategyContext, s: ZeroSizes, q: QuantizedSizes) -> Breakdown:
    """QLoRA under ZeRO-3: the moment before deepspeed.initialize partitions the base.

    Every rank holds the whole base: transformers 5.24 builds a quantized model without zero.Init (modeling_utils.py:
    ``needs_zero3_init = is_deepspeed_zero3_enabled() and not _is_quantized``), and bitsandbytes' quantizer loads it
    onto the rank's device (``Bnb4BitHfQuantizer.update_device_map``: the current CUDA device, else the CPU): the
    packed storage, the quant states, every other parameter in the load dtype and the buffers (the adapters come
    later, and are small). While a weight is quantized (``Params4bit._quantize`` -> ``quantize_4bit``) its unquantized
    copy is on the device too: ``w`` bytes per element on CUDA; on the CPU the fp32 copy and quantize_4bit's
    temporaries, ``CPU_QUANTIZE_BYTES_PER_ELEMENT``. On the CPU the checkpoint itself is one more allocation while it
    loads: safetensors maps the file into a torch storage, which the CPU meter counts (measured: one allocation of
    the checkpoint file's size); advisor takes the checkpoint as fp32 (half for a 16-bit one)."""
    stats, w = ctx.profile.stats, s.w
    per_elem = CPU_QUANTIZE_BYTES_PER_ELEMENT if ctx.device == Device.CPU else w
    checkpoint = 4 * stats.num_frozen if ctx.device == Device.CPU else 0
    # The weights by part: the fused expert weights of a mixture of experts are in ``rest_full`` (in w bytes).
    parts = quantized_base_parts(
        stats,
        q.full_storage + q.quant_states,
        w,
        stats.num_params - stats.quantized_numel - stats.num_trainable,
        extra=stats.num_trainable * w + stats.buffer_bytes,
    )
    return Breakdown(
        params=q.full_storage + q.quant_states + q.rest_full + stats.buffer_bytes,
        params_parts=parts,
        buffers=checkpoint,
        other=stats.largest_quantized_numel * per_elem,
        phase="loading (the whole quantized base, before deepspeed.initialize partitions it)",
    )


def deepspeed_model_state_estimate(ctx: StrategyContext, stage: int, offload: bool) -> dict[str, int] | None:
    """DeepSpeed's own model-state estimators (non-printing functions), for comparison:
    ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``; they assume
    fp16/bf16 + Adam and ignore activations and buffers. ``gpu_bytes`` per GPU, ``host_bytes_per_node``; None for
    ZeRO-1 (DeepSpeed has none). Imports deepspeed (``DS_ACCELERATOR`` defaults to ``cpu`` here)."""
    if stage == 1:
        return None
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    stats, hw = ctx.profile.stats, ctx.hardware
    if stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        cpu, gpu = estimate_zero2_model_states_mem_needs(
            stats.num_params, hw.gpus_per_node, hw.num_nodes, cpu_offload=offload
        )
    else:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            stats.num_params,
            stats.largest_module_params,
            hw.gpus_per_node,
            hw.num_nodes,
            cpu_offload=offload,
            cpu_offload_params=offload,
        )
    return {"gpu_bytes": int(gpu), "host_bytes_per_node": int(cpu)}
