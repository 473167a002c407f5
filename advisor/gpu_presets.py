"""GPU presets and the networks between nodes, as data, for planning on a machine without the target GPU.

``memory_mib`` is the total that ``nvidia-smi`` reports (MiB), not the marketing name: the usable
figure the plan is checked against. TFLOP/s are dense (no sparsity) bf16/fp16 tensor-core peaks;
``link_gbps`` is the per-GPU peer bandwidth in GB/s (10**9 B/s) of the default interconnect.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from .errors import AdvisorError


@dataclass(frozen=True)
class GpuPreset:
    name: str
    memory_mib: int
    bf16_tflops: float
    interconnect: str  # "nvlink" or "pcie"
    link_gbps: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20


GPU_PRESETS: dict[str, GpuPreset] = {
    p.name.lower(): p
    for p in (
        GpuPreset("A100-40GB", 40960, 312.0, "nvlink", 600.0,
                  "NVIDIA A100 datasheet (SXM4: 312 TF bf16 dense, NVLink 600 GB/s); nvidia-smi 40960MiB"),
        GpuPreset("A100-80GB", 81920, 312.0, "nvlink", 600.0,
                  "NVIDIA A100 datasheet (SXM4 80GB); nvidia-smi 81920MiB"),
        GpuPreset("H100-80GB", 81559, 989.0, "nvlink", 900.0,
                  "NVIDIA H100 datasheet (SXM5: 989 TF bf16 dense, NVLink 900 GB/s); nvidia-smi 81559MiB"),
        GpuPreset("H200-141GB", 143771, 989.0, "nvlink", 900.0,
                  "NVIDIA H200 datasheet (SXM: 141 GB HBM3e, NVLink 900 GB/s); nvidia-smi 143771MiB"),
        GpuPreset("V100-16GB", 16160, 125.0, "nvlink", 300.0,
                  "NVIDIA V100 datasheet (SXM2: 125 TF fp16, NVLink 300 GB/s); nvidia-smi 16160MiB"),
        GpuPreset("V100-32GB", 32510, 125.0, "nvlink", 300.0,
                  "NVIDIA V100 datasheet (SXM2 32GB); nvidia-smi 32510MiB"),
        GpuPreset("A10G-24GB", 23028, 70.0, "pcie", 32.0,
                  "AWS G5 / NVIDIA A10G (PCIe 4.0 x16, about 32 GB/s); nvidia-smi 23028MiB"),
        GpuPreset("L4-24GB", 23034, 121.0, "pcie", 32.0,
                  "NVIDIA L4 datasheet (121 TF bf16 dense, PCIe 4.0 x16); nvidia-smi 23034MiB"),
        GpuPreset("RTX3090", 24576, 71.0, "pcie", 32.0,
                  "NVIDIA GA102 whitepaper (RTX 3090: 71 TF fp16 dense w/ fp32 acc., PCIe 4.0); nvidia-smi 24576MiB"),
        GpuPreset("RTX4090", 24564, 165.0, "pcie", 32.0,
                  "NVIDIA Ada whitepaper (RTX 4090: 165 TF fp16 dense, no NVLink, PCIe 4.0); nvidia-smi 24564MiB"),
        GpuPreset("T4-16GB", 15360, 65.0, "pcie", 16.0,
                  "NVIDIA T4 datasheet (65 TF fp16, PCIe 3.0 x16 about 16 GB/s); nvidia-smi 15360MiB"),
    )
}

DEFAULT_GPU_PRESET = "A100-80GB"

INTERCONNECTS = ("nvlink", "pcie")  # between the GPUs of one node
# Inter-node networks, GB/s per node one direction (InfiniBand spec rates; Ethernet line rates).
NETWORKS = {"ib-ndr": 50.0, "ib-hdr": 25.0, "ib-edr": 12.5, "400gbe": 50.0, "200gbe": 25.0, "100gbe": 12.5,
            "25gbe": 3.125, "10gbe": 1.25, "1gbe": 0.125}
SLOW_NETWORKS = ("10gbe", "1gbe")  # field notes 004 section 3.1: 1 GbE is a bottleneck


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
