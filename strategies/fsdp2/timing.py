"""FSDP2's time rules: the bytes each rank sends per optimizer step and the step's time (compute, the units'
all-gathers and reduce-scatters with their overlap, HSDP's all-reduce across nodes, the optimizer step; offload's
PCIe copies and CPU step). Torch 2.14, torch/distributed/fsdp/_fully_shard/."""

from __future__ import annotations

from dataclasses import replace

from advisor.context import StrategyContext
from advisor.memory import states_per_element
from advisor.timing.comm import pcie_transfer_s
from advisor.timing.compute import ComputeTime, unit_compute_s
from advisor.timing.step import (
    FOREACH_FACTOR,
    HOST_MEM_GBPS,
    HOST_MEM_SOURCE,
    Collective,
    Layer,
    StepTime,
    prefetched_exposed_s,
)

from ..base import Timing, accumulated_step, fabric_of, optimizer_step_s
from .layout import FSDP2Rule, units


def volumes(fs: FSDP2Rule, ctx: StrategyContext) -> tuple[int, int, int]:
    """(gathered bytes in forward, gathered bytes in backward, reduce-scattered bytes) of one micro-step: the
    padded units in param_dtype (the root once: it is not resharded after forward) and the trainable ones in
    reduce_dtype."""
    n, d = fs.shard_size(ctx), fs.dtypes(ctx)
    us = units(ctx.profile.stats, n)
    fwd = sum(u.padded for u in us) * d.param
    bwd = sum(u.padded for u in us[1:]) * d.param if fs.reshard else 0
    return fwd, bwd, sum(u.trainable_padded for u in us) * d.reduce


def comm_bytes_per_step(fs: FSDP2Rule, ctx: StrategyContext, grad_accum_steps: int = 1) -> int:
    """Bytes each GPU sends per optimizer step: (N-1)/N of every all-gather and reduce-scatter buffer
    (nccl-tests PERFORMANCE.md), the gathers on every micro-step, the reduce-scatter on every micro-step or only
    the last (``--fsdp-grad-sync``); HSDP adds the all-reduce of the shards across nodes, 2(r-1)/r of them."""
    n, ga = fs.shard_size(ctx), max(1, grad_accum_steps)
    fwd, bwd, rs = volumes(fs, ctx)
    syncs = ga if fs.sync_every(ctx) else 1
    total = (n - 1) * (ga * (fwd + bwd) + syncs * rs) // n
    if fs.hybrid:
        r = ctx.hardware.num_nodes
        total += syncs * 2 * (r - 1) * (rs // n) // r
    return total


def step_time(fs: FSDP2Rule, ctx: StrategyContext, t: Timing, c: ComputeTime, grad_accum_steps: int) -> StepTime:
    """Time rule. Compute: the roofline of the 16-bit-parameters trace (MixedPrecisionPolicy casts at the
    gather; no autocast). Every micro-step gathers each unit in forward (and each block again in backward when
    resharding) and reduce-scatters the gradients in fp32 (every micro-step, or the last with
    ``--fsdp-grad-sync last-micro-step``). Overlap (FSDP2's streams: ``_fsdp_param_group.py``): a unit's
    all-gather is prefetched behind the previous unit's compute (implicit in forward, ``_backward_prefetch`` in
    backward) and each reduce-scatter, issued after its unit's backward, shares the link with the gathers;
    exposed, unit by unit (``advisor.timing.step.prefetched_exposed_s``): each pass's first gather, whatever a
    gather outlasts the compute of the unit before it, and the root's reduce-scatter, last. HSDP: gathers and
    reduce-scatters inside the node, then an all-reduce of the fp32 shards across nodes (exposed only where it
    outlasts backward). Optimizer: fused AdamW over this rank's shards; offload: the shards' PCIe copies and the
    CPU step (torch's foreach loop at host memory bandwidth), exposed.

    One optimizer step of ``grad_accum_steps`` micro-steps, in seconds; ``fs``: the strategy's way of sharding
    (``FSDP2Rule``), ``t``: the GPU's ``Timing``, ``c``: one micro-step's compute (``Strategy.compute_time``)."""
    hw, opts, stats = ctx.hardware, ctx.options, ctx.profile.stats
    n, ga = fs.shard_size(ctx), grad_accum_steps
    d = fs.dtypes(ctx)
    nodes = 1 if fs.hybrid else hw.num_nodes
    fabric = fabric_of(ctx, t, hw.gpus_per_node, nodes, concurrent_groups=1)
    us = units(stats, n)
    pieces = max(1, len(us))
    fwd_b, bwd_b, rs_b = volumes(fs, ctx)
    fwd_c, bwd_c = unit_compute_s(c, [u.numel for u in us])
    ag_u = [fabric.time_s("all_gather", u.padded * d.param) if n > 1 else 0.0 for u in us]
    rs_u = [
        fabric.time_s("reduce_scatter", u.trainable_padded * d.reduce) if n > 1 and u.trainable_padded else 0.0
        for u in us
    ]
    rs_times = [x for x in rs_u if x]
    ag_f = sum(ag_u)
    ag_b = sum(ag_u[1:]) if fs.reshard else 0.0
    rs = sum(rs_times)
    syncs = ga if fs.sync_every(ctx) else 1
    ar = ar_exposed = 0.0
    coll: list[Collective] = []
    if fs.hybrid:
        across = fabric_of(ctx, t, 1, hw.num_nodes, concurrent_groups=hw.gpus_per_node)
        ar = across.time_s("all_reduce", rs_b // n) if hw.num_nodes > 1 else 0.0
        # The root's shard after backward, and any overrun; never more than the all-reduce itself.
        ar_exposed = min(ar, max(0.0, ar - c.bwd_s) + (ar / pieces))
    # Per unit (advisor.timing.step.prefetched_exposed_s), one unit ahead: forward gathers the root, computes the
    # blocks, then the root's head and loss; backward starts with the root's (not resharded: no gather), then the
    # blocks in reverse, each reduce-scatter issued after its unit's backward, the root's last (the input
    # embedding's gradient is ready last). The embedding lookup's compute is left out (the root's compute is put
    # after the blocks): a simplification.
    fwd_layers = [Layer(ag_u[0], 0.0)] + [Layer(ag_u[i], fwd_c[i]) for i in range(1, len(us))] + [Layer(0.0, fwd_c[0])]
    bwd_layers = (
        [Layer(0.0, bwd_c[0])]
        + [Layer(ag_u[i] if fs.reshard else 0.0, bwd_c[i], rs_u[i]) for i in reversed(range(1, len(us)))]
        + [Layer(0.0, 0.0, rs_u[0])]
    )
    fwd_x = prefetched_exposed_s(fwd_layers)
    bwd_x = prefetched_exposed_s(bwd_layers)
    ag_b_only_x = prefetched_exposed_s([replace(x, reduce_s=0.0) for x in bwd_layers])
    rs_x = min(rs, max(0.0, bwd_x - ag_b_only_x))  # the reduce-scatters' share: what they add to the gathers'
    # Per optimizer step: every micro-step gathers; the reduce-scatter runs on `syncs` of them.
    exposed = ga * fwd_x + syncs * bwd_x + (ga - syncs) * ag_b_only_x + syncs * ar_exposed
    comm = ga * (ag_f + ag_b) + syncs * (rs + ar)
    if ag_f:
        coll.append(
            Collective(
                f"parameter all-gather in forward{' and in backward' if ag_b else ''} (every "
                f"micro-step, {len(us)} units)",
                "all_gather",
                "data-parallel",
                fwd_b,
                ga * (len(us) + (len(us) - 1 if ag_b else 0)),
                ga * (ag_f + ag_b),
                ga * fwd_x + (ga - syncs) * ag_b_only_x + syncs * (bwd_x - rs_x),
                passes=ga * (2 if ag_b else 1),
            )
        )
    if rs:
        when = "every micro-step" if syncs == ga else "last micro-step only"
        coll.append(
            Collective(
                f"gradient reduce-scatter (fp32, {when})" if d.reduce == 4 else f"gradient reduce-scatter ({when})",
                "reduce_scatter",
                "data-parallel",
                rs_b,
                syncs * len(rs_times),
                syncs * rs,
                syncs * rs_x,
                passes=syncs,
            )
        )
    if ar:
        coll.append(
            Collective(
                "all-reduce of the gradient shards across nodes",
                "all_reduce",
                "data-parallel",
                rs_b // n,
                syncs * pieces,
                syncs * ar,
                syncs * ar_exposed,
                passes=syncs,
            )
        )
    part = sum(u.trainable_shard(n) for u in us)
    host = 0.0
    notes: list[str] = []
    if fs.offload:
        pcie = t.preset.pcie_gen
        up = pcie_transfer_s(sum(u.shard(n) for u in us) * d.orig, pcie) * (2 if fs.reshard else 1)
        down = pcie_transfer_s(part * d.orig, pcie)
        coll.append(
            Collective(
                "sharded parameters to the GPU before each gather (every micro-step)",
                "pcie",
                "host",
                sum(u.shard(n) for u in us) * d.orig,
                2 * ga,
                ga * up,
                ga * up,
                passes=2 * ga,
            )
        )
        coll.append(
            Collective(
                "gradient shards to host memory",
                "pcie",
                "host",
                part * d.orig,
                syncs,
                syncs * down,
                syncs * down,
                passes=syncs,
            )
        )
        comm += ga * up + syncs * down
        exposed += ga * up + syncs * down
        per_elem = (2 * d.orig + d.orig + 2 * states_per_element(opts.optimizer, d.orig)) * FOREACH_FACTOR
        host = part * hw.gpus_per_node * per_elem / (HOST_MEM_GBPS * 1e9)
        opt = host
        notes.append(f"CPU optimizer at {HOST_MEM_GBPS:g} GB/s of host memory bandwidth per node ({HOST_MEM_SOURCE})")
    else:
        opt = optimizer_step_s(ctx, t, part, d.orig, d.orig, d.orig)
    overlap = (
        "per unit, each all-gather prefetched behind the previous unit's compute, each reduce-scatter after "
        "its unit's backward; exposed: each pass's first gather, whatever a gather outlasts the compute it "
        "hides behind, and the root's reduce-scatter"
    )
    return accumulated_step(
        ctx,
        t,
        c,
        ga,
        comm_s=comm,
        exposed_comm_s=exposed,
        optimizer_s=opt,
        overlap=overlap,
        collectives=tuple(coll),
        host_s=host,
        notes=tuple(notes),
    )
