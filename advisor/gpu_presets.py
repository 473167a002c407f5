"""GPU presets and the networks between nodes, as data, for planning on a machine without the target GPU.

``memory_mib`` is the total that ``nvidia-smi`` reports (MiB), not the marketing name: the usable
figure the plan is checked against. TFLOP/s are dense (no sparsity) tensor-core peaks, one per precision
(``tflops_bf16``, ``tflops_fp16``, ``tflops_tf32``; ``tflops_fp32`` is the non-tensor FP32 peak), None where
the GPU has no such unit (V100, T4, TITAN RTX: no bf16, no tf32). ``bf16_tflops`` is the older single
figure: the half-precision tensor peak (bf16, or fp16 where there is no bf16). Bandwidths are GB/s
(10**9 B/s): ``link_gbps`` the per-GPU peer bandwidth of the default interconnect as its spec states it
(NVLink: both directions together, e.g. A100 600; PCIe: one direction), ``hbm_gbps`` the memory bandwidth
(spec), ``busbw`` the nccl-tests all-reduce bus bandwidth measured inside one node (large messages, ring;
one direction): the figure time estimates use. Every figure has its source in ``sources`` (``source_of``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import AdvisorError

PRECISIONS_TFLOPS = ("bf16", "fp16", "tf32", "fp32")  # the keys of GpuPreset.peak_tflops
# The figures every preset sources (``GpuPreset.sources`` keys); a test checks each preset has them all.
FIGURES = (
    "memory_mib",
    "tflops_bf16",
    "tflops_fp16",
    "tflops_tf32",
    "tflops_fp32",
    "hbm_gbps",
    "nvlink_gen",
    "pcie_gen",
    "nics_per_node",
)


@dataclass(frozen=True)
class BusBw:
    """One measured (or, where ``source`` says so, estimated) all-reduce bus bandwidth inside one node.

    ``gbps``: nccl-tests ``all_reduce_perf`` busbw in GB/s (10**9 B/s) at large sizes, ring algorithm
    (nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n, comparable across n and across collectives).
    """

    interconnect: str  # "nvlink" | "pcie": the path the measurement ran over
    gpus: int  # ranks in the measured all-reduce
    gbps: float
    source: str


@dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_mib: int
    interconnect: str  # default link between the GPUs of one node: "nvlink" or "pcie"
    link_gbps: float  # per-GPU peer bandwidth of that link, GB/s as the spec states it (NVLink: both directions)
    source: str  # one-line summary of where the preset comes from
    tflops_bf16: float | None = None  # dense tensor-core peaks, TFLOP/s; None: no such unit
    tflops_fp16: float | None = None
    tflops_tf32: float | None = None
    tflops_fp32: float | None = None  # non-tensor FP32
    hbm_gbps: float = 0.0  # device memory bandwidth, GB/s (spec)
    nvlink_gen: int | None = None  # NVLink generation joining the GPUs; None: none
    nvlink_gpus: int = 0  # how many GPUs one NVLink domain joins (8: NVSwitch board, 2: a bridge); 0: none
    pcie_gen: int = 4  # host link, x16
    nics_per_node: int = 1  # inter-node NICs of the typical system (DGX A100: 8 x HDR, DGX H100: 8 x NDR)
    network: str | None = None  # NIC type of the typical system (a NETWORK_SPECS key); None: not typical
    busbw: tuple[BusBw, ...] = ()  # measured all-reduce bus bandwidths inside one node
    sources: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20

    @property
    def supports_bf16(self) -> bool:
        """Whether the GPU has bf16 tensor cores (Ampere and newer; not V100, T4, TITAN RTX)."""
        return self.tflops_bf16 is not None

    @property
    def bf16_tflops(self) -> float:
        """The half-precision tensor peak, TFLOP/s: bf16, or fp16 where the GPU has no bf16 (V100, T4).

        The older single figure (``Hardware.bf16_tflops``); use ``peak_tflops(precision)`` for one precision.
        """
        return self.tflops_bf16 if self.tflops_bf16 is not None else (self.tflops_fp16 or 0.0)

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak TFLOP/s for ``precision`` in ``PRECISIONS_TFLOPS``; None where the GPU has no such unit."""
        if precision not in PRECISIONS_TFLOPS:
            raise ValueError(f"precision {precision!r} is not one of {PRECISIONS_TFLOPS}")
        return getattr(self, f"tflops_{precision}")

    def source_of(self, figure: str) -> str:
        """Where ``figure`` (a ``FIGURES`` name, or "busbw") comes from; "" when unsourced."""
        if figure == "busbw":
            return "; ".join(f"{b.gpus} x {b.interconnect}: {b.source}" for b in self.busbw)
        return self.sources.get(figure, "")

    def allreduce_busbw_gbps(self, gpus: int, interconnect: str | None = None) -> float:
        """All-reduce bus bandwidth (GB/s) inside one node for ``gpus`` ranks over ``interconnect``.

        The measurement for exactly ``gpus`` when there is one, else the one with the nearest GPU count
        (busbw is built to depend little on n: nccl-tests PERFORMANCE.md). NVLink past the NVLink domain
        (e.g. 8 GPUs of bridged pairs) and interconnects without a measurement fall back to the PCIe ring
        figure of this preset, else ``PCIE_RING_BUSBW_GBPS`` for its PCIe generation.
        """
        link = interconnect or self.interconnect
        if link == "nvlink" and gpus > self.nvlink_gpus:
            link = "pcie"
        found = [b for b in self.busbw if b.interconnect == link]
        if not found:
            return PCIE_RING_BUSBW_GBPS[self.pcie_gen].gbps
        return min(found, key=lambda b: (abs(b.gpus - gpus), -b.gpus)).gbps


# ---------------------------------------------------------------- sources shared by several presets
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet (SXM4): BF16/FP16 312, TF32 156 TF dense (624/312 with sparsity)"
_A100_FP32 = "NVIDIA A100 datasheet: FP32 19.5 TF"
_A100_NVL = "A100 datasheet: NVLink 3rd generation, 600 GB/s per GPU (both directions); NVSwitch joins 8 (DGX/HGX A100)"
_A100_NIC = "DGX A100 datasheet: 8 x ConnectX-6 HDR 200 Gb/s InfiniBand for compute (2 more for storage)"
_A100_BUSBW = (
    "nccl-tests issue #149 (8 x A100-SXM4-80GB NVSwitch, all_reduce_perf -b 8 -e 1G -f 4 -g 1 -t 8): busbw "
    "~200 GB/s at 1 GiB (sjeaugey there: ~230 GB/s at 8 GiB); nccl-tests #178: 208 GB/s"
)
_H100_DS = (
    "NVIDIA H100 datasheet (SXM5) / H100 whitepaper: BF16/FP16 989.4, TF32 494.7 TF dense (1,979/989 with sparsity)"
)
_H100_FP32 = "NVIDIA H100 datasheet (SXM5): FP32 67 TF (whitepaper 66.9)"
_H100_NVL = "H100 datasheet: NVLink 4th generation, 900 GB/s per GPU (both directions); NVSwitch joins 8 (DGX/HGX H100)"
_H100_BUSBW = (
    "nccl-tests issue #212 (sjeaugey, 8 x H100 SXM): ~370 GB/s busbw with NCCL_ALGO=RING and for the "
    "non-allreduce collectives; the default NVLS (NVLink SHARP) all-reduce reaches ~480 GB/s"
)
_H200_BUSBW = (
    "nccl-tests issue #272 (8 x H200, NCCL 2.20.3): all-reduce peak 475 GB/s (NVLS, the default); the ring "
    "figure is H100's ~370 GB/s (same NVLink4/NVSwitch fabric, nccl-tests #212)"
)
_V100_DS = (
    "NVIDIA V100 datasheet (SXM2): tensor (FP16 multiply, FP32 accumulate) 125 TF, FP32 15.7 TF; "
    "Volta has no bf16 and no TF32"
)
_V100_NVL = "V100 datasheet: NVLink 2nd generation, 300 GB/s per GPU; DGX-1 joins 8 in a hybrid cube-mesh"
_V100_NIC = "DGX-1 (V100): 4 x EDR InfiniBand 100 Gb/s (nccl-tests #29: 8 x V100 servers with 4 x EDR)"
_V100_BUSBW = (
    "estimate, no run found: NVLink2 is 25 GB/s per link and direction, ~20 GB/s effective (sjeaugey, "
    "nccl-tests #149, for links of that rate); 6 links per V100 -> ~120 GB/s"
)
_PCIE_NO_NIC = "a PCIe server or workstation: one NIC assumed (no typical multi-NIC system)"
_PCIE4_RING = (
    "about 21 GB/s for an 8-GPU PCIe Gen4 ring; cf. nccl-tests #178 (A100 pairs joined over "
    "PCIe/SYS: ~20 GB/s), tinygrad/open-gpu-kernel-modules #36 (4 x RTX 4090 PCIe Gen4 with P2P: 25.9 GB/s "
    "at 1 GiB), NVIDIA/nccl #1639 (8 x RTX 4090 'little different' from 8 x RTX 5090's 28 GB/s)"
)
_PCIE3_RING = "estimate, no run found: the PCIe Gen4 ring figure (21 GB/s) halved (Gen3 x16 runs at half Gen4's rate)"
_PCIE5_RING = (
    "NVIDIA/nccl issue #1639 (8 x RTX 5090, PCIe Gen5, all_reduce_perf -b 1g -e 8g -f 2 -g 8): busbw "
    "28 GB/s (35 GB/s on 4 GPUs)"
)
_BRIDGE3_BUSBW = (
    "estimate, no run found: a 2-way NVLink 3 bridge is 56.25 GB/s per direction (4 links; "
    "tinygrad/open-gpu-kernel-modules #3) x ~0.8 effective (sjeaugey, nccl-tests #149) -> ~45 GB/s"
)

# The PCIe ring busbw by PCIe generation: the fallback where a preset has no measurement for the link asked.
PCIE_RING_BUSBW_GBPS: dict[int, BusBw] = {
    3: BusBw("pcie", 8, 10.5, _PCIE3_RING),
    4: BusBw("pcie", 8, 21.0, _PCIE4_RING),
    5: BusBw("pcie", 8, 28.0, _PCIE5_RING),
}
# Pinned host<->device copy bandwidth over one x16 link, GB/s one direction, measured (cudaMemcpy / nvbandwidth).
PCIE_HOST_GBPS: dict[int, tuple[float, str]] = {
    3: (12.0, "gearshifft PR #82: bandwidthTest, Tesla P100 PCIe Gen3 x16, pinned: 12.2 GB/s H2D, 12.9 GB/s D2H"),
    4: (
        25.0,
        "NVIDIA/nvbandwidth issue #42: A100-SXM4 host_to_device_memcpy_sm 25.13 GB/s (512 MiB-1 GiB); "
        "ZaidQureshi/bam #54: ~25 GB/s measured peak for PCIe Gen4 x16",
    ),
    5: (50.0, "estimate, no run found: twice Gen4 (PCIe Gen5 x16 doubles the signalling rate)"),
}


def _a100(name: str, memory_mib: int, hbm_gbps: float, hbm_src: str) -> GpuPreset:
    return GpuPreset(
        name,
        memory_mib,
        "nvlink",
        600.0,
        f"NVIDIA A100 datasheet (SXM4: 312 TF bf16 dense, NVLink 600 GB/s); nvidia-smi {memory_mib}MiB",
        tflops_bf16=312.0,
        tflops_fp16=312.0,
        tflops_tf32=156.0,
        tflops_fp32=19.5,
        hbm_gbps=hbm_gbps,
        nvlink_gen=3,
        nvlink_gpus=8,
        pcie_gen=4,
        nics_per_node=8,
        network="ib-hdr",
        busbw=(BusBw("nvlink", 8, 200.0, _A100_BUSBW), BusBw("pcie", 8, 21.0, _PCIE4_RING)),
        sources=dict(
            memory_mib=f"nvidia-smi {memory_mib}MiB ({name} SXM4)",
            tflops_bf16=_A100_DS,
            tflops_fp16=_A100_DS,
            tflops_tf32=_A100_DS,
            tflops_fp32=_A100_FP32,
            hbm_gbps=hbm_src,
            nvlink_gen=_A100_NVL,
            pcie_gen="A100 datasheet: PCIe Gen4",
            nics_per_node=_A100_NIC,
        ),
    )


def _hopper(name: str, memory_mib: int, hbm_gbps: float, hbm_src: str, busbw_src: str, nic_src: str) -> GpuPreset:
    return GpuPreset(
        name,
        memory_mib,
        "nvlink",
        900.0,
        f"NVIDIA {name.split('-')[0]} datasheet (SXM: 989 TF bf16 dense, NVLink 900 GB/s); nvidia-smi {memory_mib}MiB",
        tflops_bf16=989.4,
        tflops_fp16=989.4,
        tflops_tf32=494.7,
        tflops_fp32=66.9,
        hbm_gbps=hbm_gbps,
        nvlink_gen=4,
        nvlink_gpus=8,
        pcie_gen=5,
        nics_per_node=8,
        network="ib-ndr",
        busbw=(BusBw("nvlink", 8, 370.0, busbw_src), BusBw("pcie", 8, 28.0, _PCIE5_RING)),
        sources=dict(
            memory_mib=f"nvidia-smi {memory_mib}MiB ({name})",
            tflops_bf16=_H100_DS,
            tflops_fp16=_H100_DS,
            tflops_tf32=_H100_DS,
            tflops_fp32=_H100_FP32,
            hbm_gbps=hbm_src,
            nvlink_gen=_H100_NVL,
            pcie_gen="H100/H200 datasheets: PCIe Gen5",
            nics_per_node=nic_src,
        ),
    )


def _v100(name: str, memory_mib: int) -> GpuPreset:
    return GpuPreset(
        name,
        memory_mib,
        "nvlink",
        300.0,
        f"NVIDIA V100 datasheet (SXM2: 125 TF fp16, NVLink 300 GB/s); nvidia-smi {memory_mib}MiB",
        tflops_bf16=None,
        tflops_fp16=125.0,
        tflops_tf32=None,
        tflops_fp32=15.7,
        hbm_gbps=900.0,
        nvlink_gen=2,
        nvlink_gpus=8,
        pcie_gen=3,
        nics_per_node=4,
        network="ib-edr",
        busbw=(BusBw("nvlink", 8, 120.0, _V100_BUSBW), BusBw("pcie", 8, 10.5, _PCIE3_RING)),
        sources=dict(
            memory_mib=f"nvidia-smi {memory_mib}MiB ({name} SXM2)",
            tflops_bf16=_V100_DS,
            tflops_fp16=_V100_DS,
            tflops_tf32=_V100_DS,
            tflops_fp32=_V100_DS,
            hbm_gbps="V100 datasheet: HBM2 900 GB/s",
            nvlink_gen=_V100_NVL,
            pcie_gen="V100 datasheet: PCIe Gen3",
            nics_per_node=_V100_NIC,
        ),
    )


def _pcie_card(
    name: str,
    memory_mib: int,
    link_gbps: float,
    source: str,
    *,
    tflops: tuple[float | None, float | None, float | None, float | None],
    tflops_src: str,
    hbm_gbps: float,
    hbm_src: str,
    pcie_gen: int,
    nvlink_src: str,
    nvlink_gen: int | None = None,
    bridge_busbw: BusBw | None = None,
) -> GpuPreset:
    """A PCIe card: GPUs talk over PCIe by default; ``nvlink_gen`` when a 2-way NVLink bridge can pair two."""
    bf16, fp16, tf32, fp32 = tflops
    ring = PCIE_RING_BUSBW_GBPS[pcie_gen]
    return GpuPreset(
        name,
        memory_mib,
        "pcie",
        link_gbps,
        source,
        tflops_bf16=bf16,
        tflops_fp16=fp16,
        tflops_tf32=tf32,
        tflops_fp32=fp32,
        hbm_gbps=hbm_gbps,
        nvlink_gen=nvlink_gen,
        nvlink_gpus=2 if nvlink_gen else 0,
        pcie_gen=pcie_gen,
        nics_per_node=1,
        network=None,
        busbw=(ring,) + ((bridge_busbw,) if bridge_busbw else ()),
        sources=dict(
            memory_mib=f"nvidia-smi {memory_mib}MiB ({name})",
            tflops_bf16=tflops_src,
            tflops_fp16=tflops_src,
            tflops_tf32=tflops_src,
            tflops_fp32=tflops_src,
            hbm_gbps=hbm_src,
            nvlink_gen=nvlink_src,
            pcie_gen=f"PCIe Gen{pcie_gen} x16 ({name} datasheet)",
            nics_per_node=_PCIE_NO_NIC,
        ),
    )


GPU_PRESETS: dict[str, GpuPreset] = {
    p.name.lower(): p
    for p in (
        _a100("A100-40GB", 40960, 1555.0, "A100 datasheet: 40GB HBM2 1,555 GB/s"),
        _a100("A100-80GB", 81920, 2039.0, "A100 datasheet: 80GB HBM2e SXM 2,039 GB/s"),
        _hopper(
            "H100-80GB",
            81559,
            3350.0,
            "H100 datasheet (SXM5): 80GB HBM3 3.35 TB/s",
            _H100_BUSBW,
            "DGX H100 datasheet: 8 x ConnectX-7 single-port 400 Gb/s (NDR) for compute",
        ),
        _hopper(
            "H200-141GB",
            143771,
            4800.0,
            "H200 datasheet (SXM): 141GB HBM3e 4.8 TB/s",
            _H200_BUSBW,
            "DGX H200 datasheet: 8 x ConnectX-7 400 Gb/s (NDR) for compute",
        ),
        _v100("V100-16GB", 16160),
        _v100("V100-32GB", 32510),
        _pcie_card(
            "A10G-24GB",
            23028,
            32.0,
            "AWS G5 / NVIDIA A10G (PCIe 4.0 x16, about 32 GB/s); nvidia-smi 23028MiB",
            tflops=(70.0, 70.0, 35.0, 31.2),
            tflops_src=(
                "AWS G5 / A10G spec as tabled by baseten.co 'NVIDIA A10 vs A10G': 70 TF bf16/fp16 and "
                "35 TF tf32 dense tensor, 31.2 TF fp32 (less tensor compute than the A10's 125 TF)"
            ),
            hbm_gbps=600.0,
            hbm_src="baseten.co 'NVIDIA A10 vs A10G': 24 GB GDDR6, 600 GB/s",
            pcie_gen=4,
            nvlink_src="A10G: no NVLink (AWS G5)",
        ),
        _pcie_card(
            "A10-24GB",
            23028,
            32.0,
            "NVIDIA A10 datasheet (125 TF bf16 dense, PCIe 4.0 x16); nvidia-smi memory as the A10G's 23028MiB",
            tflops=(125.0, 125.0, 62.5, 31.2),
            tflops_src=(
                "NVIDIA A10 Tensor Core GPU datasheet: BF16/FP16 tensor 125 TF (250 with sparsity), TF32 62.5 TF "
                "(125 with sparsity), FP32 31.2 TF"
            ),
            hbm_gbps=600.0,
            hbm_src="NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s",
            pcie_gen=4,
            nvlink_src="NVIDIA A10 datasheet: PCIe Gen4 x16, no NVLink",
        ),
        _pcie_card(
            "A100-PCIe-40GB",
            40960,
            32.0,
            "NVIDIA A100 datasheet (PCIe: 312 TF bf16 dense, PCIe 4.0 x16); nvidia-smi memory as the SXM4 40GB "
            "preset's",
            tflops=(312.0, 312.0, 156.0, 19.5),
            tflops_src=(
                "NVIDIA A100 Tensor Core GPU datasheet (PCIe column, 40GB): BF16/FP16 312, TF32 156 TF dense "
                "(624/312 with sparsity), FP32 19.5 TF; 250 W, so it holds boost clocks less than the SXM4"
            ),
            hbm_gbps=1555.0,
            hbm_src="NVIDIA A100 datasheet (PCIe 40GB): HBM2 1,555 GB/s",
            pcie_gen=4,
            nvlink_src="NVIDIA A100 datasheet (PCIe): an optional NVLink bridge pairs 2 (600 GB/s); not modelled",
        ),
        _pcie_card(
            "H100-PCIe-80GB",
            81559,
            64.0,
            "NVIDIA H100 datasheet (PCIe: 756 TF bf16 dense, PCIe 5.0 x16); nvidia-smi memory as the SXM5 preset's",
            tflops=(756.0, 756.0, 378.0, 51.0),
            tflops_src=(
                "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column): BF16/FP16 tensor 1,513 TF and TF32 756 TF "
                "with sparsity -> 756 / 378 dense; FP32 51 TF"
            ),
            hbm_gbps=2000.0,
            hbm_src="NVIDIA H100 datasheet (H100 PCIe): 80GB HBM2e, 2 TB/s",
            pcie_gen=5,
            nvlink_src="NVIDIA H100 datasheet (H100 PCIe): an optional NVLink bridge pairs 2 (600 GB/s); not modelled",
        ),
        _pcie_card(
            "RTX6000Ada",
            49140,
            32.0,
            "NVIDIA RTX 6000 Ada datasheet / Ada whitepaper (364 TF fp16 dense, PCIe 4.0 x16); nvidia-smi memory as "
            "the RTX A6000 preset's 49140MiB",
            tflops=(364.2, 364.2, 182.1, 91.1),
            tflops_src=(
                "NVIDIA Ada GPU architecture whitepaper, appendix (RTX 6000 Ada): FP16/BF16 tensor with FP32 "
                "accumulate 364.2 TF dense (728.4 with sparsity), TF32 182.1 TF; RTX 6000 Ada datasheet: FP32 91.1 TF"
            ),
            hbm_gbps=960.0,
            hbm_src="NVIDIA RTX 6000 Ada datasheet: 48 GB GDDR6 with ECC, 960 GB/s",
            pcie_gen=4,
            nvlink_src="NVIDIA RTX 6000 Ada datasheet: PCIe Gen4 x16, no NVLink",
        ),
        _pcie_card(
            "L4-24GB",
            23034,
            32.0,
            "NVIDIA L4 datasheet (121 TF bf16 dense, PCIe 4.0 x16); nvidia-smi 23034MiB",
            tflops=(121.0, 121.0, 60.0, 30.3),
            tflops_src=(
                "NVIDIA L4 datasheet: BF16/FP16 242 and TF32 120 TF with sparsity -> 121 / 60 dense; FP32 30.3 TF"
            ),
            hbm_gbps=300.0,
            hbm_src="NVIDIA L4 datasheet: 24GB GDDR6, 300 GB/s",
            pcie_gen=4,
            nvlink_src="NVIDIA L4 datasheet: PCIe Gen4 x16, no NVLink",
        ),
        _pcie_card(
            "RTX3090",
            24576,
            32.0,
            "NVIDIA GA102 whitepaper (RTX 3090: 71 TF fp16 dense w/ fp32 acc., PCIe 4.0); nvidia-smi 24576MiB",
            tflops=(71.0, 71.0, 35.6, 35.6),
            tflops_src=(
                "NVIDIA Ampere GA102 whitepaper (RTX 3090): FP16/BF16 tensor with FP32 accumulate 71 TF "
                "dense (142 with FP16 accumulate), TF32 35.6 TF, FP32 35.6 TF"
            ),
            hbm_gbps=936.0,
            hbm_src="GA102 whitepaper (RTX 3090): 24 GB GDDR6X, 936 GB/s",
            pcie_gen=4,
            nvlink_gen=3,
            bridge_busbw=BusBw("nvlink", 2, 45.0, _BRIDGE3_BUSBW),
            nvlink_src="GA102 whitepaper: RTX 3090 takes a 2-way NVLink 3 bridge (112.5 GB/s both directions)",
        ),
        _pcie_card(
            "RTX4090",
            24564,
            32.0,
            "NVIDIA Ada whitepaper (RTX 4090: 165 TF fp16 dense, no NVLink, PCIe 4.0); nvidia-smi 24564MiB",
            tflops=(165.2, 165.2, 82.6, 82.6),
            tflops_src=(
                "NVIDIA Ada GPU architecture whitepaper (RTX 4090): FP16/BF16 tensor with FP32 "
                "accumulate 165.2 TF dense (330.3 with FP16 accumulate), TF32 82.6 TF, FP32 82.6 TF"
            ),
            hbm_gbps=1008.0,
            hbm_src="Ada whitepaper (RTX 4090): 24 GB GDDR6X, 1,008 GB/s",
            pcie_gen=4,
            nvlink_src="Ada whitepaper: no NVLink on the RTX 4090",
        ),
        _pcie_card(
            "T4-16GB",
            15360,
            16.0,
            "NVIDIA T4 datasheet (65 TF fp16, PCIe 3.0 x16 about 16 GB/s); nvidia-smi 15360MiB",
            tflops=(None, 65.0, None, 8.1),
            tflops_src=(
                "NVIDIA T4 datasheet: mixed precision (FP16/FP32) 65 TF, FP32 8.1 TF; Turing has no bf16 and no TF32"
            ),
            hbm_gbps=320.0,
            hbm_src="NVIDIA T4 datasheet: 16 GB GDDR6, 320+ GB/s",
            pcie_gen=3,
            nvlink_src="NVIDIA T4 datasheet: PCIe Gen3 x16, no NVLink",
        ),
        _pcie_card(
            "RTXA6000",
            49140,
            32.0,
            "NVIDIA RTX A6000 datasheet (155 TF fp16/bf16 dense, PCIe 4.0 x16); nvidia-smi 49140MiB",
            tflops=(154.8, 154.8, 77.4, 38.7),
            tflops_src=(
                "NVIDIA RTX A6000 datasheet: FP32 38.7 TF, tensor 309.7 TF with sparsity -> 154.8 "
                "fp16/bf16 and 77.4 tf32 dense (full-rate FP32 accumulate, as the A40 datasheet's "
                "149.7 / 74.8 at its lower clock)"
            ),
            hbm_gbps=768.0,
            hbm_src="NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s",
            pcie_gen=4,
            nvlink_gen=3,
            bridge_busbw=BusBw("nvlink", 2, 45.0, _BRIDGE3_BUSBW),
            nvlink_src="RTX A6000 datasheet: 2-way NVLink 3 bridge, 112.5 GB/s both directions",
        ),
        _pcie_card(
            "L40S-48GB",
            46068,
            32.0,
            "NVIDIA L40S datasheet (362 TF fp16/bf16 dense, PCIe 4.0 x16); nvidia-smi 46068MiB",
            tflops=(362.05, 362.05, 183.0, 91.6),
            tflops_src=(
                "NVIDIA L40S datasheet: BF16/FP16 362.05 | 733 TF (with sparsity), TF32 183 | 366 TF, FP32 91.6 TF"
            ),
            hbm_gbps=864.0,
            hbm_src="NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s",
            pcie_gen=4,
            nvlink_src="NVIDIA L40S datasheet: PCIe Gen4 x16, no NVLink",
        ),
        _pcie_card(
            "TITANRTX",
            24220,
            16.0,
            "NVIDIA Turing whitepaper (TITAN RTX: 130 TF fp16 dense, PCIe 3.0 x16; NVLink bridge pairs 2); "
            "nvidia-smi 24220MiB",
            tflops=(None, 130.5, None, 16.3),
            tflops_src=(
                "NVIDIA Turing GPU architecture whitepaper (TITAN RTX): FP16 tensor with FP32 "
                "accumulate 130.5 TF (full rate, unlike the RTX 2080 Ti), FP32 16.3 TF; Turing has no "
                "bf16, no TF32"
            ),
            hbm_gbps=672.0,
            hbm_src="NVIDIA TITAN RTX spec: 24 GB GDDR6, 672 GB/s",
            pcie_gen=3,
            nvlink_gen=2,
            bridge_busbw=BusBw(
                "nvlink",
                2,
                40.0,
                "estimate, no run found: a TITAN RTX NVLink bridge is 2 NVLink2 links, 50 GB/s "
                "per direction, x ~0.8 effective (sjeaugey, nccl-tests #149) -> ~40 GB/s",
            ),
            nvlink_src="TITAN RTX spec: 2-way NVLink 2 bridge, 2 links, 100 GB/s both directions",
        ),
    )
}

DEFAULT_GPU_PRESET = "A100-80GB"

INTERCONNECTS = ("nvlink", "pcie")  # between the GPUs of one node


@dataclass(frozen=True)
class Network:
    """One kind of inter-node NIC. Bandwidths are GB/s (10**9 B/s) per NIC, one direction.

    ``line_gbps``: the signalling rate (InfiniBand spec rates; Ethernet line rates). ``nic_gbps``: what NCCL
    reaches through one such NIC (the busbw a multi-node all-reduce shows per NIC; a node's inter-node
    bandwidth is ``nics_per_node x nic_gbps``). ``latency_s``: the latency NCCL's tuning model charges per
    ring step that crosses this network (NVIDIA/nccl src/graph/tuning.cc, ``hwLat[NET]`` ring/Simple 9.6 us,
    for RDMA NICs; TCP sockets are estimated higher).
    """

    name: str
    line_gbps: float
    nic_gbps: float
    latency_s: float
    rdma: bool  # InfiniBand or RoCE (GPUDirect RDMA); False: NCCL's socket transport over TCP
    source: str


_NCCL_NET_LAT = 9.6e-6  # NVIDIA/nccl src/graph/tuning.cc hwLat[NCCL_HW_NET][ring][simple], us -> s
_NIC_SRC = {
    "ndr": "AddyLaddy, nccl-tests issue #267: CX-7 NICs at NDR (400 Gb/s) reach up to 48-49 GB/s per NIC",
    "hdr": "sjeaugey, nccl-tests issue #119: ~24 GB/s is the peak per 200G NIC (12 GB/s per 100G NIC)",
    "edr": "sjeaugey, nccl-tests issue #119: 12 GB/s per 100G NIC",
}
_TCP_SRC = (
    "line rate x ~0.94 TCP goodput (1448 payload bytes per 1538 on the wire at MTU 1500); latency an "
    "estimate for NCCL's socket transport, no run found"
)
NETWORK_SPECS: dict[str, Network] = {
    n.name: n
    for n in (
        Network("ib-ndr", 50.0, 48.0, _NCCL_NET_LAT, True, _NIC_SRC["ndr"]),
        Network("ib-hdr", 25.0, 24.0, _NCCL_NET_LAT, True, _NIC_SRC["hdr"]),
        Network("ib-edr", 12.5, 12.0, _NCCL_NET_LAT, True, _NIC_SRC["edr"]),
        Network("400gbe", 50.0, 48.0, _NCCL_NET_LAT, True, "RoCE assumed; as NDR: " + _NIC_SRC["ndr"]),
        Network("200gbe", 25.0, 24.0, _NCCL_NET_LAT, True, "RoCE assumed; as HDR: " + _NIC_SRC["hdr"]),
        Network("100gbe", 12.5, 12.0, _NCCL_NET_LAT, True, "RoCE assumed; as EDR: " + _NIC_SRC["edr"]),
        Network("25gbe", 3.125, 2.94, 30e-6, False, _TCP_SRC),
        Network("10gbe", 1.25, 1.18, 30e-6, False, _TCP_SRC),
        Network("1gbe", 0.125, 0.118, 50e-6, False, _TCP_SRC),
    )
}
# Inter-node networks, GB/s per node one direction (InfiniBand spec rates; Ethernet line rates): the line rate
# of one NIC, as existing callers read it. NETWORK_SPECS has the per-NIC achieved bandwidth and latency.
NETWORKS = {name: n.line_gbps for name, n in NETWORK_SPECS.items()}
SLOW_NETWORKS = ("10gbe", "1gbe")  # too slow for gradient traffic between nodes (docs/decisions.md, slow networks)


def get_gpu_preset(name: str) -> GpuPreset:
    """Look up a preset by name, case-insensitively.

    Raises:
        AdvisorError: unknown name (the message lists the closest known names).
    """
    key = name.strip().lower()
    if key in GPU_PRESETS:
        return GPU_PRESETS[key]
    names = [p.name for p in GPU_PRESETS.values()]
    contains = [n for n in names if key and key in n.lower()]  # "h100" -> H100-80GB first
    close = (contains + [n for n in difflib.get_close_matches(name, names, n=3, cutoff=0.3) if n not in contains])[:3]
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise AdvisorError(f"unknown GPU preset {name!r}: {hint}known presets: {', '.join(names)}")
