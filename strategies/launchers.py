"""How a generated script is started: torchrun (torch.distributed.run) or the deepspeed launcher.
A strategy names its launcher; nothing outside strategies/ decides it by the strategy's name."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from advisor.choices import Device, LauncherKind


@dataclass(frozen=True)
class Launcher:
    """``name``: the program users type; ``script_args``: what follows ``train.py``; ``cpu_env``: what a
    machine without a GPU needs exported (DeepSpeed: its CPU accelerator, gloo); ``cpu_note``: what launch.sh says
    there before it starts (DeepSpeed: the silent first-run compile, ``first_use_note``)."""

    name: LauncherKind
    script_args: tuple[str, ...] = ()
    cpu_env: tuple[tuple[str, str], ...] = ()
    cpu_note: str = ""

    def command(self, gpus_per_node: int, num_nodes: int, port: int) -> str:
        """The launch line a user runs (one node; for several nodes, the form run on the first)."""
        tail = " ".join(("train.py",) + self.script_args)
        if self.name == LauncherKind.PYTHON:
            return f"python {tail}"
        if self.name == LauncherKind.DEEPSPEED:
            if num_nodes > 1:
                return (
                    f"deepspeed --hostfile hostfile --num_nodes {num_nodes} --num_gpus {gpus_per_node} "
                    f"--master_addr HOST0 --master_port {port} {tail}"
                )
            return f"deepspeed --num_gpus {gpus_per_node} --master_port {port} {tail}"
        if num_nodes > 1:
            return (
                f"torchrun --nnodes={num_nodes} --node_rank=$NODE_RANK --nproc_per_node={gpus_per_node} "
                f"--master_addr=HOST0 --master_port={port} {tail}"
            )
        return (
            f"torchrun --nnodes=1 --nproc_per_node={gpus_per_node} --master_addr=127.0.0.1 --master_port={port} {tail}"
        )

    def multi_node_doc(self, gpus_per_node: int, port: int) -> str:
        """The docstring paragraph on running across nodes (none for one process)."""
        tail = " ".join(("train.py",) + self.script_args)
        if self.name == LauncherKind.PYTHON:
            return "One process on one GPU (or the CPU): no launcher, no process group."
        if self.name == LauncherKind.DEEPSPEED:
            return (
                f"Several nodes (a hostfile lists each node as 'HOST slots={gpus_per_node}'):\n"
                f"    deepspeed --hostfile hostfile --num_nodes NNODES --num_gpus {gpus_per_node} --master_addr HOST0 "
                f"--master_port {port} {tail}\n"
                "On a machine without GPUs, export DS_ACCELERATOR=cpu first (gloo backend)."
            )
        return (
            f"Several nodes (run on every node, NODE_RANK = 0 .. NNODES-1):\n"
            f"    torchrun --nnodes=NNODES --node_rank=$NODE_RANK --nproc_per_node={gpus_per_node} --master_addr=HOST0 "
            f"--master_port={port} {tail}\n"
            "    (or a rendezvous endpoint: --rdzv_backend=c10d --rdzv_endpoint=HOST0:29400 --rdzv_id=JOB)"
        )

    def first_use_note(self, device: Device, env: dict[str, str]) -> str | None:
        """A line to show before the first launch here that will spend minutes building something silently, or
        None. DeepSpeed on the CPU: its shared-memory communication op (``ShareMemCommBuilder``, NAME
        ``deepspeed_shm_comm``, loaded by ``deepspeed.comm.torch.build_shm_op`` in ``init_distributed``) is
        JIT-compiled with ``torch.utils.cpp_extension.load`` unless it is already in torch's extension cache or was
        built into the package (``DS_BUILD_OPS=1``); the compile took 2.5 minutes on this project's 2-core
        machines, printing nothing until it is done."""
        if self.name != LauncherKind.DEEPSPEED or device != Device.CPU:
            return None
        cache = deepspeed_shm_op_dir(env)
        if glob.glob(os.path.join(cache, "deepspeed_shm_comm*.so")) or _prebuilt_shm_op():
            return None
        return (
            f"DeepSpeed builds its CPU communication op on first use: a C++ compile of a few minutes (2.5 on 2 "
            f"cores), once, silent until it is done; cached in {cache}"
        )

    def verify_argv(self, world: int, port: int, script_args: list[str], probe: list[str] | None = None) -> list[str]:
        """The command that runs ``train.py`` here, with this interpreter's launcher. ``probe``: run it through the
        measurement probe (``PROBE``, with these options, e.g. ``["--measured-steps", "6"]``), which writes
        --out/report.json; None: the script alone, as a user runs it."""
        args = ["train.py", *script_args]
        if probe is not None:
            args = [str(PROBE), *probe, *args]
        if self.name == LauncherKind.PYTHON:
            return [sys.executable, *args, *self.script_args]
        if self.name == LauncherKind.DEEPSPEED:
            exe = Path(sys.executable).parent / "deepspeed"
            prog = [str(exe)] if exe.exists() else [sys.executable, "-m", "deepspeed.launcher.runner"]
            return prog + ["--num_gpus", str(world), "--master_port", str(port), *args, *self.script_args]
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc_per_node={world}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            *args,
            *self.script_args,
        ]


def deepspeed_shm_op_dir(env: dict[str, str]) -> str:
    """Where ``torch.utils.cpp_extension.load`` builds and caches DeepSpeed's CPU communication op for processes
    with environment ``env``: $TORCH_EXTENSIONS_DIR/deepspeed_shm_comm, else torch's default root (the user cache
    directory's torch_extensions) in a py<version>_<cuda or cpu> folder (``_get_build_directory``, torch 2.14)."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    root = env.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        accelerator = (
            f"rocm{torch.version.hip.replace('.', '')}"
            if torch.version.hip is not None
            else f"cu{torch.version.cuda.replace('.', '')}"
            if torch.version.cuda is not None
            else "cpu"
        )
        version = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(get_default_build_root(), f"{version}_{accelerator}")
    return os.path.join(root, "deepspeed_shm_comm")


def _prebuilt_shm_op() -> bool:
    """Whether the installed DeepSpeed carries the op compiled (``deepspeed.ops.comm.deepspeed_shm_comm_op``, what
    ``OpBuilder.load`` imports instead of compiling), found without importing DeepSpeed (seconds)."""
    spec = importlib.util.find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        glob.glob(os.path.join(path, "ops", "comm", "deepspeed_shm_comm_op*.so"))
        for path in spec.submodule_search_locations
    )


def check_options_lines(script: str) -> tuple[str, ...]:
    """launch.sh's and slurm.sbatch's lines that check the python on PATH has torch (one line and exit code 2 if
    not), then run ``script`` (``train.py`` as the shell names it) once with
    ``--check-args`` and the given options before the launcher starts one process per GPU, each of which would print
    the same error: a bad option ends the launch there with train.py's one line and exit code 2; train.py exits 3
    after printing --help, and nothing is launched (exit code 0)."""
    return (
        "# The python on PATH must have torch (an environment not activated would fail in every process at once).",
        "python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)' || "
        '{ echo "error: $(command -v python || echo python) cannot import torch: activate the environment advisor '
        'was installed in (e.g. source .venv/bin/activate)" >&2; exit 2; }',
        "# train.py checks the options once, before one process per GPU starts (each would print the same error):",
        "# a bad one ends this here with one line and exit code 2; after --help (exit code 3) nothing is launched.",
        f'python {script} --check-args "$@" || {{ status=$?; [ "$status" -eq 3 ] && exit 0; exit "$status"; }}',
    )


# The measurement wrapper --verify, bench and the tests launch in place of train.py (its docstring says what it
# records); it runs the script unchanged.
PROBE = Path(__file__).parent / "probe" / "_advisor_probe.py"
TORCHRUN = Launcher(LauncherKind.TORCHRUN)
PYTHON = Launcher(LauncherKind.PYTHON)  # one process: ``python train.py``
DEEPSPEED = Launcher(
    LauncherKind.DEEPSPEED,
    script_args=("--deepspeed_config", "ds_config.json"),
    cpu_env=(("DS_ACCELERATOR", "cpu"),),
    cpu_note="the first run compiles DeepSpeed's CPU communication op (C++, a few minutes, once; "
    "cached in torch's extension directory): nothing is printed until it is done",
)
