"""Script generation: a ``Job`` (what to train, how, for which estimate) -> ``train.py``,
``launch.sh`` and, for ZeRO, ``ds_config.json`` (+ ``hostfile`` for several nodes).

A generated ``train.py`` is flat and import-free of this project: a docstring with the launch
lines and the batch arithmetic, a block of constants (every value written with ``repr`` of
validated data, so nothing the user typed becomes code), helpers copied from this package with
``inspect.getsource`` (the CPU peak meter, activation checkpointing), ``templates/common.py`` and
the strategy's own template.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advisor.errors import AdvisorError
from advisor.models import ModelSpec, _hf_model_class, hf_config

TEMPLATES = Path(__file__).parent / "templates"
DEFAULT_STEPS = 100
MASTER_PORT = 29500
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,127}$")
_SAFE_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Job:
    """Everything a generated script fixes. Sizes are per GPU; ``estimate`` holds bytes."""

    strategy: str
    spec: ModelSpec
    precision: str
    optimizer: str
    micro_batch_size: int
    grad_accum_steps: int
    gpus_per_node: int
    num_nodes: int
    dp_size: int
    tp_degree: int
    lr: float
    activation_checkpointing: bool
    estimate: dict[str, Any]
    zero: dict[str, Any] | None = None
    steps: int = DEFAULT_STEPS
    master_port: int = MASTER_PORT

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp_size * self.grad_accum_steps


def job_from_plan(plan, strategy: str, steps: int = DEFAULT_STEPS, master_port: int = MASTER_PORT) -> Job:
    """The job for ``strategy`` as sized in ``plan``.

    Raises:
        AdvisorError: unknown or not-applicable strategy.
    """
    from strategies import STRATEGY_NAMES, get_strategy

    if strategy not in STRATEGY_NAMES:
        raise AdvisorError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGY_NAMES)}")
    row = plan.row(strategy)
    if not row.applicable:
        raise AdvisorError(f"{strategy} does not apply here: {row.reason}")
    strat = get_strategy(strategy)
    ctx = plan.context()
    opts, hw = plan.options, plan.hardware
    # Linear scaling rule (Goyal et al. 2017): lr x global batch / base batch, when given.
    lr = row.learning_rate if row.learning_rate is not None else (opts.base_lr or default_lr(plan.spec))
    mem = row.memory
    estimate = {"peak_allocated_bytes": mem.peak.total, "device_total_bytes": mem.device_total,
                "breakdown_bytes": mem.peak.as_dict(), "peak_phase": mem.peak.phase, "device": plan.device,
                "gpu": hw.gpu_name, "attention": plan.attention}
    return Job(strategy=strategy, spec=plan.spec, precision=opts.precision, optimizer=opts.optimizer,
               micro_batch_size=opts.micro_batch_size, grad_accum_steps=row.grad_accum_steps,
               gpus_per_node=hw.gpus_per_node, num_nodes=hw.num_nodes, dp_size=row.dp_size,
               tp_degree=row.tp_degree, lr=lr, activation_checkpointing=opts.activation_checkpointing,
               estimate=estimate, zero=strat.ds_config(ctx, row) if hasattr(strat, "ds_config") else None,
               steps=steps, master_port=master_port)


def default_lr(spec: ModelSpec) -> float:
    """A conventional starting LR when none is given: 3e-4 (AdamW, transformers) / 0.1-equivalent
    for vision is optimizer-specific; we keep 3e-4 for Adam-family and 0.1 for SGD at batch 256."""
    return 3e-4


def _check_literal(value: Any, where: str) -> None:
    """Only JSON-like data may be written into a script, and no non-finite floats."""
    if isinstance(value, float) and not math.isfinite(value):
        raise AdvisorError(f"{where}: non-finite number {value!r} cannot go into a script: fix the config")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise AdvisorError(f"{where}: config keys must be strings")
            _check_literal(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_literal(v, where)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise AdvisorError(f"{where}: {type(value).__name__} values cannot go into a script")


def _constants(job: Job) -> dict[str, Any]:
    spec = job.spec
    if spec.family == "vision" and not _SAFE_NAME.fullmatch(spec.model_type or ""):
        raise AdvisorError(f"model name {spec.model_type!r} cannot go into a script")
    if spec.factory and not _SAFE_FACTORY.fullmatch(spec.factory):
        raise AdvisorError(f"--model-factory {spec.factory!r} cannot go into a script")
    hf_class, attn = None, "sdpa"
    if spec.is_transformer:
        config = hf_config(spec)
        cls = _hf_model_class(config)
        hf_class = cls.__name__
        attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    config_dict = dict(spec.config or {})
    _check_literal(config_dict, "config")
    warmup = max(1, job.steps // 10)
    consts: dict[str, Any] = {
        "STRATEGY": job.strategy,
        "MODEL_NAME": spec.model_type if spec.family == "vision" else spec.name,
        "MODEL_FAMILY": spec.family,
        "MODEL_FACTORY": spec.factory,
        "HF_CONFIG": config_dict,
        "HF_MODEL_CLASS": hf_class,
        "ATTN_IMPLEMENTATION": attn,
        "SEQ_LEN": spec.seq_len,
        "VOCAB_SIZE": int(config_dict.get("vocab_size") or 0),
        "INPUT_SHAPE": tuple(spec.input_shape) if spec.input_shape else None,
        "PRECISION": job.precision,
        "OPTIMIZER": job.optimizer,
        "MICRO_BATCH_SIZE": job.micro_batch_size,
        "GRAD_ACCUM_STEPS": job.grad_accum_steps,
        "GLOBAL_BATCH_SIZE": job.global_batch_size,
        "LR": job.lr,
        "WEIGHT_DECAY": 0.01,
        "WARMUP_STEPS": warmup,
        "TOTAL_STEPS": job.steps,
        "SEED": 1234,
        "DATA_SEED": 4321,
        # A small fixed synthetic set, revisited every epoch (4 optimizer steps per epoch).
        "NUM_SAMPLES": job.global_batch_size * 4,
        "ACTIVATION_CHECKPOINTING": job.activation_checkpointing,
        "SYNC_BN_MAX_MICRO_BATCH": 32,
        "TP_DEGREE": job.tp_degree,
        "OFFLOAD": bool(job.zero and job.strategy.endswith("_offload")),
        "DS_CONFIG_FILE": "ds_config.json",
        "ESTIMATE": job.estimate,
    }
    for k, v in consts.items():
        _check_literal(v, k)
    return consts


def _doc_text(text: str) -> str:
    """Free text for the docstring: printable ASCII without quotes or backslashes, at most 120
    characters (names and paths come from the user and must not end the docstring or escape)."""
    return re.sub(r"[^A-Za-z0-9 _.,:/+()=-]", "_", str(text))[:120]


def _docstring(job: Job, launch: str) -> str:
    spec = job.spec
    what = f"seq-len {spec.seq_len}" if spec.is_transformer else f"input {tuple(spec.input_shape)}"
    est = job.estimate
    name, source = _doc_text(spec.name), _doc_text(spec.source)
    return f'''"""Train {name} with {job.strategy} ({job.precision}, {job.optimizer}), generated by advisor.

Launch (this node has {job.gpus_per_node} GPU(s)):
    {launch}
{_multi_node_doc(job)}
Batch arithmetic:
    global batch = micro-batch {job.micro_batch_size} per GPU x data-parallel size {job.dp_size}
                   x gradient accumulation steps {job.grad_accum_steps} = {job.global_batch_size}
    (tensor-parallel degree {job.tp_degree}; world size {job.world_size})
Learning rate: {job.lr:g} after a linear warmup (linear scaling rule), then cosine decay.
Model: {name} ({source}), {what}; synthetic data unless --data is given.
Estimate this script was generated for: peak allocated {est["peak_allocated_bytes"] / 2**30:.3f} GiB per rank
({est["device"]}), device total {est["device_total_bytes"] / 2**30:.3f} GiB.
A JSON report with the measured per-rank peak is written to --out/--report at the end.
"""'''


def _multi_node_doc(job: Job) -> str:
    n = job.gpus_per_node
    if job.strategy.startswith("zero"):
        return (f"Several nodes (a hostfile lists each node as 'HOST slots={n}'):\n"
                f"    deepspeed --hostfile hostfile --num_nodes NNODES --num_gpus {n} --master_addr HOST0 "
                f"--master_port {job.master_port} train.py --deepspeed_config ds_config.json\n"
                "On a machine without GPUs, export DS_ACCELERATOR=cpu first (gloo backend).")
    return (f"Several nodes (run on every node, NODE_RANK = 0 .. NNODES-1):\n"
            f"    torchrun --nnodes=NNODES --node_rank=$NODE_RANK --nproc_per_node={n} --master_addr=HOST0 "
            f"--master_port={job.master_port} train.py\n"
            "    (or a rendezvous endpoint: --rdzv_backend=c10d --rdzv_endpoint=HOST0:29400 --rdzv_id=JOB)")


def launch_command_for(job: Job) -> str:
    """The single-node launch line for ``job`` (multi-node forms are in the script's docstring)."""
    n = job.gpus_per_node
    if job.strategy.startswith("zero"):
        base = f"deepspeed --num_gpus {n} --master_port {job.master_port} train.py --deepspeed_config ds_config.json"
        if job.num_nodes > 1:
            base = (f"deepspeed --hostfile hostfile --num_nodes {job.num_nodes} --num_gpus {n} --master_addr HOST0 "
                    f"--master_port {job.master_port} train.py --deepspeed_config ds_config.json")
        return base
    if job.num_nodes > 1:
        return (f"torchrun --nnodes={job.num_nodes} --node_rank=$NODE_RANK --nproc_per_node={n} "
                f"--master_addr=HOST0 --master_port={job.master_port} train.py")
    return f"torchrun --nnodes=1 --nproc_per_node={n} --master_addr=127.0.0.1 --master_port={job.master_port} train.py"


def _helpers_source() -> str:
    from advisor.checkpointing import enable_activation_checkpointing, repeated_blocks
    from advisor.measure import CpuPeakMeter

    parts = [inspect.getsource(f) for f in (repeated_blocks, enable_activation_checkpointing, CpuPeakMeter)]
    return "\n\n".join(parts)


def render_train_py(job: Job) -> str:
    consts = _constants(job)
    launch = launch_command_for(job)
    template = "zero.py" if job.strategy.startswith("zero") else "tp.py" if job.strategy.startswith("tp") else "ddp.py"
    lines = [_docstring(job, launch), "",
             "import argparse", "import contextlib", "import gc", "import json", "import math", "import os", "import time", "",
             "import torch", "import torch.distributed as dist",
             "from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook",
             "from torch.nn.parallel import DistributedDataParallel as DDP", "",
             "# --- constants written by advisor (edit freely) ---"]
    lines += [f"{k} = {v!r}" for k, v in consts.items()]
    lines += ["NUM_WORKERS = (min(8, (os.cpu_count() or 1) // max(1, int(os.environ.get('LOCAL_WORLD_SIZE', '1'))))",
              "               if torch.cuda.is_available() else 0)  # pitfall 13: about CPU cores / GPUs",
              "", "", "# --- helpers copied from advisor (activation checkpointing, CPU peak memory) ---",
              _helpers_source(), "", (TEMPLATES / "common.py").read_text(), (TEMPLATES / template).read_text()]
    return "\n".join(lines)


def render_ds_config(job: Job) -> str:
    return json.dumps(job.zero, indent=2) + "\n"


def render_launch_sh(job: Job) -> str:
    cmd = launch_command_for(job)
    ds = job.strategy.startswith("zero")
    cpu_fallback = ('if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then\n'
                    '  echo "no CUDA GPU: running on CPU with the gloo backend"\n'
                    + ("  export DS_ACCELERATOR=cpu\n" if ds else "") + "fi\n")
    return ("#!/usr/bin/env bash\n# Generated by advisor. Usage: bash launch.sh [train.py options, e.g. --steps 20]\n"
            "set -euo pipefail\ncd \"$(dirname \"$0\")\"\n" + cpu_fallback + f'{cmd} "$@"\n')


def render_job(job: Job) -> dict[str, str]:
    """File name -> text for ``job``."""
    files = {"train.py": render_train_py(job), "launch.sh": render_launch_sh(job)}
    if job.zero is not None:
        files["ds_config.json"] = render_ds_config(job)
        if job.num_nodes > 1:
            files["hostfile"] = "".join(f"node-{i} slots={job.gpus_per_node}\n" for i in range(job.num_nodes))
    return files


def render_files(plan, strategy: str, steps: int = DEFAULT_STEPS) -> dict[str, str]:
    """Render the files for ``strategy`` in ``plan`` (see ``render_job``).

    Raises:
        AdvisorError: the strategy does not apply, or a value cannot be written safely.
    """
    return render_job(job_from_plan(plan, strategy, steps))


def launch_command(plan, strategy: str) -> str | None:
    """The launch line for ``strategy`` in ``plan`` (None when it does not apply)."""
    try:
        return launch_command_for(job_from_plan(plan, strategy))
    except AdvisorError:
        return None


OWN_FILES = ("train.py", "launch.sh", "ds_config.json", "hostfile")


def check_emit_dir(out_dir: str | Path, force: bool, names: list[str] | tuple[str, ...] = OWN_FILES) -> Path:
    """Refuse, before any work, a path that is not a directory, or a non-empty directory without ``force``.

    Raises:
        AdvisorError: as said, naming the files --force would overwrite.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise AdvisorError(f"--emit {out_dir}: exists and is not a directory: choose another path")
    if out.exists() and any(out.iterdir()) and not force:
        raise AdvisorError(f"--emit {out_dir}: directory is not empty; choose an empty one or pass --force "
                           f"(which overwrites only {', '.join(names)})")
    return out


def write_files(files: dict[str, str], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out_dir`` (created if missing). Refuses a non-empty directory unless
    ``force``; even then only our own file names are written, nothing else is touched or deleted.

    Raises:
        AdvisorError: non-empty directory without force, a path that is not a directory, or an OS error.
    """
    out = check_emit_dir(out_dir, force, sorted(files))
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            if "/" in name or name.startswith("."):
                raise AdvisorError(f"refusing to write {name!r} outside {out_dir}")
            path = out / name
            path.write_text(text)
            if name.endswith(".sh"):
                path.chmod(0o755)
            written.append(path)
    except OSError as err:
        raise AdvisorError(f"--emit {out_dir}: cannot write ({err.strerror}): choose a writable directory")
    return written
