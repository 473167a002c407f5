"""FSDP2's memory rule: what ``fully_shard`` allocates per rank, phase by phase (``step_phases``).

What FSDP2 allocates per rank (torch 2.14, torch/distributed/fsdp/_fully_shard/; N = shard world size; a unit is
one ``fully_shard`` call: each repeated block, then the root with everything else; for a unit F = its parameters'
numel with dim 0 padded to a multiple of N, ``_fsdp_param.py`` ``_init_sharded_param``):

* sharded parameters: F/N per unit in the parameters' own dtype (fp32, or bf16 for pure bf16), the optimizer's
  weights (no master copy): ``FSDPParam._sharded_param_data``;
* optimizer states on the sharded parameters (``torch.zeros_like`` of each DTensor: its local F/N shard);
* sharded gradients: F/N per trainable unit, views into the reduce-scatter output (``foreach_reduce``: cast to the
  parameters' dtype when ``reduce_dtype`` differs), from the unit's post-backward to ``zero_grad``;
* gathered parameters in ``param_dtype``: per unit the flat all-gather output (``foreach_all_gather``:
  ``all_gather_comm.allocate``, F elements; the local shard is a view into it) and the per-parameter unsharded
  tensors it is copied into (``foreach_all_gather_copy_out``, F elements). In forward the flat output is kept
  until the next unit's copy-out (``wait_for_unshard``, implicit prefetch): two units' worth at once. In backward
  the current unit is gathered while the next is prefetched (``_backward_prefetch``). At world size 1 there is no
  flat buffer (the unsharded tensors are copies of the shard);
* the root keeps its parameters gathered from forward to the end of backward (``fully_shard``: the root's
  ``reshard_after_forward`` defaults to False), and its gradients (the embeddings', the LM head's) accumulate in
  ``param_dtype`` through the whole backward until its post-backward reduces them;
* reduce-scatter: per unit an input of F elements in ``reduce_dtype`` (``foreach_reduce``:
  ``reduce_scatter_comm.allocate``), kept until the next unit's post-backward
  (``reduce_scatter_max_input_buffers`` = 1, ``FSDPParamGroup.post_backward``), and its F/N output;
* with gradient accumulation and sync only on the last micro-step (``set_requires_gradient_sync(False)``), every
  unit's unsharded gradients stay until that last micro-step, in ``reduce_dtype`` when it differs from
  ``param_dtype`` (``FSDPParam.to_accumulated_grad_if_needed``); synced every micro-step the sharded gradients
  accumulate instead (``to_accumulate_grad`` in ``foreach_reduce``).
"""

from __future__ import annotations

from itertools import accumulate

from advisor.context import StrategyContext
from advisor.memory import Breakdown, optimizer_state_bytes, optimizer_step_temp_bytes, trace_mode, weight_bytes

from ..ddp import grad_accum_steps
from .layout import Dtypes, FSDP2Rule, Unit, units


def windows(
    blocks: list[Unit], d: Dtypes, flat: int, reshard: bool, n: int = 1, grads_done: bool = True
) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """Bytes of the blocks' gathered parameters and collective buffers at three moments, each the largest over the
    blocks in forward order (P_i: block i's padded numel in param_dtype, T_i: its trainable padded numel in
    reduce_dtype; ``flat`` 0 at world size 1, where no flat all-gather buffer exists). The two backward moments
    come with the sharded gradients the blocks after i have produced by then (G_i: their trainable shards in the
    parameters' dtype; with ``grads_done`` False the caller counts every shard itself) as (buffers, gradients) at
    the block where their sum is largest:

    * forward: block i gathered with its flat output kept (``wait_for_unshard``'s implicit prefetch), or that output
      and block i+1's flat output once i+1's all-gather is issued: P_i + flat x max(P_i, P_i+1);
    * backward, while block i computes: P_i, block i-1's flat output (``_backward_prefetch``) and block i+1's
      reduce-scatter input (kept until i's post-backward): P_i + flat x P_i-1 + T_i+1;
    * backward, at block i's copy-out: its flat output and its unsharded tensors with T_i+1: P_i + flat x P_i + T_i+1.

    Without resharding every block stays gathered from forward to its own post-backward: forward ends with all of
    them (and the last flat output), backward at block i holds blocks 0..i and T_i+1; nothing is gathered again.
    """
    if not blocks:
        return 0, (0, 0), (0, 0)
    p = [u.padded * d.param for u in blocks] + [0]
    t = [u.trainable_padded * d.reduce for u in blocks] + [0]
    k = len(blocks)
    # G_i, the trainable shards of blocks i+1.. (suffix sums: linear in the depth, a 1000-block config included)
    after = list(accumulate((u.trainable_shard(n) for u in reversed(blocks[1:])), initial=0))[::-1]
    g = [a * d.orig if grads_done else 0 for a in after]

    def largest(buffers: list[int]) -> tuple[int, int]:
        i = max(range(k), key=lambda j: buffers[j] + g[j])
        return buffers[i], g[i]

    if not reshard:
        held = [gathered + t[i + 1] for i, gathered in enumerate(accumulate(p[:k]))]
        return sum(p[:k]) + flat * max(p[:k]), largest(held), largest(held)
    fwd = max(p[i] + flat * max(p[i], p[i + 1]) for i in range(k))
    bwd = [p[i] + flat * (p[i - 1] if i else 0) + t[i + 1] for i in range(k)]
    copy = [p[i] + flat * p[i] + t[i + 1] for i in range(k)]
    return fwd, largest(bwd), largest(copy)


def step_phases(fs: FSDP2Rule, ctx: StrategyContext, micro_batch: int) -> tuple[list[Breakdown], int, int]:
    """(forward, backward, end of backward, optimizer step breakdowns; model-state bytes on the GPU; host bytes
    per node) at ``micro_batch`` samples per GPU, each term as the module docstring sources it; ``fs``: the
    strategy's way of sharding (``FSDP2Rule``)."""
    opts, stats = ctx.options, ctx.profile.stats
    n = fs.shard_size(ctx)
    d = fs.dtypes(ctx)
    us = units(stats, n)
    root, blocks = us[0], us[1:]
    blk = max(blocks, key=lambda u: u.padded) if blocks else Unit(0, 0, 0, 0)
    # Frozen shards (a LoRA base) stay in the dtype they were loaded in, the trainable ones in theirs.
    frozen_elem = weight_bytes(stats, ctx.profile.spec.adapter, trace_mode(opts.precision, False)).frozen_elem
    shard_params = sum((u.shard(n) - u.trainable_shard(n)) * frozen_elem + u.trainable_shard(n) * d.orig for u in us)
    shard_grads = sum(u.trainable_shard(n) for u in us) * d.orig
    optim = optimizer_state_bytes(opts.optimizer, sum(u.trainable_shard(n) for u in us), d.orig)
    accumulating = grad_accum_steps(ctx, fs.dp_size(ctx)) > 1
    step = ctx.profile.activations(fs.trace_mode(opts.precision)).at(micro_batch)
    # Gathered parameters and collective buffers (module docstring), block by block in forward order, the root
    # gathered throughout: ``windows`` gives forward's largest, backward's while a block computes, and
    # backward's at a block's copy-out (its flat all-gather output and its unsharded tensors both alive).
    flat = 1 if n > 1 else 0
    root_gathered = root.padded * d.param
    no_sync = accumulating and not fs.sync_every(ctx)
    # Sharded gradients alive in backward: all of them from the second micro-step on when synced every micro-step
    # (they accumulate), else those of the blocks backward has passed (``windows``); none without sync.
    every = accumulating and not no_sync
    fwd_blocks, (bwd_blocks, bwd_done), (copy_out, copy_done) = windows(
        blocks, d, flat, fs.reshard, n, grads_done=not (every or no_sync or fs.offload)
    )
    # Gradients in flight in backward: the root's (in param_dtype until the end of backward) and the current
    # block's (the previous block's reduce-scatter input is in ``windows``); HSDP holds one all-reduce buffer.
    root_grads = root.trainable_numel * d.param
    early_root_grads = (root.trainable_numel - root.late_numel) * d.param  # all but the input embedding's
    in_flight_grads = min(step.bwd_net_grads, early_root_grads + blk.trainable_numel * d.param)
    rs_buffers = blk.trainable_shard(n) * d.reduce if fs.hybrid else 0
    # Accumulating without sync: every unit's unsharded gradients until the last micro-step (reduce dtype).
    held = sum(u.trainable_numel for u in us) * max(d.param, d.reduce) if no_sync else 0
    fwd_shard_grads = shard_grads if every else 0
    if fs.offload:  # the shards live in host memory; the GPU keeps gathered units and the buffers
        resident_params, resident_optim = stats.buffer_bytes, 0
        fwd_shard_grads = 0
        upload = blk.shard(n) * d.orig  # the host shard copied up before its all-gather
        rs_buffers += blk.trainable_shard(n) * d.reduce  # the reduce-scatter output, before it goes down
    else:
        resident_params, resident_optim = shard_params + stats.buffer_bytes, optim
        upload = 0
    fwd = Breakdown(
        params=resident_params,
        grads=fwd_shard_grads + held,
        optimizer_states=resident_optim,
        buffers=root_gathered + fwd_blocks + upload,
        activations=step.activations,
        other=max(0, step.fwd_peak - step.activations),
        phase="forward",
    )
    # Where the traced backward peak falls, from the gradients made by then (the trace's own dtype per element).
    per_elem = step.grads / max(1, stats.num_trainable)
    blocks_made = sum(u.trainable_numel for u in blocks) * per_elem
    if blocks and step.bwd_net_grads >= 0.999 * blocks_made:  # after every block: the root's own backward
        # (the input embedding's; a tied one accumulates its second share there): every block resharded, its
        # sharded gradient made, block 0's reduce-scatter input still held until the root's post-backward
        bwd_buffers = blocks[0].trainable_padded * d.reduce + rs_buffers
        bwd_grads = 0 if every or no_sync or fs.offload else sum(u.trainable_shard(n) for u in blocks) * d.orig
        when = "backward (the root's, after the blocks)"
    elif step.bwd_net_grads:  # inside the blocks: the window while a block computes
        bwd_buffers, bwd_grads, when = bwd_blocks + rs_buffers, bwd_done + in_flight_grads, "backward"
    else:  # before the first gradient (the loss and LM head / classifier): the root's pre-backward has only
        # issued the last block's all-gather (``_backward_prefetch``); no block is gathered or reduced yet
        # (without resharding every block is still gathered from forward)
        gathered = sum(u.padded for u in blocks) if not fs.reshard else (flat * blocks[-1].padded if blocks else 0)
        bwd_buffers, bwd_grads = gathered * d.param, 0
        when = "backward (loss and head, before the blocks)"
    bwd = Breakdown(
        params=resident_params,
        grads=fwd_shard_grads + bwd_grads + held,
        optimizer_states=resident_optim,
        buffers=root_gathered + bwd_buffers + upload,
        activations=step.bwd_net_activations,
        other=max(0, step.bwd_net_peak - step.bwd_net_activations),
        phase=when,
    )
    # A block's copy-out happens between ops (no backward temporaries), after the root's LM head / classifier
    # made its gradients (the input embedding's reaches .grad only at the end: ``ParamStats.fsdp_units``).
    gather = Breakdown(
        params=resident_params,
        grads=fwd_shard_grads + copy_done + held + early_root_grads,
        optimizer_states=resident_optim,
        buffers=root_gathered + copy_out + rs_buffers + upload,
        activations=step.bwd_net_activations,
        phase="backward (a block's all-gather copy-out)",
    )
    # The root's post-backward (``FSDPParamGroup.post_backward``): it reshards (frees its gathered parameters)
    # first, then ``foreach_reduce`` allocates the reduce-scatter input and copies the unsharded gradients in,
    # frees them, and allocates the output (the root's sharded gradient). Before it, the other units' sharded
    # gradients (all of them when accumulating).
    before = (
        0
        if fs.offload or no_sync
        else (shard_grads if accumulating else shard_grads - root.trainable_shard(n) * d.orig)
    )
    root_in, root_out = root.trainable_padded * d.reduce, root.trainable_shard(n) * d.reduce
    copy_in = Breakdown(
        params=resident_params,
        grads=before + held + root_grads,
        optimizer_states=resident_optim,
        buffers=root_in,
        phase="end of backward (root reduce-scatter copy-in)",
    )
    reduce = Breakdown(
        params=resident_params,
        grads=before + held,
        optimizer_states=resident_optim,
        buffers=root_in + root_out,
        phase="end of backward (root reduce-scatter)",
    )
    phases = [fwd, bwd, gather, copy_in, reduce]
    if not fs.offload:
        largest_shard = -(-stats.largest_param_numel // n)
        temp = optimizer_step_temp_bytes(opts.optimizer, ctx.device, largest_shard, d.orig)
        phases.append(
            Breakdown(
                params=resident_params, grads=shard_grads, optimizer_states=optim, other=temp, phase="optimizer step"
            )
        )
    host = (shard_params + shard_grads + optim) * ctx.hardware.gpus_per_node if fs.offload else 0
    states = stats.buffer_bytes if fs.offload else shard_params + shard_grads + optim + stats.buffer_bytes
    return phases, states, host
