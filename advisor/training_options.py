"""How to train: the ``TrainingOptions`` group of the input schema (``advisor.schema``), its fields with their
defaults, bounds, help and faces, and the choices they list as plain strings. Each field's own type, bounds and
choices are checked by ``advisor.schema``'s ``validate_group``; the rules that name several of its fields are
``advisor.training_rules``.

Nothing here imports torch or any other layer of advisor but the bottom data modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from .bnb_layout import OPTIMIZER_CHOICES, QUANT_CHOICES
from .choices import (
    Attention,
    Dtype,
    Framework,
    FsdpGradSync,
    Optimizer,
    PipelineSchedule,
    Precision,
    Quant,
    SelectiveCheckpointing,
    Zero3Fetch,
    values,
)
from .fields import as_members
from .fields import option as _f  # short: the dataclass body below calls it once per field

# The choices as plain strings (advisor.choices.values), in the order --help lists them.
PRECISIONS = values(Precision)
FRAMEWORKS = values(Framework)
FSDP_GRAD_SYNC = values(FsdpGradSync)
OPTIMIZERS = OPTIMIZER_CHOICES  # torch.optim's, bitsandbytes' and transformers' Adafactor (advisor.bnb_layout)
QUANT_TYPES = QUANT_CHOICES
ADAPTER_DTYPES = values(Dtype)
COMPUTE_DTYPES = tuple(d.value for d in (Dtype.BF16, Dtype.FP16, Dtype.FP32))
ATTENTION_CHOICES = values(Attention)
PP_SCHEDULES = values(PipelineSchedule)
SELECTIVE_CHECKPOINTING = values(SelectiveCheckpointing)
CHECKPOINT_EVERY = 2  # --selective-checkpointing layer without --checkpoint-every: every second block
ZERO3_FETCH = values(Zero3Fetch)
LORA_ALPHA = 16.0  # LoRA's alpha when --lora-alpha is not given: the QLoRA paper's (Dettmers et al. 2023, appendix)
LORA_DROPOUT = 0.05  # adapter input dropout when --lora-dropout is not given: the QLoRA paper's for 33B-65B


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
    # The memory options beyond full checkpointing (advisor.memory_options): applied to every strategy row that can
    # take them and sized in the ladder (--ladder), by the same rules (advisor.applied_options); the generated
    # scripts write selective checkpointing, chunked cross-entropy and (single) the optimizer step in backward, not
    # yet activation offload (advisor.applied_options.unscripted_flags).
    selective_checkpointing: SelectiveCheckpointing | None = _f(
        None,
        flag="--selective-checkpointing",
        choices=SELECTIVE_CHECKPOINTING,
        none="off",
        help="torchtitan's selective activation checkpointing: op (save matmul and attention outputs, recompute "
        "every second matmul) or layer (checkpoint every --checkpoint-every-th block)",
    )
    checkpoint_every: int | None = _f(
        None,
        flag="--checkpoint-every",
        low=1,
        high=1024,
        none=str(CHECKPOINT_EVERY),
        help="--selective-checkpointing layer: checkpoint every k-th block",
    )
    activation_offload: bool = _f(
        False,
        flag="--activation-offload",
        help="move the activations saved for backward to pinned host memory (saved_tensors_hooks)",
    )
    optimizer_in_backward: bool = _f(
        False,
        flag="--optimizer-in-backward",
        help="step each parameter in its post-accumulate-grad hook (no accumulation, no global-norm clipping)",
    )
    chunked_cross_entropy: int | None = _f(
        None,
        flag="--chunked-cross-entropy",
        low=1,
        high=4096,
        metavar="CHUNKS",
        none="off",
        help="cross-entropy over CHUNKS slices of the logits at a time, keeping the logits in their own dtype (16 "
        "bits under mixed precision; fp32 saves less) instead of the fp32 log-softmax (torchtune uses 8)",
    )
    ladder: bool = _f(
        False,
        flag="--ladder",
        label="Memory-savings ladder",
        faces=("cli", "page"),
        help="show the ladder of memory savings with their cost in speed (also when nothing fits)",
    )
    top: int | None = _f(
        None,
        flag="--top",
        metavar="N",
        low=1,
        high=100,
        none="off",
        help="search the layouts (TP inside a node, PP across, data parallel the rest; every data-parallel policy, "
        "micro-batch size and activation checkpointing off and on) and show the N (1-100) fastest that fit (GPU plans)",
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
    zero3_fetch: Zero3Fetch = _f(
        Zero3Fetch.COALESCED,
        flag="--zero3-fetch",
        faces=("cli", "bench"),
        choices=ZERO3_FETCH,
        help="DeepSpeed ZeRO-3's parameter gathers, for its step time: coalesced per module (DeepSpeed 0.6 "
        "and later, default) or one per parameter with a host synchronize each (before 0.6)",
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
        short="--tp",
        low=1,
        high=64,
        help="tensor-parallel degree (default: pure TP the GPUs per node; TP x DP the "
        "largest divisor of the heads and kv heads <= GPUs per node)",
    )
    pp_degree: int | None = _f(
        None,
        flag="--pp-degree",
        short="--pp",
        low=1,  # 1: no pipeline (no row; with --top, layouts without stages only), as --tp-degree 1 is no TP
        high=256,
        none="off: no pipeline row",
        help="pipeline-parallel degree (1: none, and --top searches no pipeline): 2 or more adds a PP x DP row "
        "(1F1B; TP --tp-degree, default 1, inside a node, stages across nodes, data parallel the rest) with every "
        "stage's memory, and a PP x ZeRO-1 row; --strategy pp emits and verifies its script (PP x TP, PP x ZeRO-1 "
        "and fp16 rows are estimate-only)",
    )
    pp_schedule: PipelineSchedule | None = _f(
        None,
        flag="--pp-schedule",
        choices=PP_SCHEDULES,
        none="1f1b",
        help="the pipeline row's schedule (torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B, "
        "ScheduleInterleaved1F1B); with --pp-degree",
    )
    pp_virtual_stages: int | None = _f(
        None,
        flag="--pp-virtual-stages",
        low=2,
        high=16,
        none="2 with interleaved-1f1b",
        help="model chunks per pipeline rank for --pp-schedule interleaved-1f1b",
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
    # Step time: the shares of peak of the GPU time model (advisor.timing.gpu_model) and the training budget.
    mfu: float | None = _f(
        None,
        flag="--mfu",
        faces=("cli", "bench"),
        low=0.0,
        high=1.0,
        metavar="FRACTION",
        none="per GPU generation",
        help="compute efficiency: the share of the GPU's dense peak that large matmuls, convolutions and "
        "attention reach, 0-1 (tile and wave quantization still lower it for small shapes; takes precedence "
        "over the generation's value)",
    )
    bandwidth_efficiency: float | None = _f(
        None,
        flag="--bandwidth-efficiency",
        faces=("cli", "bench"),
        low=0.0,
        high=1.0,
        metavar="FRACTION",
        none="per GPU generation",
        help="the share of the GPU's memory bandwidth that large memory-bound ops reach, 0-1 (takes "
        "precedence over the generation's value)",
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

    @property
    def memory_options(self) -> bool:
        """Whether any memory option beyond full checkpointing is passed (--selective-checkpointing,
        --activation-offload, --optimizer-in-backward, --chunked-cross-entropy: ``advisor.applied_options``)."""
        return bool(
            self.selective_checkpointing
            or self.activation_offload
            or self.optimizer_in_backward
            or self.chunked_cross_entropy
        )

    @property
    def pipeline_schedule(self) -> tuple[PipelineSchedule, int]:
        """(schedule, model chunks per rank): --pp-schedule (default 1F1B) and --pp-virtual-stages (default 2 for
        the interleaved schedule, as torchtitan's default of 2 stages per rank for multi-stage schedules,
        ``_get_pipeline_metadata``; else 1)."""
        schedule = self.pp_schedule or PipelineSchedule.ONE_F_ONE_B
        return schedule, (self.pp_virtual_stages or 2) if schedule.interleaved else 1

    @property
    def checkpointing_label(self) -> str:
        """``on`` (full activation checkpointing), the selective policy (``selective (op policy)``, ``selective (layer
        policy: one block in 2)``) or ``off``: what the report's Training line says."""
        if self.activation_checkpointing:
            return "on"
        if self.selective_checkpointing == SelectiveCheckpointing.OP:
            return "selective (op policy)"
        if self.selective_checkpointing == SelectiveCheckpointing.LAYER:
            return f"selective (layer policy: one block in {self.layer_every})"
        return "off"

    @property
    def layer_every(self) -> int:
        """The layer policy's k: --checkpoint-every, else ``CHECKPOINT_EVERY``."""
        return self.checkpoint_every or CHECKPOINT_EVERY

    def __post_init__(self) -> None:
        as_members(self)  # "bf16" from a face becomes Precision.BF16 (advisor.choices); bad values stay for validate
