"""Communication formulas of the step-time model (issue 13, phase 1) against hand arithmetic, and the
sourced hardware figures they read (advisor.gpu_presets)."""

from __future__ import annotations

import pytest

from advisor.gpu_presets import (
    FIGURES,
    GPU_PRESETS,
    NETWORK_SPECS,
    NETWORKS,
    PCIE_HOST_GBPS,
    PCIE_RING_BUSBW_GBPS,
    get_gpu_preset,
)
from advisor.timing.comm import (
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    Fabric,
    all_gather_fabric_s,
    all_gather_s,
    allreduce_s,
    bucketed_allreduce,
    ddp_bucket_sizes,
    pcie_transfer_s,
    reduce_scatter_fabric_s,
    reduce_scatter_s,
    ring_allreduce_s,
    ring_latency_s,
)

GiB, MiB = 2**30, 2**20


def _quiet(**kw) -> Fabric:
    """A fabric without latency terms, for pure bandwidth arithmetic."""
    return Fabric(intra_step_latency_s=0.0, inter_step_latency_s=0.0, base_latency_s=0.0, **kw)


# ------------------------------------------------------------------------------------------ ring formulas
def test_ring_allreduce_1gib_on_8_gpus_is_exact_hand_arithmetic():
    # 2 x 7/8 x 2**30 B / 200e9 B/s = 1.75 x 1073741824 / 2e11 = 1879048192 / 2e11 s
    assert ring_allreduce_s(GiB, 8, 200.0) == 0.00939524096
    assert ring_allreduce_s(GiB, 8, 200.0, latency_s=56e-6) == 0.00939524096 + 56e-6


def test_reduce_scatter_and_all_gather_move_half_an_allreduce():
    # 7/8 x 2**30 / 2e11 = 939524096 / 2e11 s
    assert reduce_scatter_s(GiB, 8, 200.0) == 0.00469762048
    assert all_gather_s(GiB, 8, 200.0) == 0.00469762048
    assert reduce_scatter_s(GiB, 8, 200.0) + all_gather_s(GiB, 8, 200.0) == ring_allreduce_s(GiB, 8, 200.0)
    # 2 ranks over a 21 GB/s PCIe ring: 1/2 x 2**30 / 21e9
    assert reduce_scatter_s(GiB, 2, 21.0) == pytest.approx(0.025565281523809524, rel=1e-15)


def test_one_rank_and_empty_buffers_cost_nothing():
    for f in (ring_allreduce_s, reduce_scatter_s, all_gather_s):
        assert f(GiB, 1, 200.0, latency_s=1e-3) == 0.0
        assert f(0, 8, 200.0, latency_s=1e-3) == 0.0
        assert f(GiB, 1, 0.0) == 0.0  # no bandwidth needed when nothing moves
    single = Fabric(gpus_per_node=1, intra_busbw_gbps=200.0)
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        assert single.time_s(collective, GiB) == 0.0
        assert ring_latency_s(collective, 1) == 0.0
    assert bucketed_allreduce(100 * MiB, single).total_s == 0.0


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        ring_allreduce_s(GiB, 8, 0.0)
    with pytest.raises(ValueError):
        ring_allreduce_s(-1, 8, 200.0)
    with pytest.raises(ValueError):
        reduce_scatter_s(GiB, 0, 200.0)
    with pytest.raises(ValueError):
        Fabric(gpus_per_node=8, intra_busbw_gbps=200.0, nodes=2)  # several nodes need the NIC bandwidth
    with pytest.raises(ValueError):
        _quiet(gpus_per_node=8, intra_busbw_gbps=200.0).time_s("all_to_all", GiB)


def test_nccl_ring_latency_model():
    # NVIDIA/nccl tuning.cc, ring/Simple: 8.4 us + steps x 3.4 us (NVLink), network steps 9.6 us
    assert ring_latency_s("all_reduce", 8) == pytest.approx(8.4e-6 + 14 * 3.4e-6)  # 56.0 us
    assert ring_latency_s("reduce_scatter", 8) == pytest.approx(8.4e-6 + 7 * 3.4e-6)  # 32.2 us
    assert ring_latency_s("all_gather", 8, intra_step_s=5.7e-6) == pytest.approx(8.4e-6 + 7 * 5.7e-6)  # PCIe
    # 2 nodes x 8: 30 steps, 2 of them across the network: 8.4 + 28 x 3.4 + 2 x 9.6 = 122.8 us
    assert ring_latency_s("all_reduce", 16, nodes=2) == pytest.approx(122.8e-6)
    fabric = Fabric(gpus_per_node=8, intra_busbw_gbps=200.0)
    assert allreduce_s(GiB, fabric) == pytest.approx(0.00939524096 + 56e-6)


# ------------------------------------------------------------------------------------------ across nodes
def test_hierarchical_two_node_allreduce_by_hand():
    # 2 nodes x 8 A100, 200 GB/s inside, 8 HDR NICs x 24 GB/s = 192 GB/s between, 1 GiB.
    fabric = _quiet(gpus_per_node=8, intra_busbw_gbps=200.0, nodes=2, inter_gbps=192.0)
    inside = 2 * 0.00469762048  # reduce-scatter then all-gather inside: 2 x 7/8 x 2**30 / 2e11
    across = 2**30 / 192e9  # all-reduce across 2 nodes: 2 x 1/2 x (S/8) per GPU over 192/8 GB/s each
    assert allreduce_s(GiB, fabric, "hierarchical") == pytest.approx(inside + across, rel=1e-12)
    assert allreduce_s(GiB, fabric, "hierarchical") == pytest.approx(0.014987646293333, rel=1e-12)
    # One flat ring through 16 GPUs at min(200, 192): 2 x 15/16 x 2**30 / 192e9 = 2013265920 / 1.92e11
    assert allreduce_s(GiB, fabric, "ring") == pytest.approx(0.01048576, rel=1e-12)
    assert allreduce_s(GiB, fabric) == allreduce_s(GiB, fabric, "ring")  # auto: the faster


def test_hierarchical_wins_over_a_single_slow_nic():
    # Same 2 x 8, one 100 GbE RoCE NIC per node (12 GB/s): the tree-like scheme sends S once over the network.
    fabric = _quiet(gpus_per_node=8, intra_busbw_gbps=200.0, nodes=2, inter_gbps=12.0)
    ring = 1.875 * 2**30 / 12e9  # = 0.16777216
    hier = 2 * 0.00469762048 + 2**30 / 12e9  # = 0.00939524096 + 0.08947848533
    assert allreduce_s(GiB, fabric, "ring") == pytest.approx(0.16777216, rel=1e-12)
    assert allreduce_s(GiB, fabric, "hierarchical") == pytest.approx(hier, rel=1e-12)
    assert allreduce_s(GiB, fabric) == pytest.approx(hier, rel=1e-12) and hier < ring
    # Reduce-scatter / all-gather: NCCL's ring by default (15/16 x S / 12e9); the hierarchical half on request.
    assert reduce_scatter_fabric_s(GiB, fabric) == pytest.approx(0.08388608, rel=1e-12)
    assert all_gather_fabric_s(GiB, fabric) == pytest.approx(0.08388608, rel=1e-12)
    assert reduce_scatter_fabric_s(GiB, fabric, "hierarchical") == pytest.approx(
        0.00469762048 + 0.5 * 2**30 / 12e9, rel=1e-12
    )


def test_one_gpu_per_node_is_a_ring_over_the_network():
    fabric = _quiet(gpus_per_node=1, intra_busbw_gbps=200.0, nodes=4, inter_gbps=24.0)
    expected = 2 * 3 / 4 * 2**30 / 24e9
    assert allreduce_s(GiB, fabric, "ring") == pytest.approx(expected, rel=1e-12)
    assert allreduce_s(GiB, fabric, "hierarchical") == pytest.approx(expected, rel=1e-12)
    with_lat = Fabric(gpus_per_node=1, intra_busbw_gbps=200.0, nodes=4, inter_gbps=24.0)
    assert allreduce_s(GiB, with_lat, "ring") == pytest.approx(expected + 8.4e-6 + 6 * 9.6e-6, rel=1e-12)


def test_fabric_from_preset_reads_the_sourced_figures():
    a100 = get_gpu_preset("A100-80GB")
    f = Fabric.from_preset(a100, 8, nodes=2)
    assert (f.intra_busbw_gbps, f.inter_gbps, f.gpus) == (200.0, 8 * 24.0, 16)  # DGX A100: 8 x HDR
    f = Fabric.from_preset(a100, 8, nodes=2, network="1gbe", nics_per_node=1)
    assert f.inter_gbps == NETWORK_SPECS["1gbe"].nic_gbps and f.inter_step_latency_s == 50e-6
    f = Fabric.from_preset(a100, 8, interconnect="pcie")
    assert f.intra_busbw_gbps == 21.0 and f.intra_step_latency_s == 5.7e-6
    f = Fabric.from_preset(a100, 4, nodes=2, link_busbw_gbps=150.0, network_gbps=50.0)  # --link/--network-bandwidth
    assert (f.intra_busbw_gbps, f.inter_gbps) == (150.0, 50.0)
    assert Fabric.from_preset(get_gpu_preset("RTX4090"), 2, nodes=2).inter_gbps == 12.0  # 1 NIC, 100gbe default
    assert Fabric.from_preset(get_gpu_preset("H100-80GB"), 8).intra_busbw_gbps == 370.0  # ring, not NVLS


# ------------------------------------------------------------------------------------------ DDP buckets
def test_ddp_bucket_counts_for_a_gradient_size():
    # torch default: a 1 MiB first bucket, then 25 MiB ones; the last holds the remainder: 1 + 25 x 3 + 24
    assert ddp_bucket_sizes(100 * MiB) == [1 * MiB, 25 * MiB, 25 * MiB, 25 * MiB, 24 * MiB]
    assert (DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES) == (MiB, 25 * MiB)
    # A user-set bucket_cap_mb caps the first bucket too (torch 2.x _BucketCapacityConfig).
    assert ddp_bucket_sizes(100 * MiB, bucket_cap_mb=25) == [25 * MiB] * 4
    # GPT-2 124M, fp32 gradients: 124,439,808 x 4 B = 474.7 MiB -> 1 MiB + 18 x 25 MiB + 23.7 MiB: 20 buckets
    assert len(ddp_bucket_sizes(124_439_808 * 4)) == 20
    assert ddp_bucket_sizes(512 * 1024) == [512 * 1024]
    assert ddp_bucket_sizes(0) == []


def test_ddp_buckets_by_tensor_close_once_they_reach_the_cap():
    sizes = [600_000, 600_000, 30 * MiB, 10 * MiB]  # ready order in backward
    assert ddp_bucket_sizes(sizes) == [1_200_000, 30 * MiB, 10 * MiB]
    assert ddp_bucket_sizes([MiB, MiB, MiB]) == [MiB, 2 * MiB]


def test_bucketed_allreduce_counts_collectives_and_adds_their_times():
    quiet = _quiet(gpus_per_node=8, intra_busbw_gbps=200.0)
    plan = bucketed_allreduce(100 * MiB, quiet)
    assert plan.count == 5 and sum(plan.buckets) == 100 * MiB
    assert plan.total_s == pytest.approx(ring_allreduce_s(100 * MiB, 8, 200.0), rel=1e-12)  # bandwidth is linear
    assert plan.last_s == pytest.approx(ring_allreduce_s(24 * MiB, 8, 200.0), rel=1e-12)
    noisy = Fabric(gpus_per_node=8, intra_busbw_gbps=200.0)
    plan = bucketed_allreduce(100 * MiB, noisy)  # every bucket pays NCCL's 56 us ring latency
    assert plan.total_s == pytest.approx(ring_allreduce_s(100 * MiB, 8, 200.0) + 5 * 56e-6, rel=1e-12)


# ------------------------------------------------------------------------------------------ PCIe copies
def test_pcie_host_device_transfer():
    assert pcie_transfer_s(GiB, 4) == 0.04294967296  # 2**30 / 25e9
    assert pcie_transfer_s(GiB, 3) == pytest.approx(2**30 / 12e9)
    assert pcie_transfer_s(GiB, 5) == pytest.approx(2**30 / 50e9)
    assert pcie_transfer_s(GiB, 4, gbps=10.0) == pytest.approx(0.1073741824)
    assert pcie_transfer_s(0, 4) == 0.0
    with pytest.raises(ValueError):
        pcie_transfer_s(GiB, 2)


# ------------------------------------------------------------------------------------------ the presets
def test_every_preset_sources_every_figure():
    for p in GPU_PRESETS.values():
        for figure in FIGURES:
            assert p.source_of(figure).strip(), (p.name, figure)
        assert p.busbw and all(b.source.strip() and b.gbps > 0 and b.gpus >= 2 for b in p.busbw), p.name
        assert p.hbm_gbps > 0 and p.tflops_fp16 and p.tflops_fp32 and p.pcie_gen in PCIE_HOST_GBPS, p.name
        assert (p.nvlink_gen is None) == (p.nvlink_gpus == 0), p.name
        assert p.network is None or p.network in NETWORK_SPECS, p.name
        assert p.source.strip()
    for b in PCIE_RING_BUSBW_GBPS.values():
        assert b.source.strip()
    for gbps, src in PCIE_HOST_GBPS.values():
        assert gbps > 0 and src.strip()


def test_bf16_support_and_peaks():
    for name in ("V100-16GB", "V100-32GB", "T4-16GB", "TITANRTX"):
        p = get_gpu_preset(name)
        assert not p.supports_bf16 and p.peak_tflops("bf16") is None and p.peak_tflops("tf32") is None
        assert p.bf16_tflops == p.tflops_fp16  # the older single figure: the half-precision tensor peak
    a100 = get_gpu_preset("A100-80GB")
    assert a100.supports_bf16 and a100.peak_tflops("bf16") == 312.0 == a100.bf16_tflops
    assert (a100.peak_tflops("fp16"), a100.peak_tflops("tf32"), a100.peak_tflops("fp32")) == (312.0, 156.0, 19.5)
    assert get_gpu_preset("V100-32GB").peak_tflops("fp16") == 125.0
    with pytest.raises(ValueError):
        a100.peak_tflops("int8")


def test_older_attributes_still_read_the_same():
    a100 = get_gpu_preset("A100-80GB")
    assert (a100.memory_mib, a100.interconnect, a100.link_gbps) == (81920, "nvlink", 600.0)
    assert a100.memory_bytes == 81920 * 2**20 and "A100" in a100.source
    assert get_gpu_preset("RTX4090").interconnect == "pcie"
    assert NETWORKS == {
        "ib-ndr": 50.0,
        "ib-hdr": 25.0,
        "ib-edr": 12.5,
        "400gbe": 50.0,
        "200gbe": 25.0,
        "100gbe": 12.5,
        "25gbe": 3.125,
        "10gbe": 1.25,
        "1gbe": 0.125,
    }
    assert set(NETWORK_SPECS) == set(NETWORKS)
    for n in NETWORK_SPECS.values():
        assert 0 < n.nic_gbps <= n.line_gbps and n.latency_s > 0 and n.source.strip()


def test_new_presets_and_the_busbw_lookup():
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match="did you mean TITANRTX"):
        get_gpu_preset("titan")
    assert get_gpu_preset("titanrtx").name == "TITANRTX" and get_gpu_preset("rtxa6000").name == "RTXA6000"
    assert get_gpu_preset("l40s-48gb").memory_mib == 46068 and get_gpu_preset("RTXA6000").memory_mib == 49140
    assert get_gpu_preset("TITANRTX").memory_mib == 24220
    # Measured ring figures: 8 x A100 ~200, 8 x H100 ~370 (ring; NVLS 480 is not used), PCIe Gen4 ring ~21.
    assert get_gpu_preset("A100-40GB").allreduce_busbw_gbps(8) == 200.0
    assert get_gpu_preset("H100-80GB").allreduce_busbw_gbps(4) == 370.0  # nearest count
    assert get_gpu_preset("A100-80GB").allreduce_busbw_gbps(8, "pcie") == 21.0
    assert get_gpu_preset("L4-24GB").allreduce_busbw_gbps(8, "nvlink") == 21.0  # no NVLink: the PCIe ring
    titan = get_gpu_preset("TITANRTX")
    assert titan.allreduce_busbw_gbps(2, "nvlink") == 40.0  # a bridged pair
    assert titan.allreduce_busbw_gbps(4, "nvlink") == 10.5  # past the bridge: PCIe Gen3
    assert get_gpu_preset("A100-80GB").nics_per_node == 8 and get_gpu_preset("H100-80GB").network == "ib-ndr"
