"""Script generation: a ``Job`` (what to train, how, for which estimate) -> ``train.py``,
``launch.sh`` and, for ZeRO, ``ds_config.json`` (+ ``hostfile`` for several nodes).

A generated ``train.py`` is flat and import-free of this project: a docstring with the launch
lines and the batch arithmetic, a block of constants (every value written with ``repr`` of
validated data, so nothing the user typed becomes code), then ``main()`` and the functions it calls, copied whole
(``strategies.pick``) from the template modules: advisor's activation-checkpointing helpers (``inspect.getsource``),
``templates/common.py``, the process group's helpers, LoRA's ``templates/adapters.py``, the model family's fragment,
the checkpoint part and the strategy's own. Every strategy is built on the shared loop, ``templates/loop.py``'s
``main()``, with its functions from ``templates/torch_steps.py`` and its own module (``Strategy.script_loop``); each
function or value the job needs in one of several variants is picked by name (``variants``): the optimizer, the data
(text or not), LoRA's base and export, precision, activation checkpointing, the launcher's options and the
strategy's own (``Strategy.script_variants``). Nothing of the measurement is in a script: ``--verify``, bench and the
tests run it through ``strategies/probe/_advisor_probe.py``.
"""

from __future__ import annotations

import inspect
import math
import os
import pprint
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import advisor
from advisor.choices import (
    Device,
    FsdpGradSync,
    LauncherKind,
    Optimizer,
    Precision,
    SelectiveCheckpointing,
    plain,
)
from advisor.errors import AdvisorError
from advisor.free_text import init_from as checked_init_from
from advisor.models import ModelSpec, family_of
from advisor.models.families.transformer import chunked_loss_blocker

from . import get_strategy, runnable_names, strategy_names
from .emit_manifest import MANIFEST, edited_files, kept_copy, manifest_text, stale_files
from .launchers import check_options_lines
from .pick import pick
from .slurm import SLURM_FILE, render_slurm

if TYPE_CHECKING:
    from advisor.training_options import TrainingOptions

    from .base import Strategy
    from .seams import RenderedPlan

TEMPLATES = Path(__file__).parent / "templates"
# advisor.selective_ac's source, read as text (importing it would import torch): the op policy's pieces are copied
SELECTIVE_AC = Path(advisor.__file__).parent / "selective_ac.py"
# advisor.chunked_ce's source, read as text likewise: chunked cross-entropy's ChunkedCrossEntropy is copied from it
CHUNKED_CE = Path(advisor.__file__).parent / "chunked_ce.py"
# The standard-library modules a script may use; each is imported where its text uses it.
_STDLIB = (
    "argparse",
    "contextlib",
    "datetime",
    "gc",
    "itertools",
    "json",
    "logging",
    "math",
    "os",
    "re",
    "shutil",
    "signal",
    "time",
)
# bitsandbytes (imported by peft, and for its optimizers) tries an optional Hub kernel on CPUs with AVX-512 bf16
# and logs a warning on every rank when it cannot load it (bitsandbytes/backends/cpu/ops.py); it then uses its
# own kernel, so the line is noise to users. The scripts and advisor's faces quiet that one logger.
# With the `kernels` package installed (transformers 5.25 requires it), the attempt also logs "Skipping publisher
# trust check" from kernels/_internals/hf_hub.py when the Hub is offline (HF_HUB_OFFLINE=1, as --verify runs): the
# same attempt, the same noise, quieted the same way.
BNB_QUIET = (
    "# bitsandbytes warns on each rank that an optional kernel from the Hub is missing; its built-in one runs.\n"
    'logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)\n'
    'logging.getLogger("kernels._internals.hf_hub").setLevel(logging.ERROR)'
)
# make_optimizer's variant for each optimizer (only the one the job uses is written).
_OPTIMIZER_VARIANTS = {
    "adam": "adam",
    "adamw": "adam",
    "sgd": "sgd",
    "sgd-momentum": "sgd",
    "adamw-8bit": "bnb",
    "paged-adamw-8bit": "bnb",
    "paged-adamw": "bnb",
    "lion": "bnb",
    "adafactor": "adafactor",
}
# The optimizer variants the scripts can step per parameter in backward (common.py's make_optimizer__*_in_backward)
_IN_BACKWARD = ("adam", "bnb")
DEFAULT_STEPS = 100
MASTER_PORT = 29500


class Estimate(TypedDict):
    """``Job.estimate``: what the plan estimated for the job's row, per GPU (bytes; the step in seconds)."""

    peak_allocated_bytes: int
    device_total_bytes: int
    breakdown_bytes: dict[str, int]  # ``Breakdown.as_dict``
    peak_phase: str
    device: str
    gpu: str
    attention: str
    step_s: float | None
    mfu: float | None


@dataclass(frozen=True)
class Job:
    """Everything a generated script fixes. Sizes are per GPU; ``estimate`` holds bytes."""

    strategy: str
    spec: ModelSpec
    precision: Precision
    optimizer: Optimizer
    micro_batch_size: int
    grad_accum_steps: int
    gpus_per_node: int
    num_nodes: int
    dp_size: int
    tp_degree: int
    lr: float
    activation_checkpointing: bool
    estimate: Estimate
    ds_config: dict[str, object] | None = None
    steps: int = DEFAULT_STEPS
    master_port: int = MASTER_PORT
    # FSDP2 with accumulation: reduce-scatter every micro-step or the last
    fsdp_grad_sync: FsdpGradSync = FsdpGradSync.EVERY_MICRO_STEP
    lr_source: str = "given"  # where ``lr`` comes from (the docstring says it)
    time_limit_s: float | None = None  # slurm.sbatch's --time (None: 24 h)
    init_from: str | None = None  # --init-from's default in the script: the pretrained weights the plan was made for
    # MFU in the step log: the model FLOPs of one sample's forward + backward over all GPUs (recompute excluded,
    # PaLM appendix B) and the planned GPU's dense peak FLOP/s at this precision (None: not timed, no MFU)
    model_flops_per_sample: int | None = None
    peak_flops_per_gpu: float | None = None
    # The absolute path of the folder the files are written to: slurm.sbatch finds train.py there wherever it is
    # submitted from (None: in the directory it is submitted from, e.g. a downloaded file)
    folder: str | None = None
    pp_schedule: str | None = None  # the pipeline row's --pp-schedule and --pp-virtual-stages (None: its defaults)
    pp_virtual_stages: int | None = None
    # --selective-checkpointing (op: per op inside each block; layer: every checkpoint_every-th block whole)
    selective_checkpointing: SelectiveCheckpointing | None = None
    checkpoint_every: int = 2
    ce_chunks: int | None = None  # --chunked-cross-entropy: the logits' slices (None: the model's own loss)
    optimizer_in_backward: bool = False  # --optimizer-in-backward: each parameter steps in its gradient's hook

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.num_nodes

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.dp_size * self.grad_accum_steps

    @property
    def strategy_unit(self) -> Strategy:
        """The registered ``Strategy`` this job runs."""
        return get_strategy(self.strategy)


def job_from_plan(plan: RenderedPlan, strategy: str, steps: int = DEFAULT_STEPS, master_port: int = MASTER_PORT) -> Job:
    """The job for ``strategy`` as sized in ``plan``.

    Raises:
        AdvisorError: unknown or not-applicable strategy.
    """
    if strategy not in runnable_names():
        raise AdvisorError(f"unknown strategy {strategy!r}: choose one of {', '.join(strategy_names())}")
    row = plan.row(strategy)
    if not row.applicable:
        raise AdvisorError(f"{strategy} does not apply here: {row.reason}")
    strat = get_strategy(strategy)
    ctx = plan.context()
    opts, hw = plan.options, plan.hardware
    _script_refusal(strat, opts, plan.spec)
    mem, t, precision = row.memory, row.time, opts.precision
    grad_accum, global_batch = row.grad_accum_steps, row.global_batch_size
    assert mem is not None and precision is not None and grad_accum is not None and global_batch is not None, (
        "the plan sizes every row that applies, at the options it resolved"
    )
    # Linear scaling rule (Goyal et al. 2017): lr x global batch / base batch, when given; else the family's default.
    if row.learning_rate is not None:
        lr, lr_source = (
            row.learning_rate,
            (f"--base-lr {opts.base_lr:g} at batch {opts.base_batch_size}, linearly scaled (Goyal et al. 2017)"),
        )
    else:
        lr, lr_source = family_of(plan.spec).default_lr(plan.spec, opts.optimizer, global_batch)
    # StepTime.model_flops is one GPU's per optimizer step; every GPU runs the same, so the cluster's per sample is
    # that x the GPUs the row uses / the global batch.
    flops = (
        t.model_flops * row.dp_size * row.tp_degree // global_batch
        if t is not None and t.model_flops and global_batch
        else None
    )
    estimate: Estimate = {
        "peak_allocated_bytes": mem.peak.total,
        "device_total_bytes": mem.device_total,
        "breakdown_bytes": mem.peak.as_dict(),
        "peak_phase": mem.peak.phase,
        "device": plan.device,
        "gpu": hw.gpu_name,
        "attention": plan.attention,
        "step_s": t.step_s if t is not None else None,
        "mfu": t.mfu if t is not None else None,
    }
    return Job(
        strategy=strategy,
        spec=plan.spec,
        precision=precision,
        optimizer=opts.optimizer,
        micro_batch_size=ctx.micro_batch_size,
        grad_accum_steps=grad_accum,
        gpus_per_node=hw.gpus_per_node,
        num_nodes=hw.num_nodes,
        dp_size=row.dp_size,
        tp_degree=row.tp_degree,
        lr=lr,
        activation_checkpointing=opts.activation_checkpointing,
        estimate=estimate,
        ds_config=strat.ds_config(ctx, row),
        steps=steps,
        master_port=master_port,
        fsdp_grad_sync=opts.fsdp_grad_sync,
        lr_source=lr_source,
        init_from=_script_path(opts.init_from),
        model_flops_per_sample=flops,
        peak_flops_per_gpu=t.peak_flops_per_s if t is not None else None,
        pp_schedule=opts.pp_schedule,
        pp_virtual_stages=opts.pp_virtual_stages,
        selective_checkpointing=opts.selective_checkpointing,
        checkpoint_every=opts.layer_every,  # as the plan sizes it (advisor.ladder_state.user_state)
        ce_chunks=opts.chunked_cross_entropy,
        optimizer_in_backward=opts.optimizer_in_backward,
    )


def _script_refusal(strategy: Strategy, opts: TrainingOptions, spec: ModelSpec) -> None:
    """Refuse a memory option the script for ``strategy`` would not apply (the plan sizes it all the same).

    Raises:
        AdvisorError: the strategy's script (``Strategy.unscripted_options``), the model (chunked cross-entropy:
            ``chunked_loss_blocker``), the precision or the optimizer (the optimizer step in backward) cannot take
            an option passed; one line, with what to do.
    """
    passed = {
        "--selective-checkpointing": opts.selective_checkpointing is not None,
        "--chunked-cross-entropy": opts.chunked_cross_entropy is not None,
        "--optimizer-in-backward": opts.optimizer_in_backward,
    }
    why = next(
        ((flag, f"the {strategy.name} script {w}") for flag, w in strategy.unscripted_options if passed[flag]), None
    )
    if why is None and passed["--chunked-cross-entropy"] and (model := chunked_loss_blocker(spec)):
        why = ("--chunked-cross-entropy", model)
    if why is None and passed["--optimizer-in-backward"]:
        if opts.precision == Precision.FP16:
            why = (
                "--optimizer-in-backward",
                "fp16's GradScaler unscales every gradient before one step; use bf16, or fp32 on a GPU without bf16 "
                "(V100, T4)",
            )
        elif _OPTIMIZER_VARIANTS[opts.optimizer] not in _IN_BACKWARD:
            why = (
                "--optimizer-in-backward",
                f"the script steps Adam, AdamW or bitsandbytes' optimizers per parameter, not {opts.optimizer}",
            )
    if why is not None:
        raise AdvisorError(
            f"{why[0]}: {why[1]}: drop it to --emit or --verify {strategy.name} (without --emit the plan sizes it)"
        )


def _check_literal(value: object, where: str) -> None:
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


def _constants(job: Job) -> dict[str, object]:
    """The script's constants: the job's, then the model family's (``ModelFamily.script_constants``).

    Raises:
        AdvisorError: a value that cannot be written into a script safely.
    """
    spec, strategy = job.spec, job.strategy_unit
    family = family_of(spec)
    warmup = max(1, job.steps // 10)
    consts: dict[str, object] = {
        "STRATEGY": job.strategy,
        "MODEL": spec.name,
        **family.script_constants(spec),
        "PRECISION": job.precision,
        "OPTIMIZER": job.optimizer,
        "MICRO_BATCH_SIZE": job.micro_batch_size,
        "GRAD_ACCUM_STEPS": job.grad_accum_steps,
        "GLOBAL_BATCH_SIZE": job.global_batch_size,
        "LR": job.lr,
        "WEIGHT_DECAY": 0.01,
        "WARMUP_STEPS": warmup,
        "TOTAL_STEPS": job.steps,
        **({} if job.optimizer_in_backward else {"MAX_GRAD_NORM": 1.0}),  # stepping in backward: nothing to clip
        "EVAL_EVERY": max(1, job.steps // 4),
        "SAVE_EVERY": max(1, job.steps // 2),
        "KEEP_CHECKPOINTS": 1,
        "EVAL_BATCHES": 50,
        "HELD_OUT_FRACTION": 0.05,
        "SEED": 1234,
        "DATA_SEED": 4321,
        # A small fixed synthetic set, revisited every epoch (4 optimizer steps per epoch).
        "NUM_SAMPLES": job.global_batch_size * 4,
        "EVAL_SAMPLES": job.micro_batch_size * job.dp_size * 2,
        "INIT_FROM": job.init_from,  # pretrained weights (advisor's --init-from); None: fresh weights
    }
    if job.strategy_unit.distributes:
        consts["COLLECTIVE_TIMEOUT_MINUTES"] = 30
    if job.selective_checkpointing == SelectiveCheckpointing.LAYER:
        consts["CHECKPOINT_EVERY"] = job.checkpoint_every
    if job.ce_chunks:
        consts["CE_CHUNKS"] = job.ce_chunks
    if job.model_flops_per_sample and job.peak_flops_per_gpu:
        consts["MODEL_FLOPS_PER_SAMPLE"] = job.model_flops_per_sample
        consts["PEAK_FLOPS_PER_GPU"] = float(job.peak_flops_per_gpu)
    consts.update(_adapter_constants(job, consts))
    consts.update(strategy.script_constants(job, family))
    for k, v in consts.items():
        _check_literal(v, k)
    return consts


# One short comment per constant of a script (those without one explain themselves by name).
CONSTANT_NOTES = {
    "STRATEGY": "how the work is split over the GPUs",
    "MODEL": "what advisor planned",
    "HF_CONFIG": "the model's config (a fresh build; --init-from brings its own)",
    "HF_MODEL_CLASS": "the transformers class built",
    "ATTN_IMPLEMENTATION": "the attention kernel",
    "SEQ_LEN": "tokens per sample",
    "VOCAB_SIZE": "token ids are below this",
    "PRECISION": "fp32, bf16, fp16 or pure-bf16",
    "OPTIMIZER": "the optimizer the memory estimate assumed",
    "MICRO_BATCH_SIZE": "samples per GPU per forward pass",
    "GRAD_ACCUM_STEPS": "micro-batches per optimizer step",
    "GLOBAL_BATCH_SIZE": "samples per optimizer step, all GPUs",
    "LR": "peak learning rate (the docstring gives its source)",
    "WEIGHT_DECAY": "AdamW's decoupled weight decay",
    "WARMUP_STEPS": "linear warmup to LR (at most a tenth of --steps)",
    "TOTAL_STEPS": "default --steps; the cosine decay ends at --steps",
    "KEEP_CHECKPOINTS": "newest checkpoints kept",
    "MAX_GRAD_NORM": "gradient clipping: total L2 norm",
    "EVAL_EVERY": "default --eval-every (optimizer steps)",
    "SAVE_EVERY": "default --save-every (optimizer steps)",
    "EVAL_BATCHES": "held-out micro-batches per rank per evaluation",
    "HELD_OUT_FRACTION": "share of --data held out for evaluation",
    "SEED": "initial weights and dropout",
    "DATA_SEED": "data order and synthetic samples",
    "NUM_SAMPLES": "synthetic training samples (without --data)",
    "EVAL_SAMPLES": "synthetic held-out samples (without --data)",
    "INIT_FROM": "default --init-from: pretrained weights (None: freshly initialised)",
    "COLLECTIVE_TIMEOUT_MINUTES": "a rank waiting this long in a collective fails instead of hanging",
    "CHECKPOINT_EVERY": "selective checkpointing: every N-th block is checkpointed whole",
    "CE_CHUNKS": "chunked cross-entropy: the loss takes this many slices of the logits at a time in fp32",
    "MODEL_FLOPS_PER_SAMPLE": "forward + backward FLOPs of one sample (advisor's trace; recompute excluded)",
    "PEAK_FLOPS_PER_GPU": "dense peak FLOP/s of the planned GPU at this precision (for MFU; set your GPU's)",
    "SYNC_BN_MAX_MICRO_BATCH": "SyncBatchNorm at or below this per-GPU batch",
    "TP_DEGREE": "GPUs per tensor-parallel group",
    "DS_CONFIG_FILE": "DeepSpeed's config",
    "RESHARD_AFTER_FORWARD": "free the gathered parameters after each block's forward",
    "REPLICATE_DEGREE": "HSDP: replicas across nodes (1: plain FSDP2)",
    "MODEL_NAME": "the torchvision builder",
    "INPUT_SHAPE": "one sample's shape (channels, height, width)",
    "NUM_CLASSES": "the classifier's outputs",
    "MODEL_FACTORY": "your model's module:function",
    "LORA_RANK": "the adapters' rank r",
    "LORA_ALPHA": "the adapters' scale is alpha / r",
    "LORA_DROPOUT": "dropout on the adapters' input",
    "LORA_TARGETS": "adapted modules (None: peft's default)",
    "LORA_DTYPE": "the adapters' dtype (auto: peft's)",
    "LORA_TASK_TYPE": "peft's task type",
    "QUANTIZE": "the frozen base's bitsandbytes format",
    "DOUBLE_QUANT": "quantize the quantization constants too",
    "BNB_COMPUTE_DTYPE": "dtype the quantized layers compute in",
}


def _constant_line(name: str, value: object) -> str:
    """``NAME = value  # note``; a dict or list too long for a line is written one item per line (pprint). Enum
    members (``advisor.choices``) are written as their values."""
    value = plain(value)
    text = repr(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**6:
        text = f"{value:_}"  # 894_272_274_432: digits grouped
    elif isinstance(value, float) and abs(value) >= 1e6 and float(f"{value:g}") == value:
        text = f"{value:g}"  # 3.12e+14, not 312000000000000.0
    if len(name) + len(text) > 117 and isinstance(value, (dict, list)):  # wider than a line of 120 columns
        text = pprint.pformat(value, width=100, sort_dicts=False)
    note = CONSTANT_NOTES.get(name)
    if note is None:
        return f"{name} = {text}"
    return (
        f"# {note}\n{name} = {text}"
        if "\n" in text or len(name) + len(text) + len(note) > 110
        else f"{name} = {text}  # {note}"
    )


def _adapter_constants(job: Job, consts: Mapping[str, object]) -> dict[str, object]:
    """LoRA's constants (none without ``job.spec.adapter``): peft ``LoraConfig``'s fields, the adapters' dtype and
    peft's task type for the model class; QLoRA adds bitsandbytes' quantization (``BitsAndBytesConfig``)."""
    adapter = job.spec.adapter
    if adapter is None:
        return {}
    targets: str | list[str] | None = None  # peft's default target modules for the architecture
    if adapter.targets == ("all-linear",):
        targets = "all-linear"
    elif adapter.targets:
        targets = list(adapter.targets)
    cls = str(consts.get("HF_MODEL_CLASS") or "")
    task = (
        "CAUSAL_LM"
        if cls.endswith("ForCausalLM")
        else "SEQ_2_SEQ_LM"
        if cls.endswith(("ForConditionalGeneration", "ForSeq2SeqLM"))
        else None
    )
    out: dict[str, object] = {
        "LORA_RANK": adapter.rank,
        "LORA_ALPHA": adapter.alpha,
        "LORA_DROPOUT": adapter.dropout,
        "LORA_TARGETS": targets,
        "LORA_DTYPE": adapter.dtype,
        "LORA_TASK_TYPE": task,
    }
    if adapter.quantize:
        out.update(
            {
                "QUANTIZE": adapter.quantize,
                "DOUBLE_QUANT": adapter.double_quant,
                "BNB_COMPUTE_DTYPE": adapter.compute_dtype,
            }
        )
    return out


def _script_path(init_from: str | None) -> str | None:
    """``--init-from`` as the script's default: a relative path that exists here made absolute (the script reads
    relative paths from where it is launched, and launch.sh may run from anywhere); a hub id, an absolute path or
    one that does not exist here (the cluster's) as given."""
    if init_from is None or os.path.isabs(os.path.expanduser(init_from)) or not os.path.exists(init_from):
        return init_from
    try:  # (a folder whose absolute path has a character --init-from may not hold: as given)
        return checked_init_from(os.path.abspath(init_from))
    except AdvisorError:
        return init_from


def _doc_text(text: str) -> str:
    """Free text for the docstring: printable ASCII without quotes or backslashes, at most 120
    characters (names and paths come from the user and must not end the docstring or escape)."""
    return re.sub(r"[^A-Za-z0-9 _.,:/+()=-]", "_", str(text))[:120]


def _docstring(job: Job, launch: str) -> str:
    spec = job.spec
    if spec.is_transformer:
        what = f"seq-len {spec.seq_len}"
    else:
        assert spec.input_shape is not None, "a vision or custom model has an input shape"
        what = f"input {tuple(spec.input_shape)}"
    est = job.estimate
    name, source = _doc_text(spec.name), _doc_text(spec.source)
    distributes = job.strategy_unit.distributes
    # the planned node's GPU count: the GPUs of the machine the plan was made on, or of the preset it was made for
    gpus = f"{job.gpus_per_node} GPU" + ("s" if job.gpus_per_node != 1 else "")
    where = f"one node of {gpus}, as planned" if distributes else "one process on one GPU"
    if distributes and job.num_nodes > 1:
        reads = (
            "MASTER_ADDR" if job.strategy_unit.launcher.name == LauncherKind.DEEPSPEED else "NODE_RANK and MASTER_ADDR"
        )
        where = f"{job.num_nodes} nodes of {gpus} each, as planned; launch.sh reads {reads}"
    if est.get("device") == Device.CPU:  # --verify's variant of the job (fp32, a small micro-batch), not the job itself
        ranks = f"{job.gpus_per_node} CPU ranks" if distributes else "one process on the CPU"
        where = f"{ranks}: --verify's run of the job on this machine, not the job to keep"
    ranks = (
        f"tensor-parallel degree {job.tp_degree}; world size {job.world_size}"
        if distributes
        else "one process: no process group"
    )
    return f'''"""Train {name} with {job.strategy} ({job.precision}, {job.optimizer}), generated by advisor.

Launch ({where}):
    {launch}
{job.strategy_unit.launcher.multi_node_doc(job.gpus_per_node, job.master_port)}
Under SLURM: sbatch slurm.sbatch [train.py options]. SIGTERM (SLURM's --signal, a preemption) saves a checkpoint
at the next step and exits 0; --resume continues from --out/checkpoints.
Batch arithmetic:
    global batch = micro-batch {job.micro_batch_size} per GPU x data-parallel size {job.dp_size}
                   x gradient accumulation steps {job.grad_accum_steps} = {job.global_batch_size}
    ({ranks})
Learning rate: {job.lr:g} ({_doc_text(job.lr_source)}),
    after a linear warmup, then cosine decay; {_clipping_doc(job)}.{_scratch_lr_doc(job)}\
{_pure_bf16_doc(job)}
Model: {name} ({source}), {what}; pretrained weights with --init-from; synthetic data unless --data is given;
    evaluation on held-out data every --eval-every steps.
{_lora_doc(job)}Estimate this script was generated for: peak allocated {est["peak_allocated_bytes"] / 2**30:.3f} GiB
per rank ({est["device"]}), device total {est["device_total_bytes"] / 2**30:.3f} GiB{_time_doc(job)}.
Every step logs the loss, learning rate, gradient norm, seconds and throughput (and on CUDA the MFU and the peak
allocated memory); the trained weights go to --out at the end.
"""'''


def _clipping_doc(job: Job) -> str:
    """The docstring's word on clipping: none with the optimizer step in backward (each parameter steps in its own
    gradient hook, so no global norm exists: templates/torch_steps.py ``optimizer_step__in_backward``)."""
    if job.optimizer_in_backward:
        return "no gradient clipping\n    (each parameter steps in backward, before the others' gradients exist)"
    return "gradients clipped to a total norm of 1.0"


def fresh_weights_at_a_fine_tuning_rate(job: Job) -> bool:
    """Whether the script starts from fresh weights (no --init-from by default) at a rate chosen for fine-tuning a
    pretrained model: its loss moves little over a few steps."""
    return job.init_from is None and "fine-tuning of a pretrained" in job.lr_source


def fresh_weights_note(job: Job) -> str | None:
    """What a verification of such a script says of its loss (None for another): a new user read the flat loss of
    fresh weights at a fine-tuning rate as a failed run."""
    if not fresh_weights_at_a_fine_tuning_rate(job):
        return None
    return (
        f"the run trains fresh weights at a fine-tuning learning rate ({job.lr:g}): its loss moves little in a few "
        "steps; what it checks is the memory and the step time"
    )


def _scratch_lr_doc(job: Job) -> str:
    """A fine-tuning rate in a script that starts from fresh weights (no --init-from by default): say that training
    from scratch wants a larger one (nanoGPT's GPT-2 124M: 6e-4, its train.py) and where to set it."""
    if not fresh_weights_at_a_fine_tuning_rate(job):
        return ""
    return (
        "\n    That rate is for fine-tuning from --init-from; from fresh weights training wants more (nanoGPT's GPT-2:"
        "\n    6e-4): edit LR below."
    )


def _pure_bf16_doc(job: Job) -> str:
    """The docstring's warning for pure bf16 (no fp32 master weights: small updates round away; advisor.plan)."""
    if job.precision != Precision.PURE_BF16:
        return ""
    return (
        "\nPure bf16: no fp32 master weights, so an update below about 0.2% of a weight rounds away (most AdamW "
        "updates\n    at a fine-tuning learning rate): prefer --precision bf16 (mixed) unless you need this."
    )


def _time_doc(job: Job) -> str:
    """The docstring's estimated step time and MFU (empty where the plan was not timed)."""
    est = job.estimate
    if not est.get("step_s"):
        return ""
    mfu = f", MFU {est['mfu']:.0%}" if est.get("mfu") else ""
    return f";\nstep time {est['step_s']:.3g} s at global batch {job.global_batch_size}{mfu} on {_doc_text(est['gpu'])}"


def _lora_doc(job: Job) -> str:
    """The docstring's fine-tuning paragraph (empty without an adapter)."""
    adapter = job.spec.adapter
    if adapter is None:
        return ""
    targets = _doc_text(adapter.targets_text)
    base = (
        f"a frozen {adapter.quantize}-quantized base (bitsandbytes, computing in {adapter.compute_dtype})"
        if adapter.quantize
        else "a frozen base"
    )
    where = (
        "--init-from DIR loads the base (a save_pretrained directory); without it a freshly initialised\n"
        "base is used (smoke tests only)"
        if job.spec.is_transformer
        else "--init-from FILE loads the base (a state_dict such as model.pt); without it the base is\n"
        "freshly initialised (smoke tests only)"
    )
    return (
        f"Fine-tuning: LoRA rank {adapter.rank} (alpha {adapter.alpha:g}) on {targets} over {base};\n"
        f"only the adapters train and are saved (--out/adapter, peft format).\n{where}.\n"
    )


def launch_command_for(job: Job) -> str:
    """The launch line for ``job`` (its strategy's launcher; multi-node forms are in the docstring)."""
    return job.strategy_unit.launcher.command(job.gpus_per_node, job.num_nodes, job.master_port)


def _helpers_source(job: Job, template: str) -> str:
    """advisor's own activation-checkpointing helpers, copied in (``inspect.getsource``) where the job uses them:
    with activation checkpointing, and where the strategy's ``template`` text calls ``repeated_blocks`` (FSDP2's
    units, one per repeated block)."""
    from advisor.checkpointing import enable_activation_checkpointing, repeated_blocks

    checkpointing = _checkpointing_variant(job) != "off"
    parts: list[Callable[..., object]] = [repeated_blocks] if checkpointing or "repeated_blocks(" in template else []
    if checkpointing:
        parts.append(enable_activation_checkpointing)
    if not parts:
        return ""
    return "# --- helpers copied from advisor ---\n" + "\n\n\n".join(inspect.getsource(f).strip("\n") for f in parts)


def _checkpointing_variant(job: Job) -> str:
    """``checkpoint_activations``'s variant: off, on (full), or selective checkpointing's op or layer policy."""
    if job.selective_checkpointing is not None:
        return str(job.selective_checkpointing)
    return "on" if job.activation_checkpointing else "off"


def _used_names(statement: str, text: str) -> str:
    """``from M import (a, b, ...)`` cut to the names ``text`` uses (one per line when more than one, as isort writes
    them at its default width; empty when none); any other import statement unchanged."""
    m = re.fullmatch(r"from (\S+) import \(?([^)]*)\)?", statement.strip(), re.DOTALL)
    if m is None:
        return statement
    names = [n.strip() for n in m.group(2).replace("\n", ",").split(",") if n.strip()]
    used = [n for n in names if re.search(rf"\b{re.escape(n.split(' as ')[-1])}\b", text)]
    if len(used) <= 1:
        return f"from {m.group(1)} import {used[0]}" if used else ""
    return f"from {m.group(1)} import (\n" + "".join(f"    {n},\n" for n in used) + ")"


def variants(job: Job) -> dict[str, str]:
    """The variant of each function or value the template modules offer in several (``strategies.pick``): the job's
    precision, model (full, LoRA on a 16/32-bit base, QLoRA), activation checkpointing, export, optimizer, data
    (throughput in tokens or samples, --tokenizer), MFU (where the planned GPU's peak is known), options, LoRA's base
    and adapters' dtype, then the strategy's own (``Strategy.script_variants``)."""
    adapter = job.spec.adapter
    pure = job.precision == Precision.PURE_BF16
    model = "qlora" if adapter and adapter.quantize else "lora" if adapter else "pure_bf16" if pure else "full"
    # --export-merged: LoRA on a 16/32-bit base only (no merging into a quantized base)
    export = "lora" if adapter and adapter.quantize else "lora_merged" if adapter else "full"
    text = job.spec.is_transformer
    deepspeed = job.strategy_unit.launcher.name == LauncherKind.DEEPSPEED
    quantized_zero = bool(adapter and adapter.quantize and deepspeed)
    # LoRA's frozen base: the family's own (the transformer's loads --init-from with from_pretrained; ZeRO-3's QLoRA
    # one quantized into the module's dtype), else templates/adapters.py's (a state_dict)
    family_base = "def build_base__pretrained(" in family_of(job.spec).script_fragment()
    return {
        "precision_dtypes": "pure_bf16" if pure else "mixed",
        "prepare_model": model,
        "checkpoint_activations": _checkpointing_variant(job),
        "export": export,
        "make_optimizer": _OPTIMIZER_VARIANTS[job.optimizer] + "_in_backward" * job.optimizer_in_backward,
        "optimizer_step": "in_backward" if job.optimizer_in_backward else "clipped",
        "throughput": "tokens" if text else "samples",
        "mfu": "known" if job.peak_flops_per_gpu and job.model_flops_per_sample else "unknown",
        "DATA_OPTIONS": "text" if text else "files",
        "EXPORT_OPTIONS": "merged" if export == "lora_merged" else "plain",
        "LAUNCHER_OPTIONS": "deepspeed" if deepspeed else "torchrun",
        **(
            {
                "build_base": "quantized" if quantized_zero else "pretrained" if family_base else "state_dict",
                "adapter_dtype": "pure_bf16" if pure else "as_set",
            }
            if adapter
            else {}
        ),
        **({"compute_loss": "chunked" if job.ce_chunks else "plain"} if text else {}),
        **family_of(job.spec).script_variants(job.spec),
        **job.strategy_unit.script_variants(job),
    }


def render_train_py(job: Job) -> str:
    consts = _constants(job)
    launch = launch_command_for(job)
    strategy = job.strategy_unit
    lora = job.spec.adapter is not None
    chosen = variants(job)
    # The shared loop (templates/loop.py) with the strategy's function modules (or a template with a main() of its
    # own, ``Strategy.template``, for a strategy not built on the loop).
    own = ["loop.py", *strategy.script_loop] if strategy.script_loop else [strategy.template]
    template = "\n".join((TEMPLATES / name).read_text() for name in own)
    modules = [
        "common.py",
        # The process group's helpers, or their one-process stand-ins (a one-process script never touches
        # torch.distributed).
        "collectives.py" if strategy.distributes else "local.py",
        *(["adapters.py"] if lora else []),
    ]
    sources = [
        ("advisor.checkpointing", _helpers_source(job, template)),
        # the op policy's save list and policy function (module-level values and functions, copied where used)
        *([("advisor.selective_ac", SELECTIVE_AC.read_text())] if chosen["checkpoint_activations"] == "op" else []),
        # chunked cross-entropy (ChunkedCrossEntropy and IGNORE_INDEX, copied where used)
        *([("advisor.chunked_ce", CHUNKED_CE.read_text())] if job.ce_chunks else []),
        *((name, (TEMPLATES / name).read_text()) for name in modules),
        ("the model family's fragment", family_of(job.spec).script_fragment()),
        *((name, (TEMPLATES / name).read_text()) for name in (*strategy.script_parts, *own)),
    ]
    text = pick([(where, part) for where, part in sources if part.strip()], chosen)
    # The standard-library modules the script uses (no unused import).
    quiet = BNB_QUIET if lora or chosen["make_optimizer"] == "bnb" else ""
    stdlib = sorted(m for m in _STDLIB if re.search(rf"\b{m}\.[A-Za-z_]", text + quiet))
    imports = [_used_names(statement, text) for statement in strategy.script_imports]
    # the op policy's annotations (advisor.selective_ac's, copied): standard library, after its plain imports
    sac = ["from collections.abc import Callable", "from contextlib import AbstractContextManager"]
    stdlib_from = sac if chosen["checkpoint_activations"] == "op" else []
    if job.ce_chunks:  # ChunkedCrossEntropy's annotations (advisor.chunked_ce's, copied)
        stdlib_from = [*stdlib_from, "from typing import Any"]
    lines = [
        _docstring(job, launch),
        "",
        # annotations name the script's own classes, defined after main(), which uses them first
        "from __future__ import annotations",
        "",
        *(f"import {m}" for m in stdlib),
        *stdlib_from,
        "",
        *(["import data  # data.py, beside this file: the --data readers"] if _data_module(job) else []),
        "import torch",
        *(["import torch.distributed as dist"] if strategy.distributes else []),
        *(i for i in imports if i),
        "",
        *([quiet, ""] if quiet else []),
        "# --- constants written by advisor (edit freely) ---",
    ]
    lines += [_constant_line(k, v) for k, v in consts.items()]
    lines += [
        "NUM_WORKERS = (min(8, (os.cpu_count() or 1) // max(1, int(os.environ.get('LOCAL_WORLD_SIZE', '1'))))",
        "               if torch.cuda.is_available() else 0)  # data-loading workers: about CPU cores / GPUs",
        "",
        "",
        text,
        "",
        'if __name__ == "__main__":',
        "    main()",
        "",
    ]
    return "\n".join(lines)


def _data_module(job: Job) -> str | None:
    """``data.py`` for ``job`` (None: its family has no readers of its own)."""
    return family_of(job.spec).data_module()


def render_launch_sh(job: Job) -> str:
    """``launch.sh``: the launch line with this directory's files by absolute path, so relative paths given to it
    (--data, --init-from, --out) stay the caller's; on a machine without CUDA, the CPU fallback's exports."""
    here = {
        " train.py": ' "$HERE/train.py"',
        " ds_config.json": ' "$HERE/ds_config.json"',
        " hostfile": ' "$HERE/hostfile"',
    }
    cmd = launch_command_for(job)
    for name, path in here.items():
        cmd = cmd.replace(name, path)
    exports = "".join(f"  export {k}={v}\n" for k, v in job.strategy_unit.launcher.cpu_env)
    if job.strategy_unit.launcher.cpu_note:
        exports += f'  echo "{job.strategy_unit.launcher.cpu_note}"\n'
    backend = " with the gloo backend" if job.strategy_unit.distributes else ""
    # One process prints a bad option's error once by itself; a launcher's processes would each print it.
    check = (
        "".join(f"{line}\n" for line in check_options_lines('"$HERE/train.py"'))
        if job.strategy_unit.distributes
        else ""
    )
    cpu_fallback = (
        'if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then\n'
        f'  echo "no CUDA GPU: running on the CPU{backend}"\n' + exports + "fi\n"
    )
    nodes = guard = ""
    if job.num_nodes > 1 and job.strategy_unit.launcher.name == LauncherKind.DEEPSPEED:
        nodes = (
            "# Several nodes: run this on the first node only; DeepSpeed starts the others over ssh from hostfile\n"
            "# (one 'HOST slots=N' line per node: replace the placeholders), with MASTER_ADDR exported as this\n"
            "# node's address.\n"
        )
        needed = {"MASTER_ADDR": "this node's address"}
    elif job.num_nodes > 1 and job.strategy_unit.distributes:
        nodes = (
            "# Several nodes: run this on every node with NODE_RANK (0 on the first) and MASTER_ADDR (the first\n"
            "# node's address) exported, or submit slurm.sbatch.\n"
        )
        needed = {
            "NODE_RANK": "0 on the first node, 1 .. NNODES-1 on the others",
            "MASTER_ADDR": "the first node's address",
        }
    if nodes:
        # The launch line's placeholder becomes the exported address; a variable left unset is said in one line, not
        # as bash's "unbound variable" (set -u) or a rendezvous that waits for a host named HOST0.
        cmd = cmd.replace("--master_addr=HOST0", '--master_addr="$MASTER_ADDR"').replace(
            "--master_addr HOST0", '--master_addr "$MASTER_ADDR"'
        )
        guard = "".join(
            f'if [ -z "${{{var}:-}}" ]; then\n'
            f'  echo "error: {job.num_nodes} nodes: export {var} ({what}) before bash launch.sh, or submit '
            f'slurm.sbatch" >&2\n  exit 2\nfi\n'
            for var, what in needed.items()
        )
    return (
        "#!/usr/bin/env bash\n# Generated by advisor. Usage: bash launch.sh [train.py options, e.g. --steps 20]\n"
        "# Relative paths in the options are read from where you run it.\n"
        + nodes
        + 'set -euo pipefail\nHERE="$(cd "$(dirname "$0")" && pwd)"\n'
        + check
        + guard
        + cpu_fallback
        + f'{cmd} "$@"\n'
    )


def render_job(job: Job) -> dict[str, str]:
    """File name -> text for ``job``."""
    files = {
        "train.py": render_train_py(job),
        "launch.sh": render_launch_sh(job),
        SLURM_FILE: render_slurm(job, job.time_limit_s, job.folder),
    }
    data = _data_module(job)
    if data is not None:
        files["data.py"] = data
    files.update(job.strategy_unit.extra_files(job))
    return files


def render_files(plan: RenderedPlan, strategy: str, steps: int = DEFAULT_STEPS) -> dict[str, str]:
    """Render the files for ``strategy`` in ``plan`` (see ``render_job``).

    Raises:
        AdvisorError: the strategy does not apply, or a value cannot be written safely.
    """
    return render_job(job_from_plan(plan, strategy, steps))


def launch_command(plan: RenderedPlan, strategy: str) -> str | None:
    """The launch line for ``strategy`` in ``plan`` (None when it does not apply; why not, when its script would not
    be written). Renders nothing: the text output prints it, and it must not need the model's classes."""
    if strategy not in runnable_names() or not plan.row(strategy).applicable:
        return None
    try:  # an option the script would not write: --emit refuses it, so there is nothing to launch
        _script_refusal(get_strategy(strategy), plan.options, plan.spec)
    except AdvisorError as err:
        return f"none: --emit would not write this job ({err})"
    hw = plan.hardware
    return get_strategy(strategy).launcher.command(hw.gpus_per_node, hw.num_nodes, MASTER_PORT)


OWN_FILES = ("train.py", "data.py", "launch.sh", "slurm.sbatch", "ds_config.json", "hostfile")


def check_emit_dir(out_dir: str | Path, force: bool, names: list[str] | tuple[str, ...] = OWN_FILES) -> Path:
    """Refuse, before any work, a path that is not a directory, or a non-empty directory without ``force``.

    Raises:
        AdvisorError: as said, naming the files --force would overwrite.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise AdvisorError(f"--emit {out_dir}: exists and is not a directory: choose another path")
    if out.exists() and any(out.iterdir()) and not force:
        raise AdvisorError(
            f"--emit {out_dir}: directory is not empty; choose an empty one or pass --force (which overwrites only "
            f"{', '.join(names)} and removes the files an earlier --emit wrote there that it does not write)"
        )
    # A file written and removed in the nearest folder that exists (nothing is created yet): root passes os.access
    # on read-only and pseudo file systems (/proc), so only a write tells.
    near = next((d for d in (out, *out.absolute().parents) if d.exists()), None)
    try:
        if near is not None:
            with tempfile.NamedTemporaryFile(dir=near, prefix=".advisor-write-check-"):
                pass
    except OSError as err:
        raise AdvisorError(f"--emit {out_dir}: {near} cannot be written ({err.strerror or err}): choose another path")
    return out


def write_files(files: dict[str, str], out_dir: str | Path, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out_dir`` (created if missing), and the manifest of what was written
    (``emit_manifest.MANIFEST``). Refuses a non-empty directory unless ``force``; even then only our own file names
    are written, and the only files removed are those the folder's manifest lists, unchanged since, that ``files``
    does not write again (``emit_manifest.stale_files``: a ZeRO job's ds_config.json when the strategy becomes
    DDP); nothing else is touched.

    Raises:
        AdvisorError: non-empty directory without force, a path that is not a directory, or an OS error.
    """
    out = check_emit_dir(out_dir, force, sorted(files))
    written = []
    stale = stale_files(out, frozenset(files)) if out.is_dir() else []
    edited = edited_files(out, frozenset(files)) if out.is_dir() else []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path in edited:  # the user's edits of a file advisor wrote: kept beside the new one
            path.rename(kept_copy(path))
        for name, text in files.items():
            if "/" in name or name.startswith("."):
                raise AdvisorError(f"refusing to write {name!r} outside {out_dir}")
            path = out / name
            try:
                path.write_text(text, encoding="utf-8")
                if name.endswith(".sh"):
                    path.chmod(0o755)
            except OSError as err:
                raise AdvisorError(
                    f"--emit {out_dir}: cannot write {name} ({err.strerror}): move it away or choose another directory"
                ) from None
            written.append(path)
        for path in stale:
            path.unlink(missing_ok=True)
        (out / MANIFEST).write_text(manifest_text(files), encoding="utf-8")
    except OSError as err:
        raise AdvisorError(f"--emit {out_dir}: cannot write ({err.strerror}): choose a writable directory")
    return written
