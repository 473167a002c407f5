"""Hardware: detected GPUs (torch.cuda / NVML, ``nvidia-smi topo -m`` as fallback), or a preset,
overridden by flags. Every figure records where it came from. Probes warn and fall back; they never
raise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .gpu_presets import DEFAULT_GPU_PRESET, GpuPreset, get_gpu_preset
from .schema import ClusterSpec

if TYPE_CHECKING:
    from .cache import DiskCache, NullCache
    from .choices import Precision
    from .timing.calibrate import CpuCalibration
    from .timing.gpu_model import GpuModel

# Where the host RAM figure comes from: this machine's (planning for its own GPUs), the user's
# (--host-mem / the page's field), or nobody's (planning for a preset GPU elsewhere).
HOST_DETECTED, HOST_GIVEN, HOST_UNKNOWN = "detected", "given", "unknown"
CALIBRATED_LINK = "NCCL all-reduce busbw measured by advisor calibrate"  # sources["link_busbw_gbps"] of a calibration


@dataclass(frozen=True)
class DetectedGpus:
    count: int
    name: str
    memory_bytes: int
    interconnect: str | None
    warnings: tuple[str, ...] = ()
    supports_bf16: bool | None = None  # torch.cuda.is_bf16_supported(including_emulation=False)


@dataclass(frozen=True)
class Hardware:
    """The target cluster: ``gpus_per_node`` x ``num_nodes`` GPUs of one kind."""

    gpu_name: str
    gpu_memory_bytes: int  # usable, as nvidia-smi reports it
    gpus_per_node: int
    num_nodes: int
    interconnect: str  # within a node: nvlink | pcie
    network: str | None  # between nodes; None for one node
    bf16_tflops: float
    link_gbps: float
    host_mem_bytes: int | None  # per node; None when unknown (``host_mem_state``)
    sources: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    host_mem_state: str = HOST_GIVEN  # HOST_DETECTED | HOST_GIVEN | HOST_UNKNOWN
    # CPU verification runs only (plan(device="cpu")); GPU plans ignore it. > 0: the intra-op threads of each
    # rank on a CPU where oneDNN books a transient weight-gradient scratch for some convolutions (AVX2
    # without AVX-512; ``advisor.trace.cpu_conv_scratch_bytes``); 0: no such scratch (the default).
    cpu_conv_scratch_threads: int = 0
    # Whether the GPU has bf16 tensor cores (Ampere and newer; V100 and T4 do not). None: unknown.
    supports_bf16: bool | None = True
    # Step time: the all-reduce bus bandwidth inside a node (--link-bandwidth) and a node's bandwidth to the
    # others (--network-bandwidth), GB/s; None: the GPU preset's figures (advisor.timing.comm.Fabric.from_preset).
    link_busbw_gbps: float | None = None
    network_gbps: float | None = None
    # CPU verification runs only: this machine's measured rates (``advisor.timing.calibrate.CpuCalibration``),
    # which the step-time model uses in place of a GPU preset's figures (``strategies.base.timing_of``). None:
    # time a GPU by its preset.
    calibration: CpuCalibration | None = field(default=None, compare=False, repr=False)
    # GPU plans only: the compute model's constants to time this GPU with (``advisor.timing.gpu_model.GpuModel``:
    # a calibration of this machine's GPU, or a fit's trial values). None: the GPU generation's fitted constants.
    gpu_model: GpuModel | None = field(default=None, compare=False, repr=False)

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes


def detect_gpus() -> DetectedGpus | None:
    """GPUs on this machine via torch.cuda, interconnect via NVML; ``None`` when there are none."""
    try:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return None
        count = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        name, memory = props.name, int(props.total_memory)
        bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except Exception:  # a broken driver must not stop planning
        return None
    link, warnings = _detect_interconnect(count)
    return DetectedGpus(count, name, memory, link, tuple(warnings), supports_bf16=bf16)


def _detect_interconnect(count: int) -> tuple[str | None, list[str]]:
    if count < 2:
        return None, []
    try:
        import pynvml  # from the nvidia-ml-py package

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                        return "nvlink", []
                except pynvml.NVMLError:
                    break
            return "pcie", []
        finally:
            pynvml.nvmlShutdown()
    except Exception as err:
        topo = _topo_from_nvidia_smi()
        if topo:
            return topo, []
        return None, [
            f"could not read the GPU interconnect ({err.__class__.__name__}); assuming pcie: "
            "pass --interconnect nvlink if the GPUs have NVLink"
        ]


def _topo_from_nvidia_smi() -> str | None:
    """Parse ``nvidia-smi topo -m``: any ``NV#`` cell between GPUs means NVLink."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_topo_matrix(out)


def parse_topo_matrix(text: str) -> str | None:
    """``nvidia-smi topo -m`` output -> "nvlink" if any GPU pair is ``NV<n>``, "pcie" if GPU rows
    exist without one, ``None`` when no GPU rows are found."""
    rows = [line.split() for line in text.splitlines() if line.startswith("GPU")]
    gpu_rows = [r for r in rows if len(r) > 1 and r[0][3:].isdigit()]
    if not gpu_rows:
        return None
    cells = [c for r in gpu_rows for c in r[1:]]
    return "nvlink" if any(c.startswith("NV") and c[2:].isdigit() for c in cells) else "pcie"


def host_memory_bytes() -> int:
    """Physical RAM of this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def resolve_hardware(cluster: ClusterSpec) -> Hardware:
    """Combine detection, a preset and flags (flags win, then the preset, then detection). The fields
    were checked by ``advisor.schema.validate``.

    Without a detected GPU and without ``cluster.gpu``, plans for ``DEFAULT_GPU_PRESET`` and says so.
    Host RAM: this machine's when planning for its own (detected) GPUs, ``--host-mem`` when given, else
    unknown (a preset is a machine elsewhere).

    Raises:
        AdvisorError: unknown preset.
    """
    gpu, gpu_mem_gib, gpus, nodes = cluster.gpu, cluster.gpu_mem_gib, cluster.gpus, cluster.nodes
    interconnect, network, host_mem_gib = cluster.interconnect, cluster.network, cluster.host_mem_gib
    detect = cluster.detect_hardware
    preset: GpuPreset | None = get_gpu_preset(gpu) if gpu else None
    found = detect_gpus() if detect and preset is None else None
    sources: dict[str, str] = {}
    warnings: list[str] = []
    bf16: bool | None
    if preset is None and found is None:
        preset = get_gpu_preset(DEFAULT_GPU_PRESET)
        warnings.append(f"no GPU detected: planning for the default preset {preset.name} (use --gpu to choose)")
        src = f"default preset {preset.name}"
    else:
        src = f"preset {preset.name}" if preset else "detected"
    if preset is not None:
        name, memory = preset.name, preset.memory_bytes
        link, tflops, link_gbps = preset.interconnect, preset.bf16_tflops, preset.link_gbps
        bf16 = preset.supports_bf16
    else:
        assert found is not None, "without a preset the GPUs were detected (the default preset otherwise)"
        name, memory, link = found.name, found.memory_bytes, found.interconnect or "pcie"
        warnings.extend(found.warnings)
        tflops, link_gbps = 0.0, 600.0 if link == "nvlink" else 32.0
        bf16 = found.supports_bf16
    sources.update(gpu_name=src, gpu_memory_bytes=src, bf16_tflops=src if tflops else "unknown")
    sources["interconnect"] = src
    if gpu_mem_gib is not None:
        if gpu_mem_gib * 2**30 > memory:  # usable memory is at most what the GPU has: a typo, or the wrong --gpu
            warnings.append(
                f"--gpu-mem {gpu_mem_gib:g} GiB is more than {name}'s {memory / 2**30:.2f} GiB: planned with "
                f"{gpu_mem_gib:g} GiB as asked; check --gpu-mem and --gpu"
            )
        memory, sources["gpu_memory_bytes"] = int(gpu_mem_gib * 2**30), "flag --gpu-mem"
    if interconnect is not None:
        link, sources["interconnect"] = interconnect, "flag --interconnect"
        link_gbps = 600.0 if link == "nvlink" else 32.0
    if gpus is not None:
        per_node, sources["gpus_per_node"] = gpus, "flag --gpus"
    elif found is not None:
        per_node, sources["gpus_per_node"] = found.count, "detected"
    else:
        per_node, sources["gpus_per_node"] = 1, "default (1; use --gpus)"
    if host_mem_gib is not None:
        host, state, sources["host_mem_bytes"] = int(host_mem_gib * 2**30), HOST_GIVEN, "flag --host-mem"
    elif preset is None:
        host, state, sources["host_mem_bytes"] = host_memory_bytes(), HOST_DETECTED, "detected (this machine)"
    else:
        host, state, sources["host_mem_bytes"] = None, HOST_UNKNOWN, "unknown (a preset GPU: give --host-mem)"
    if nodes > 1 and network is None:
        warnings.append("--nodes > 1 without --network: assuming 100gbe between nodes")
        network, sources["network"] = "100gbe", "default (100gbe)"
    elif network is not None:
        sources["network"] = "flag --network"
        if nodes == 1:
            warnings.append(f"--network {network} is not used: it links nodes and this plan has one (add --nodes N)")
    sources["num_nodes"] = "flag --nodes" if nodes > 1 else "default (1)"
    if cluster.link_bandwidth_gbps is not None:
        sources["link_busbw_gbps"] = "flag --link-bandwidth"
    if cluster.network_bandwidth_gbps is not None:
        sources["network_gbps"] = "flag --network-bandwidth"
        if nodes == 1:
            warnings.append("--network-bandwidth is not used: it is the link between nodes and this plan has one")
    return Hardware(
        gpu_name=name,
        gpu_memory_bytes=memory,
        gpus_per_node=per_node,
        num_nodes=nodes,
        interconnect=link,
        network=network if nodes > 1 else network,
        bf16_tflops=tflops,
        link_gbps=link_gbps,
        host_mem_bytes=host,
        sources=sources,
        warnings=tuple(warnings),
        host_mem_state=state,
        supports_bf16=bf16,
        link_busbw_gbps=cluster.link_bandwidth_gbps,
        network_gbps=cluster.network_bandwidth_gbps,
    )


def with_gpu_calibration(hw: Hardware, precision: Precision, cache: DiskCache | NullCache) -> Hardware:
    """``hw`` timed by this machine's stored calibration of its GPU, if there is one (``advisor calibrate``;
    ``advisor.timing.gpu_calibrate.calibration_for``: the same GPU, measured under the installed torch): its
    constants at ``precision`` as ``gpu_model``, with ``sources["time_model"]`` saying "calibrated on this machine,
    <date>", and its measured NCCL all-reduce bus bandwidth as ``link_busbw_gbps`` when it was measured over as
    many GPUs as a node of the plan has and ``--link-bandwidth`` was not given. Unchanged without one, for a CPU
    verification run (``calibration``) and when ``gpu_model`` is set already (a fit's trial constants).
    ``cache``: the plan's (``NullCache`` for --no-cache: no calibration is read)."""
    if hw.calibration is not None or hw.gpu_model is not None:
        return hw
    from .timing.compute import preset_for_gpu
    from .timing.gpu_calibrate import calibration_for

    cal = calibration_for(hw.gpu_name, hw.gpu_memory_bytes, cache)
    preset = preset_for_gpu(hw.gpu_name, hw.gpu_memory_bytes)
    if cal is None or preset is None:
        return hw
    sources = dict(hw.sources)
    model = cal.model(precision, preset)
    if model is not None:
        hw, sources["time_model"] = replace(hw, gpu_model=model), model.source
    busbw = cal.rates.get("all_reduce_busbw_gbps")
    if busbw and hw.link_busbw_gbps is None and cal.gpu_count == hw.gpus_per_node:
        hw = replace(hw, link_busbw_gbps=busbw)
        sources["link_busbw_gbps"] = f"{CALIBRATED_LINK} over {cal.gpu_count} GPUs, {cal.source}"
    return replace(hw, sources=sources)


def without_gpu_calibration(hw: Hardware) -> Hardware:
    """``hw`` as it was before ``with_gpu_calibration``: no ``gpu_model``, and the preset's link bandwidth where the
    calibration had set it (what the GPU preset's constants predict, beside the calibrated prediction)."""
    sources = {k: v for k, v in hw.sources.items() if k != "time_model"}
    link = hw.link_busbw_gbps
    if sources.get("link_busbw_gbps", "").startswith(CALIBRATED_LINK):
        link = None
        del sources["link_busbw_gbps"]
    return replace(hw, gpu_model=None, link_busbw_gbps=link, sources=sources)
