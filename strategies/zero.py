"""DeepSpeed ZeRO stages 1/2/3 and the CPU-offload variants: one module, one rule, parameterised
by stage and offload (they share one generated script and differ only in ds_config).

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

The phases (which of these coexist with which activations) are in ``stage12_phases`` and
``stage3_phases``, each sourced to the DeepSpeed function that allocates or frees.
The ZeRO paper's idealised accounting (advisor.memory.zero_paper_model_states) omits the fp32
gradient partition and the buckets; DeepSpeed's own estimator uses 2P + 18P/N for ZeRO-2.
"""

from __future__ import annotations

import json
import math
import os

from advisor.bnb_layout import quant_storage_numel, quant_weight_layout
from advisor.context import StrategyContext
from advisor.memory import (
    RULE_OF_THUMB_BYTES_PER_PARAM,
    Breakdown,
    StrategyMemory,
    dequantized_weight_bytes,
    device_overhead,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
    peak_of,
    quantized_base_parts,
    rule_of_thumb_split,
    states_per_element,
)
from advisor.models import family_of
from advisor.profile import ZERO3_PERSISTENCE_THRESHOLD
from advisor.timing.comm import pcie_transfer_s, split_buckets
from advisor.timing.step import FOREACH_FACTOR, HOST_MEM_GBPS, HOST_MEM_SOURCE, Collective, StepTime, exposed_s

from .base import Strategy, fabric_of, optimizer_step_s, pretrained_bytes, timing_of
from .ddp import grad_accum_steps
from .launchers import DEEPSPEED

# DeepSpeed defaults (deepspeed/runtime/zero/config.py) and what generated ds_configs use.
DS_REDUCE_BUCKET_ELEMS = 500_000_000
DS_ALLGATHER_BUCKET_ELEMS = 500_000_000
DS_PREFETCH_BUCKET_ELEMS = 50_000_000
DS_MAX_LIVE_PARAMETERS = 1_000_000_000
# bitsandbytes quantizing a weight on the CPU (``Params4bit._quantize`` -> ``quantize_4bit``, backends/cpu): the fp32
# weight and the op's temporaries beyond its packed output, per element (measured here while from_pretrained loaded
# a 1024 x 1024 nf4 weight: 7,843,264 bytes beyond the loaded tensors and the mapped checkpoint).
CPU_QUANTIZE_BYTES_PER_ELEMENT = 8


def bucket_elems(ctx: StrategyContext) -> dict[str, int]:
    """Bucket sizes written into generated ds_configs: DeepSpeed's defaults, capped at the model's
    size (a bucket larger than all gradients is never filled but is still allocated in full)."""
    trainable = max(1, ctx.profile.stats.num_trainable)
    return {
        "reduce_bucket_size": min(DS_REDUCE_BUCKET_ELEMS, trainable),
        "allgather_bucket_size": min(DS_REDUCE_BUCKET_ELEMS, trainable),
        "stage3_prefetch_bucket_size": min(DS_PREFETCH_BUCKET_ELEMS, trainable),
        "stage3_max_live_parameters": DS_MAX_LIVE_PARAMETERS,
    }


def gathered_bytes(elems: int, w: int) -> int:
    """ZeRO-3 parameters gathered for compute. The coalesced all-gather
    (deepspeed/runtime/zero/partition_parameters.py, ``_all_gather_dtype``) receives a bucket into
    one flat buffer of partition x world-size elements, and ``AllGatherCoalescedHandle.wait`` then
    builds each parameter with ``torch.cat`` of its slices: while a prefetched bucket is in flight
    both copies are alive (measured on CPU: 94.6 MiB flat buffer + 94.6 MiB of concatenated
    parameters for resnet50 at world size 2)."""
    return 2 * elems * w


def stage12_phases(s: dict[str, int], step, params: int, optim: int, stage: int, offload: bool, temp: int,
                   bucket_fills: bool, accumulating: bool = False) -> list[Breakdown]:
    """The moments of a ZeRO-1/2 step (deepspeed/runtime/zero/stage_1_and_2.py, contiguous_gradients):

    * forward: weights + optimizer states + activations; no gradient buffers exist (the reduce
      bucket is released at the end of every backward, ``independent_gradient_partition_epilogue``
      -> ``_release_ipg_buffers``);
    * first gradient: ``process_gradients`` -> ``setup_buckets`` allocates the bucket when the first
      parameter gradient arrives, while the forward's activations are still alive (the temporaries
      of that moment are not in the traced figures, so this is a lower bound);
    * backward at the traced peak (stage 2: net of gradients, which are copied into the bucket and
      freed): the bucket only if a gradient exists by then;
      stage 2's 16-bit gradient partition (``grads_in_partition``) is allocated at the first bucket
      reduction (``copy_grads_in_partition``), inside the backward only when the bucket is smaller
      than the gradients; stage 1 keeps the gradients as they accumulate;
    * end of backward: ``independent_gradient_partition_epilogue`` -> ``reduce_ipg_grads`` reduces the
      last bucket through ``allreduce_bucket``, which flattens the bucket's gradients into a new
      tensor (``tensor = self.flatten(bucket)``) next to the bucket; the gradient partition is
      filled after that copy is freed (measured on CPU, resnet18 at world size 2: bucket 44.6 MiB +
      flat copy 44.6 MiB at the peak, inside ``reduce_ipg_grads``);
    * stage 1 only: the hooks reduce nothing (``process_gradients`` -> ``reduce_ready_partitions_and_remove_grads``
      only with ``partition_gradients`` or ``overlap_comm``), so the backward ends with every gradient alive beside
      the empty bucket; the engine's ``allreduce_gradients`` -> ``reduce_gradients`` then moves them into the bucket
      one by one (``reduce_independent_p_g_buckets_and_remove_grads``: ``grad.data`` becomes a view of the bucket),
      reducing each time it is full: at a reduction only the gradients not yet moved are alive beside it, plus the
      partition from the first reduction on (rank 0's partition is the first slice of the flat group);
    * optimizer step (``step``): the gradients of parameters outside the partition are freed first
      (``free_grad_in_param_list(params_not_in_partition)``; under stage 1 they are views of the bucket), the
      partition is flattened and cast to fp32 (``flatten(...).to(fp32)``, a second copy unless the
      weights are fp32), the partition's 16-bit gradients are freed, then the optimizer runs on the
      fp32 gradient partition.

    ``accumulating`` (more than one micro-step per optimizer step), stage 1: the engine's ``allreduce_gradients``
    reduces only at the accumulation boundary and only the boundary's ``independent_gradient_partition_epilogue``
    -> ``_release_ipg_buffers`` frees the bucket, so from the second micro-step on the forward and the backward run
    beside every gradient and the bucket (autograd adds each new gradient into ``param.grad``: the backward's traced
    peak net of gradients). Measured on CPU, tests/data/small_llama.json at 2 ranks, 2 micro-steps: 45,257,640
    bytes, estimated 45,388,168 (40,197,256 without this).
    """
    bucket, g16, g32 = s["bucket"], s["grads16"], s["grads32"]
    if stage == 1:  # gradients accumulate as autograd makes them: the traced peak of the sum
        act, grads_so_far = step.bwd_activations, step.bwd_grads
        in_flight = max(0, step.bwd_peak - act - grads_so_far)
    else:  # each gradient is copied into the bucket and freed: the traced peak net of gradients
        act, grads_so_far = step.bwd_net_activations, step.bwd_net_grads
        in_flight = max(0, step.bwd_net_peak - act)
    fwd = Breakdown(params=params, optimizer_states=optim, activations=step.activations,
                    other=max(0, step.fwd_peak - step.activations), phase="forward")
    if offload:  # gradients go to host memory bucket by bucket
        bwd = Breakdown(params=params, buffers=bucket, activations=act, other=in_flight, phase="backward")
        return [fwd, bwd]
    later = []
    if stage == 1 and accumulating and not offload:
        later = [Breakdown(params=params, grads=g16, optimizer_states=optim, buffers=bucket, activations=step.activations,
                           other=max(0, step.fwd_peak - step.activations), phase="forward (later micro-step)"),
                 Breakdown(params=params, grads=g16, optimizer_states=optim, buffers=bucket,
                           activations=step.bwd_net_activations,
                           other=max(0, step.bwd_net_peak - step.bwd_net_activations),
                           phase="backward (later micro-step)")]
    started = grads_so_far > 0
    bwd_grads = grads_so_far if stage == 1 else (g16 if started and bucket_fills else 0)
    first = Breakdown(params=params, optimizer_states=optim, buffers=bucket, activations=step.activations,
                      phase="backward (first gradient)")
    bwd = Breakdown(params=params, grads=bwd_grads, optimizer_states=optim, buffers=bucket if started else 0,
                    activations=act, other=in_flight, phase="backward")
    part = s["grads16_partition"]
    extra = []
    if stage == 1:
        # Stage 1 reduces after the backward (the engine's ``allreduce_gradients`` -> ``reduce_gradients``):
        # until then every gradient autograd made is alive beside the empty bucket. ``reduce_gradients`` ->
        # ``reduce_independent_p_g_buckets_and_remove_grads`` then copies each ``param.grad`` into the bucket and
        # points ``grad.data`` at that copy, freeing the gradient's own storage: at the first reduction the
        # gradients not yet moved (t - B elements) are alive beside the bucket; at the second, t - 2B and rank 0's
        # partition (``copy_grads_in_partition`` allocates ``grads_in_partition`` at the first one); the gradients
        # outside the partition stay views of the reused bucket (issue 25: counting g16 beside the bucket was
        # +22% on tests/data/small_llama.json at 2 ranks).
        extra.append(Breakdown(params=params, grads=g16, optimizer_states=optim, buffers=bucket,
                               phase="end of backward (every gradient, empty bucket)"))
        left = max(0, g16 - bucket)
        reduce_grads = max(left, max(0, g16 - 2 * bucket) + part) if left else 0
        filled = part
    else:
        reduce_grads, filled = (g16 if bucket_fills else 0), g16
    reduce = Breakdown(params=params, grads=reduce_grads, optimizer_states=optim,
                       buffers=bucket + s["reduce_copy"], phase="end of backward (bucket reduction)")
    epilogue = Breakdown(params=params, grads=filled, optimizer_states=optim, buffers=bucket,
                         phase="end of backward (gradient partition filled)")
    # The step first frees the gradients of parameters outside this rank's partition (stage 1 kept them
    # in the bucket), then flattens the partition's and casts that to fp32 (a second copy unless already fp32).
    cast = part if s["w"] == 4 else part + g32
    flatten = Breakdown(params=params, grads=part + cast, optimizer_states=optim, phase="optimizer step (flatten)")
    opt_step = Breakdown(params=params, grads=g32, optimizer_states=optim, other=temp, phase="optimizer step")
    return [fwd, first, bwd, *later, *extra, reduce, epilogue, flatten, opt_step]


def stage3_phases(s: dict[str, int], step, params: int, optim: int, offload: bool, temp: int,
                  dequant: tuple[int, int] = (0, 0)) -> list[Breakdown]:
    """The moments of a ZeRO-3 step (deepspeed/runtime/zero/stage3.py). Resident throughout: the
    weight partition, the reduce bucket and the gradient partition (``grad_partitions_flat_buffer``,
    zeros allocated in ``__init__``), the optimizer states; forward and backward add the gathered
    parameters; at the end of backward ``independent_gradient_partition_epilogue`` reduce-scatters the
    bucket through ``reduce_scatter_coalesced`` (runtime/comm/coalesced_collectives.py), which
    concatenates the bucket's gradients into a new flat tensor; measured on CPU (gloo, gpt2 at world
    size 2) a second bucket-sized copy (``aten::clone``) is alive at the same moment; the step
    releases the gathered parameters (``_partition_all_parameters``) and adds the fp32 flat gradient
    (``_prepare_fp32_grad_for_sub_group``: ``flatten(...).to(fp32)``) and the optimizer's temporaries.
    ``dequant``: QLoRA's dequantized copy of the layer being computed, (forward, backward)
    (``advisor.memory.dequantized_weight_bytes``)."""
    grads = 0 if offload else s["grads16"]
    resident = dict(params=params, grads=grads, optimizer_states=optim)
    buffers = s["bucket"] + s["gathered"]
    in_flight = max(0, step.bwd_net_peak - step.bwd_net_activations)
    fwd = Breakdown(**resident, buffers=buffers, activations=step.activations,
                    other=max(0, step.fwd_peak - step.activations) + dequant[0], phase="forward")
    bwd = Breakdown(**resident, buffers=buffers, activations=step.bwd_net_activations, other=in_flight + dequant[1],
                    phase="backward")
    if offload:
        return [fwd, bwd]
    reduce = Breakdown(**resident, buffers=s["bucket"] + 2 * s["reduce_copy"], phase="end of backward (reduce-scatter)")
    opt_step = Breakdown(params=params, grads=grads + s["grads32"], optimizer_states=optim, buffers=s["bucket"],
                         other=temp, phase="optimizer step")
    return [fwd, bwd, reduce, opt_step]


class Zero(Strategy):
    framework = "deepspeed"
    launcher = DEEPSPEED
    template = "zero.py"
    script_parts = ()  # DeepSpeed writes its own checkpoints (engine.save_checkpoint)
    casts_weights = True  # DeepSpeed's bf16/fp16 modes cast the whole module to 16 bits (no autocast)

    def __init__(self, stage: int, offload: bool = False) -> None:
        self.stage, self.offload = stage, offload
        self.name = f"zero{stage}" + ("_offload" if offload else "")
        self.title = f"ZeRO-{stage}" + (" + CPU offload" if offload else "")
        self.comm_order = 4 if offload else (2 if stage == 3 else 1)
        self.shards_everything = stage == 3
        self.sharding_stage = None if offload else stage
        # QLoRA: ZeRO-3 partitions a 4-bit base stored in the module's dtype (``quantized_sizes``); stages 1-2 would
        # replicate it as DDP does, and are not verified with it.
        self.quantized_base = stage == 3 and not offload
        self.comm_pattern = ("all-gather of the parameters in forward and in backward, reduce-scatter of the "
                             "gradients" if stage == 3 else "reduce-scatter of the gradients (all-reduce in "
                             "buckets), all-gather of the updated parameters") + (
                                 "; gradients and optimizer states over PCIe to host RAM" if offload else "")

    def not_applicable(self, ctx: StrategyContext) -> str | None:
        if ctx.options.precision == "pure-bf16":
            return "DeepSpeed ZeRO keeps fp32 master weights; pure bf16 runs with single, DDP, FSDP2 or TP"
        return None

    def fine_tuning_blocker(self, ctx: StrategyContext) -> str | None:
        adapter = ctx.profile.spec.adapter
        if self.quantized_base and adapter is not None and adapter.quantize == "int8":
            return ("ZeRO-3 partitions a 4-bit base (nf4, fp4) stored in the module's dtype (bnb_4bit_quant_storage); "
                    "an int8 (LLM.int8()) base under ZeRO-3 is not modelled: use --quantize nf4, or ddp with int8")
        return super().fine_tuning_blocker(ctx)

    def quantized_sizes(self, ctx: StrategyContext) -> dict[str, int] | None:
        """QLoRA under ZeRO-3 (None without a quantized base), per rank, in bytes; ``w`` is the module's dtype.

        The script loads the base with ``BitsAndBytesConfig(bnb_4bit_quant_storage=<the module's dtype>)``:
        ``Params4bit`` then packs the 4-bit codes into elements of that float dtype
        (``advisor.bnb_layout.quant_storage_numel``), so DeepSpeed's cast of the module (``engine.py``
        ``_cast_module_mixed_precision``: every float parameter ``.to(bf16/fp16)``) leaves the packed bits alone, and
        ZeRO-3 partitions each packed weight like any parameter (``partition_parameters.py`` ``_partition_param``:
        ``ceil(ds_numel / N)`` elements per rank, ``ds_tensor``), except those of at most
        ``stage3_param_persistence_threshold`` elements, which stay whole once gathered
        (``parameter_offload.py`` ``mark_persistent_parameters``; the threshold counts storage elements).

        - ``storage``: this rank's packed storage; ``full_storage``: all of it (one whole copy);
        - ``quant_states``: every weight's ``QuantState`` (absmax, code, double quantization's nested state;
          ``advisor.bnb_layout.quant_weight_layout``): attributes of the ``Params4bit``, not parameters, so DeepSpeed
          never partitions them: whole on every rank, on the device (``Params4bit.to`` moves them with the weight);
        - ``rest``: this rank's share of every other parameter (embeddings, norms, LM head, adapters), in ``w``: the
          script leaves out peft's ``prepare_model_for_kbit_training``, whose fp32 upcast DeepSpeed's cast would
          undo (checked: every parameter bf16 after ``deepspeed.initialize`` in bf16 mode; trl's SFTTrainer skips it
          for sharded QLoRA too); ``rest_full``: all of them whole;
        - ``gathered_elems``: the largest gather unit in elements of ``w`` (a module's non-quantized parameters, or a
          packed weight); ``gathered_total``: the bytes one pass gathers (everything not persistent).
        """
        adapter, stats = ctx.profile.spec.adapter, ctx.profile.stats
        if not (self.quantized_base and adapter is not None and adapter.quantize):
            return None
        n, w = ctx.world_size, self._w(ctx)
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
        return {"storage": storage, "full_storage": full_storage, "quant_states": states,
                "rest": -(-(rest - rest_persistent) * w // n) + rest_persistent * w, "rest_full": rest * w,
                "gathered_elems": max(largest, stats.largest_unquantized_module_params),
                "gathered_total": gathered_total}

    def _sizes(self, ctx: StrategyContext) -> dict[str, int]:
        stats, n = ctx.profile.stats, ctx.world_size
        w = 4 if ctx.options.precision == "fp32" else 2
        p, t = stats.num_params, stats.num_trainable
        b = bucket_elems(ctx)
        q = self.quantized_sizes(ctx)
        if q is not None:  # QLoRA: elements of w throughout (packed storage included)
            gathered = min(DS_MAX_LIVE_PARAMETERS, b["stage3_prefetch_bucket_size"] + q["gathered_elems"])
            weights = q["storage"] + q["quant_states"] + q["rest"]
            p = q["gathered_total"] // w
        elif self.stage == 3:
            gathered = min(DS_MAX_LIVE_PARAMETERS, b["stage3_prefetch_bucket_size"] + stats.largest_module_params)
            weights = -(-(p - stats.persistent_params) * w // n) + stats.persistent_params * w
        else:
            gathered, weights = 0, p * w
        if n == 1:
            # One partition holds the whole parameter: ``all_gather_coalesced`` returns
            # ``_no_gather_coalesced`` when every partition world size is 1 (partition_parameters.py).
            gathered = 0
        return dict(
            weights=weights + stats.buffer_bytes,
            gathered=gathered_bytes(min(gathered, p), w),
            master=-(-4 * t // n),
            # The torch (or bitsandbytes) optimizer steps one flat fp32 partition per group: 8-bit states are blocks of
            # that one large tensor (``advisor.memory.optimizer_state_bytes``).
            moments=optimizer_state_bytes(ctx.options.optimizer, -(-t // n), 4),
            grads16=t * w if self.stage == 1 else -(-t * w // n),
            grads16_partition=-(-t * w // n),
            grads32=-(-4 * t // n),
            # One bucket: stages 1-2 add a second only with overlap_comm (off in our configs;
            # stage_1_and_2.py setup_buckets), stage 3 allocates exactly one (stage3.py __init__, "IPG").
            bucket=b["reduce_bucket_size"] * w,
            partition_numel=-(-t // n),
            reduce_copy=min(b["reduce_bucket_size"], t) * w,
            w=w,
        )

    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        s = self._sizes(ctx)
        step = ctx.profile.activations(self.trace_mode(ctx.options.precision)).at(micro_batch)
        optim = 0 if self.offload else s["master"] + s["moments"]
        # Offloaded ZeRO-3 keeps only the persistent small parameters resident on the GPU.
        params = s["weights"]
        if self.offload and self.stage == 3:
            params = ctx.profile.stats.persistent_params * (4 if ctx.options.precision == "fp32" else 2)
        q = self.quantized_sizes(ctx)
        if q is not None:
            # Activations: the traced step of this precision. Under bf16/fp16 that trace (shared with pure bf16's
            # single/DDP QLoRA) keeps the non-quantized frozen parameters in fp32, as prepare_model_for_kbit_training
            # does there; DeepSpeed holds them in 16 bits, so its embedding output and norms are sized high. QLoRA
            # adds one layer's dequantized weight in forward and in backward (as under DDP).
            stats, adapter = ctx.profile.stats, ctx.profile.spec.adapter
            dequant = tuple(dequantized_weight_bytes(stats, adapter, ctx.device, ph) for ph in ("forward", "backward"))
            phases = stage3_phases(s, step, params, optim, self.offload, self._step_temp(ctx, s), dequant)
            # Before deepspeed.initialize partitions it, every rank holds the whole base: transformers 5.24 builds a
            # quantized model without zero.Init (modeling_utils.py: ``needs_zero3_init = is_deepspeed_zero3_enabled()
            # and not _is_quantized``), and bitsandbytes' quantizer loads it onto the rank's device
            # (``Bnb4BitHfQuantizer.update_device_map``: the current CUDA device, else the CPU): the packed storage, the
            # quant states, every other parameter in the load dtype and the buffers (the adapters come later, and are
            # small). While a weight is quantized (``Params4bit._quantize`` -> ``quantize_4bit``) its unquantized copy
            # is on the device too: ``w`` bytes per element on CUDA; on the CPU the fp32 copy and quantize_4bit's
            # temporaries, ``CPU_QUANTIZE_BYTES_PER_ELEMENT``. On the CPU the checkpoint itself is one more allocation
            # while it loads: safetensors maps the file into a torch storage, which the CPU meter counts (measured: one
            # allocation of the checkpoint file's size); advisor takes the checkpoint as fp32 (half for a 16-bit one).
            w = s["w"]
            per_elem = CPU_QUANTIZE_BYTES_PER_ELEMENT if ctx.device == "cpu" else w
            checkpoint = 4 * stats.num_frozen if ctx.device == "cpu" else 0
            # The weights by part: the fused expert weights of a mixture of experts are in ``rest_full`` (in w bytes).
            parts = quantized_base_parts(stats, q["full_storage"] + q["quant_states"], w,
                                         stats.num_params - stats.quantized_numel - stats.num_trainable,
                                         extra=stats.num_trainable * w + stats.buffer_bytes)
            phases.append(Breakdown(params=q["full_storage"] + q["quant_states"] + q["rest_full"] + stats.buffer_bytes,
                                    params_parts=parts,
                                    buffers=checkpoint, other=stats.largest_quantized_numel * per_elem,
                                    phase="loading (the whole quantized base, before deepspeed.initialize "
                                          "partitions it)"))
        elif self.stage == 3:
            phases = stage3_phases(s, step, params, optim, self.offload, self._step_temp(ctx, s))
        else:
            phases = stage12_phases(s, step, params, optim, self.stage, self.offload, self._step_temp(ctx, s),
                                    bucket_fills=bucket_elems(ctx)["reduce_bucket_size"] < ctx.profile.stats.num_trainable,
                                    accumulating=grad_accum_steps(ctx, ctx.world_size) > 1)
        peak = peak_of(*phases)
        host = 0
        if self.offload:
            per_rank = s["master"] + s["moments"] + s["grads32"]
            if self.stage == 3:
                per_rank += s["weights"]
            host = per_rank * ctx.hardware.gpus_per_node
        states = params if self.offload else params + optim + s["grads16"] + s["grads32"]
        return StrategyMemory(peak=peak, overhead=device_overhead(ctx.device, peak.total, ctx.world_size),
                              model_state_bytes=states,
                              host_bytes_per_node=host)

    def _step_temp(self, ctx: StrategyContext, s: dict[str, int]) -> int:
        """DeepSpeed hands the torch optimizer one flat fp32 partition per parameter group
        (``single_partition_of_fp32_groups`` in stage_1_and_2.py, ``fp32_partitioned_groups_flat``
        in stage3.py), so the CPU Adam loop's temporaries are the size of the whole partition."""
        return optimizer_step_temp_bytes(ctx.options.optimizer, ctx.device, s["partition_numel"], 4)

    def load_host_bytes_per_node(self, ctx: StrategyContext) -> int:
        """ZeRO-3 builds the model inside ``deepspeed.zero.Init`` where the family allows it
        (``script_constants``' ZERO_INIT): each parameter is partitioned as its module is created
        (partition_parameters.py, ``_post_init_method``), so a rank holds at most one module's full
        parameters in fp32 at a time; otherwise every rank builds the full fp32 model (the base rule,
        ``--init-from`` included: every rank loads the pretrained weights whole).

        ``--init-from`` under ZERO_INIT goes through transformers' DeepSpeed integration (transformers 5.24; the
        script keeps an ``HfDeepSpeedConfig`` alive): ``from_pretrained`` builds the model under ``zero.Init``
        (``PreTrainedModel.get_init_context``: the rule above), then ``PreTrainedModel._load_pretrained_model`` reads
        the checkpoint with ``load_state_dict(ckpt_file, map_location="cpu" if rank 0 else "meta")`` for every
        checkpoint shard file, merged into one dict before anything is copied: rank 0 holds the whole checkpoint,
        the other ranks only its shapes. ``integrations.deepspeed._load_state_dict_into_zero3_model`` then gathers
        each module's partitions on the GPU (``deepspeed.zero.GatheredParameters(params, modifier_rank=0)``), rank 0
        alone copies the values in (``module._load_from_state_dict``), and they are re-partitioned; buffers are
        broadcast from rank 0 on the GPU. Node 0 needs the larger of the build and rank 0's checkpoint (they do not
        overlap: the loading starts after the build, and each gather is a collective). The checkpoint's own dtype is
        not known to advisor: counted as ``pretrained_bytes`` (fp32; a 16-bit checkpoint needs half; safetensors'
        memory-mapped pages count as they are touched)."""
        if self.stage == 3 and family_of(ctx.profile.spec).zero_init and self.quantized_sizes(ctx) is None:
            stats = ctx.profile.stats
            build = ctx.hardware.gpus_per_node * 4 * stats.largest_module_params
            return max(build, pretrained_bytes(ctx)) if ctx.options.init_from else build
        return super().load_host_bytes_per_node(ctx)

    def load_fix(self, ctx: StrategyContext | None = None) -> str:
        """ZeRO-3 loading ``--init-from`` under zero.Init: what rank 0 holds is the checkpoint itself."""
        if (ctx is not None and ctx.options.init_from and self.stage == 3 and family_of(ctx.profile.spec).zero_init
                and self.quantized_sizes(ctx) is None):
            return ("rank 0 reads the whole checkpoint into host RAM while it copies it into the partitions: give node "
                    "0 more host RAM, or save the checkpoint in 16 bits (half the bytes)")
        return super().load_fix(ctx)

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        (frozen, p), n = rule_of_thumb_split(ctx.profile.stats, ctx.profile.spec.adapter), ctx.world_size
        # A frozen LoRA base is replicated by stages 1-2 and sharded by stage 3, like the 16-bit weights.
        sharded = {1: frozen + 4 * p + 12 * p // n, 2: frozen + 2 * p + 14 * p // n,
                   3: (frozen + RULE_OF_THUMB_BYTES_PER_PARAM * p) // n}
        if self.offload:
            return 2 * p if self.stage == 2 else 2 * p // n
        return sharded[self.stage]

    def ds_config(self, ctx: StrategyContext, row) -> dict:
        """The ds_config.json matching this estimate (DeepSpeed config docs, "ZeRO optimizations")."""
        opts, b = ctx.options, bucket_elems(ctx)
        zero: dict = {
            "stage": self.stage,
            "contiguous_gradients": True,
            "overlap_comm": self.stage == 3,  # DeepSpeed's default: on for stage 3 only
            "reduce_bucket_size": b["reduce_bucket_size"],
            "allgather_bucket_size": b["allgather_bucket_size"],
        }
        if self.stage == 3 and ctx.profile.spec.adapter is not None:
            # zero.Init's memory-efficient linear (deepspeed/runtime/zero/linear.py, LinearFunctionForZeroStage3)
            # saves every linear's input for backward, also where the weight is frozen, which torch's F.linear does
            # not: under LoRA that is every frozen projection's input (measured on 2 gloo ranks, tiny Llama, q/v
            # adapters: +15% of the peak with it, -0.4% against the estimate without it).
            zero["memory_efficient_linear"] = False
        if self.stage == 3:
            zero.update(stage3_prefetch_bucket_size=b["stage3_prefetch_bucket_size"],
                        stage3_param_persistence_threshold=100_000,
                        stage3_max_live_parameters=b["stage3_max_live_parameters"],
                        stage3_gather_16bit_weights_on_model_save=True)
        if self.offload:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
            if self.stage == 3:
                zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        config: dict = {
            "train_micro_batch_size_per_gpu": opts.micro_batch_size,
            "gradient_accumulation_steps": row.grad_accum_steps,
            "train_batch_size": opts.micro_batch_size * row.dp_size * row.grad_accum_steps,
            "zero_optimization": zero,
            # Set explicitly, as every other strategy's script clips (DeepSpeed's default is also 1.0).
            "gradient_clipping": 1.0,
            "steps_per_print": 1_000_000,
            "wall_clock_breakdown": False,
        }
        if opts.precision == "bf16":
            config["bf16"] = {"enabled": True}
        elif opts.precision == "fp16":
            config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}  # dynamic loss scaling
        if self.offload:
            # A torch optimizer as the client optimizer with offload: DeepSpeed's CPU Adam needs a C++ build.
            config["zero_force_ds_cpu_optimizer"] = False
        if opts.optimizer not in ("adam", "adamw"):
            # DeepSpeed refuses a client optimizer outside ZERO_SUPPORTED_OPTIMIZERS (zero/utils.py: Adam,
            # AdamW, Adagrad, Lion...; engine.py ``_do_optimizer_sanity_check``) unless this is set.
            config["zero_allow_untested_optimizer"] = True
        return config

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU sends per optimizer step, in DeepSpeed's 16-bit (fp32: 32-bit) dtype: a ring
        reduce-scatter or all-gather of S sends (n-1)/n x S (nccl-tests PERFORMANCE.md). ZeRO-1: gradients
        reduce-scattered once per step, updated parameters all-gathered once; ZeRO-2 reduce-scatters on every
        micro-step (it keeps only its gradient partition); ZeRO-3 gathers the parameters in forward and in backward
        and reduce-scatters the gradients on every micro-step (ZeRO paper section 7.2.2: 1.5x DDP per micro-step).
        0 on one GPU."""
        n, w = ctx.world_size, self._w(ctx)
        stats, ga = ctx.profile.stats, max(1, grad_accum_steps)
        # Stages 1-2 partition and re-gather only what the optimizer updates (its param groups: the trainable
        # parameters; a frozen LoRA base stays replicated and is never sent).
        grads, params = stats.num_trainable * w, stats.num_trainable * w
        if self.stage == 1:
            total = grads + params
        elif self.stage == 2:
            total = ga * grads + params
        else:
            total = ga * (grads + 2 * self._gathered_total(ctx))
        return (n - 1) * total // n

    def _gathered_total(self, ctx: StrategyContext) -> int:
        """Bytes one ZeRO-3 pass (forward or backward) all-gathers: every non-persistent parameter in the module's
        dtype (QLoRA: the packed 4-bit storage of the quantized weights, ``quantized_sizes``)."""
        q = self.quantized_sizes(ctx)
        if q is not None:
            return q["gathered_total"]
        stats = ctx.profile.stats
        return (stats.num_params - stats.persistent_params) * self._w(ctx)

    @staticmethod
    def _w(ctx: StrategyContext) -> int:
        return 4 if ctx.options.precision == "fp32" else 2

    def step_time(self, ctx: StrategyContext, row) -> StepTime | None:
        """Time rule (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; DeepSpeed 0.19). Compute: the roofline
        of the 16-bit-weights trace (DeepSpeed casts the module, no autocast casts). Collectives in the 16-bit
        dtype (fp32 runs: 32-bit), buckets as the emitted ds_config sets them:

        * ZeRO-1: reduce-scatter of the gradients at the accumulation boundary only (the engine's
          ``allreduce_gradients`` reduces stage 1 only there), all-gather of the updated parameters after the step;
        * ZeRO-2: reduce-scatter on every micro-step (``overlapping_partition_gradients_reduce_epilogue``: it keeps
          only its partition), all-gather after the step. The emitted config sets ``overlap_comm`` false for
          stages 1-2, so each bucket is reduced inside the backward hook that filled it: nothing overlaps;
        * ZeRO-3 (``overlap_comm`` true, prefetch ``stage3_prefetch_bucket_size``): every micro-step gathers the
          non-persistent parameters module by module in forward and again in backward and reduce-scatters the
          gradients; gathers are prefetched behind the compute of the modules before them, the reduce-scatter
          runs beside backward; exposed: the first module's gather of each pass, the last reduce bucket, and
          whatever communication outlasts compute (``advisor.timing.step.exposed_s``);
        * offload: the gradient partition goes to host memory over PCIe on every micro-step, the optimizer runs on
          the CPU (torch's foreach loop, all the node's ranks sharing the host memory bandwidth), the updated
          16-bit partition comes back over PCIe (ZeRO-3 + offload_param: the parameter partition comes up before
          every gather instead); all of it exposed.

        Optimizer on the GPU: fused AdamW over this rank's fp32 partition plus DeepSpeed's fp32 gradient
        flatten/cast and the copy of the updated partition into the 16-bit weights (6 bytes per element each)."""
        t = timing_of(ctx)
        if t is None:
            return None
        hw, opts, stats = ctx.hardware, ctx.options, ctx.profile.stats
        n, w, ga = ctx.world_size, self._w(ctx), row.grad_accum_steps or 1
        c = self.compute_time(ctx, t)
        fabric = fabric_of(ctx, t, hw.gpus_per_node, hw.num_nodes)
        b = bucket_elems(ctx)
        grads, params = stats.num_trainable * w, stats.num_trainable * w  # stages 1-2 gather the updated (trainable)
        coll: list[Collective] = []

        def run(kind: str, nbytes: int, bucket_bytes: int) -> tuple[float, float, int]:
            """(seconds, last bucket's seconds, calls) of one collective over ``nbytes`` in buckets."""
            sizes = split_buckets(nbytes, max(1, bucket_bytes)) if nbytes else []
            times = [fabric.time_s(kind, x) for x in sizes]
            return sum(times), (times[-1] if times else 0.0), len(sizes)

        exposed = comm = 0.0
        if self.stage in (1, 2):
            rs_s, _, rs_calls = run("reduce_scatter", grads, b["reduce_bucket_size"] * w)
            ag_s, _, ag_calls = run("all_gather", params, b["allgather_bucket_size"] * w)
            per = 1 if self.stage == 1 else ga
            if rs_s:
                coll.append(Collective("gradient reduce-scatter" + (" (every micro-step)" if self.stage == 2 else ""),
                                       "reduce_scatter", "data-parallel", grads, per * rs_calls, per * rs_s,
                                       per * rs_s, passes=per))
            if ag_s:
                coll.append(Collective("all-gather of the updated parameters", "all_gather", "data-parallel", params,
                                       ag_calls, ag_s, ag_s))
            comm = exposed = per * rs_s + ag_s
            overlap = "none: the emitted ds_config sets overlap_comm false for ZeRO-1/2"
        else:
            gathered = self._gathered_total(ctx)
            modules = max(1, stats.num_gathered_modules or stats.num_param_tensors)
            ag_s = fabric.time_s("all_gather", gathered // modules) * modules if n > 1 and gathered else 0.0
            rs_s, rs_last, rs_calls = run("reduce_scatter", grads, b["reduce_bucket_size"] * w)
            first = ag_s / modules
            fwd = exposed_s(ag_s, c.fwd_s, modules, first_s=first)
            bwd = exposed_s(ag_s + rs_s, c.bwd_s, modules + rs_calls, first_s=first, last_s=rs_last)
            if ag_s:
                coll.append(Collective("parameter all-gather in forward and in backward (every micro-step, "
                                       f"{modules} modules)", "all_gather", "data-parallel", gathered,
                                       2 * ga * modules, 2 * ga * ag_s, ga * (fwd + bwd - min(bwd, rs_last)),
                                       passes=2 * ga))
            if rs_s:
                coll.append(Collective("gradient reduce-scatter (every micro-step)", "reduce_scatter", "data-parallel",
                                       grads, ga * rs_calls, ga * rs_s, ga * min(bwd, rs_last), passes=ga))
            comm, exposed = ga * (2 * ag_s + rs_s), ga * (fwd + bwd)
            overlap = ("parameter gathers prefetched behind the compute of the modules before them, the gradient "
                       "reduce-scatter beside backward (overlap_comm); exposed: each pass's first gather, the last "
                       "reduce bucket and any overrun")
        k_opt = 0.0
        host = 0.0
        notes: list[str] = []
        part = -(-stats.num_trainable // n)
        if self.offload:
            pcie = t.preset.pcie_gen
            down = pcie_transfer_s(part * w, pcie)  # gradient partition to the host, per micro-step
            if self.stage == 3:
                up = 2 * pcie_transfer_s(-(-stats.num_params // n) * w, pcie)  # parameter partition, each pass
                up_per_step = ga * up
                up_what = "parameter partition to the GPU before each gather (every micro-step)"
            else:
                up_per_step = pcie_transfer_s(-(-stats.num_params // n) * w, pcie)
                up_what = "updated 16-bit partition back to the GPU"
            coll.append(Collective("gradient partition to host memory (every micro-step)", "pcie", "host", part * w,
                                   ga, ga * down, ga * down, passes=ga))
            ups = 2 * ga if self.stage == 3 else 1
            coll.append(Collective(up_what, "pcie", "host", -(-stats.num_params // n) * w, ups, up_per_step,
                                   up_per_step, passes=ups))
            comm += ga * down + up_per_step
            exposed += ga * down + up_per_step
            per_elem = (2 * 4 + 4 + 2 * states_per_element(opts.optimizer, 4)) * FOREACH_FACTOR
            # Every rank of the node steps its partition on the same host at once.
            host = part * hw.gpus_per_node * per_elem / (HOST_MEM_GBPS * 1e9)
            k_opt = host
            notes.append(f"CPU optimizer at {HOST_MEM_GBPS:g} GB/s of host memory bandwidth per node "
                         f"({HOST_MEM_SOURCE})")
        else:
            k_opt = optimizer_step_s(ctx, t, part, 4, 4, 4, extra=12)
        return StepTime(micro_batch=opts.micro_batch_size, micro_steps=ga, compute_s=ga * c.total_s, comm_s=comm,
                        exposed_comm_s=exposed, optimizer_s=k_opt, flops=ga * c.flops, model_flops=ga * c.model_flops,
                        peak_flops_per_s=t.peak_flops_per_s, overlap=overlap, collectives=tuple(coll), host_s=host,
                        notes=tuple(notes))

    def script_tags(self, job) -> set[str]:
        """``ds`` (the deepspeed launcher's flags), ``zero3`` (partitioned weights: gathered to export),
        ``zero-init`` (parameters partitioned as they are created, deepspeed.zero.Init, where the family allows it
        and the base is not quantized)
        and ``offload`` (the optimizer steps on the CPU)."""
        tags = {"ds"}
        if self.stage == 3:
            tags.add("zero3")
            # transformers builds a quantized base without zero.Init (every rank loads it whole; quantized_sizes)
            quantized = job.spec.adapter is not None and job.spec.adapter.quantize
            if family_of(job.spec).zero_init and not quantized:
                tags.add("zero-init")
        if self.offload:
            tags.add("offload")
        return tags

    def script_constants(self, job, family) -> dict:
        return {"DS_CONFIG_FILE": "ds_config.json"}

    def extra_files(self, job) -> dict[str, str]:
        """ds_config.json (what the estimate assumed), and a hostfile for several nodes."""
        files = {"ds_config.json": json.dumps(job.ds_config, indent=2) + "\n"}
        if job.num_nodes > 1:
            files["hostfile"] = "".join(f"node-{i} slots={job.gpus_per_node}\n" for i in range(job.num_nodes))
        return files

    def deepspeed_estimate(self, ctx: StrategyContext) -> dict[str, int] | None:
        """DeepSpeed's own model-state estimators (non-printing functions), for comparison:
        ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``; they assume
        fp16/bf16 + Adam and ignore activations and buffers. None for ZeRO-1 (DeepSpeed has none)."""
        if self.stage == 1:
            return None
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        stats, hw = ctx.profile.stats, ctx.hardware
        if self.stage == 2:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

            cpu, gpu = estimate_zero2_model_states_mem_needs(stats.num_params, hw.gpus_per_node, hw.num_nodes,
                                                             cpu_offload=self.offload)
        else:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(stats.num_params, stats.largest_module_params,
                                                                hw.gpus_per_node, hw.num_nodes,
                                                                cpu_offload=self.offload,
                                                                cpu_offload_params=self.offload)
        return {"gpu_bytes": int(gpu), "host_bytes_per_node": int(cpu)}
