"""The per-rank sizes ZeRO's memory rules add up (``ZeroSizes``; QLoRA's quantized base under ZeRO-3:
``QuantizedSizes``), in bytes, from the parameter counts, the precision and the buckets of the emitted ds_config
(deepspeed/runtime/zero/stage_1_and_2.py, stage3.py, partition_parameters.py; DeepSpeed 0.19)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from advisor.bnb_layout import quant_storage_numel, quant_weight_layout
from advisor.choices import Precision
from advisor.context import StrategyContext
from advisor.memory import optimizer_state_bytes
from advisor.profile import ZERO3_PERSISTENCE_THRESHOLD

from .ds_config import DS_MAX_LIVE_PARAMETERS, bucket_elems


@dataclass(frozen=True)
class ZeroSizes:
    """What one ZeRO rank holds, in bytes (``partition_numel`` in elements, ``w`` in bytes per element), as
    ``zero_sizes`` computes it (N = data-parallel size, P = parameters, T = trainable parameters, W = ``w``):

    * ``weights``: the module's weights and buffers: W*P (stages 1-2), or this rank's W*P/N partition plus the
      persistent small parameters whole (stage 3, ``stage3_param_persistence_threshold``;
      ``partition_parameters.py`` ``_partition_param``);
    * ``gathered``: stage 3's gathered working set in forward and backward (prefetch bucket + the largest module,
      ``gathered_bytes``); 0 for stages 1-2 and at world size 1 (``_no_gather_coalesced``);
    * ``master``: the fp32 partition of the trainable weights, 4*T/N (``single_partition_of_fp32_groups``,
      ``fp32_partitioned_groups_flat``); ``moments``: the optimizer's states on it
      (``advisor.memory.optimizer_state_bytes``);
    * ``grads16``: the gradients in W bytes: all of them under stage 1 (W*T), the partition under stages 2-3;
      ``grads16_partition``: the W*T/N partition (``grads_in_partition``, ``grad_partitions_flat_buffer``);
      ``grads32``: the fp32 gradient partition of the step, 4*T/N (``flatten(...).to(fp32)``);
    * ``bucket``: the one contiguous-gradient reduce bucket, ``reduce_bucket_size`` elements of W
      (``setup_buckets``; stage 3: "IPG" in ``__init__``); ``reduce_copy``: the flat copy a bucket reduction makes
      of it (``allreduce_bucket``: ``self.flatten(bucket)``; stage 3 ``reduce_scatter_coalesced``);
    * ``partition_numel``: this rank's elements of the flat fp32 partition (T/N, the optimizer's one tensor).
    """

    weights: int
    gathered: int
    master: int
    moments: int
    grads16: int
    grads16_partition: int
    grads32: int
    bucket: int
    partition_numel: int
    reduce_copy: int
    w: int


@dataclass(frozen=True)
class QuantizedSizes:
    """QLoRA under ZeRO-3 (``quantized_sizes``), per rank, in bytes of the module's dtype (``gathered_elems`` in
    elements of it):

    - ``storage``: this rank's packed storage; ``full_storage``: all of it (one whole copy);
    - ``quant_states``: every weight's ``QuantState`` (absmax, code, double quantization's nested state;
      ``advisor.bnb_layout.quant_weight_layout``): attributes of the ``Params4bit``, not parameters, so DeepSpeed
      never partitions them: whole on every rank, on the device (``Params4bit.to`` moves them with the weight);
    - ``rest``: this rank's share of every other parameter (embeddings, norms, LM head, adapters): the script leaves
      out peft's ``prepare_model_for_kbit_training``, whose fp32 upcast DeepSpeed's cast would undo (checked: every
      parameter bf16 after ``deepspeed.initialize`` in bf16 mode; trl's SFTTrainer skips it for sharded QLoRA
      too); ``rest_full``: all of them whole;
    - ``gathered_elems``: the largest gather unit (a module's non-quantized parameters, or a packed weight);
      ``gathered_total``: the bytes one pass gathers (everything not persistent).
    """

    storage: int
    full_storage: int
    quant_states: int
    rest: int
    rest_full: int
    gathered_elems: int
    gathered_total: int


def module_dtype_bytes(ctx: StrategyContext) -> int:
    """Bytes per element of the module under DeepSpeed: 4 in fp32, else 2 (its bf16/fp16 modes cast the whole
    module, ``engine.py`` ``_cast_module_mixed_precision``)."""
    return 4 if ctx.options.precision == Precision.FP32 else 2


def gathered_bytes(elems: int, w: int) -> int:
    """ZeRO-3 parameters gathered for compute. The coalesced all-gather
    (deepspeed/runtime/zero/partition_parameters.py, ``_all_gather_dtype``) receives a bucket into
    one flat buffer of partition x world-size elements, and ``AllGatherCoalescedHandle.wait`` then
    builds each parameter with ``torch.cat`` of its slices: while a prefetched bucket is in flight
    both copies are alive (measured on CPU: 94.6 MiB flat buffer + 94.6 MiB of concatenated
    parameters for resnet50 at world size 2)."""
    return 2 * elems * w


def quantized_sizes(ctx: StrategyContext, quantized_base: bool) -> QuantizedSizes | None:
    """QLoRA under ZeRO-3 (None without a quantized base, or where the strategy does not partition one:
    ``quantized_base`` False), per rank, in bytes (``QuantizedSizes``).

    The script loads the base with ``BitsAndBytesConfig(bnb_4bit_quant_storage=<the module's dtype>)``:
    ``Params4bit`` then packs the 4-bit codes into elements of that float dtype
    (``advisor.bnb_layout.quant_storage_numel``), so DeepSpeed's cast of the module (``engine.py``
    ``_cast_module_mixed_precision``: every float parameter ``.to(bf16/fp16)``) leaves the packed bits alone, and
    ZeRO-3 partitions each packed weight like any parameter (``partition_parameters.py`` ``_partition_param``:
    ``ceil(ds_numel / N)`` elements per rank, ``ds_tensor``), except those of at most
    ``stage3_param_persistence_threshold`` elements, which stay whole once gathered
    (``parameter_offload.py`` ``mark_persistent_parameters``; the threshold counts storage elements).
    """
    adapter, stats = ctx.profile.spec.adapter, ctx.profile.stats
    if not (quantized_base and adapter is not None and adapter.quantize):
        return None
    n, w = ctx.world_size, module_dtype_bytes(ctx)
    storage = full_storage = states = gathered_total = persistent_logical = largest = 0
    for shape in stats.quantized_shapes:
        q = quant_storage_numel(shape, w)
        layout = quant_weight_layout(shape, adapter.quantize, adapter.double_quant)
        states += layout.absmax + layout.code + layout.nested
        full_storage += q * w
        if q <= ZERO3_PERSISTENCE_THRESHOLD:  # persistent: whole on every rank after the first gather
            storage += q * w
        else:
            storage += -(-q // n) * w
            gathered_total += q * w
            largest = max(largest, q)
        # profile.param_stats counted the quantized weights by their logical size among the persistent ones
        if math.prod(shape) < ZERO3_PERSISTENCE_THRESHOLD:
            persistent_logical += math.prod(shape)
    rest = stats.num_params - stats.quantized_numel
    rest_persistent = stats.persistent_params - persistent_logical
    gathered_total += (rest - rest_persistent) * w
    return QuantizedSizes(
        storage=storage,
        full_storage=full_storage,
        quant_states=states,
        rest=-(-(rest - rest_persistent) * w // n) + rest_persistent * w,
        rest_full=rest * w,
        gathered_elems=max(largest, stats.largest_unquantized_module_params),
        gathered_total=gathered_total,
    )


def zero_sizes(ctx: StrategyContext, stage: int, q: QuantizedSizes | None) -> ZeroSizes:
    """``ZeroSizes`` of ZeRO ``stage`` (1-3) on ``ctx``; ``q``: the quantized base's sizes (``quantized_sizes``),
    whose packed storage is partitioned and gathered in elements of the module's dtype."""
    stats, n = ctx.profile.stats, ctx.world_size
    w = module_dtype_bytes(ctx)
    p, t = stats.num_params, stats.num_trainable
    b = bucket_elems(ctx)
    if q is not None:  # QLoRA: elements of w throughout (packed storage included)
        gathered = min(DS_MAX_LIVE_PARAMETERS, b["stage3_prefetch_bucket_size"] + q.gathered_elems)
        weights = q.storage + q.quant_states + q.rest
        p = q.gathered_total // w
    elif stage == 3:
        gathered = min(DS_MAX_LIVE_PARAMETERS, b["stage3_prefetch_bucket_size"] + stats.largest_module_params)
        weights = -(-(p - stats.persistent_params) * w // n) + stats.persistent_params * w
    else:
        gathered, weights = 0, p * w
    if n == 1:
        # One partition holds the whole parameter: ``all_gather_coalesced`` returns
        # ``_no_gather_coalesced`` when every partition world size is 1 (partition_parameters.py).
        gathered = 0
    return ZeroSizes(
        weights=weights + stats.buffer_bytes,
        gathered=gathered_bytes(min(gathered, p), w),
        master=-(-4 * t // n),
        # The torch (or bitsandbytes) optimizer steps one flat fp32 partition per group: 8-bit states are blocks of
        # that one large tensor (``advisor.memory.optimizer_state_bytes``).
        moments=optimizer_state_bytes(ctx.options.optimizer, -(-t // n), 4),
        grads16=t * w if stage == 1 else -(-t * w // n),
        grads16_partition=-(-t * w // n),
        grads32=-(-4 * t // n),
        # One bucket: stages 1-2 add a second only with overlap_comm (off in our configs;
        # stage_1_and_2.py setup_buckets), stage 3 allocates exactly one (stage3.py __init__, "IPG").
        bucket=b["reduce_bucket_size"] * w,
        partition_numel=-(-t // n),
        reduce_copy=min(b["reduce_bucket_size"], t) * w,
        w=w,
    )
