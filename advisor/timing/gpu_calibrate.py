"""Measuring this machine's GPU (``measure_gpu``: ``_gpu_calibrate_worker.py`` in a subprocess, and its NCCL
collectives under torchrun with two or more GPUs) and keeping the result in the cache directory.

Stored in ``advisor.cache``, namespace ``NAMESPACE``, one entry per GPU name, driver version and torch version
(``key``); the value is ``GpuCalibration.document()``, one JSON object whose ``"device"`` is ``"cuda"`` (the CPU's
calibrations, ``advisor.timing.calibrate``, are the same kind of object with ``"device": "cpu"``). A plan for a GPU
uses the newest stored calibration whose GPU maps to the same preset (a detected GPU: of the same name) and whose
torch version is the running one (``calibration_for``): a torch upgrade makes it miss. Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

from ..cache import FORMAT as CACHE_FORMAT
from ..cache import DiskCache, NullCache, library_versions
from ..choices import Device
from ..processes import free_port
from .compute import preset_for_gpu
from .gpu_calibration import FORMAT, GpuCalibration, from_document, from_measurements

NAMESPACE = "gpu-calibration"
SECONDS_PER_BENCHMARK = 0.03  # each round of each benchmark (two rounds, after a warm-up call)
TIMEOUT_S = 240.0
_WORKER = Path(__file__).with_name("_gpu_calibrate_worker.py")


def key(gpu: str, driver: str, torch: str) -> dict[str, object]:
    """The cache key of a calibration of ``gpu`` (the device's name) under ``driver`` and ``torch``."""
    return {"format": FORMAT, "device": Device.CUDA, "gpu": gpu, "driver": driver, "torch": torch}


def store(cal: GpuCalibration, cache: DiskCache | NullCache) -> None:
    """Keep ``cal`` under its GPU, driver and torch version (an older one of the same three is replaced)."""
    cache.put(NAMESPACE, key(cal.gpu, cal.driver, cal.torch), cal.document())


def namespace_keys(cache: DiskCache | NullCache, namespace: str) -> list[dict[str, object]]:
    """The keys of the entries of ``namespace`` in ``cache``, read from the files as the cache's module docstring
    lays them out (zlib-compressed JSON records); none for ``NullCache`` or on I/O trouble. Read a value with
    ``cache.get(namespace, key)``, which checks it again and marks it used."""
    if isinstance(cache, NullCache):
        return []
    keys = []
    try:
        files = sorted(os.scandir(cache.directory / namespace), key=lambda f: f.name)
    except OSError:
        return []
    for f in files:
        if len(f.name) != 64 or not f.is_file(follow_symlinks=False):
            continue
        try:
            record = json.loads(zlib.decompress(Path(f.path).read_bytes()).decode("utf-8"))
        except (OSError, zlib.error, ValueError, RecursionError):
            continue
        if isinstance(record, dict) and record.get("format") == CACHE_FORMAT and isinstance(record.get("key"), dict):
            keys.append(record["key"])
    return keys


def stored(cache: DiskCache | NullCache) -> list[GpuCalibration]:
    """Every stored GPU calibration of this ``FORMAT``, oldest first."""
    out = []
    for k in namespace_keys(cache, NAMESPACE):
        if k.get("format") != FORMAT:
            continue
        cal = from_document(cache.get(NAMESPACE, k))
        if cal is not None:
            out.append(cal)
    return sorted(out, key=lambda c: c.measured_at)


def calibration_for(
    gpu_name: str, memory_bytes: int, cache: DiskCache | NullCache, torch: str | None = None
) -> GpuCalibration | None:
    """The newest stored calibration a plan for ``gpu_name`` uses (module docstring), measured under ``torch``
    (default: the installed torch's version, ``library_versions``); None when there is none."""
    preset = preset_for_gpu(gpu_name, memory_bytes)
    if preset is None:
        return None
    torch = library_versions()["torch"] if torch is None else torch
    detected = gpu_name.strip().lower() != preset.name.lower()
    found = [
        c for c in stored(cache) if c.preset == preset.name and c.torch == torch and (not detected or c.gpu == gpu_name)
    ]
    return found[-1] if found else None


def _run(argv: list[str], marker: str, env: dict[str, str], timeout_s: float) -> dict[str, object]:
    """Run ``argv`` and return the JSON after ``marker`` on its output.

    Raises:
        RuntimeError: it failed, ran past ``timeout_s`` or printed no figures.
    """
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the GPU calibration ran past {timeout_s:.0f} s") from None
    except OSError as err:
        raise RuntimeError(f"the GPU calibration could not start: {err}") from None
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith(marker + " ")), None)
    if done.returncode != 0 or line is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise RuntimeError(f"the GPU calibration failed: {tail[0]}")
    doc = json.loads(line.split(" ", 1)[1])
    if not isinstance(doc, dict):
        raise RuntimeError("the GPU calibration printed no figures")
    return doc


def measure_gpu(
    seconds: float = SECONDS_PER_BENCHMARK, timeout_s: float = TIMEOUT_S, collectives: bool = True
) -> GpuCalibration:
    """Run the microbenchmarks on device 0 now, and with two or more GPUs (and ``collectives``) the NCCL
    collectives across all of them under torchrun; about a minute on an A100 or H100.

    Raises:
        RuntimeError: a worker failed, ran past ``timeout_s`` or printed nothing; the figures make no calibration.
    """
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    doc = _run([sys.executable, str(_WORKER), "bench", str(seconds)], "GPU_CALIBRATION", env, timeout_s)
    gpus = doc.get("gpu_count")
    if collectives and isinstance(gpus, int) and gpus >= 2:
        argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={gpus}"]
        argv += [f"--master_port={free_port()}", str(_WORKER), "collectives", str(seconds)]
        left = max(30.0, timeout_s - (time.perf_counter() - t0))
        doc["collectives"] = _run(argv, "GPU_COLLECTIVES", env, left)
    doc["seconds"] = time.perf_counter() - t0
    # The version the cache keys use (package metadata, as ``calibration_for`` compares it); torch.__version__ beside.
    doc["torch_runtime"], doc["torch"] = doc.get("torch"), library_versions()["torch"]
    try:
        return from_measurements(doc)
    except ValueError as err:
        raise RuntimeError(f"the GPU calibration's figures are incomplete: {err}") from None
