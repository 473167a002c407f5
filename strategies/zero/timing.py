"""ZeRO's time rules: the bytes each rank sends per optimizer step and the step's time (compute, collectives in
the buckets of the emitted ds_config, their overlap, the optimizer step; offload's PCIe copies and CPU step), from
deepspeed/runtime/zero/stage_1_and_2.py and stage3.py (DeepSpeed 0.19)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from advisor.choices import Zero3Fetch
from advisor.context import StrategyContext
from advisor.memory import states_per_element
from advisor.profile import ZERO3_PERSISTENCE_THRESHOLD
from advisor.timing.comm import Fabric, pcie_transfer_s, split_buckets
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
from .ds_config import DS_MAX_LIVE_PARAMETERS, bucket_elems
from .sizes import module_dtype_bytes, quantized_sizes

# DeepSpeed ZeRO-3's CPU time per gathered module per pass (its pre- and post-module hooks: fetch_sub_module, the
# coalesced all-gather's launch, release_sub_module; DeepSpeed 0.6 and later, partitioned_param_coordinator.py).
# No clean measurement isolates it: 0.3 ms is the bound that runs at parity with ZeRO-2 or FSDP put on the part
# that shows (deepspeedai/DeepSpeed PR #1453, RoBERTa-10B on 64 x A100 at micro-batch 16, "roughly at parity with
# stage 2"; Hugging Face's blog deepspeed-to-fsdp-and-back, Granite-7B on 4 x A100, 10.6 vs 10.4 s per step with
# about 291 modules), below the 0.38 ms of launch work one gather took before coalescing (PR #1069's profile).
# The CPU runs ahead of the GPU (the gathers are waited for on the stream), so it shows only where a module's
# compute is shorter: small models at small micro-batches.
ZERO3_FETCH_HOST_S = 3e-4
# Before DeepSpeed 0.6: one all-gather per parameter tensor, each about 0.5 ms of host time with the
# torch.cuda.synchronize after it (deepspeedai/DeepSpeed issue #1069, the June 2021 profile: ~130 us before the
# launch, ~250 us the launch, then the synchronize; 394 tensors in RoBERTa-10B's forward), so the CPU waits for
# the GPU and its time adds to the step (--zero3-fetch per-parameter).
ZERO3_PER_PARAMETER_HOST_S = 5e-4


def fetch_passes(checkpointing: bool) -> int:
    """Passes per micro-step that run ZeRO-3's fetch hooks: forward and backward, and with activation checkpointing
    the recompute's forward inside backward."""
    return 3 if checkpointing else 2


def comm_bytes_per_step(ctx: StrategyContext, stage: int, quantized_base: bool, grad_accum_steps: int = 1) -> int:
    """Bytes each GPU sends per optimizer step, in DeepSpeed's 16-bit (fp32: 32-bit) dtype: a ring
    reduce-scatter or all-gather of S sends (n-1)/n x S (nccl-tests PERFORMANCE.md). ZeRO-1: gradients
    reduce-scattered once per step, updated parameters all-gathered once; ZeRO-2 reduce-scatters on every
    micro-step (it keeps only its gradient partition); ZeRO-3 gathers the parameters in forward and in backward
    and reduce-scatters the gradients on every micro-step (ZeRO paper section 7.2.2: 1.5x DDP per micro-step).
    0 on one GPU."""
    n, w = ctx.world_size, module_dtype_bytes(ctx)
    stats, ga = ctx.profile.stats, max(1, grad_accum_steps)
    # Stages 1-2 partition and re-gather only what the optimizer updates (its param groups: the trainable
    # parameters; a frozen LoRA base stays replicated and is never sent).
    grads, params = stats.num_trainable * w, stats.num_trainable * w
    if stage == 1:
        total = grads + params
    elif stage == 2:
        total = ga * grads + params
    else:
        total = ga * (grads + 2 * gathered_total(ctx, quantized_base))
    return (n - 1) * total // n


def gathered_total(ctx: StrategyContext, quantized_base: bool) -> int:
    """Bytes one ZeRO-3 pass (forward or backward) all-gathers: every non-persistent parameter in the module's
    dtype (QLoRA: the packed 4-bit storage of the quantized weights, ``quantized_sizes``)."""
    q = quantized_sizes(ctx, quantized_base)
    if q is not None:
        return q.gathered_total
    stats = ctx.profile.stats
    return (stats.num_params - stats.persistent_params) * module_dtype_bytes(ctx)


@dataclass(frozen=True)
class Stage3Passes:
    """One ZeRO-3 micro-step's layers in execution order (``advisor.timing.step.Layer``): ``fwd`` and ``bwd``
    (reduce buckets on the layer whose gradients close them), the seconds of one pass's gathers and of the
    reduce-scatters, how many gathers and reduce-scatters one pass runs, the bytes one pass gathers, and how many
    modules ahead DeepSpeed's prefetch issues their gathers."""

    fwd: tuple[Layer, ...]
    bwd: tuple[Layer, ...]
    gather_s: float
    reduce_s: float
    gathers: int
    reduces: int
    gathered: int
    ahead: int
    host_s: float = 0.0  # CPU seconds of the fetch hooks per pass (forward; backward with recompute: twice)
    host_waits: bool = False  # the CPU synchronizes after each gather (--zero3-fetch per-parameter)


def stage3_passes(
    ctx: StrategyContext, fabric: Fabric, c: ComputeTime, quantized_base: bool, b: dict[str, int]
) -> Stage3Passes:
    """ZeRO-3's forward and backward of one micro-step, module by module (deepspeed/runtime/zero/stage3.py,
    partitioned_param_coordinator.py; DeepSpeed 0.19). Simplifications, each stated:

    * a gathered module is a parameter of at least ``stage3_param_persistence_threshold`` elements (a linear's
      weight; its bias and norms are below it and stay persistent), from ``ParamStats.fsdp_units``; its bytes
      are its share of ``gathered_total`` (QLoRA: the packed storage);
    * the root's parameters (embeddings, final norm, an untied head) are gathered before the first block in both
      passes (the tied head's second gather is not counted, as in ``gathered_total``); its compute (head, loss)
      runs after the last block in forward and first in backward (``advisor.timing.compute.unit_compute_s``), a block's
      among its modules in proportion to their parameters;
    * gradients join the reduce bucket (``reduce_bucket_size`` elements) as each module's backward ends; a full
      bucket is reduce-scattered when the next gradient does not fit (stage3.py
      ``reduce_independent_p_g_buckets_and_remove_grads``), the rest at the end of backward
      (``independent_gradient_partition_epilogue``), the root's gradients last (the input embedding's);
    * prefetch (``fetch_sub_module``: after each fetch, gathers of the next modules until
      ``stage3_prefetch_bucket_size`` elements are in flight, at most ``stage3_max_live_parameters`` gathered):
      one module ahead when a module holds at least the prefetch bucket, otherwise as many as the live
      parameters allow (each fetch adds more than it uses until that cap);
    * the CPU time of the hooks: ``ZERO3_FETCH_HOST_S`` per gathered module and pass (coalesced fetch, the CPU
      running ahead), or ``ZERO3_PER_PARAMETER_HOST_S`` per parameter tensor and pass spread over the modules
      (``--zero3-fetch per-parameter``: a synchronize after each gather); backward with activation checkpointing
      fetches twice (the recompute runs the forward hooks again).

    No unit list (a hand-made ParamStats): ``num_gathered_modules`` equal modules in one stack."""
    stats, w = ctx.profile.stats, module_dtype_bytes(ctx)
    gathered = gathered_total(ctx, quantized_base) if ctx.world_size > 1 else 0
    units = stats.fsdp_units
    if units:
        big = [[size for _d, size, _t, _l in u if size >= ZERO3_PERSISTENCE_THRESHOLD] for u in units]
        numel = [sum(size for _d, size, _t, _l in u) for u in units]
        grads = [sum(size for _d, size, t, _l in u if t) for u in units]
    else:
        modules = max(1, stats.num_gathered_modules or stats.num_param_tensors)
        each = max(1, (stats.num_params - stats.persistent_params) // modules)
        big = [[], [each] * modules]
        numel, grads = [0, stats.num_params], [0, stats.num_trainable]
    pieces = sum(len(x) for x in big)
    scale = gathered / max(1, sum(sum(x) for x in big))
    waits = ctx.options.zero3_fetch == Zero3Fetch.PER_PARAMETER
    hook = ZERO3_PER_PARAMETER_HOST_S * stats.num_param_tensors / max(1, pieces) if waits else ZERO3_FETCH_HOST_S
    bwd_hook = hook * (fetch_passes(ctx.options.activation_checkpointing) - 1)

    def gather(elems: int) -> float:
        return fabric.time_s("all_gather", int(elems * scale)) if gathered else 0.0

    fwd_c, bwd_c = unit_compute_s(c, numel)
    fwd: list[Layer] = [Layer(gather(x), 0.0, host_s=hook) for x in big[0]]
    bwd: list[Layer] = [Layer(gather(x), 0.0, host_s=bwd_hook) for x in big[0]] + [Layer(0.0, bwd_c[0])]
    cap = max(1, b["reduce_bucket_size"])
    bucket = 0
    reduce_s, reduces = 0.0, 0

    def flush() -> float:
        nonlocal bucket, reduce_s, reduces
        s = fabric.time_s("reduce_scatter", bucket * w) if bucket and ctx.world_size > 1 else 0.0
        reduce_s, reduces, bucket = reduce_s + s, reduces + (1 if s else 0), 0
        return s

    for i in range(1, len(units) if units else 2):
        mods = big[i] or [0]
        total = max(1, sum(mods))
        fwd += [Layer(gather(m), fwd_c[i] * (m / total if big[i] else 1.0), host_s=hook if m else 0.0) for m in mods]
        for m in reversed(mods):
            g = grads[i] * m // total if big[i] else grads[i]
            r = flush() if bucket and bucket + g > cap else 0.0
            bucket += g
            bwd.append(Layer(gather(m), bwd_c[i] * (m / total if big[i] else 1.0), r, bwd_hook if m else 0.0))
    fwd.append(Layer(0.0, fwd_c[0]))
    r = flush() if bucket and bucket + grads[0] > cap else 0.0
    bucket += grads[0]
    bwd.append(Layer(0.0, 0.0, r + flush()))
    block_mods = [m for x in big[1:] for m in x]
    mean = sum(block_mods) // max(1, len(block_mods))
    prefetch = b["stage3_prefetch_bucket_size"]
    live = b.get("stage3_max_live_parameters", DS_MAX_LIVE_PARAMETERS)
    ahead = 1 if mean >= prefetch or mean <= 0 else max(1, min(pieces, live // mean))
    return Stage3Passes(
        fwd=tuple(fwd),
        bwd=tuple(bwd),
        gather_s=sum(x.gather_s for x in fwd),
        reduce_s=reduce_s,
        gathers=pieces,
        reduces=reduces,
        gathered=gathered,
        ahead=ahead,
        host_s=hook * pieces,
        host_waits=waits,
    )


def step_time(
    ctx: StrategyContext,
    t: Timing,
    c: ComputeTime,
    grad_accum_steps: int,
    stage: int,
    offload: bool,
    quantized_base: bool,
) -> StepTime:
    """Time rule (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py; DeepSpeed 0.19). Compute: the roofline
    of the 16-bit-weights trace (DeepSpeed casts the module, no autocast casts). Collectives in the 16-bit
    dtype (fp32 runs: 32-bit), buckets as the emitted ds_config sets them:

    * ZeRO-1: reduce-scatter of the gradients at the accumulation boundary only (the engine's
      ``allreduce_gradients`` reduces stage 1 only there), all-gather of the updated parameters after the step;
    * ZeRO-2: reduce-scatter on every micro-step (``overlapping_partition_gradients_reduce_epilogue``: it keeps
      only its partition), all-gather after the step. The emitted config sets ``overlap_comm`` false for
      stages 1-2, so each bucket is reduced inside the backward hook that filled it: nothing overlaps;
    * ZeRO-3 (``overlap_comm`` true, prefetch ``stage3_prefetch_bucket_size``): every micro-step gathers the
      non-persistent parameters module by module in forward and again in backward (the parameters are released
      after each module) and reduce-scatters the gradients bucket by bucket; overlap per module
      (``stage3_passes``, ``advisor.timing.step.prefetched_exposed_s``): a prefetched gather hides only behind
      the compute of the modules it is issued ahead of, so at a small micro-batch, where a module's gather
      outlasts its neighbour's compute, each module exposes the difference; a reduce bucket starts once its
      gradients exist and shares the link with the gathers; the last bucket waits for the end of backward;
    * offload: the gradient partition goes to host memory over PCIe on every micro-step, the optimizer runs on
      the CPU (torch's foreach loop, all the node's ranks sharing the host memory bandwidth), the updated
      16-bit partition comes back over PCIe (ZeRO-3 + offload_param: the parameter partition comes up before
      every gather instead); all of it exposed.

    Optimizer on the GPU: fused AdamW over this rank's fp32 partition plus DeepSpeed's fp32 gradient
    flatten/cast and the copy of the updated partition into the 16-bit weights (6 bytes per element each).

    One optimizer step of ``grad_accum_steps`` micro-steps, in seconds, of ZeRO ``stage`` (1-3, ``offload``,
    ``quantized_base``: QLoRA's packed base gathered under ZeRO-3); ``t``: the GPU's ``Timing``, ``c``: one
    micro-step's compute (``Strategy.compute_time``)."""
    hw, opts, stats = ctx.hardware, ctx.options, ctx.profile.stats
    n, w, ga = ctx.world_size, module_dtype_bytes(ctx), grad_accum_steps
    fabric = fabric_of(ctx, t, hw.gpus_per_node, hw.num_nodes)
    b = bucket_elems(ctx)
    grads, params = stats.num_trainable * w, stats.num_trainable * w  # stages 1-2 gather the updated (trainable)
    coll: list[Collective] = []

    def run(kind: str, nbytes: int, bucket_bytes: int) -> tuple[float, float, int]:
        """(seconds, last bucket's seconds, calls) of one collective over ``nbytes`` in buckets."""
        sizes = split_buckets(nbytes, max(1, bucket_bytes)) if nbytes else []
        times = [fabric.time_s(kind, x) for x in sizes]
        return sum(times), (times[-1] if times else 0.0), len(sizes)

    exposed = comm = stall = 0.0
    notes: list[str] = []
    if stage in (1, 2):
        rs_s, _, rs_calls = run("reduce_scatter", grads, b["reduce_bucket_size"] * w)
        ag_s, _, ag_calls = run("all_gather", params, b["allgather_bucket_size"] * w)
        per = 1 if stage == 1 else ga
        if rs_s:
            coll.append(
                Collective(
                    "gradient reduce-scatter" + (" (every micro-step)" if stage == 2 else ""),
                    "reduce_scatter",
                    "data-parallel",
                    grads,
                    per * rs_calls,
                    per * rs_s,
                    per * rs_s,
                    passes=per,
                )
            )
        if ag_s:
            coll.append(
                Collective(
                    "all-gather of the updated parameters", "all_gather", "data-parallel", params, ag_calls, ag_s, ag_s
                )
            )
        comm = exposed = per * rs_s + ag_s
        overlap = "none: the emitted ds_config sets overlap_comm false for ZeRO-1/2"
    else:
        plan = stage3_passes(ctx, fabric, c, quantized_base, b)
        ag_s, rs_s = plan.gather_s, plan.reduce_s

        def exposure(layers: tuple[Layer, ...], reduces: bool = True, hooks: bool = True) -> float:
            kept = [
                replace(x, reduce_s=x.reduce_s if reduces else 0.0, host_s=x.host_s if hooks else 0.0) for x in layers
            ]
            return prefetched_exposed_s(kept, plan.ahead, plan.host_waits)

        fwd, bwd = exposure(plan.fwd), exposure(plan.bwd)
        bwd_ag = exposure(plan.bwd, reduces=False)
        # The hooks' share: what the CPU time adds to the communication's own exposure.
        hook_x = max(0.0, fwd + bwd - exposure(plan.fwd, hooks=False) - exposure(plan.bwd, hooks=False))
        # The reduce-scatters' share of backward's exposure: what they add to the gathers' own.
        rs_x = min(rs_s, max(0.0, bwd - bwd_ag))
        if ag_s:
            coll.append(
                Collective(
                    f"parameter all-gather in forward and in backward (every micro-step, {plan.gathers} modules)",
                    "all_gather",
                    "data-parallel",
                    plan.gathered,
                    2 * ga * plan.gathers,
                    2 * ga * ag_s,
                    ga * max(0.0, fwd + bwd - rs_x - hook_x),
                    passes=2 * ga,
                )
            )
        if plan.host_s:
            passes = ga * fetch_passes(ctx.options.activation_checkpointing)
            fetch = "one gather per parameter, a synchronize after each" if plan.host_waits else "coalesced per module"
            notes.append(
                f"ZeRO-3's fetch hooks ({fetch}): {passes * plan.host_s * 1e3:.3g} ms of CPU time per step, "
                f"{ga * hook_x * 1e3:.3g} ms of it beyond the GPU's work (counted in compute)"
            )
        if rs_s:
            coll.append(
                Collective(
                    "gradient reduce-scatter (every micro-step)",
                    "reduce_scatter",
                    "data-parallel",
                    grads,
                    ga * plan.reduces,
                    ga * rs_s,
                    ga * rs_x,
                    passes=ga,
                )
            )
        # What the hooks' CPU time adds is the GPU waiting for the CPU, counted in compute (as eager dispatch is).
        stall = ga * hook_x
        comm, exposed = ga * (2 * ag_s + rs_s), ga * (fwd + bwd) - stall
        overlap = (
            "per module, each gather prefetched behind the compute of the modules before it (up to "
            f"{plan.ahead} module{'s' if plan.ahead > 1 else ''} ahead), each reduce bucket once its gradients "
            "exist (overlap_comm); exposed: the first gathers, whatever a gather outlasts the compute it hides "
            "behind, and the last reduce bucket (the fetch hooks' CPU time beyond the GPU's work is in compute)"
        )
    k_opt = 0.0
    host = 0.0
    part = -(-stats.num_trainable // n)
    if offload:
        pcie = t.preset.pcie_gen
        down = pcie_transfer_s(part * w, pcie)  # gradient partition to the host, per micro-step
        if stage == 3:
            up = 2 * pcie_transfer_s(-(-stats.num_params // n) * w, pcie)  # parameter partition, each pass
            up_per_step = ga * up
            up_what = "parameter partition to the GPU before each gather (every micro-step)"
        else:
            up_per_step = pcie_transfer_s(-(-stats.num_params // n) * w, pcie)
            up_what = "updated 16-bit partition back to the GPU"
        coll.append(
            Collective(
                "gradient partition to host memory (every micro-step)",
                "pcie",
                "host",
                part * w,
                ga,
                ga * down,
                ga * down,
                passes=ga,
            )
        )
        ups = 2 * ga if stage == 3 else 1
        coll.append(
            Collective(
                up_what, "pcie", "host", -(-stats.num_params // n) * w, ups, up_per_step, up_per_step, passes=ups
            )
        )
        comm += ga * down + up_per_step
        exposed += ga * down + up_per_step
        per_elem = (2 * 4 + 4 + 2 * states_per_element(opts.optimizer, 4)) * FOREACH_FACTOR
        # Every rank of the node steps its partition on the same host at once.
        host = part * hw.gpus_per_node * per_elem / (HOST_MEM_GBPS * 1e9)
        k_opt = host
        notes.append(f"CPU optimizer at {HOST_MEM_GBPS:g} GB/s of host memory bandwidth per node ({HOST_MEM_SOURCE})")
    else:
        k_opt = optimizer_step_s(ctx, t, part, 4, 4, 4, extra=12)
    return accumulated_step(
        ctx,
        t,
        c,
        ga,
        comm_s=comm,
        exposed_comm_s=exposed,
        optimizer_s=k_opt,
        overlap=overlap,
        collectives=tuple(coll),
        host_s=host,
        notes=tuple(notes),
        stall_s=stall,
    )
