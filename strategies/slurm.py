"""``slurm.sbatch``: the SLURM batch file for a ``Job`` (submit with ``sbatch slurm.sbatch [train.py options]``).

Every distributed strategy, DeepSpeed's included, is started the same way under SLURM: ``srun`` runs one
``torchrun`` per node and the torchruns meet through a c10d rendezvous on the first node. (DeepSpeed's
``train.py`` reads torchrun's RANK/LOCAL_RANK/WORLD_SIZE, and the deepspeed launcher's own ssh/pdsh fan-out
is what SLURM already does.) A one-process job (the ``python`` launcher) asks for one node and one GPU.

Only validated ints, a sanitised job name and the emit folder's path (shell-quoted) are written into the file,
so nothing a user typed becomes shell.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import TYPE_CHECKING

from advisor.choices import LauncherKind
from advisor.errors import AdvisorError

from .launchers import check_options_lines

if TYPE_CHECKING:
    from .base import ScriptJob

SLURM_FILE = "slurm.sbatch"
DEFAULT_TIME_LIMIT_S = 24 * 3600.0
MIN_TIME_LIMIT_S = 10 * 60
SIGNAL_LEAD_S = 120  # SIGTERM this long before the kill: time for train.py to write a checkpoint


def _job_name(name: str) -> str:
    """``name`` reduced to ``[A-Za-z0-9_.-]`` (at most 64 characters); ``advisor`` when nothing is left."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:64].strip("_") or "advisor"


def _positive_int(value: object, what: str, upper: int | None = None) -> int:
    """``value`` when it is an int (not a bool) in 1..``upper``.

    Raises:
        AdvisorError: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (upper is not None and value > upper):
        raise AdvisorError(
            f"slurm.sbatch: {what} must be a whole number from 1{f' to {upper}' if upper else ''}, not {value!r}"
        )
    return value


def slurm_time(time_limit_s: float | None) -> str:
    """``--time`` as ``HH:MM:SS`` (hours may pass 24): ``time_limit_s`` seconds rounded up to whole minutes, at
    least 10 minutes; None means 24 hours.

    Raises:
        AdvisorError: a limit that is not a finite number above zero.
    """
    if time_limit_s is None:
        time_limit_s = DEFAULT_TIME_LIMIT_S
    if (
        isinstance(time_limit_s, bool)
        or not isinstance(time_limit_s, (int, float))
        or not (math.isfinite(time_limit_s) and time_limit_s > 0)
    ):
        raise AdvisorError(f"slurm.sbatch: time limit must be a number of seconds above 0, not {time_limit_s!r}")
    minutes = max(MIN_TIME_LIMIT_S // 60, math.ceil(time_limit_s / 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def render_slurm(job: ScriptJob, time_limit_s: float | None = None, folder: str | None = None) -> str:
    """The text of ``slurm.sbatch`` for ``job``: a bash batch script that checks the options given to ``sbatch``
    once (``train.py --check-args``, ``launchers.check_options_lines``), then has ``srun`` start one ``torchrun`` per
    node (c10d rendezvous on the first node, port ``job.master_port``) running ``train.py`` with the launcher's
    script arguments (DeepSpeed: ``--deepspeed_config ds_config.json``) and those options; for the ``python``
    launcher, ``python train.py`` on one node with one GPU (no check: one process prints an error once). The job
    works in the directory it was submitted from (relative paths in the options are read from there).

    ``job``: a ``strategies.render.Job`` (typed by the ``ScriptJob`` protocol: render imports this module, not the
    other way).
    ``time_limit_s``: the job's wall-clock limit in seconds (``--time``), rounded up to whole minutes, at least
    10 minutes; None means 24 hours.
    ``folder``: the absolute path of the folder the files are written to, where the job finds ``train.py`` and
    ``ds_config.json`` (under sbatch ``$0`` is a copy in a spool directory, so the file cannot find its own folder);
    None (a file for download): they are looked for in the directory the job is submitted from.

    Raises:
        AdvisorError: never for a job from ``job_from_plan``; only for sizes that are not positive ints, a port
        outside 1..65535, a time limit that is not a finite number above 0, or a relative or multi-line ``folder``.
    """
    launcher = job.strategy_unit.launcher
    one_process = launcher.name == LauncherKind.PYTHON
    gpus = 1 if one_process else _positive_int(job.gpus_per_node, "gpus_per_node")
    nodes = 1 if one_process else _positive_int(job.num_nodes, "num_nodes")
    port = _positive_int(job.master_port, "master_port", 65535)
    if folder is not None and (not folder.startswith("/") or "\n" in folder or "\r" in folder):
        raise AdvisorError(f"slurm.sbatch: the folder must be an absolute path on one line, not {folder!r}")
    # The folder's files by absolute path, or by name in the directory the job is submitted from.
    own = {name: f'"$HERE/{name}"' if folder else name for name in ("train.py", "ds_config.json")}
    args = " ".join(own.get(a, shlex.quote(a)) for a in ("train.py", *launcher.script_args))
    where = (
        [
            "# sbatch runs a copy of this file from a spool directory: the folder advisor wrote it to is written in.",
            f"HERE={shlex.quote(folder)}",
            "# a copy of the folder (on a cluster): the folder it is submitted from, which holds train.py",
            '[ -f "$HERE/train.py" ] || HERE="${SLURM_SUBMIT_DIR:-$PWD}"',
            'cd "${SLURM_SUBMIT_DIR:-$HERE}"',
        ]
        if folder
        else [
            "# sbatch runs a copy of this file from a spool directory: submit it from the folder that holds train.py.",
            'cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")}"',
        ]
    )
    head = [
        "#!/usr/bin/env bash",
        f"# Generated by advisor ({_job_name(job.strategy)}). Submit: sbatch {SLURM_FILE} [train.py options]",
        f"#SBATCH --job-name={_job_name(job.spec.name)}",
        f"#SBATCH --nodes={nodes}",
        "# One task per node: each task is a launcher that starts that node's GPU processes itself.",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        "# Data-loader workers want CPU cores; uncomment and set to about the node's cores:",
        "##SBATCH --cpus-per-task=32",
        f"#SBATCH --time={slurm_time(time_limit_s)}",
        f"# SIGTERM {SIGNAL_LEAD_S} s before the time limit or a preemption kills the job, so train.py can save.",
        f"#SBATCH --signal=TERM@{SIGNAL_LEAD_S}",
        "#SBATCH --output=slurm-%j.out",
        "set -euo pipefail",
        *where,
    ]
    if one_process:
        body = ["# One process on one GPU: no launcher, no process group.", f'srun python {args} "$@"']
    else:
        body = [
            "# The first node of the allocation hosts the rendezvous (sed, not head: head would close the pipe",
            "# early and pipefail would end the job on scontrol's SIGPIPE).",
            ': "${SLURM_JOB_NODELIST:?submit this file with sbatch}"',
            'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
            f"PORT={port}",
            *check_options_lines(own["train.py"]),
            "# c10d rendezvous: the torchruns find each other at HEAD_NODE:PORT and agree on node ranks, so no",
            "# node needs its rank written here; the job id keeps concurrent jobs apart. --kill-on-bad-exit",
            "# ends every node when one fails instead of leaving the others waiting in a collective.",
            f'srun --kill-on-bad-exit=1 torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node={gpus} \\',
            '    --rdzv_id="$SLURM_JOB_ID" --rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:$PORT" \\',
            f'    {args} "$@"',
        ]
    return "\n".join(head + body) + "\n"
