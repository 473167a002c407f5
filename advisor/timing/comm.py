"""Time of the collectives training runs, and of PCIe host<->device copies: pure formulas.

Units: sizes are ``int`` bytes, bandwidths GB/s (10**9 B/s, one direction), times ``float`` seconds.
``nbytes`` (S) is always the full, unsharded buffer: for a reduce-scatter the whole input every rank
holds, for an all-gather the whole output (nccl-tests doc/PERFORMANCE.md defines S that way).

Bandwidth terms (nccl-tests doc/PERFORMANCE.md, "Bus bandwidth"): with ``busbw`` the bus bandwidth that
nccl-tests reports, an all-reduce of S bytes over n ranks takes ``2(n-1)/n x S / busbw``, a reduce-scatter
or an all-gather ``(n-1)/n x S / busbw``. busbw is built to be comparable across n and across collectives
and to reflect the hardware bottleneck (NVLink, PCIe or network), so one measured all-reduce busbw per link
serves all three.

Latency terms: NCCL's own tuning model (NVIDIA/nccl src/graph/tuning.cc, ring algorithm, Simple protocol,
the one used for large buffers): ``baseLat`` 8.4 us per collective plus, per ring step, ``hwLat`` 3.4 us over
NVLink, 5.7 us over PCIe, 9.6 us over the network; an all-reduce has 2(n-1) steps of which 2(nodes-1) cross
the network, a reduce-scatter or all-gather n-1 steps of which nodes-1 do.

Across nodes, two schemes (``scheme=``):

* ``"ring"``: one ring through all ``gpus_per_node x nodes`` ranks, as NCCL's ring algorithm runs it. Each
  node's traffic leaves over its NICs, one ring channel per NIC, so the ring's busbw is
  ``min(intra-node busbw, nics x per-NIC bandwidth)`` (nccl-tests #119, #412: 4 HDR NICs give ~96 GB/s busbw,
  one gives ~24).
* ``"hierarchical"`` (the "2D" or hierarchical all-reduce: Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE; Huawei
  HCCL "Hierarchical Communication Principles"; Jia et al. 2018, arXiv:1807.11205): reduce-scatter inside
  each node over S (g = gpus_per_node ranks), then all-reduce across the nodes of each rank's S/g shard (the
  g shards at once, sharing the node's NICs: ``2(N-1)/N x (S/g) / (inter/g) = 2(N-1)/N x S / inter``), then
  all-gather inside. Reduce-scatter and all-gather keep their own half of that scheme. The phases are
  summed (run one after another), each with its own latency.
* ``"auto"``: the faster of the two. NCCL picks its algorithm by a time model (tuning.cc); its tree, used on
  few nodes, sends about S per node over the network as the hierarchical scheme does on 2 nodes (sjeaugey,
  nccl-tests #196: "on two nodes, NCCL uses the tree ... which can go beyond the network bottleneck").
  The default for all-reduce. NCCL runs reduce-scatter and all-gather with the ring only (tuning.cc), so
  their default is ``"ring"``.

DDP buckets (torch.nn.parallel.DistributedDataParallel, torch 2.x): gradients are all-reduced in buckets of
``bucket_cap_mb`` MiB (default 25 MiB). With the default, the first bucket (the gradients ready first in
backward) is capped at 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``; the reducer's
``rebuild_buckets`` passes ``[first_bucket_bytes_cap, bucket_bytes_cap]``); with a user-set
``bucket_cap_mb`` every bucket uses it. A bucket closes once its size reaches its cap, so the last one
holds the remainder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..gpu_presets import NETWORK_SPECS, PCIE_HOST_GBPS, GpuPreset

GB = 10**9
MiB = 2**20

# NVIDIA/nccl src/graph/tuning.cc, ring algorithm, Simple protocol: baseLat and hwLat[NVLINK|PCI|NET], us -> s.
NCCL_BASE_LATENCY_S = 8.4e-6
NCCL_STEP_LATENCY_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "net": 9.6e-6}

# torch.nn.parallel.DistributedDataParallel: bucket_cap_mb default 25 (MiB); first bucket 1 MiB with the default.
DDP_BUCKET_CAP_BYTES = 25 * MiB
DDP_FIRST_BUCKET_BYTES = 1 * MiB

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
SCHEMES = ("auto", "ring", "hierarchical")


def _check(nbytes: int, n: int, busbw_gbps: float) -> None:
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if n < 1:
        raise ValueError(f"the number of ranks must be >= 1, got {n}")
    if n > 1 and nbytes > 0 and not busbw_gbps > 0:
        raise ValueError(f"bus bandwidth must be > 0 GB/s, got {busbw_gbps}")


def ring_allreduce_s(nbytes: int, n: int, busbw_gbps: float, latency_s: float = 0.0) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks: ``2(n-1)/n x S / busbw + latency_s`` seconds.

    ``busbw_gbps``: nccl-tests bus bandwidth, GB/s. Source: nccl-tests doc/PERFORMANCE.md (AllReduce). One rank
    or an empty buffer costs 0 (no collective runs).
    """
    _check(nbytes, n, busbw_gbps)
    if n == 1 or nbytes == 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / (busbw_gbps * GB) + latency_s


def reduce_scatter_s(nbytes: int, n: int, busbw_gbps: float, latency_s: float = 0.0) -> float:
    """Ring reduce-scatter of a ``nbytes`` buffer (the full input) over ``n`` ranks: ``(n-1)/n x S / busbw +
    latency_s`` seconds. Source: nccl-tests doc/PERFORMANCE.md (ReduceScatter). ``n == 1`` costs 0."""
    _check(nbytes, n, busbw_gbps)
    if n == 1 or nbytes == 0:
        return 0.0
    return (n - 1) / n * nbytes / (busbw_gbps * GB) + latency_s


def all_gather_s(nbytes: int, n: int, busbw_gbps: float, latency_s: float = 0.0) -> float:
    """Ring all-gather producing a ``nbytes`` buffer (the full output) on each of ``n`` ranks: ``(n-1)/n x S /
    busbw + latency_s`` seconds. Source: nccl-tests doc/PERFORMANCE.md (AllGather). ``n == 1`` costs 0."""
    _check(nbytes, n, busbw_gbps)
    if n == 1 or nbytes == 0:
        return 0.0
    return (n - 1) / n * nbytes / (busbw_gbps * GB) + latency_s


_RING = {"all_reduce": ring_allreduce_s, "reduce_scatter": reduce_scatter_s, "all_gather": all_gather_s}


def ring_latency_s(
    collective: str,
    n: int,
    nodes: int = 1,
    intra_step_s: float = NCCL_STEP_LATENCY_S["nvlink"],
    inter_step_s: float = NCCL_STEP_LATENCY_S["net"],
    base_s: float = NCCL_BASE_LATENCY_S,
) -> float:
    """Latency of one ring collective over ``n`` ranks on ``nodes`` nodes, seconds (NCCL's tuning model).

    ``base_s + (steps - inter_steps) x intra_step_s + inter_steps x inter_step_s`` with steps = 2(n-1) and
    inter_steps = 2(nodes-1) for an all-reduce, n-1 and nodes-1 for a reduce-scatter or all-gather.
    Source: NVIDIA/nccl src/graph/tuning.cc (``ncclTopoTuneModel``, ring). ``n == 1`` costs 0.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"collective {collective!r} is not one of {COLLECTIVES}")
    if n <= 1:
        return 0.0
    factor = 2 if collective == "all_reduce" else 1
    steps, inter_steps = factor * (n - 1), factor * (max(nodes, 1) - 1)
    return base_s + (steps - inter_steps) * intra_step_s + inter_steps * inter_step_s


@dataclass(frozen=True)
class Fabric:
    """One communicating group: ``gpus_per_node`` of its ranks on each of ``nodes`` nodes.

    ``intra_busbw_gbps``: all-reduce bus bandwidth inside a node for ``gpus_per_node`` ranks (nccl-tests, GB/s).
    ``inter_gbps``: the node's bandwidth to the other nodes, GB/s one direction (NICs x per-NIC bandwidth);
    when several groups communicate at once (the data-parallel groups of TP x DP), give each its share.
    Step latencies per NCCL's tuning model (module docstring); ``intra_step_latency_s`` is NVLink's or PCIe's.
    """

    gpus_per_node: int
    intra_busbw_gbps: float
    nodes: int = 1
    inter_gbps: float = 0.0
    intra_step_latency_s: float = NCCL_STEP_LATENCY_S["nvlink"]
    inter_step_latency_s: float = NCCL_STEP_LATENCY_S["net"]
    base_latency_s: float = NCCL_BASE_LATENCY_S
    # Inside a node, a bus bandwidth per collective where it differs from the all-reduce's: (collective, GB/s)
    # pairs. Empty for NCCL (nccl-tests' busbw is the same for the three ring collectives); a calibrated CPU's
    # gloo measures its own (``advisor.timing.calibrate``).
    collective_busbw_gbps: tuple[tuple[str, float], ...] = ()

    def intra_gbps(self, collective: str) -> float:
        """Bus bandwidth inside a node for ``collective`` (``collective_busbw_gbps``, else the all-reduce's)."""
        return dict(self.collective_busbw_gbps).get(collective, self.intra_busbw_gbps)

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise ValueError(f"a fabric needs >= 1 GPU per node and >= 1 node, got {self.gpus_per_node} x {self.nodes}")
        if self.nodes > 1 and not self.inter_gbps > 0:
            raise ValueError("a fabric of several nodes needs inter_gbps > 0 (the node's NIC bandwidth)")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @classmethod
    def from_preset(
        cls,
        preset: GpuPreset,
        gpus_per_node: int,
        nodes: int = 1,
        *,
        interconnect: str | None = None,
        network: str | None = None,
        nics_per_node: int | None = None,
        link_busbw_gbps: float | None = None,
        network_gbps: float | None = None,
    ) -> Fabric:
        """The fabric of ``gpus_per_node x nodes`` GPUs of ``preset``.

        Inside a node: ``link_busbw_gbps`` (``--link-bandwidth``) else the preset's measured all-reduce busbw
        for ``gpus_per_node`` over ``interconnect`` (default: the preset's). Between nodes: ``network_gbps``
        (``--network-bandwidth``, per node) else ``nics_per_node`` (default: the preset's typical count) x the
        per-NIC bandwidth NCCL reaches on ``network`` (default: the preset's typical NIC, else ``100gbe``).
        """
        link = interconnect or preset.interconnect
        intra = link_busbw_gbps if link_busbw_gbps is not None else preset.allreduce_busbw_gbps(gpus_per_node, link)
        step = NCCL_STEP_LATENCY_S["nvlink" if link == "nvlink" and gpus_per_node <= preset.nvlink_gpus else "pcie"]
        net = NETWORK_SPECS[network or preset.network or "100gbe"]
        nics = nics_per_node if nics_per_node is not None else preset.nics_per_node
        inter = network_gbps if network_gbps is not None else nics * net.nic_gbps
        return cls(
            gpus_per_node=gpus_per_node,
            intra_busbw_gbps=intra,
            nodes=nodes,
            inter_gbps=inter if nodes > 1 else 0.0,
            intra_step_latency_s=step,
            inter_step_latency_s=net.latency_s,
        )

    def _lat(self, collective: str, n: int, nodes: int, step_s: float) -> float:
        return ring_latency_s(collective, n, nodes, step_s, self.inter_step_latency_s, self.base_latency_s)

    def ring_s(self, collective: str, nbytes: int) -> float:
        """One ring through all ranks: busbw min(intra, inter) across nodes; NCCL's ring latency."""
        n = self.gpus
        busbw = self.intra_gbps(collective) if self.nodes == 1 else min(self.intra_gbps(collective), self.inter_gbps)
        return _RING[collective](nbytes, n, busbw, self._lat(collective, n, self.nodes, self.intra_step_latency_s))

    def hierarchical_s(self, collective: str, nbytes: int) -> float:
        """Inside-node phase(s) over S, across-node phase over each rank's S/g shard (module docstring)."""
        g, nn = self.gpus_per_node, self.nodes
        if nn == 1:
            return self.ring_s(collective, nbytes)
        inside = 0.0
        if g > 1:  # one inside phase for reduce-scatter / all-gather, two (RS then AG) for all-reduce
            lat = self._lat("reduce_scatter", g, 1, self.intra_step_latency_s)
            inside = reduce_scatter_s(nbytes, g, self.intra_gbps("reduce_scatter"), lat)
            inside *= 2 if collective == "all_reduce" else 1
        # Across: g concurrent collectives of S/g over N ranks, each with 1/g of the NICs: the g cancel out.
        across_lat = self._lat(collective, nn, nn, self.inter_step_latency_s)
        across = _RING[collective](nbytes, nn, self.inter_gbps, across_lat)
        return inside + across

    def time_s(self, collective: str, nbytes: int, scheme: str | None = None) -> float:
        """Seconds for ``collective`` of the full buffer ``nbytes`` over all ranks of this fabric.

        ``scheme``: ``"ring"``, ``"hierarchical"`` or ``"auto"`` (the faster); default ``"auto"`` for all-reduce,
        ``"ring"`` for reduce-scatter and all-gather (what NCCL runs; module docstring).
        """
        if collective not in COLLECTIVES:
            raise ValueError(f"collective {collective!r} is not one of {COLLECTIVES}")
        scheme = scheme or ("auto" if collective == "all_reduce" else "ring")
        if scheme not in SCHEMES:
            raise ValueError(f"scheme {scheme!r} is not one of {SCHEMES}")
        if scheme == "ring":
            return self.ring_s(collective, nbytes)
        if scheme == "hierarchical":
            return self.hierarchical_s(collective, nbytes)
        return min(self.ring_s(collective, nbytes), self.hierarchical_s(collective, nbytes))


def allreduce_s(nbytes: int, fabric: Fabric, scheme: str | None = None) -> float:
    """All-reduce of ``nbytes`` over ``fabric``, seconds (``Fabric.time_s``)."""
    return fabric.time_s("all_reduce", nbytes, scheme)


def reduce_scatter_fabric_s(nbytes: int, fabric: Fabric, scheme: str | None = None) -> float:
    """Reduce-scatter of the full buffer ``nbytes`` over ``fabric``, seconds (``Fabric.time_s``)."""
    return fabric.time_s("reduce_scatter", nbytes, scheme)


def all_gather_fabric_s(nbytes: int, fabric: Fabric, scheme: str | None = None) -> float:
    """All-gather producing ``nbytes`` on every rank of ``fabric``, seconds (``Fabric.time_s``)."""
    return fabric.time_s("all_gather", nbytes, scheme)


def split_buckets(total_bytes: int, cap_bytes: int, first_cap_bytes: int | None = None) -> list[int]:
    """Split ``total_bytes`` into consecutive buckets of ``cap_bytes`` (the first of ``first_cap_bytes``); the last
    holds the remainder. An idealisation of bucketing by tensors that ignores where tensors end."""
    if total_bytes < 0 or cap_bytes <= 0:
        raise ValueError(f"need total_bytes >= 0 and cap_bytes > 0, got {total_bytes}, {cap_bytes}")
    sizes, left, cap = [], total_bytes, first_cap_bytes or cap_bytes
    while left > 0:
        take = min(cap, left)
        sizes.append(take)
        left -= take
        cap = cap_bytes
    return sizes


def ddp_bucket_sizes(grad_bytes: int | Sequence[int], bucket_cap_mb: float | None = None) -> list[int]:
    """The bytes of each DDP gradient bucket, in the order DDP launches their all-reduces.

    ``grad_bytes``: the total gradient bytes (split evenly at the caps), or each parameter's gradient bytes in
    the order gradients become ready in backward (about the reverse of ``model.parameters()``), packed as
    torch's ``compute_bucket_assignment_by_size``: a bucket closes once it reaches its cap, so a bucket can
    exceed the cap by its last tensor. ``bucket_cap_mb`` None is torch's default: 25 MiB buckets after a first
    of 1 MiB; a set value caps every bucket, the first included (torch 2.x ``_BucketCapacityConfig``). One
    dtype is assumed (torch buckets each dtype apart).
    """
    cap = DDP_BUCKET_CAP_BYTES if bucket_cap_mb is None else int(bucket_cap_mb * MiB)
    first = DDP_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    if isinstance(grad_bytes, int):
        return split_buckets(grad_bytes, cap, first)
    sizes, current, limit = [], 0, first
    for t in grad_bytes:
        current += t
        if current >= limit:
            sizes.append(current)
            current, limit = 0, cap
    if current:
        sizes.append(current)
    return sizes


@dataclass(frozen=True)
class BucketedAllReduce:
    """DDP's gradient all-reduce, bucket by bucket. Times in seconds; buckets in launch order, bytes."""

    buckets: tuple[int, ...]
    total_s: float  # every bucket's all-reduce, one after another (NCCL runs them in order on one stream)
    last_s: float  # the last bucket's: it starts when backward ends, so nothing hides it

    @property
    def count(self) -> int:
        """The number of all-reduce collectives DDP launches per synchronised backward."""
        return len(self.buckets)


def bucketed_allreduce(
    grad_bytes: int | Sequence[int], fabric: Fabric, bucket_cap_mb: float | None = None, scheme: str | None = None
) -> BucketedAllReduce:
    """DDP's bucketed gradient all-reduce over ``fabric``: the buckets (``ddp_bucket_sizes``), each an all-reduce
    with its own latency (``Fabric.time_s``), their total and the last one's time."""
    buckets = tuple(ddp_bucket_sizes(grad_bytes, bucket_cap_mb))
    times = [fabric.time_s("all_reduce", b, scheme) for b in buckets]
    return BucketedAllReduce(buckets=buckets, total_s=sum(times), last_s=times[-1] if times else 0.0)


def pcie_host_gbps(pcie_gen: int) -> float:
    """Pinned host<->device copy bandwidth over one x16 link of PCIe generation ``pcie_gen``, GB/s one direction
    (measured: Gen3 ~12, Gen4 ~25; Gen5 ~50 estimated; ``advisor.gpu_presets.PCIE_HOST_GBPS`` cites each)."""
    if pcie_gen not in PCIE_HOST_GBPS:
        raise ValueError(f"PCIe generation {pcie_gen} is not one of {sorted(PCIE_HOST_GBPS)}")
    return PCIE_HOST_GBPS[pcie_gen][0]


def pcie_transfer_s(nbytes: int, pcie_gen: int, gbps: float | None = None) -> float:
    """Seconds to copy ``nbytes`` between pinned host memory and one GPU: ``S / bandwidth``.

    ``gbps`` overrides the per-generation figure (``pcie_host_gbps``). One direction; GPUs copying at once
    through a shared PCIe switch or one host's memory share it (not modelled here).
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    rate = gbps if gbps is not None else pcie_host_gbps(pcie_gen)
    if not rate > 0:
        raise ValueError(f"PCIe bandwidth must be > 0 GB/s, got {rate}")
    return nbytes / (rate * GB)
