"""FSDP2 (``torch.distributed.fsdp.fully_shard``): PyTorch's own sharding of parameters, gradients and optimizer
states, one module parameterised by how it shards (four rows, one generated script):

* ``fsdp2``: every repeated block resharded after forward (gathered again in backward), like ZeRO-3;
* ``fsdp2_noreshard``: blocks keep their gathered parameters from forward to backward
  (``reshard_after_forward=False``), like ZeRO-2: more memory, one all-gather less per micro-step;
* ``fsdp2_offload``: ``CPUOffloadPolicy``: sharded parameters, gradients and optimizer states in pinned host memory,
  the optimizer step on the CPU;
* ``hsdp``: several nodes as a 2-D mesh (replicate across nodes, shard inside a node): gathers stay on NVLink.

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

from dataclasses import dataclass

from advisor.context import StrategyContext
from advisor.memory import (
    RULE_OF_THUMB_BYTES_PER_PARAM,
    Breakdown,
    StrategyMemory,
    device_overhead,
    optimizer_state_bytes,
    optimizer_step_temp_bytes,
    peak_of,
    rule_of_thumb_split,
    states_per_element,
    trace_mode,
    weight_bytes,
)
from advisor.timing.comm import pcie_transfer_s
from advisor.timing.step import (
    FOREACH_FACTOR,
    HOST_MEM_GBPS,
    HOST_MEM_SOURCE,
    Collective,
    StepTime,
    exposed_s,
)

from .base import (
    DCP_IMPORTS,
    Strategy,
    fabric_of,
    optimizer_step_s,
    pretrained_bytes,
    pretrained_copies,
    timing_of,
)
from .ddp import grad_accum_steps


@dataclass(frozen=True)
class Unit:
    """One ``fully_shard`` unit at shard world size N: ``padded``/``trainable_padded`` are its (trainable)
    parameters' numel with dim 0 padded to a multiple of N (the all-gather output and the reduce-scatter input);
    ``numel``/``trainable_numel`` unpadded (autograd's unsharded gradients); ``late_numel``: trainable parameters
    whose gradient reaches ``.grad`` last (the input embedding)."""

    padded: int
    numel: int
    trainable_padded: int
    trainable_numel: int
    late_numel: int = 0

    def shard(self, n: int) -> int:
        return self.padded // n

    def trainable_shard(self, n: int) -> int:
        return self.trainable_padded // n


def units(stats, n: int) -> list[Unit]:
    """``stats.fsdp_units`` at shard world size ``n``, the root first (``advisor.profile.fsdp_units``)."""
    if not stats.fsdp_units:  # no unit list (a hand-made ParamStats): one root unit, unpadded
        return [Unit(stats.num_params, stats.num_params, stats.num_trainable, stats.num_trainable)]
    out = []
    for unit in stats.fsdp_units:
        padded = train_padded = numel = train_numel = late = 0
        for dim0, size, trainable, last in unit:
            rows = max(1, dim0)
            p = -(-rows // n) * n * (size // rows)
            padded, numel = padded + p, numel + size
            if trainable:
                train_padded, train_numel = train_padded + p, train_numel + size
                late += size if last else 0
        out.append(Unit(padded, numel, train_padded, train_numel, late))
    return out


def windows(blocks: list[Unit], d: Dtypes, flat: int, reshard: bool, n: int = 1,
            grads_done: bool = True) -> tuple[int, tuple[int, int], tuple[int, int]]:
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
    g = [sum(u.trainable_shard(n) for u in blocks[i + 1:]) * d.orig if grads_done else 0 for i in range(k)]

    def largest(buffers: list[int]) -> tuple[int, int]:
        i = max(range(k), key=lambda j: buffers[j] + g[j])
        return buffers[i], g[i]

    if not reshard:
        held = [sum(p[:i + 1]) + t[i + 1] for i in range(k)]
        return sum(p[:k]) + flat * max(p[:k]), largest(held), largest(held)
    fwd = max(p[i] + flat * max(p[i], p[i + 1]) for i in range(k))
    bwd = [p[i] + flat * (p[i - 1] if i else 0) + t[i + 1] for i in range(k)]
    copy = [p[i] + flat * p[i] + t[i + 1] for i in range(k)]
    return fwd, largest(bwd), largest(copy)


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element: ``orig`` the parameters' own dtype (sharded parameters, gradients, optimizer states),
    ``param`` the MixedPrecisionPolicy's param_dtype (gathered parameters, autograd's gradients), ``reduce`` its
    reduce_dtype (reduce-scatter buffers; the emitted policy sets fp32 under mixed precision)."""

    orig: int
    param: int
    reduce: int


def dtypes(precision: str, trainable_elem: int | None = None) -> Dtypes:
    """``Dtypes`` at ``precision``; ``trainable_elem``: the trainable parameters' own bytes per element when they
    differ from the precision's (LoRA adapters in bf16, ``advisor.memory.weight_bytes``)."""
    if precision == "pure-bf16":  # the module is bf16 itself; no policy, so gradients are reduced in bf16
        return Dtypes(2, 2, 2)
    orig = trainable_elem or 4
    if precision in ("bf16", "fp16"):
        return Dtypes(orig, 2, 4)
    return Dtypes(orig, 4, 4)


class FSDP2(Strategy):
    framework = "torch"
    template = "fsdp2.py"
    casts_weights = True  # MixedPrecisionPolicy runs the blocks on 16-bit parameters (no autocast): the half trace
    uses_fsdp_grad_sync = True
    client_optimizers = False  # bitsandbytes' and Adafactor's steps on DTensor shards are not verified
    script_imports = (*DCP_IMPORTS,
                      "from torch.distributed.device_mesh import init_device_mesh",
                      ("from torch.distributed.fsdp import (\n    CPUOffloadPolicy,\n    FSDPModule,\n"
                       "    MixedPrecisionPolicy,\n    OffloadPolicy,\n    fully_shard,\n)"))

    def __init__(self, reshard: bool = True, offload: bool = False, hybrid: bool = False) -> None:
        self.reshard, self.offload, self.hybrid = reshard, offload, hybrid
        self.name = "hsdp" if hybrid else "fsdp2" + ("_offload" if offload else "" if reshard else "_noreshard")
        self.title = ("HSDP (FSDP2 2-D)" if hybrid else "FSDP2" + (" + CPU offload" if offload else
                                                                    "" if reshard else " (no reshard)"))
        self.shards_everything = reshard and not hybrid
        # Ties in step time: after ZeRO's (FSDP2 moves what ZeRO-3 moves); offload last with ZeRO's offload.
        self.comm_order = 4 if offload else 2
        self.comm_pattern = ("all-gather of the parameters in forward" + (" and in backward" if reshard else "")
                             + ", reduce-scatter of the gradients (fp32)" +
                             (" inside each node, all-reduce of the shards across nodes" if hybrid else "")
                             + ("; sharded states in host RAM over PCIe" if offload else ""))

    # --- where it applies -------------------------------------------------------------------------------------
    def not_applicable(self, ctx: StrategyContext) -> str | None:
        # fp16 applies: torch.amp.GradScaler unscales DTensor gradients and takes the found-inf flag's maximum over
        # the mesh (checked on 2 gloo ranks: an inf on one rank skips the step on both and halves the scale).
        if self.hybrid and ctx.hardware.num_nodes < 2:
            return "HSDP replicates across nodes: it needs at least 2 nodes (on one node use fsdp2)"
        return None

    def dtypes(self, ctx: StrategyContext) -> Dtypes:
        """``dtypes`` of this plan: the trainable parameters held as under autocast (LoRA adapters in fp32, peft's
        upcast, unless ``--lora-dtype``), the frozen base apart (``phases``)."""
        wb = weight_bytes(ctx.profile.stats, ctx.profile.spec.adapter, trace_mode(ctx.options.precision, False))
        return dtypes(ctx.options.precision, wb.trainable_elem)

    def shard_size(self, ctx: StrategyContext) -> int:
        """N: the ranks a parameter is sharded over (HSDP: one node's GPUs)."""
        return ctx.hardware.gpus_per_node if self.hybrid else ctx.world_size

    def _sync_every(self, ctx: StrategyContext) -> bool:
        return ctx.options.fsdp_grad_sync != "last-micro-step"

    # --- memory -----------------------------------------------------------------------------------------------
    def memory(self, ctx: StrategyContext, micro_batch: int) -> StrategyMemory:
        """The largest of ``phases``; host RAM (offload): every rank's shards, gradients and optimizer states."""
        phases, states, host = self.phases(ctx, micro_batch)
        peak = peak_of(*phases)
        return StrategyMemory(peak=peak, overhead=device_overhead(ctx.device, peak.total, ctx.world_size),
                              model_state_bytes=states, host_bytes_per_node=host)

    def phases(self, ctx: StrategyContext, micro_batch: int) -> tuple[list[Breakdown], int, int]:
        """(forward, backward, end of backward, optimizer step breakdowns; model-state bytes on the GPU; host bytes
        per node) at ``micro_batch``, each term as the module docstring sources it."""
        opts, stats = ctx.options, ctx.profile.stats
        n = self.shard_size(ctx)
        d = self.dtypes(ctx)
        us = units(stats, n)
        root, blocks = us[0], us[1:]
        blk = max(blocks, key=lambda u: u.padded) if blocks else Unit(0, 0, 0, 0)
        # Frozen shards (a LoRA base) stay in the dtype they were loaded in, the trainable ones in theirs.
        frozen_elem = weight_bytes(stats, ctx.profile.spec.adapter, trace_mode(opts.precision, False)).frozen_elem
        shard_params = sum((u.shard(n) - u.trainable_shard(n)) * frozen_elem + u.trainable_shard(n) * d.orig
                           for u in us)
        shard_grads = sum(u.trainable_shard(n) for u in us) * d.orig
        optim = optimizer_state_bytes(opts.optimizer, sum(u.trainable_shard(n) for u in us), d.orig)
        accumulating = grad_accum_steps(ctx, self.dp_size(ctx)) > 1
        step = ctx.profile.activations(self.trace_mode(opts.precision)).at(micro_batch)
        # Gathered parameters and collective buffers (module docstring), block by block in forward order, the root
        # gathered throughout: ``windows`` gives forward's largest, backward's while a block computes, and
        # backward's at a block's copy-out (its flat all-gather output and its unsharded tensors both alive).
        flat = 1 if n > 1 else 0
        root_gathered = root.padded * d.param
        no_sync = accumulating and not self._sync_every(ctx)
        # Sharded gradients alive in backward: all of them from the second micro-step on when synced every micro-step
        # (they accumulate), else those of the blocks backward has passed (``windows``); none without sync.
        every = accumulating and not no_sync
        fwd_blocks, (bwd_blocks, bwd_done), (copy_out, copy_done) = windows(
            blocks, d, flat, self.reshard, n, grads_done=not (every or no_sync or self.offload))
        # Gradients in flight in backward: the root's (in param_dtype until the end of backward) and the current
        # block's (the previous block's reduce-scatter input is in ``windows``); HSDP holds one all-reduce buffer.
        root_grads = root.trainable_numel * d.param
        early_root_grads = (root.trainable_numel - root.late_numel) * d.param  # all but the input embedding's
        in_flight_grads = min(step.bwd_net_grads, early_root_grads + blk.trainable_numel * d.param)
        rs_buffers = blk.trainable_shard(n) * d.reduce if self.hybrid else 0
        # Accumulating without sync: every unit's unsharded gradients until the last micro-step (reduce dtype).
        held = sum(u.trainable_numel for u in us) * max(d.param, d.reduce) if no_sync else 0
        fwd_shard_grads = shard_grads if every else 0
        if self.offload:  # the shards live in host memory; the GPU keeps gathered units and the buffers
            resident_params, resident_optim = stats.buffer_bytes, 0
            fwd_shard_grads = 0
            upload = blk.shard(n) * d.orig  # the host shard copied up before its all-gather
            rs_buffers += blk.trainable_shard(n) * d.reduce  # the reduce-scatter output, before it goes down
        else:
            resident_params, resident_optim = shard_params + stats.buffer_bytes, optim
            upload = 0
        fwd = Breakdown(params=resident_params, grads=fwd_shard_grads + held, optimizer_states=resident_optim,
                        buffers=root_gathered + fwd_blocks + upload, activations=step.activations,
                        other=max(0, step.fwd_peak - step.activations), phase="forward")
        # Where the traced backward peak falls, from the gradients made by then (the trace's own dtype per element).
        per_elem = step.grads / max(1, stats.num_trainable)
        blocks_made = sum(u.trainable_numel for u in blocks) * per_elem
        if blocks and step.bwd_net_grads >= 0.999 * blocks_made:  # after every block: the root's own backward
            # (the input embedding's; a tied one accumulates its second share there): every block resharded, its
            # sharded gradient made, block 0's reduce-scatter input still held until the root's post-backward
            bwd_buffers = blocks[0].trainable_padded * d.reduce + rs_buffers
            bwd_grads = 0 if every or no_sync or self.offload else sum(u.trainable_shard(n) for u in blocks) * d.orig
            when = "backward (the root's, after the blocks)"
        elif step.bwd_net_grads:  # inside the blocks: the window while a block computes
            bwd_buffers, bwd_grads, when = bwd_blocks + rs_buffers, bwd_done + in_flight_grads, "backward"
        else:  # before the first gradient (the loss and LM head / classifier): the root's pre-backward has only
            # issued the last block's all-gather (``_backward_prefetch``); no block is gathered or reduced yet
            # (without resharding every block is still gathered from forward)
            gathered = sum(u.padded for u in blocks) if not self.reshard else (flat * blocks[-1].padded if blocks else 0)
            bwd_buffers, bwd_grads = gathered * d.param, 0
            when = "backward (loss and head, before the blocks)"
        bwd = Breakdown(params=resident_params, grads=fwd_shard_grads + bwd_grads + held,
                        optimizer_states=resident_optim, buffers=root_gathered + bwd_buffers + upload,
                        activations=step.bwd_net_activations,
                        other=max(0, step.bwd_net_peak - step.bwd_net_activations), phase=when)
        # A block's copy-out happens between ops (no backward temporaries), after the root's LM head / classifier
        # made its gradients (the input embedding's reaches .grad only at the end: ``ParamStats.fsdp_units``).
        gather = Breakdown(params=resident_params, grads=fwd_shard_grads + copy_done + held + early_root_grads,
                           optimizer_states=resident_optim, buffers=root_gathered + copy_out + rs_buffers + upload,
                           activations=step.bwd_net_activations, phase="backward (a block's all-gather copy-out)")
        # The root's post-backward (``FSDPParamGroup.post_backward``): it reshards (frees its gathered parameters)
        # first, then ``foreach_reduce`` allocates the reduce-scatter input and copies the unsharded gradients in,
        # frees them, and allocates the output (the root's sharded gradient). Before it, the other units' sharded
        # gradients (all of them when accumulating).
        before = 0 if self.offload or no_sync else (shard_grads if accumulating else
                                                     shard_grads - root.trainable_shard(n) * d.orig)
        root_in, root_out = root.trainable_padded * d.reduce, root.trainable_shard(n) * d.reduce
        copy_in = Breakdown(params=resident_params, grads=before + held + root_grads, optimizer_states=resident_optim,
                            buffers=root_in, phase="end of backward (root reduce-scatter copy-in)")
        reduce = Breakdown(params=resident_params, grads=before + held, optimizer_states=resident_optim,
                           buffers=root_in + root_out, phase="end of backward (root reduce-scatter)")
        phases = [fwd, bwd, gather, copy_in, reduce]
        if not self.offload:
            largest_shard = -(-stats.largest_param_numel // n)
            temp = optimizer_step_temp_bytes(opts.optimizer, ctx.device, largest_shard, d.orig)
            phases.append(Breakdown(params=resident_params, grads=shard_grads, optimizer_states=optim, other=temp,
                                    phase="optimizer step"))
        host = (shard_params + shard_grads + optim) * ctx.hardware.gpus_per_node if self.offload else 0
        states = stats.buffer_bytes if self.offload else shard_params + shard_grads + optim + stats.buffer_bytes
        return phases, states, host

    def rule_of_thumb_bytes(self, ctx: StrategyContext) -> int:
        (frozen, p), n = rule_of_thumb_split(ctx.profile.stats, ctx.profile.spec.adapter), self.shard_size(ctx)
        return 0 if self.offload else (frozen + RULE_OF_THUMB_BYTES_PER_PARAM * p) // n

    def load_host_bytes_per_node(self, ctx: StrategyContext) -> int:
        """The generated script builds the model on the meta device (no memory) and materialises only each rank's
        shards (``to_empty`` after ``fully_shard``): the rank's fp32 shards (offload: they stay there).

        Their values come from rank 0, which builds the model whole in host memory as the DDP and single-GPU scripts
        do (the same SEED gives the same initial weights; ``--init-from``: ``build_model(path)``,
        ``from_pretrained(path, dtype=torch.float32)`` or a ``torch.load``'ed state_dict beside the model; LoRA: the
        base in its held dtype) and broadcasts it into every rank's shards with
        ``torch.distributed.checkpoint.state_dict.set_model_state_dict(..., StateDictOptions(full_state_dict=True,
        broadcast_from_rank0=True))``, which sends it tensor by tensor from the GPU
        (``torch.distributed._state_dict_utils._broadcast_state_dict``): node 0 holds ``pretrained_copies`` x
        ``pretrained_bytes`` on top of its ranks' shards (the per-node figure is node 0's; the others keep the
        shards alone)."""
        stats = ctx.profile.stats
        shards = ctx.hardware.gpus_per_node * (-(-4 * stats.num_params // self.shard_size(ctx)) + stats.buffer_bytes)
        return shards + pretrained_copies(ctx) * pretrained_bytes(ctx)

    def load_fix(self, ctx: StrategyContext | None = None) -> str:
        what = "the pretrained model" if ctx is not None and ctx.options.init_from else "the model (its initial weights)"
        return (f"rank 0 holds a whole copy of {what} while it broadcasts it into the shards: give node 0 more host "
                "RAM (more GPUs per node shrink only the shards)")

    # --- communication and time -------------------------------------------------------------------------------
    def _volumes(self, ctx: StrategyContext) -> tuple[int, int, int]:
        """(gathered bytes in forward, gathered bytes in backward, reduce-scattered bytes) of one micro-step: the
        padded units in param_dtype (the root once: it is not resharded after forward) and the trainable ones in
        reduce_dtype."""
        n, d = self.shard_size(ctx), self.dtypes(ctx)
        us = units(ctx.profile.stats, n)
        fwd = sum(u.padded for u in us) * d.param
        bwd = sum(u.padded for u in us[1:]) * d.param if self.reshard else 0
        return fwd, bwd, sum(u.trainable_padded for u in us) * d.reduce

    def comm_bytes_per_step(self, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
        """Bytes each GPU sends per optimizer step: (N-1)/N of every all-gather and reduce-scatter buffer
        (nccl-tests PERFORMANCE.md), the gathers on every micro-step, the reduce-scatter on every micro-step or only
        the last (``--fsdp-grad-sync``); HSDP adds the all-reduce of the shards across nodes, 2(r-1)/r of them."""
        n, ga = self.shard_size(ctx), max(1, grad_accum_steps)
        fwd, bwd, rs = self._volumes(ctx)
        syncs = ga if self._sync_every(ctx) else 1
        total = (n - 1) * (ga * (fwd + bwd) + syncs * rs) // n
        if self.hybrid:
            r = ctx.hardware.num_nodes
            total += syncs * 2 * (r - 1) * (rs // n) // r
        return total

    def step_time(self, ctx: StrategyContext, row) -> StepTime | None:
        """Time rule. Compute: the roofline of the 16-bit-parameters trace (MixedPrecisionPolicy casts at the
        gather; no autocast). Every micro-step gathers each unit in forward (and each block again in backward when
        resharding) and reduce-scatters the gradients in fp32 (every micro-step, or the last with
        ``--fsdp-grad-sync last-micro-step``). Overlap (FSDP2's streams: ``_fsdp_param_group.py``): a unit's
        all-gather is prefetched behind the previous unit's compute (implicit in forward, ``_backward_prefetch`` in
        backward) and each reduce-scatter runs beside the next unit's backward; exposed: each pass's first gather,
        the last reduce-scatter (the root's) and any overrun (``advisor.timing.step.exposed_s``). HSDP: gathers and
        reduce-scatters inside the node, then an all-reduce of the fp32 shards across nodes (exposed only where it
        outlasts backward). Optimizer: fused AdamW over this rank's shards; offload: the shards' PCIe copies and the
        CPU step (torch's foreach loop at host memory bandwidth), exposed."""
        t = timing_of(ctx)
        if t is None:
            return None
        hw, opts, stats = ctx.hardware, ctx.options, ctx.profile.stats
        n, ga = self.shard_size(ctx), row.grad_accum_steps or 1
        d = self.dtypes(ctx)
        c = self.compute_time(ctx, t)
        nodes = 1 if self.hybrid else hw.num_nodes
        fabric = fabric_of(ctx, t, hw.gpus_per_node, nodes, concurrent_groups=1)
        us = units(stats, n)
        pieces = max(1, len(us))
        fwd_b, bwd_b, rs_b = self._volumes(ctx)
        if n > 1:
            ag_f = sum(fabric.time_s("all_gather", u.padded * d.param) for u in us)
            ag_b = sum(fabric.time_s("all_gather", u.padded * d.param) for u in us[1:]) if self.reshard else 0.0
            rs_times = [fabric.time_s("reduce_scatter", u.trainable_padded * d.reduce) for u in us if u.trainable_padded]
        else:
            ag_f = ag_b = 0.0
            rs_times = []
        rs = sum(rs_times)
        rs_last = rs_times[0] if rs_times else 0.0  # the root reduces last
        syncs = ga if self._sync_every(ctx) else 1
        ar = ar_exposed = 0.0
        coll: list[Collective] = []
        if self.hybrid:
            across = fabric_of(ctx, t, 1, hw.num_nodes, concurrent_groups=hw.gpus_per_node)
            ar = across.time_s("all_reduce", rs_b // n) if hw.num_nodes > 1 else 0.0
            # The root's shard after backward, and any overrun; never more than the all-reduce itself.
            ar_exposed = min(ar, max(0.0, ar - c.bwd_s) + (ar / pieces))
        fwd_x = exposed_s(ag_f, c.fwd_s, pieces, first_s=ag_f / pieces)
        bwd_x = exposed_s(ag_b + rs, c.bwd_s, pieces + len(rs_times), first_s=ag_b / pieces if ag_b else 0.0,
                          last_s=rs_last)
        rs_only_x = exposed_s(rs, c.bwd_s, len(rs_times), last_s=rs_last)
        ag_b_only_x = exposed_s(ag_b, c.bwd_s, pieces, first_s=ag_b / pieces) if ag_b else 0.0
        # Per optimizer step: every micro-step gathers; the reduce-scatter runs on `syncs` of them.
        exposed = ga * fwd_x + syncs * bwd_x + (ga - syncs) * ag_b_only_x + syncs * ar_exposed
        comm = ga * (ag_f + ag_b) + syncs * (rs + ar)
        if ag_f:
            coll.append(Collective(f"parameter all-gather in forward{' and in backward' if ag_b else ''} (every "
                                   f"micro-step, {len(us)} units)", "all_gather", "data-parallel", fwd_b,
                                   ga * (len(us) + (len(us) - 1 if ag_b else 0)), ga * (ag_f + ag_b),
                                   ga * fwd_x + (ga - syncs) * ag_b_only_x + syncs * max(0.0, bwd_x - rs_only_x),
                                   passes=ga * (2 if ag_b else 1)))
        if rs:
            when = "every micro-step" if syncs == ga else "last micro-step only"
            coll.append(Collective(f"gradient reduce-scatter (fp32, {when})" if d.reduce == 4 else
                                   f"gradient reduce-scatter ({when})", "reduce_scatter", "data-parallel", rs_b,
                                   syncs * len(rs_times), syncs * rs, syncs * min(bwd_x, rs_only_x), passes=syncs))
        if ar:
            coll.append(Collective("all-reduce of the gradient shards across nodes", "all_reduce", "data-parallel",
                                   rs_b // n, syncs * pieces, syncs * ar, syncs * ar_exposed, passes=syncs))
        part = sum(u.trainable_shard(n) for u in us)
        host = 0.0
        notes: list[str] = []
        if self.offload:
            pcie = t.preset.pcie_gen
            up = pcie_transfer_s(sum(u.shard(n) for u in us) * d.orig, pcie) * (2 if self.reshard else 1)
            down = pcie_transfer_s(part * d.orig, pcie)
            coll.append(Collective("sharded parameters to the GPU before each gather (every micro-step)", "pcie",
                                   "host", sum(u.shard(n) for u in us) * d.orig, 2 * ga, ga * up, ga * up,
                                   passes=2 * ga))
            coll.append(Collective("gradient shards to host memory", "pcie", "host", part * d.orig, syncs,
                                   syncs * down, syncs * down, passes=syncs))
            comm += ga * up + syncs * down
            exposed += ga * up + syncs * down
            per_elem = (2 * d.orig + d.orig + 2 * states_per_element(opts.optimizer, d.orig)) * FOREACH_FACTOR
            host = part * hw.gpus_per_node * per_elem / (HOST_MEM_GBPS * 1e9)
            opt = host
            notes.append(f"CPU optimizer at {HOST_MEM_GBPS:g} GB/s of host memory bandwidth per node ({HOST_MEM_SOURCE})")
        else:
            opt = optimizer_step_s(ctx, t, part, d.orig, d.orig, d.orig)
        overlap = ("each unit's all-gather prefetched behind the previous unit's compute, each reduce-scatter beside "
                   "the next unit's backward; exposed: each pass's first gather, the root's reduce-scatter and any "
                   "overrun")
        return StepTime(micro_batch=opts.micro_batch_size, micro_steps=ga, compute_s=ga * c.total_s, comm_s=comm,
                        exposed_comm_s=exposed, optimizer_s=opt, flops=ga * c.flops, model_flops=ga * c.model_flops,
                        peak_flops_per_s=t.peak_flops_per_s, overlap=overlap, collectives=tuple(coll), host_s=host,
                        notes=tuple(notes))

    # --- the script -------------------------------------------------------------------------------------------
    def script_tags(self, job) -> set[str]:
        """``offload`` (CPUOffloadPolicy), ``hsdp`` (the 2-D mesh) and ``sync-last`` (gradients reduce-scattered on
        the last accumulation micro-step only, where there are several)."""
        tags = {"offload"} if self.offload else set()
        if self.hybrid:
            tags.add("hsdp")
        if job.fsdp_grad_sync == "last-micro-step" and job.grad_accum_steps > 1:
            tags.add("sync-last")
        return tags

    def script_constants(self, job, family) -> dict:
        # Blocks free their gathered parameters after forward and gather again in backward (ZeRO-3-like).
        consts: dict = {"RESHARD_AFTER_FORWARD": self.reshard}
        if self.hybrid:  # 2-D mesh: replicate across nodes, shard inside a node
            consts["REPLICATE_DEGREE"] = job.num_nodes
        return consts

    def verify_blocker(self, device: str) -> str | None:
        if self.hybrid and device == "cpu":
            return "hsdp needs several nodes; verify fsdp2 on one machine (the same script with REPLICATE_DEGREE 1)"
        return super().verify_blocker(device)
