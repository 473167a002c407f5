"""The checks' data types and the checks that only read facts: GPUs (NVML vs torch), driver vs torch's CUDA,
backend, master port. Versions for the cross-node comparison live here too. Every check returns a ``Check``.
"""

from __future__ import annotations

import errno
import platform
import re
import socket
from dataclasses import dataclass

TORCHRUN_DEFAULT_PORT = 29500  # torchrun's and deepspeed's default --master_port
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclass(frozen=True)
class Check:
    """One line of the report. ``fix`` is one sentence for WARN/FAIL, ``None`` for PASS."""

    name: str
    status: str  # PASS | WARN | FAIL
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Host:
    """A line of the nodes file (deepspeed hostfile format: ``HOST [slots=N]``)."""

    name: str
    slots: int | None = None


@dataclass(frozen=True)
class DoctorOptions:
    """What to check. ``hosts`` is the parsed ``--nodes-file``."""

    master_port: int = TORCHRUN_DEFAULT_PORT
    data: str | None = None
    ckpt_dir: str | None = None
    timeout_s: float = 60.0
    hosts: tuple[Host, ...] = ()
    json: bool = False


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML says; every field ``None`` (and ``error`` set) when NVML cannot be read."""

    gpu_count: int | None = None
    driver: str | None = None  # nvmlSystemGetDriverVersion, e.g. "550.54.15"
    driver_cuda: int | None = None  # nvmlSystemGetCudaDriverVersion, e.g. 12040 for CUDA 12.4
    error: str | None = None


# ---------------------------------------------------------------- facts


def read_nvml() -> NvmlFacts:
    """GPU count and driver versions from NVML (nvmlInit, nvmlDeviceGetCount, nvmlSystemGetDriverVersion,
    nvmlSystemGetCudaDriverVersion). Never raises: a missing driver or package becomes ``error``."""
    try:
        import pynvml  # from the nvidia-ml-py package

        pynvml.nvmlInit()
    except Exception as err:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return NvmlFacts(error=f"{err.__class__.__name__}: {err}" if str(err) else err.__class__.__name__)
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return NvmlFacts(
            gpu_count=int(pynvml.nvmlDeviceGetCount()),
            driver=driver.decode() if isinstance(driver, bytes) else str(driver),
            driver_cuda=int(pynvml.nvmlSystemGetCudaDriverVersion()),
        )
    except Exception as err:
        return NvmlFacts(error=f"{err.__class__.__name__}: {err}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def torch_gpu_count() -> int:
    """``torch.cuda.device_count()`` (0 when CUDA is unusable); honours CUDA_VISIBLE_DEVICES."""
    import torch

    try:
        return int(torch.cuda.device_count())
    except Exception:
        return 0


def visible_count(nvml_count: int, cuda_visible: str | None) -> int:
    """How many GPUs CUDA should expose given CUDA_VISIBLE_DEVICES: every GPU when unset, else the entries up
    to the first invalid one (CUDA stops there): an out-of-range or repeated index, or an unknown token."""
    if cuda_visible is None:
        return nvml_count
    seen: set[int] = set()
    n = 0
    for item in (s.strip() for s in cuda_visible.split(",")):
        if re.fullmatch(r"-?\d+", item):
            index = int(item)
            if not 0 <= index < nvml_count or index in seen:
                break
            seen.add(index)
        elif not item.startswith(("GPU-", "MIG-")):  # UUIDs count as one device each
            break
        n += 1
    return n


def collect_versions(nvml: NvmlFacts) -> dict[str, str | None]:
    """Versions every node must share (docs/pitfalls.md, pitfall 18); the ``driver*`` keys may differ between nodes
    as long as each driver supports torch's CUDA. ``None`` means absent."""
    import importlib.metadata as metadata

    import torch

    def dist_version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cudnn = nccl = None
    try:
        raw = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if raw:  # cuDNN 9+: MAJOR*10000 + MINOR*100 + PATCH; cuDNN 8: MAJOR*1000 + MINOR*100 + PATCH
            major, rest = divmod(raw, 10000 if raw >= 90000 else 1000)
            cudnn = f"{major}.{rest // 100}.{rest % 100}"
    except Exception:
        pass
    if torch.version.cuda:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            pass
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn,
        "nccl": nccl,
        "deepspeed": dist_version("deepspeed"),
        "transformers": dist_version("transformers"),
        "driver": nvml.driver,
        "driver_cuda": _cuda_str(nvml.driver_cuda) if nvml.driver_cuda else None,
    }


def _cuda_str(encoded: int) -> str:
    """NVML's CUDA version integer (1000 * major + 10 * minor) -> "major.minor"."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


# ---------------------------------------------------------------- checks


def compare_gpu_counts(
    nvml_count: int | None, torch_count: int, cuda_visible: str | None, nvml_error: str | None = None
) -> Check:
    """Check 1: NVML's count (all GPUs of the machine) against torch's (after CUDA_VISIBLE_DEVICES)."""
    cvd = "" if cuda_visible is None else f", CUDA_VISIBLE_DEVICES={cuda_visible!r}"
    seen = f"NVML nvmlDeviceGetCount = {nvml_count}, torch.cuda.device_count() = {torch_count}{cvd}"
    if nvml_count is None:
        if torch_count == 0:
            return Check(
                "gpus",
                WARN,
                f"no GPU: CPU/gloo only (NVML: {nvml_error or 'not readable'}; torch.cuda.device_count() = 0)",
                "fine for CPU dry runs; on a GPU node install the "
                "NVIDIA driver (nvidia-smi must list the GPUs) and a CUDA build of torch",
            )
        return Check(
            "gpus",
            WARN,
            f"torch sees {torch_count} GPU(s) but NVML cannot be read ({nvml_error})",
            "pip install nvidia-ml-py (module pynvml) so GPU facts and the driver version can be read",
        )
    expected = visible_count(nvml_count, cuda_visible)
    if torch_count != expected:
        why = (
            f"CUDA_VISIBLE_DEVICES={cuda_visible!r} should expose {expected}"
            if cuda_visible is not None
            else "CUDA_VISIBLE_DEVICES is not set"
        )
        return Check(
            "gpus",
            FAIL,
            f"GPU counts disagree: {seen} ({why})",
            "check CUDA_VISIBLE_DEVICES, that torch is a CUDA build matching the driver "
            "(see cuda-driver below) and that no GPU is in a failed state (nvidia-smi)",
        )
    if torch_count == 0:
        if nvml_count:
            return Check(
                "gpus",
                WARN,
                f"NVML sees {nvml_count} GPU(s) but CUDA_VISIBLE_DEVICES={cuda_visible!r} "
                "hides them all: CPU/gloo only",
                "unset CUDA_VISIBLE_DEVICES or list the GPUs to use",
            )
        return Check(
            "gpus",
            WARN,
            f"no GPU: CPU/gloo only ({seen})",
            "fine for CPU dry runs; training on GPUs needs a node where nvidia-smi lists them",
        )
    return Check("gpus", PASS, f"{torch_count} GPU(s) visible ({seen})")


def compare_cuda_versions(driver_cuda: int | None, torch_cuda: str | None, nvml_error: str | None = None) -> Check:
    """Check 2: the newest CUDA the driver supports (nvmlSystemGetCudaDriverVersion) >= ``torch.version.cuda``.
    Same major, older minor: WARN (CUDA minor-version compatibility runs most code); older major: FAIL."""
    if not torch_cuda:
        return Check(
            "cuda-driver",
            WARN,
            "skipped: torch is a CPU-only build (torch.version.cuda is None)",
            "on GPU nodes install a CUDA build of torch (pip install torch --index-url "
            "https://download.pytorch.org/whl/cuXYZ)",
        )
    if driver_cuda is None:
        return Check(
            "cuda-driver",
            WARN,
            f"torch is built for CUDA {torch_cuda}; no NVIDIA driver to compare (NVML: {nvml_error or 'not readable'})",
            f"on GPU nodes the driver must support CUDA >= {torch_cuda} (nvidia-smi, 'CUDA Version')",
        )
    try:
        want = tuple(int(x) for x in torch_cuda.split(".")[:2])
    except ValueError:
        return Check(
            "cuda-driver",
            WARN,
            f"cannot parse torch.version.cuda = {torch_cuda!r}",
            "compare nvidia-smi's 'CUDA Version' with torch.version.cuda by hand",
        )
    have = (driver_cuda // 1000, driver_cuda % 1000 // 10)
    text = f"driver supports CUDA {_cuda_str(driver_cuda)}, torch is built for CUDA {torch_cuda}"
    if have >= want:
        return Check("cuda-driver", PASS, text)
    fix = (
        f"upgrade the NVIDIA driver to one supporting CUDA {torch_cuda}, or install a torch wheel built for "
        f"CUDA <= {_cuda_str(driver_cuda)}"
    )
    if have[0] == want[0]:
        return Check(
            "cuda-driver",
            WARN,
            f"{text}: runs under CUDA minor-version compatibility, but kernels "
            "needing a newer driver (PTX JIT) can fail",
            fix,
        )
    return Check("cuda-driver", FAIL, f"{text}: torch cannot use these GPUs", fix)


def check_backend(gpu_count: int) -> Check:
    """Check 3: NCCL when there are GPUs (``torch.distributed.is_nccl_available``), else gloo."""
    import torch.distributed as dist

    if not dist.is_available():
        return Check(
            "backend",
            FAIL,
            "torch.distributed is not available in this torch build",
            "install an official torch wheel (pip install torch), which ships torch.distributed",
        )
    if gpu_count:
        if dist.is_nccl_available():
            return Check("backend", PASS, "nccl (GPU)")
        return Check(
            "backend",
            FAIL,
            f"{gpu_count} GPU(s) but this torch has no NCCL",
            "install a CUDA build of torch for Linux; they ship NCCL",
        )
    if dist.is_gloo_available():
        return Check("backend", PASS, "gloo (CPU)")
    return Check(
        "backend",
        FAIL,
        "no GPU and no gloo backend in this torch build",
        "install an official torch wheel (pip install torch), which ships gloo",
    )


def check_port(port: int) -> Check:
    """Check 5: ``port`` can be bound on 0.0.0.0, as torchrun's rendezvous store on the master will
    (SO_REUSEADDR, like the store, so sockets in TIME_WAIT do not count as taken)."""
    from ..processes import free_port

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as err:
            other = free_port()
            use = f"pass another port to torchrun/deepspeed (--master_port {other} is free now)"
            if err.errno == errno.EADDRINUSE:
                return Check(
                    "master-port",
                    FAIL,
                    f"port {port} is taken (a stale torchrun/deepspeed process? `ss -ltnp | grep {port}`)",
                    f"stop the process holding it (ss -ltnp shows its pid) or {use}",
                )
            if err.errno == errno.EACCES:
                return Check("master-port", FAIL, f"port {port} needs root (privileged port below 1024)", use)
            return Check("master-port", FAIL, f"cannot bind port {port}: {err.strerror or err}", use)
    return Check("master-port", PASS, f"port {port} is free on 0.0.0.0")
