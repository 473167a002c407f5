"""The one input schema: every choice a user can make, typed, with its default, bounds, help text and
the faces that show it, validated in one place (``validate``).

Faces are derived from it: the CLI's argparse parser (``advisor.cli.build_parser`` iterates
``fields_for("cli")``), the Streamlit form (``app.py`` draws ``fields_for("page")``), bench's case runner
(``inputs_from_values``) and the JSON echo of the inputs (``echo``). Choices come from the registries
(GPU presets, networks, precisions, optimizers; the strategy names from ``strategies``, resolved by the
faces because strategies sit above this layer), never typed twice.

Groups (torchtitan-style typed config dataclasses): ``ModelSource`` (what to train), ``TrainingOptions``
(how), ``ClusterSpec`` (on what), ``RunOptions`` (scripts, verification and output: CLI/page only, never
part of a plan). ``PlanInputs`` holds the first three plus the plan-level switches.

What one field is and how one value is checked against it (``Opt``, ``Field``, the type read from the
annotation) is ``advisor.fields``; the free-text inputs (``--lora-targets``, ``--init-from``,
``--input-shape``) are parsed in ``advisor.free_text``. Numeric bounds (``low``/``high``) are inclusive,
except a ``low`` of 0.0, which is exclusive: the value must be above 0. A choice from a closed set is typed
with its ``StrEnum`` (``advisor.choices``): the string a face passes becomes the member as the group is built
(``TrainingOptions.__post_init__``), and the choices the faces list stay plain strings.

Nothing here imports torch or any other layer of advisor but the bottom data modules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .bnb_layout import OPTIMIZER_CHOICES, QUANT_CHOICES
from .choices import Attention, Device, Dtype, Framework, FsdpGradSync, Optimizer, Precision, Quant, values
from .errors import AdvisorError
from .fields import FACES, STRATEGY_CHOICES, Field, as_members, check_value, group_fields
from .fields import option as _f  # short: the dataclass bodies below call it once per field
from .free_text import init_from, lora_targets
from .gpu_presets import GPU_PRESETS, INTERCONNECTS, NETWORKS

# The choices as plain strings (advisor.choices.values), in the order --help lists them.
PRECISIONS = values(Precision)
FRAMEWORKS = values(Framework)
FSDP_GRAD_SYNC = values(FsdpGradSync)
OPTIMIZERS = OPTIMIZER_CHOICES  # torch.optim's, bitsandbytes' and transformers' Adafactor (advisor.bnb_layout)
QUANT_TYPES = QUANT_CHOICES
ADAPTER_DTYPES = values(Dtype)
COMPUTE_DTYPES = tuple(d.value for d in (Dtype.BF16, Dtype.FP16, Dtype.FP32))
ATTENTION_CHOICES = values(Attention)
DEVICES = values(Device)
LORA_ALPHA = 16.0  # LoRA's alpha when --lora-alpha is not given: the QLoRA paper's (Dettmers et al. 2023, appendix)
LORA_DROPOUT = 0.05  # adapter input dropout when --lora-dropout is not given: the QLoRA paper's for 33B-65B


@dataclass(frozen=True)
class ModelSource:
    """What to train. Exactly one source: a name, a config file, a pasted config or a factory."""

    model: str | None = _f(
        None,
        positional=True,
        label="Catalog model",
        faces=("cli", "page", "bench"),
        help="torchvision name (resnet50, vit_b_16, ...), transformer preset (gpt2, llama-2-7b, "
        "...) or Hugging Face repo id alias; see --list-models",
    )
    config_path: str | None = _f(
        None,
        flag="--config",
        metavar="PATH",
        faces=("cli", "bench"),
        help="a Hugging Face config.json (parsed as JSON only)",
    )
    config_dict: dict[str, object] | None = _f(
        None,
        label="Paste a config.json",
        faces=("page",),
        help="a pasted or uploaded Hugging Face config.json (parsed as JSON only)",
    )
    config_source: str | None = _f(None, faces=(), help="where config_dict came from (an upload's name)")
    model_factory: str | None = _f(
        None, flag="--model-factory", metavar="MOD:FN", help="import MOD and call FN() -> nn.Module (your code)"
    )
    input_shape: tuple[int, ...] | None = _f(
        None,
        flag="--input-shape",
        metavar="C,H,W",
        help="per-sample input shape of a --model-factory model "
        "(default 3,224,224; float inputs, loss = mean square of the output)",
    )
    seq_len: int | None = _f(
        None,
        flag="--seq-len",
        label="Sequence length",
        faces=("cli", "page", "bench"),
        low=1,
        none="auto",
        help="tokens per sample (default min(model max, 2048))",
    )
    image_size: int | None = _f(
        None,
        flag="--image-size",
        label="Image size (px)",
        faces=("cli", "page", "bench"),
        low=1,
        none="224",
        help="image side in pixels (default 224)",
    )


@dataclass(frozen=True)
class TrainingOptions:
    """How to train (per GPU unless said otherwise)."""

    precision: Precision | None = _f(
        None,
        flag="--precision",
        label="Precision",
        faces=("cli", "page", "bench"),
        choices=PRECISIONS,
        none="bf16; fp16 on GPUs without bf16; --verify on CPU: fp32",
        help="bf16/fp16: mixed precision; fp32; pure-bf16",
    )
    optimizer: Optimizer = _f(
        Optimizer.ADAMW,
        flag="--optimizer",
        label="Optimizer",
        faces=("cli", "page", "bench"),
        choices=OPTIMIZERS,
        help="default adamw; adamw-8bit, paged-adamw-8bit, paged-adamw and "
        "lion are bitsandbytes', adafactor transformers'",
    )
    init_from: str | None = _f(
        None,
        flag="--init-from",
        label="Pretrained weights (path or hub id)",
        faces=("cli", "page", "bench"),
        metavar="PATH",
        none="off: freshly initialised",
        help="the generated script will load pretrained weights from PATH (a save_pretrained "
        "directory or a state_dict file) or a hub id; sizes the host RAM that loading "
        "takes (advisor never reads or downloads it)",
    )
    lora_rank: int | None = _f(
        None,
        flag="--lora-rank",
        label="LoRA rank",
        faces=("cli", "page", "bench"),
        low=1,
        high=4096,
        none="off: full fine-tuning",
        help="train LoRA adapters of this rank on a frozen base (peft) instead of every weight",
    )
    # None, not the default value, when not given: so "--lora-alpha 16" without --lora-rank is refused too.
    lora_alpha: float | None = _f(
        None,
        flag="--lora-alpha",
        label="LoRA alpha",
        faces=("cli", "page", "bench"),
        low=0.0,
        high=1e6,
        none=f"{LORA_ALPHA:g}, the QLoRA paper's",
        help="LoRA scaling: updates are scaled by alpha / rank",
    )
    lora_dropout: float | None = _f(
        None,
        flag="--lora-dropout",
        label="LoRA dropout",
        faces=("cli", "page", "bench"),
        high=0.9,
        high_message="--lora-dropout must be between 0 and 0.9, got {value}",
        none=f"{LORA_DROPOUT:g}",
        help="dropout on the adapters' input, 0-0.9 (0 saves its mask)",
    )
    lora_targets: str | None = _f(
        None,
        flag="--lora-targets",
        label="LoRA target modules",
        faces=("cli", "page", "bench"),
        metavar="NAMES",
        none="peft's default for the architecture",
        help="comma-separated module names (q_proj,v_proj) or all-linear; required for vision and custom models",
    )
    lora_dtype: Dtype = _f(
        Dtype.AUTO,
        flag="--lora-dtype",
        label="LoRA adapters' dtype",
        faces=("cli", "page", "bench"),
        choices=ADAPTER_DTYPES,
        help="the adapters' dtype (auto: fp32 under single, DDP and FSDP2, as peft upcasts them; "
        "16-bit under DeepSpeed's bf16/fp16 modes, which cast the module)",
    )
    quantize: Quant | None = _f(
        None,
        flag="--quantize",
        label="Quantize the frozen base (QLoRA)",
        faces=("cli", "page", "bench"),
        choices=QUANT_TYPES,
        none="off",
        help="QLoRA: hold the frozen base in 4 bits (nf4, fp4) or 8 bits (int8) with bitsandbytes; needs --lora-rank",
    )
    double_quant: bool = _f(
        False,
        flag="--double-quant",
        label="Double quantization (QLoRA)",
        faces=("cli", "page", "bench"),
        help="QLoRA: quantize the 4-bit blocks' scales too (bnb_4bit_use_double_quant)",
    )
    bnb_compute_dtype: Dtype | None = _f(
        None,
        flag="--bnb-compute-dtype",
        faces=("cli", "bench"),
        choices=COMPUTE_DTYPES,
        none="the precision's (bf16, fp16; fp32 under fp32)",
        help="QLoRA: the dtype the quantized layers compute in (bnb_4bit_compute_dtype)",
    )
    micro_batch_size: int | None = _f(
        None,
        flag="--micro-batch-size",
        label="Micro-batch size per GPU",
        faces=("cli", "page", "bench"),
        low=1,
        high=2**20,
        none="auto",
        help="samples per GPU per step (default: the best throughput that fits the GPU; "
        "1 for transformers and 32 for vision on CPU and in --verify)",
    )
    global_batch_size: int | None = _f(
        None,
        flag="--global-batch-size",
        label="Global batch size",
        faces=("cli", "page", "bench"),
        low=1,
        high=2**30,
        none="no accumulation",
        help="micro-batch x data-parallel size x accumulation steps (default: no accumulation)",
    )
    activation_checkpointing: bool = _f(
        False,
        flag="--activation-checkpointing",
        label="Activation checkpointing",
        faces=("cli", "page", "bench"),
        help="recompute blocks in backward",
    )
    framework: Framework = _f(
        Framework.ANY,
        flag="--framework",
        label="Framework",
        faces=("cli", "page", "bench"),
        choices=FRAMEWORKS,
        help="limit the strategies to what one framework runs: torch (single, DDP, FSDP2, HSDP, "
        "TP), deepspeed (ZeRO), any (default)",
    )
    fsdp_grad_sync: FsdpGradSync = _f(
        FsdpGradSync.EVERY_MICRO_STEP,
        flag="--fsdp-grad-sync",
        faces=("cli", "bench"),
        choices=FSDP_GRAD_SYNC,
        help="FSDP2 with gradient accumulation: reduce-scatter the gradients on every "
        "micro-step (default: least memory) or only on the last (less "
        "communication; every rank keeps all unsharded fp32 gradients until then)",
    )
    attention: Attention = _f(
        Attention.AUTO,
        flag="--attention",
        choices=ATTENTION_CHOICES,
        help="attention kernel to model (auto: what the target GPU runs)",
    )
    tp_degree: int | None = _f(
        None,
        flag="--tp-degree",
        low=1,
        high=64,
        help="tensor-parallel degree (default: pure TP the GPUs per node; TP x DP the "
        "largest divisor of the heads and kv heads <= GPUs per node)",
    )
    safety_factor: float = _f(
        1.2,
        flag="--safety-factor",
        low=1.0,
        high=2.0,
        help="multiplier for the 16-bytes-per-parameter rule of thumb, 1.0-2.0 (default 1.2)",
    )
    base_lr: float | None = _f(None, flag="--base-lr", low=0.0, help="learning rate tuned at --base-batch-size")
    base_batch_size: int | None = _f(
        None, flag="--base-batch-size", low=1, help="global batch the base LR was tuned at"
    )
    # Generated DDP scripts set it (PyTorch DDP docs); not a user choice.
    gradient_as_bucket_view: bool = _f(True, faces=(), help="DDP gradients as views into its buckets")
    # Step time (issue 13): the efficiencies of the roofline and the training budget.
    mfu: float | None = _f(
        None,
        flag="--mfu",
        faces=("cli", "bench"),
        low=0.0,
        high=1.0,
        metavar="FRACTION",
        none="fitted per GPU generation",
        help="compute efficiency: the share of the GPU's dense peak that matmuls, convolutions and "
        "attention reach, 0-1 (takes precedence over the fitted value)",
    )
    bandwidth_efficiency: float | None = _f(
        None,
        flag="--bandwidth-efficiency",
        faces=("cli", "bench"),
        low=0.0,
        high=4.0,
        metavar="FACTOR",
        none="fitted per GPU generation",
        help="effective memory bandwidth of memory-bound ops as a share of the "
        "GPU's (above 1 where kernels fuse ops or hit the L2 cache; 0.8 "
        "models eager PyTorch), 0-4",
    )
    train_tokens: int | None = _f(
        None,
        flag="--train-tokens",
        label="Training tokens",
        faces=("cli", "page", "bench"),
        low=1,
        high=10**16,
        none="not given",
        help="tokens to train on (language models): adds training hours and GPU-hours",
    )
    train_samples: int | None = _f(
        None,
        flag="--train-samples",
        faces=("cli", "bench"),
        low=1,
        high=10**15,
        none="not given",
        help="samples to train on: adds training hours and GPU-hours",
    )
    epochs: float | None = _f(
        None,
        flag="--epochs",
        faces=("cli", "bench"),
        low=0.0,
        high=10**6,
        none="not given",
        help="epochs over --dataset-size samples: adds training hours and GPU-hours",
    )
    dataset_size: int | None = _f(
        None,
        flag="--dataset-size",
        faces=("cli", "bench"),
        low=1,
        high=10**15,
        none="not given",
        help="samples in the dataset (with --epochs)",
    )
    gpu_hour_price: float | None = _f(
        None,
        flag="--gpu-hour-price",
        label="Price per GPU-hour",
        faces=("cli", "page", "bench"),
        low=0.0,
        high=10**4,
        none="not given",
        help="price of one GPU-hour (any currency): adds the training cost",
    )

    def __post_init__(self) -> None:
        as_members(self)  # "bf16" from a face becomes Precision.BF16 (advisor.choices); bad values stay for validate


@dataclass(frozen=True)
class ClusterSpec:
    """On what: ``gpus`` x ``nodes`` GPUs of one kind. Unset fields are detected, else from the preset."""

    gpu: str | None = _f(
        None,
        flag="--gpu",
        label="GPU",
        faces=("cli", "page", "bench"),
        metavar="PRESET",
        choices=tuple(p.name for p in GPU_PRESETS.values()),
        strict=False,
        none="detected, else A100-80GB",
        help="GPU preset (case-insensitive)",
    )
    gpu_mem_gib: float | None = _f(
        None,
        flag="--gpu-mem",
        label="Usable GPU memory (GiB)",
        faces=("cli", "page"),
        metavar="GIB",
        low=0.0,
        high=4096,
        none="the GPU's",
        help="usable GPU memory, GiB (nvidia-smi MiB/1024)",
    )
    gpus: int | None = _f(
        None,
        flag="--gpus",
        label="GPUs per node",
        faces=("cli", "page", "bench"),
        low=1,
        high=64,
        high_message="--gpus is GPUs per node; {value} is more than any node has: use --nodes for more",
        none="detected, else 1",
        help="GPUs per node",
    )
    nodes: int = _f(
        1,
        flag="--nodes",
        label="Nodes",
        faces=("cli", "page", "bench"),
        low=1,
        high=100_000,
        high_message="--nodes {value} is absurd: check the value",
        help="number of nodes (default 1)",
    )
    interconnect: str | None = _f(
        None,
        flag="--interconnect",
        label="Interconnect (inside a node)",
        faces=("cli", "page", "bench"),
        choices=INTERCONNECTS,
        none="the GPU's",
        help="link between GPUs in a node",
    )
    network: str | None = _f(
        None,
        flag="--network",
        label="Network (between nodes)",
        faces=("cli", "page"),
        choices=tuple(NETWORKS),
        none="100gbe when nodes > 1",
        help="link between nodes",
    )
    link_bandwidth_gbps: float | None = _f(
        None,
        flag="--link-bandwidth",
        faces=("cli", "bench"),
        metavar="GBPS",
        low=0.0,
        high=10**5,
        none="the preset's measured figure",
        help="all-reduce bus bandwidth between the GPUs of one node, GB/s (nccl-tests busbw)",
    )
    network_bandwidth_gbps: float | None = _f(
        None,
        flag="--network-bandwidth",
        faces=("cli", "bench"),
        metavar="GBPS",
        low=0.0,
        high=10**5,
        none="NICs per node x the network's per-NIC figure",
        help="bandwidth from one node to the others, GB/s one direction",
    )
    host_mem_gib: float | None = _f(
        None,
        flag="--host-mem",
        label="Host RAM per node (GiB)",
        faces=("cli", "page"),
        metavar="GIB",
        low=0.0,
        high=2**20,
        none="auto",
        help="host RAM per node, GiB (for CPU offload; default: this machine's when "
        "planning for its own GPUs, else unknown)",
    )
    detect_hardware: bool = _f(True, faces=(), help="detect this machine's GPUs when no preset is given")


@dataclass(frozen=True)
class RunOptions:
    """Scripts, verification and output. Read by the faces; never part of a plan."""

    strategy: str | None = _f(
        None,
        flag="--strategy",
        label="Strategy for the scripts and the verification run",
        faces=("cli", "page", "bench"),
        choices=STRATEGY_CHOICES,
        none="the recommended one",
        help="strategy for --emit/--verify",
    )
    emit: str | None = _f(
        None,
        flag="--emit",
        metavar="DIR",
        help="write train.py, launch.sh, slurm.sbatch (and ds_config.json) into DIR (with "
        "--verify: the run's directory; default advisor-runs/MODEL-STRATEGY-TIME)",
    )
    force: bool = _f(False, flag="--force", help="let --emit overwrite its own files in a non-empty DIR")
    runs_dir: str | None = _f(
        None,
        label="Folder for verification runs",
        faces=("page",),
        none="advisor-runs",
        help="each verification writes a new folder MODEL-STRATEGY-TIME inside this one and "
        "never reuses an existing run's (the CLI's --emit DIR names the run's folder "
        "itself); a relative path is from the server's working directory",
    )
    verify: bool = _f(False, flag="--verify", help="run the script here and compare measured peaks")
    steps: int | None = _f(
        None,
        flag="--steps",
        label="Steps",
        faces=("cli", "page", "bench"),
        low=1,
        high=10_000,
        none="6",
        help="optimizer steps for --verify (default 6)",
    )
    timeout: float | None = _f(
        None,
        flag="--timeout",
        label="Timeout (s)",
        faces=("cli", "page"),
        low=0.0,
        high=7 * 86400,
        none="600",
        high_message="--timeout is in seconds, at most a week (604800), got {value:g}",
        help="seconds before --verify gives up (default 600, at most a week)",
    )
    json: bool = _f(False, flag="--json", help="print one JSON document (schema in README)")
    compare: bool = _f(False, flag="--compare", help="also show DeepSpeed's own model-state estimates")
    no_cache: bool = _f(
        False, flag="--no-cache", help="neither read nor write the trace cache (advisor cache info shows where it is)"
    )
    list_models: bool = _f(False, flag="--list-models", help="list the known model names and exit")


GROUPS: dict[str, type] = {"model": ModelSource, "training": TrainingOptions, "cluster": ClusterSpec, "run": RunOptions}
GROUP_TITLES = {
    "model": "model source",
    "training": "training",
    "cluster": "hardware (default: detected GPUs, else the A100-80GB preset)",
    "run": "scripts, verification and output",
}


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan depends on (``plan(PlanInputs) -> Plan``)."""

    source: ModelSource = field(default_factory=ModelSource)
    training: TrainingOptions = field(default_factory=TrainingOptions)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    compare: bool = False  # RunOptions.compare: DeepSpeed's estimators beside ours
    use_cache: bool = True  # not RunOptions.no_cache


def all_fields() -> Iterator[Field]:
    """Every field of every group, in declaration order."""
    for group, cls in GROUPS.items():
        yield from group_fields(group, cls)


def fields_for(face: str) -> list[Field]:
    """The fields ``face`` ("cli", "page" or "bench") shows."""
    if face not in FACES:
        raise ValueError(f"unknown face {face!r}")
    return [f for f in all_fields() if face in f.opt.faces]


def get_field(name: str) -> Field:
    for f in all_fields():
        if f.name == name:
            return f
    raise KeyError(name)


def field_labels() -> dict[str, str]:
    """CLI flag -> page label, for the fields both faces show (the page says the label where the core's
    messages name the flag)."""
    return {
        f.opt.flag: f.opt.label
        for f in all_fields()
        if f.opt.flag and f.opt.label and {"cli", "page"} <= set(f.opt.faces)
    }


# ----------------------------------------------------------------------------------------- validation
def validate_group(
    group: ModelSource | TrainingOptions | ClusterSpec | RunOptions, strategy_names: tuple[str, ...] = ()
) -> None:
    """Check every field of one group instance (``ModelSource``, ``TrainingOptions``, ...).

    Raises:
        AdvisorError: the first bad value, in one line naming the flag and the accepted range.
    """
    name = next(g for g, cls in GROUPS.items() if isinstance(group, cls))
    for f in (f for f in all_fields() if f.group == name):
        check_value(f, getattr(group, f.name), strategy_names)


def validate(inputs: PlanInputs) -> None:
    """The one validation place for a plan's inputs: every field's type, bounds and choices, then the
    rules that name several fields. Rules that need the resolved model or hardware (``--seq-len`` against
    learned positions, ``--tp-degree`` against the GPUs per node, the global batch against micro-batch x
    GPUs) are checked where those are resolved, in ``advisor.plan``.

    Raises:
        AdvisorError: one line saying what is wrong and what to do.
    """
    for group in (inputs.source, inputs.training, inputs.cluster):
        validate_group(group)
    t, s = inputs.training, inputs.source
    if (t.base_lr is None) != (t.base_batch_size is None):
        raise AdvisorError("--base-lr and --base-batch-size go together: give both or neither")
    if (t.epochs is None) != (t.dataset_size is None):
        raise AdvisorError("--epochs and --dataset-size go together: give both or neither")
    budgets = [
        n
        for n, v in (("--train-tokens", t.train_tokens), ("--train-samples", t.train_samples), ("--epochs", t.epochs))
        if v is not None
    ]
    if len(budgets) > 1:
        raise AdvisorError(f"give one training budget, not {' and '.join(budgets)}")
    _validate_adapter(t)
    init_from(t.init_from)
    if s.input_shape is not None:
        if not s.model_factory:
            raise AdvisorError("--input-shape applies to --model-factory models only")
        if not s.input_shape or len(s.input_shape) > 5 or any(not 1 <= d <= 65536 for d in s.input_shape):
            raise AdvisorError(f"--input-shape needs 1-5 dimensions between 1 and 65536, got {s.input_shape}")


def _validate_adapter(t: TrainingOptions) -> None:
    """The LoRA/QLoRA flags against each other (one place, naming every flag)."""
    if t.lora_rank is None:
        given = [
            flag
            for flag, on in (
                ("--lora-targets", t.lora_targets is not None),
                ("--lora-dtype", t.lora_dtype != Dtype.AUTO),
                ("--lora-alpha", t.lora_alpha is not None),
                ("--lora-dropout", t.lora_dropout is not None),
                ("--quantize", t.quantize is not None),
            )
            if on
        ]
        if given:
            raise AdvisorError(
                f"{given[0]} configures LoRA adapters: add --lora-rank R (for example 16), or drop "
                f"{given[0]} to size full fine-tuning"
            )
    if t.lora_dropout is not None and not 0.0 <= t.lora_dropout <= 0.9:
        raise AdvisorError(f"--lora-dropout must be between 0 and 0.9, got {t.lora_dropout}")
    if t.quantize is None and (t.double_quant or t.bnb_compute_dtype is not None):
        flag, kinds = (
            ("--double-quant", "nf4 (or fp4)") if t.double_quant else ("--bnb-compute-dtype", "nf4 (or fp4, int8)")
        )
        raise AdvisorError(f"{flag} configures QLoRA's quantized base: add --quantize {kinds}")
    if t.double_quant and t.quantize == Quant.INT8:
        raise AdvisorError("--double-quant applies to 4-bit bases (--quantize nf4 or fp4); int8 has per-row scales")
    lora_targets(t.lora_targets)


def validate_run(run: RunOptions, strategy_names: tuple[str, ...]) -> None:
    """The run/output options: each field, then the flags that only make sense together.

    Raises:
        AdvisorError: one line, as ``validate``.
    """
    validate_group(run, strategy_names)
    if run.strategy and not (run.emit or run.verify):
        raise AdvisorError("--strategy chooses what --emit/--verify produce: add --emit DIR or --verify")
    if run.force and not run.emit:
        raise AdvisorError("--force only applies to --emit DIR")
    if run.emit is not None and not run.emit.strip():
        raise AdvisorError("--emit needs a directory path")
    for name in ("steps", "timeout"):
        if getattr(run, name) is not None and not run.verify:
            raise AdvisorError(f"--{name} applies to --verify only: add --verify or drop --{name}")


# ------------------------------------------------------------------------------- building and echo
def split_values(values: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """Flat ``{field name: value}`` -> ``{group: {field name: value}}`` (unset names keep defaults).

    Raises:
        KeyError: a name that is no schema field.
    """
    by_name = {f.name: f.group for f in all_fields()}
    out: dict[str, dict[str, object]] = {g: {} for g in GROUPS}
    for name, value in values.items():
        out[by_name[name]][name] = value
    return out


_Group = TypeVar("_Group")  # one of GROUPS' classes


def _group(cls: type[_Group], values: Mapping[str, object]) -> _Group:
    """``cls(**values)``: one group from the values a face gave, of whatever types they are (``validate`` checks
    them).

    Raises:
        TypeError: a name that is no field of ``cls``.
    """
    return cls(**values)


def inputs_from_values(values: Mapping[str, object]) -> tuple[PlanInputs, RunOptions]:
    """What every face does with what the user gave: flat field values -> typed, validated inputs.

    Raises:
        AdvisorError: as ``validate``.
        KeyError: a name that is no schema field (a face's bug, not the user's).
    """
    g = split_values(values)
    run = _group(RunOptions, g["run"])
    inputs = PlanInputs(
        source=_group(ModelSource, g["model"]),
        training=_group(TrainingOptions, g["training"]),
        cluster=_group(ClusterSpec, g["cluster"]),
        compare=run.compare,
        use_cache=not run.no_cache,
    )
    validate(inputs)
    return inputs, run


def plan_inputs(**values: object) -> PlanInputs:
    """``PlanInputs`` from field values by name, validated: ``plan_inputs(model="gpt2", gpus=2, seq_len=256)``.

    Raises:
        AdvisorError: as ``validate``.
    """
    return inputs_from_values(values)[0]


def echo(inputs: PlanInputs) -> dict[str, object]:
    """The inputs as JSON: ``{group: {field: value}}`` for every field a face can set (a pasted config is
    echoed as its source name, not its text)."""
    out: dict[str, object] = {}
    for name, group in (("model", inputs.source), ("training", inputs.training), ("cluster", inputs.cluster)):
        values: dict[str, object] = {}
        out[name] = values
        for f in (f for f in all_fields() if f.group == name and f.opt.faces):
            value = getattr(group, f.name)
            if f.name == "config_dict":
                value = None if value is None else (inputs.source.config_source or "pasted config")
            values[f.name] = list(value) if isinstance(value, tuple) else value
    out["use_cache"] = inputs.use_cache
    return out
