"""How a generated script is started: torchrun (torch.distributed.run) or the deepspeed launcher.
A strategy names its launcher; nothing outside strategies/ decides it by the strategy's name."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Launcher:
    """``name``: the program users type; ``script_args``: what follows ``train.py``; ``cpu_env``: what a
    machine without a GPU needs exported (DeepSpeed: its CPU accelerator, gloo)."""

    name: str
    script_args: tuple[str, ...] = ()
    cpu_env: tuple[tuple[str, str], ...] = ()

    def command(self, gpus_per_node: int, num_nodes: int, port: int) -> str:
        """The launch line a user runs (one node; for several nodes, the form run on the first)."""
        tail = " ".join(("train.py",) + self.script_args)
        if self.name == "python":
            return f"python {tail}"
        if self.name == "deepspeed":
            if num_nodes > 1:
                return (f"deepspeed --hostfile hostfile --num_nodes {num_nodes} --num_gpus {gpus_per_node} "
                        f"--master_addr HOST0 --master_port {port} {tail}")
            return f"deepspeed --num_gpus {gpus_per_node} --master_port {port} {tail}"
        if num_nodes > 1:
            return (f"torchrun --nnodes={num_nodes} --node_rank=$NODE_RANK --nproc_per_node={gpus_per_node} "
                    f"--master_addr=HOST0 --master_port={port} {tail}")
        return f"torchrun --nnodes=1 --nproc_per_node={gpus_per_node} --master_addr=127.0.0.1 --master_port={port} {tail}"

    def multi_node_doc(self, gpus_per_node: int, port: int) -> str:
        """The docstring paragraph on running across nodes (none for one process)."""
        tail = " ".join(("train.py",) + self.script_args)
        if self.name == "python":
            return "One process on one GPU (or the CPU): no launcher, no process group."
        if self.name == "deepspeed":
            return (f"Several nodes (a hostfile lists each node as 'HOST slots={gpus_per_node}'):\n"
                    f"    deepspeed --hostfile hostfile --num_nodes NNODES --num_gpus {gpus_per_node} --master_addr HOST0 "
                    f"--master_port {port} {tail}\n"
                    "On a machine without GPUs, export DS_ACCELERATOR=cpu first (gloo backend).")
        return (f"Several nodes (run on every node, NODE_RANK = 0 .. NNODES-1):\n"
                f"    torchrun --nnodes=NNODES --node_rank=$NODE_RANK --nproc_per_node={gpus_per_node} --master_addr=HOST0 "
                f"--master_port={port} {tail}\n"
                "    (or a rendezvous endpoint: --rdzv_backend=c10d --rdzv_endpoint=HOST0:29400 --rdzv_id=JOB)")

    def verify_argv(self, world: int, port: int, script_args: list[str], probe: list[str] | None = None) -> list[str]:
        """The command that runs ``train.py`` here, with this interpreter's launcher. ``probe``: run it through the
        measurement probe (``PROBE``, with these options, e.g. ``["--measured-steps", "6"]``), which writes
        --out/report.json; None: the script alone, as a user runs it."""
        args = ["train.py", *script_args]
        if probe is not None:
            args = [str(PROBE), *probe, *args]
        if self.name == "python":
            return [sys.executable, *args, *self.script_args]
        if self.name == "deepspeed":
            exe = Path(sys.executable).parent / "deepspeed"
            prog = [str(exe)] if exe.exists() else [sys.executable, "-m", "deepspeed.launcher.runner"]
            return prog + ["--num_gpus", str(world), "--master_port", str(port), *args, *self.script_args]
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={world}",
                "--master_addr=127.0.0.1", f"--master_port={port}", *args, *self.script_args]


# The measurement wrapper --verify, bench and the tests launch in place of train.py (its docstring says what it
# records); it runs the script unchanged.
PROBE = Path(__file__).parent / "probe" / "_advisor_probe.py"
TORCHRUN = Launcher("torchrun")
PYTHON = Launcher("python")  # one process: ``python train.py``
DEEPSPEED = Launcher("deepspeed", script_args=("--deepspeed_config", "ds_config.json"),
                     cpu_env=(("DS_ACCELERATOR", "cpu"),))
