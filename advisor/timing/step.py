"""One optimizer step's time, as the strategies' time rules (``Strategy.step_time``) report it.

A step at the global batch is ``micro_steps`` forward + backward passes (``compute_s``, the time model of
``advisor.timing.compute``), the communication that compute does not hide (``exposed_comm_s``; each strategy
states its overlap rule) and the optimizer step (``optimizer_s``)::

    step_s = compute_s + exposed_comm_s + optimizer_s

Data loading is not modelled (the input is assumed ready); eager PyTorch's per-op host cost enters through the
queue of each phase (``advisor.timing.gpu_time.phase_s``, ``GpuModel.dispatch_s``). Seconds are floats; bytes ints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

GB = 1e9

# Host memory bandwidth for the CPU optimizer of ZeRO-Offload, GB/s per node: an estimate, no run found.
# A two-socket server with 8 channels of DDR4-3200 per socket has 2 x 8 x 25.6 = 409.6 GB/s of peak bandwidth
# (JEDEC DDR4-3200: 25.6 GB/s per 64-bit channel; AMD EPYC 7003 / Intel Xeon Ice Lake: 8 channels per socket);
# STREAM-like kernels reach about half of it across sockets, and torch's CPU optimizer loops are element-wise
# kernels of that kind.
HOST_MEM_GBPS = 200.0
HOST_MEM_SOURCE = (
    "estimate, no run found: half of a 2-socket, 8-channel DDR4-3200 server's 409.6 GB/s peak "
    "(JEDEC DDR4-3200 25.6 GB/s per channel)"
)


# Bytes an optimizer step reads and writes per parameter element, for a parameter of ``w`` bytes, its gradient of
# ``g`` bytes and ``states`` bytes of optimizer state: a fused (single-kernel) step reads the parameter, the gradient
# and the states and writes the parameter and the states once: 2w + g + 2 x states (torch.optim.AdamW(fused=True):
# states = 2 moments x s; SGD with momentum one; plain SGD none; bitsandbytes' 8-bit optimizers 2 bytes and their
# block scales, ``advisor.bnb_layout.state_bytes_per_element``).
def fused_step_bytes(w: int, g: int, states: float) -> float:
    """Bytes per element of a single-kernel optimizer step (comment above)."""
    return 2 * w + g + 2 * states


# torch's foreach (multi-tensor) Adam (torch/optim/adam.py ``_multi_tensor_adam``: lerp_, mul_, addcmul_, the
# weight-decay mul_, sqrt, div_, add_, addcdiv_) makes 8 passes, about 80 bytes per fp32 element against the
# fused kernel's 28: the factor for the scripts that run the foreach step (TP, whose DTensors fused kernels do not
# take, and the CPU step of offload).
FOREACH_FACTOR = 80 / 28


@dataclass(frozen=True)
class Collective:
    """One kind of communication of a step. ``nbytes``: the full, unsharded buffer of one call (S of the ring
    formulas; a PCIe copy's bytes). ``calls``: how many run per optimizer step; ``seconds``: all of them;
    ``exposed_s``: the part compute does not hide."""

    what: str
    kind: str  # "all_reduce" | "reduce_scatter" | "all_gather" | "pcie"
    group: str  # "data-parallel" | "tensor-parallel" | "host"
    nbytes: int  # S: the full buffer one pass moves (all its buckets together)
    calls: int  # collective calls per optimizer step (buckets x passes)
    seconds: float
    exposed_s: float
    passes: int = 1  # how many times per optimizer step the whole buffer goes

    def as_dict(self) -> dict[str, object]:
        """The collective as JSON (its size as ``bytes``)."""
        return {
            "what": self.what,
            "kind": self.kind,
            "group": self.group,
            "bytes": self.nbytes,
            "passes": self.passes,
            "calls": self.calls,
            "seconds": self.seconds,
            "exposed_s": self.exposed_s,
        }


@dataclass(frozen=True)
class StepTime:
    """One optimizer step at the row's global batch on one GPU (every GPU runs the same). ``model_flops`` and
    ``flops`` are this GPU's per step (model FLOPs exclude activation checkpointing's recompute)."""

    micro_batch: int
    micro_steps: int  # gradient-accumulation micro-steps per optimizer step
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    optimizer_s: float
    flops: int
    model_flops: int
    peak_flops_per_s: float  # the dense peak the MFU is against (precision's, datasheet)
    overlap: str  # the strategy's overlap rule, one sentence
    collectives: tuple[Collective, ...] = ()
    host_s: float = 0.0  # CPU optimizer and host copies that the GPU waits for (offload), inside optimizer_s/comm
    bubble_s: float = 0.0  # a pipeline's idle slots as it fills and drains (timing.pipeline), inside compute_s
    speedup_vs_single_gpu: float | None = None
    scaling_efficiency: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.optimizer_s

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: model FLOPs per second over the dense peak (PaLM paper, Chowdhery et al. 2022,
        appendix B: recompute excluded)."""
        if not self.peak_flops_per_s or not self.step_s:
            return None
        return self.model_flops / self.step_s / self.peak_flops_per_s


def exposed_s(comm_s: float, compute_s: float, pieces: int, first_s: float = 0.0, last_s: float = 0.0) -> float:
    """What ``compute_s`` of compute does not hide of ``comm_s`` of communication that runs beside it in
    ``pieces`` consecutive pieces (buckets, prefetched modules), one link used in order.

    A piece can only start once compute made it ready (DDP: its gradients; ZeRO-3: the module before it), so
    the pieces queue behind compute: the first waits ``first_s`` before compute can start (ZeRO-3's first
    gather), the last cannot start before compute ends (``last_s``: DDP's last bucket). When communication is
    slower than compute the queue only grows and the overrun is exposed as well (the pieces are ready
    evenly through compute; the last is ready when compute ends)::

        exposed = first_s + last_s + max(0, (comm_s - first_s - last_s) - compute_s x (pieces - 1) / pieces)

    With one piece nothing overlaps: everything is exposed.
    """
    if comm_s <= 0:
        return 0.0
    if pieces <= 1:
        return comm_s
    middle = max(0.0, comm_s - first_s - last_s)
    overrun = max(0.0, middle - compute_s * (pieces - 1) / pieces)
    return min(comm_s, first_s + last_s + overrun)


@dataclass(frozen=True)
class Layer:
    """One layer (block, module) of a pass whose parameters are gathered before its compute: ``gather_s`` the
    all-gather that must end before ``compute_s`` starts, ``reduce_s`` a reduce-scatter issued when the compute
    ends (its gradients, or a full reduce bucket; the last layer's: what is left at the end of backward),
    ``host_s`` the framework's CPU seconds before the layer's compute can be queued (DeepSpeed ZeRO-3's fetch and
    release hooks, ``strategies.zero.timing``)."""

    gather_s: float
    compute_s: float
    reduce_s: float = 0.0
    host_s: float = 0.0


def prefetched_exposed_s(layers: Sequence[Layer], ahead: int = 1, host_waits: bool = False) -> float:
    """Communication of one pass (a forward or a backward) that its compute does not hide, layer by layer, when
    each layer's all-gather is prefetched ``ahead`` layers early and reduce-scatters wait for their gradients.

    The schedule (DeepSpeed's ZeRO-3, deepspeed/runtime/zero/partitioned_param_coordinator.py
    ``_fetch_sub_module_impl``: the current module's gather is waited for, then the next modules' gathers are
    issued, up to ``stage3_prefetch_bucket_size`` elements, before the module computes; stage3.py
    ``__add_grad_to_ipg_bucket``: the reduce stream waits for the compute stream, so a bucket's reduce-scatter
    starts once its gradients exist; FSDP2: torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, the next
    unit's all-gather issued ahead of its compute, each reduce-scatter after its unit's backward):

    * the gathers of the first ``ahead`` layers are issued at the start, layer i + ``ahead``'s when layer i's
      compute starts; layer i computes once the previous layer ended and its own gather arrived;
    * layer i's reduce-scatter is issued when its compute ends;
    * collectives share the one link and run in the order issued (NCCL serialises them on the network: one
      collective's bandwidth at a time, a simplification of streams that in fact interleave).

    With ``ahead`` 1 and no reduce-scatters this is the gather of the first layer plus, per layer,
    max(0, gather_{i+1} - compute_i): prefetch hides a gather only behind the compute of the layer before it, so
    a gather longer than that compute is exposed by the difference, and a short gather leaves the link idle (its
    slack is not lent to later layers, as one queue over the whole pass, ``exposed_s``, would).

    The host: layer i's compute cannot start before the CPU has spent the ``host_s`` of every layer up to i. The
    CPU runs ahead of the GPU (``host_waits`` false: CUDA queues the work, so per stretch of layers the pass takes the
    longer of GPU time and CPU time), or, with ``host_waits``, waits for each layer's gather and everything queued
    before it (a host synchronize per gather: the CPU time adds to the GPU's). Returns seconds: when the last compute
    or collective ends, minus the compute."""
    ahead = max(1, ahead)
    host = 0.0  # when the CPU has queued everything so far
    n = len(layers)
    done = [0.0] * n
    link = 0.0  # when the link is free
    for j in range(min(ahead, n)):
        link += layers[j].gather_s
        done[j] = link
    t = 0.0  # when the compute stream is free
    for i, layer in enumerate(layers):
        if host_waits:
            start = max(t, done[i]) + layer.host_s
        else:
            host += layer.host_s
            start = max(t, done[i], host)
        j = i + ahead
        if j < n:
            link = max(link, start) + layers[j].gather_s
            done[j] = link
        t = start + layer.compute_s
        if layer.reduce_s:
            link = max(link, t) + layer.reduce_s
    return max(0.0, max(t, link) - sum(layer.compute_s for layer in layers))
