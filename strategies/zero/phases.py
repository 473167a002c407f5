"""The moments of a ZeRO step: which of a rank's sizes (``strategies.zero.sizes.ZeroSizes``) coexist with which
activations of the traced step, each moment sourced to the DeepSpeed function that allocates or frees
(deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; DeepSpeed 0.19). Bytes per rank throughout."""

from __future__ import annotations

from functools import partial

from advisor.memory import Breakdown
from advisor.trace import StepTrace

from .sizes import ZeroSizes


def stage12_phases(
    s: ZeroSizes,
    step: StepTrace,
    params: int,
    optim: int,
    stage: int,
    offload: bool,
    temp: int,
    bucket_fills: bool,
    accumulating: bool = False,
) -> list[Breakdown]:
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
    bucket, g16, g32 = s.bucket, s.grads16, s.grads32
    if stage == 1:  # gradients accumulate as autograd makes them: the traced peak of the sum
        act, grads_so_far = step.bwd_activations, step.bwd_grads
        in_flight = max(0, step.bwd_peak - act - grads_so_far)
    else:  # each gradient is copied into the bucket and freed: the traced peak net of gradients
        act, grads_so_far = step.bwd_net_activations, step.bwd_net_grads
        in_flight = max(0, step.bwd_net_peak - act)
    fwd = Breakdown(
        params=params,
        optimizer_states=optim,
        activations=step.activations,
        other=max(0, step.fwd_peak - step.activations),
        phase="forward",
    )
    if offload:  # gradients go to host memory bucket by bucket
        bwd = Breakdown(params=params, buffers=bucket, activations=act, other=in_flight, phase="backward")
        return [fwd, bwd]
    later = []
    if stage == 1 and accumulating and not offload:
        later = [
            Breakdown(
                params=params,
                grads=g16,
                optimizer_states=optim,
                buffers=bucket,
                activations=step.activations,
                other=max(0, step.fwd_peak - step.activations),
                phase="forward (later micro-step)",
            ),
            Breakdown(
                params=params,
                grads=g16,
                optimizer_states=optim,
                buffers=bucket,
                activations=step.bwd_net_activations,
                other=max(0, step.bwd_net_peak - step.bwd_net_activations),
                phase="backward (later micro-step)",
            ),
        ]
    started = grads_so_far > 0
    bwd_grads = grads_so_far if stage == 1 else (g16 if started and bucket_fills else 0)
    first = Breakdown(
        params=params,
        optimizer_states=optim,
        buffers=bucket,
        activations=step.activations,
        phase="backward (first gradient)",
    )
    bwd = Breakdown(
        params=params,
        grads=bwd_grads,
        optimizer_states=optim,
        buffers=bucket if started else 0,
        activations=act,
        other=in_flight,
        phase="backward",
    )
    part = s.grads16_partition
    extra = []
    if stage == 1:
        # Stage 1 reduces after the backward (the engine's ``allreduce_gradients`` -> ``reduce_gradients``):
        # until then every gradient autograd made is alive beside the empty bucket. ``reduce_gradients`` ->
        # ``reduce_independent_p_g_buckets_and_remove_grads`` then copies each ``param.grad`` into the bucket and
        # points ``grad.data`` at that copy, freeing the gradient's own storage: at the first reduction the
        # gradients not yet moved (t - B elements) are alive beside the bucket; at the second, t - 2B and rank 0's
        # partition (``copy_grads_in_partition`` allocates ``grads_in_partition`` at the first one); the gradients
        # outside the partition stay views of the reused bucket (counting g16 beside the bucket was
        # +22% on tests/data/small_llama.json at 2 ranks).
        extra.append(
            Breakdown(
                params=params,
                grads=g16,
                optimizer_states=optim,
                buffers=bucket,
                phase="end of backward (every gradient, empty bucket)",
            )
        )
        left = max(0, g16 - bucket)
        reduce_grads = max(left, max(0, g16 - 2 * bucket) + part) if left else 0
        filled = part
    else:
        reduce_grads, filled = (g16 if bucket_fills else 0), g16
    reduce = Breakdown(
        params=params,
        grads=reduce_grads,
        optimizer_states=optim,
        buffers=bucket + s.reduce_copy,
        phase="end of backward (bucket reduction)",
    )
    epilogue = Breakdown(
        params=params,
        grads=filled,
        optimizer_states=optim,
        buffers=bucket,
        phase="end of backward (gradient partition filled)",
    )
    # The step first frees the gradients of parameters outside this rank's partition (stage 1 kept them
    # in the bucket), then flattens the partition's and casts that to fp32 (a second copy unless already fp32).
    cast = part if s.w == 4 else part + g32
    flatten = Breakdown(params=params, grads=part + cast, optimizer_states=optim, phase="optimizer step (flatten)")
    opt_step = Breakdown(params=params, grads=g32, optimizer_states=optim, other=temp, phase="optimizer step")
    return [fwd, first, bwd, *later, *extra, reduce, epilogue, flatten, opt_step]


def stage3_phases(
    s: ZeroSizes, step: StepTrace, params: int, optim: int, offload: bool, temp: int, dequant: tuple[int, int] = (0, 0)
) -> list[Breakdown]:
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
    grads = 0 if offload else s.grads16
    resident = partial(Breakdown, params=params, grads=grads, optimizer_states=optim)
    buffers = s.bucket + s.gathered
    in_flight = max(0, step.bwd_net_peak - step.bwd_net_activations)
    fwd = resident(
        buffers=buffers,
        activations=step.activations,
        other=max(0, step.fwd_peak - step.activations) + dequant[0],
        phase="forward",
    )
    bwd = resident(
        buffers=buffers, activations=step.bwd_net_activations, other=in_flight + dequant[1], phase="backward"
    )
    if offload:
        return [fwd, bwd]
    reduce = resident(buffers=s.bucket + 2 * s.reduce_copy, phase="end of backward (reduce-scatter)")
    opt_step = Breakdown(
        params=params,
        grads=grads + s.grads32,
        optimizer_states=optim,
        buffers=s.bucket,
        other=temp,
        phase="optimizer step",
    )
    return [fwd, bwd, reduce, opt_step]
