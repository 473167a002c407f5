"""``python -m advisor doctor``: the pre-flight checklist of a first multi-GPU run as a command.

    advisor doctor [--nodes-file hosts] [--master-port N] [--data DIR] [--ckpt-dir DIR] [--json] [--timeout S]

Each check prints ``PASS|WARN|FAIL  name: what was found`` and, for WARN/FAIL, an indented ``fix:`` line.
Exit code 1 if any check FAILs, else 0; 2 for bad input (one line on stderr, ``advisor: error: ...``).

Where the facts come from:
- gpus: NVML ``nvmlDeviceGetCount`` (nvidia-ml-py, module ``pynvml``; sees every GPU of the machine) against
  ``torch.cuda.device_count()`` (honours CUDA_VISIBLE_DEVICES).
- cuda-driver: NVML ``nvmlSystemGetCudaDriverVersion`` (nvidia-smi's "CUDA Version") against
  ``torch.version.cuda``.
- backend: ``torch.distributed.is_nccl_available()`` with GPUs, else ``is_gloo_available()``.
- allreduce: ``python -m torch.distributed.run --nproc_per_node 2`` (torchrun) on 127.0.0.1, a free port, a
  small script in a temp dir: all-reduce of ones and 2 DDP steps.
- master-port: a bind on 0.0.0.0; 29500 is torchrun's (and deepspeed's) default ``--master_port``.
- data / ckpt-dir: listing and reading / creating and deleting a uniquely named temp file.
- versions: ``platform.python_version``, ``torch.__version__``, ``torch.version.cuda``,
  ``torch.backends.cudnn.version()``, ``torch.cuda.nccl.version()``, NVML ``nvmlSystemGetDriverVersion``, and
  ``importlib.metadata`` for deepspeed and transformers (never imported: deepspeed's import takes seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..faces import OneLineParser, finite_float, positive_int, run_face
from .checks import (
    FAIL,
    PASS,
    TORCHRUN_DEFAULT_PORT,
    WARN,
    Check,
    DoctorOptions,
    Host,
    NvmlFacts,
    check_backend,
    check_port,
    collect_versions,
    compare_cuda_versions,
    compare_gpu_counts,
    read_nvml,
    torch_gpu_count,
    visible_count,
)
from .launch import check_allreduce
from .paths import check_ckpt_dir, check_data
from .report import compare_command, node_commands, parse_nodes_file, render_json, render_text

__all__ = [
    "Check",
    "DoctorOptions",
    "Host",
    "NvmlFacts",
    "PASS",
    "WARN",
    "FAIL",
    "main",
    "run_checks",
    "exit_code",
    "parse_args",
    "check_allreduce",
    "check_backend",
    "check_ckpt_dir",
    "check_data",
    "check_port",
    "collect_versions",
    "compare_cuda_versions",
    "compare_gpu_counts",
    "compare_command",
    "node_commands",
    "parse_nodes_file",
    "read_nvml",
    "render_json",
    "render_text",
    "torch_gpu_count",
    "visible_count",
]

EXIT_OK, EXIT_FAIL = 0, 1
MAX_TIMEOUT_S = 3600.0


def run_checks(options: DoctorOptions, nvml: NvmlFacts | None = None) -> list[Check]:
    """All checks for ``options`` in checklist order: gpus, cuda-driver, backend, allreduce, master-port, then
    data and ckpt-dir when given. ``nvml`` defaults to ``read_nvml()``."""
    import torch

    nvml = nvml if nvml is not None else read_nvml()
    gpus = torch_gpu_count()
    checks = [
        compare_gpu_counts(nvml.gpu_count, gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), nvml.error),
        compare_cuda_versions(nvml.driver_cuda, torch.version.cuda, nvml.error),
        check_backend(gpus),
    ]
    if checks[-1].status == FAIL:
        checks.append(Check("allreduce", FAIL, "skipped: no usable backend", "fix the backend check first"))
    else:
        checks.append(check_allreduce(gpus, options.timeout_s))
    checks.append(check_port(options.master_port))
    if options.data is not None:
        checks.append(check_data(options.data))
    if options.ckpt_dir is not None:
        checks.append(check_ckpt_dir(options.ckpt_dir))
    return checks


def exit_code(checks: Sequence[Check]) -> int:
    """1 if any check failed, else 0."""
    return EXIT_FAIL if any(c.status == FAIL for c in checks) else EXIT_OK


def _port(text: str) -> int:
    """A TCP port, 1-65535 (integer parsing and its messages are the CLI's)."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port between 1 and 65535, got {value}")
    return value


def _timeout(text: str) -> float:
    """Seconds, more than 0 and at most an hour."""
    value = finite_float(text)
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds, got {text}")
    return value


def _path(text: str) -> str:
    """A non-empty path."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError("needs a path")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``advisor doctor`` flags; errors are one line, exit 2."""
    p = OneLineParser(
        prog="advisor doctor",
        description="Pre-flight checklist for distributed training on this node: "
        "GPUs, driver vs torch CUDA, backend, a 2-rank all-reduce through torchrun, master port, data "
        "and checkpoint paths, versions. Exit 1 if any check fails.",
    )
    p.add_argument(
        "--nodes-file",
        metavar="HOSTS",
        type=_path,
        help="one hostname a line ('#' comments, optional slots=N, as a deepspeed hostfile): print the "
        "command to run this doctor on each node and how to compare the reports (nothing is run there)",
    )
    p.add_argument(
        "--master-port",
        metavar="N",
        type=_port,
        default=TORCHRUN_DEFAULT_PORT,
        help=f"port torchrun/deepspeed will use on the master (default {TORCHRUN_DEFAULT_PORT})",
    )
    p.add_argument("--data", metavar="DIR", type=_path, help="data directory: must exist, be readable, not empty")
    p.add_argument("--ckpt-dir", metavar="DIR", type=_path, help="checkpoint directory: must be writable")
    p.add_argument(
        "--timeout", metavar="S", type=_timeout, default=60.0, help="seconds for the 2-rank run (default 60)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document: checks, versions, exit_code")
    return p


def parse_args(argv: Sequence[str] | None) -> DoctorOptions:
    """argv -> options; reads the nodes file. Raises AdvisorError on bad input."""
    args = build_parser().parse_args(argv)
    hosts = parse_nodes_file(args.nodes_file) if args.nodes_file else ()
    return DoctorOptions(
        master_port=args.master_port,
        data=args.data,
        ckpt_dir=args.ckpt_dir,
        timeout_s=args.timeout,
        hosts=hosts,
        json=args.json,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``advisor doctor`` entry: 0 all checks pass or warn, 1 a check failed, 2 bad input, 130 interrupted."""
    return run_face(lambda: _doctor(sys.argv[1:] if argv is None else argv))


def _doctor(argv: Sequence[str]) -> int:
    options = parse_args(argv)
    nvml = read_nvml()
    checks = run_checks(options, nvml)
    versions = collect_versions(nvml)
    code = exit_code(checks)
    text = render_json(checks, versions, options, code) if options.json else render_text(checks, versions, options)
    print(text)
    return code
