"""``ModelSpec``: what to build, as pure data (a JSON-able config for transformers). Every model source
(a preset, a torchvision name, a config.json, a factory) resolves to one (``advisor.models.resolve``);
the family unit named by ``family`` builds it (``advisor.models.families``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..bnb_layout import QUANT_CHOICES
from ..choices import Dtype, Quant, values
from .tp_plan import PP_MODEL_TYPES, tp_plan_blocker

FAMILY_NAMES = ("transformer", "vision", "custom")
# bitsandbytes' quantized storage of a frozen base (``--quantize``): 4-bit NormalFloat, 4-bit float, LLM.int8().
QUANT_TYPES = QUANT_CHOICES
ADAPTER_DTYPES = values(Dtype)


@dataclass(frozen=True)
class AdapterSpec:
    """LoRA adapters on a frozen base (peft ``LoraConfig``), optionally over a quantized base (QLoRA:
    transformers' ``BitsAndBytesConfig``). Pure data; ``advisor.models.adapters`` applies it to a model.

    ``targets``: module names (peft ``target_modules``), ``("all-linear",)``, or ``()`` for peft's default
    for the architecture. ``dtype``: the adapters' dtype; ``auto``: what the strategy keeps them in (peft
    upcasts them to fp32, ``autocast_adapter_dtype=True``; DeepSpeed's bf16/fp16 modes cast them to 16 bits).
    ``quantize``: one of ``QUANT_TYPES`` or None (a 16/32-bit base). ``compute_dtype``: the dtype the quantized
    layers compute in (``bnb_4bit_compute_dtype``).
    """

    rank: int
    alpha: float = 16.0
    dropout: float = 0.05
    targets: tuple[str, ...] = ()
    dtype: Dtype = Dtype.AUTO
    quantize: Quant | None = None
    double_quant: bool = False
    compute_dtype: Dtype = Dtype.BF16

    @property
    def targets_text(self) -> str:
        return ",".join(self.targets) if self.targets else "peft's default for the architecture"


# The adapters advisor offers when full fine-tuning does not fit: the ladder's LoRA and QLoRA rungs and the "fine-tune
# with LoRA instead" lines are one recipe, torchtune's LoRA recipes for Llama 3.2 (rank 8, alpha 16 on q/k/v/o and the
# MLP projections: ``lora_attn_modules`` q_proj, k_proj, v_proj, output_proj with ``apply_lora_to_mlp``), which peft's
# all-linear (every nn.Linear but the output head) names; QLoRA on an nf4 base with double quantization (the QLoRA
# paper's recipe; torchtune's NF4 quantizes its scales too). No LoRA dropout, as torchtune's recipes set
# (lora_dropout: 0.0): peft's wrapper of fused MoE expert weights (lora.ParamWrapper) takes no other value.
RECIPE_LORA_RANK, RECIPE_LORA_ALPHA, RECIPE_LORA_DROPOUT = 8, 16.0, 0.0


def recipe_adapter(compute_dtype: Dtype, quantize: bool = False) -> AdapterSpec:
    """The offered adapters (see ``RECIPE_LORA_RANK``): LoRA, or with ``quantize`` QLoRA on an nf4 base with double
    quantization, its quantized layers computing in ``compute_dtype``."""
    return AdapterSpec(
        rank=RECIPE_LORA_RANK,
        alpha=RECIPE_LORA_ALPHA,
        dropout=RECIPE_LORA_DROPOUT,
        targets=("all-linear",),
        compute_dtype=compute_dtype,
        quantize=Quant.NF4 if quantize else None,
        double_quant=quantize,
    )


def recipe_flags(quantize: bool = False) -> str:
    """The command-line flags of ``recipe_adapter``."""
    lora = f"--lora-rank {RECIPE_LORA_RANK} --lora-targets all-linear --lora-dropout 0"
    return lora + " --quantize nf4 --double-quant" if quantize else lora


@dataclass(frozen=True)
class ModelSpec:
    """What to build. ``config`` is a plain JSON-able dict (transformers) or None (vision/custom)."""

    name: str
    family: str  # one of FAMILY_NAMES
    source: str
    model_type: str | None = None  # HF model_type, or the torchvision builder name
    config: dict[str, object] | None = None
    factory: str | None = None  # "package.module:function" for family == "custom"
    input_shape: tuple[int, ...] | None = None  # per-sample shape (vision/custom), e.g. (3, 224, 224)
    seq_len: int | None = None
    max_positions: int | None = None
    position_kind: str | None = None  # "learned" | "rotary" | "relative" | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    adapter: AdapterSpec | None = None  # LoRA / QLoRA: what is trained is the adapters, not the base

    @property
    def is_transformer(self) -> bool:
        return self.family == "transformer"

    @property
    def tp_capable(self) -> bool:
        """Whether tensor parallelism shards this model here (``tp_blocker`` is None)."""
        return self.tp_blocker is None

    @property
    def tp_blocker(self) -> str | None:
        """Why tensor parallelism cannot shard this model here (``advisor.models.tp_plan``); None: it can."""
        if self.family != "transformer":
            return f"a {'CNN/vision' if self.family == 'vision' else self.family} model has no tensor-parallel plan"
        return tp_plan_blocker(self.model_type, self.config)

    @property
    def pp_blocker(self) -> str | None:
        """Why pipeline stages cannot cut this model here (``advisor.models.tp_plan.PP_MODEL_TYPES``); None: they
        can."""
        if self.family != "transformer" or self.model_type not in PP_MODEL_TYPES:  # the reason the user can act on
            return (
                f"pipeline stages are cut for {'/'.join(PP_MODEL_TYPES)} decoders only (the pipeline script rebuilds "
                f"their blocks), not {self.model_type}"
            )
        return self.tp_blocker  # a llama-type config the stages still cannot cut (experts, say)

    @property
    def shape_text(self) -> str:
        """``seq-len 1024`` or ``input 3x224x224``: the per-sample shape as the outputs say it."""
        if self.seq_len is not None:
            return f"seq-len {self.seq_len}"
        return f"input {'x'.join(map(str, self.input_shape or ()))}"
