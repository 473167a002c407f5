"""The benchmark's cases: what is trained, how, on how many ranks.

Sizes are chosen so the whole suite runs in under 30 minutes on a 2-core CPU machine (small images,
short sequences, 3 optimizer steps). bf16 autocast is emulated on CPUs without native bf16, so only
the small Llama-architecture model runs in bf16. Every model appears at two micro-batch sizes so
the activation slope (bytes per extra sample) is tested, not just one point.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
LLAMA_SMALL = BENCH_DIR / "llama_small.json"  # hidden 256, 4 layers, 8 heads, 4 kv heads, vocab 8000
# The same shape in two other families TP shards by transformers' own plans (advisor.models.tp_plan): gemma (tied
# embeddings, GeGLU, explicit head_dim), starcoder2 (biases, LayerNorm, a 2-layer GELU MLP).
SMALL_CONFIGS = {
    "llama-small": LLAMA_SMALL,
    "gemma-small": BENCH_DIR / "gemma_small.json",
    "starcoder2-small": BENCH_DIR / "starcoder2_small.json",
}


@dataclass(frozen=True)
class Case:
    """One measured run. ``model`` is a torchvision name or transformer preset, or ``llama-small``
    (the config file above). ``seq_len`` for transformers, ``image_size`` for vision models."""

    model: str
    strategy: str
    world: int
    micro_batch: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: bool = False
    seq_len: int | None = None
    image_size: int | None = None
    steps: int = 3
    # LoRA / QLoRA (issue 16): adapters of this rank on these modules ("all-linear", or names), over a base quantized
    # to ``quantize`` (nf4) with or without double quantization; None: full fine-tuning.
    lora_rank: int | None = None
    lora_targets: str | None = None
    quantize: str | None = None
    double_quant: bool = False
    pp_degree: int | None = None  # the pinned pipeline row (strategy "pp"): its degree, DP the rest
    selective: str | None = None  # --selective-checkpointing op|layer (torchtitan's policies; layer: every 2nd block)
    ce_chunks: int | None = None  # --chunked-cross-entropy: the loss over this many slices of the logits at a time
    in_backward: bool = False  # --optimizer-in-backward: each parameter steps in its gradient's hook (single)

    @property
    def case_id(self) -> str:
        shape = f"s{self.seq_len}" if self.seq_len else f"i{self.image_size}"
        ac = "-ac" if self.checkpointing else f"-sac{self.selective}" if self.selective else ""
        ac += f"-ce{self.ce_chunks}" if self.ce_chunks else ""
        ac += "-oib" if self.in_backward else ""
        lora = ""
        if self.lora_rank:
            where = "all" if self.lora_targets == "all-linear" else (self.lora_targets or "default").replace(",", "+")
            quant = f"-{self.quantize}{'dq' if self.double_quant else ''}" if self.quantize else ""
            lora = f"-lora{self.lora_rank}-{where}{quant}"
        return (
            f"{self.model}-{shape}-b{self.micro_batch}-{self.precision}-{self.optimizer}{ac}{lora}"
            f"-{self.strategy}{self.pp_degree or ''}-w{self.world}"
        )

    def as_dict(self) -> dict:
        return asdict(self) | {"case_id": self.case_id}

    def values(self) -> dict:
        """The case as schema field values (``advisor.schema``), as a user would type it: one node of
        ``world`` NVLink-connected GPUs, no hardware detection."""
        small = SMALL_CONFIGS.get(self.model)
        source = {"config_path": str(small)} if small else {"model": self.model}
        shape = {"seq_len": self.seq_len} if self.seq_len else {"image_size": self.image_size}
        lora = {
            k: v
            for k, v in (
                ("lora_rank", self.lora_rank),
                ("lora_targets", self.lora_targets),
                ("quantize", self.quantize),
            )
            if v is not None
        }
        if self.double_quant:
            lora["double_quant"] = True
        if self.pp_degree:
            lora["pp_degree"] = self.pp_degree
        if self.selective:
            lora["selective_checkpointing"] = self.selective
        if self.ce_chunks:
            lora["chunked_cross_entropy"] = self.ce_chunks
        if self.in_backward:
            lora["optimizer_in_backward"] = True
        return {
            **source,
            **shape,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "micro_batch_size": self.micro_batch,
            "activation_checkpointing": self.checkpointing,
            "gpus": self.world,
            "nodes": 1,
            "interconnect": "nvlink",
            "detect_hardware": False,
            **lora,
        }


def _vision(model: str, size: int, strategy: str, world: int, mb: int, **kw) -> Case:
    return Case(model=model, image_size=size, strategy=strategy, world=world, micro_batch=mb, **kw)


def _lm(model: str, seq: int, strategy: str, world: int, mb: int, **kw) -> Case:
    return Case(model=model, seq_len=seq, strategy=strategy, world=world, micro_batch=mb, **kw)


SUITE: tuple[Case, ...] = (
    # resnet18: SGD and Adam, DDP and ZeRO-2, two micro-batches, checkpointing on/off
    _vision("resnet18", 64, "ddp", 1, 8, optimizer="sgd-momentum"),
    _vision("resnet18", 64, "ddp", 1, 16, optimizer="sgd-momentum"),
    _vision("resnet18", 64, "ddp", 2, 16, optimizer="sgd"),
    _vision("resnet18", 64, "ddp", 2, 16, optimizer="adamw", checkpointing=True),
    _vision("resnet18", 64, "zero2", 2, 8, optimizer="adamw"),
    # resnet50
    _vision("resnet50", 64, "ddp", 1, 4, optimizer="sgd-momentum"),
    _vision("resnet50", 64, "ddp", 2, 8, optimizer="adam"),
    _vision("resnet50", 64, "zero3", 2, 4, optimizer="adamw"),
    # vit_b_16 at its native 224 px: generated scripts build torchvision's ViT without image_size, so
    # other sizes fail (see bench/README.md); ZeRO-3 fails under zero.Init for torchvision's ViT.
    _vision("vit_b_16", 224, "ddp", 1, 1, optimizer="adamw"),
    _vision("vit_b_16", 224, "zero2", 2, 2, optimizer="adamw", checkpointing=True),
    # convnext_tiny
    _vision("convnext_tiny", 64, "ddp", 1, 4, optimizer="adamw"),
    _vision("convnext_tiny", 64, "zero2", 2, 8, optimizer="sgd-momentum"),
    # gpt2 at seq 256 and 1024
    _lm("gpt2", 256, "ddp", 1, 1),
    _lm("gpt2", 256, "ddp", 1, 2, checkpointing=True),
    _lm("gpt2", 256, "zero2", 2, 2),
    _lm("gpt2", 256, "zero3", 2, 1),
    _lm("gpt2", 1024, "ddp", 1, 1),
    # bert-base
    _lm("bert-base", 128, "ddp", 1, 2),
    _lm("bert-base", 128, "ddp", 2, 4, optimizer="sgd-momentum"),
    _lm("bert-base", 128, "zero2", 2, 4, checkpointing=True),
    # small Llama architecture: every strategy, fp32 and bf16 autocast
    _lm("llama-small", 256, "ddp", 1, 2),
    _lm("llama-small", 256, "ddp", 2, 8),
    _lm("llama-small", 256, "ddp", 2, 8, checkpointing=True),
    # selective checkpointing (issue 29): torchtitan's op policy and layer policy, each its own case
    _lm("llama-small", 256, "single", 1, 8, selective="op"),
    _lm("llama-small", 256, "ddp", 2, 8, selective="layer"),
    # chunked cross-entropy: the output head per slice of the sequence; gpt2's head is tied to its embedding
    _lm("llama-small", 256, "single", 1, 8, ce_chunks=4),
    _lm("gpt2", 256, "ddp", 2, 2, ce_chunks=4),
    # the optimizer step in backward, at a size whose plain run peaks at its optimizer step (every gradient held)
    _lm("llama-small", 32, "single", 1, 2, in_backward=True),
    _lm("llama-small", 256, "zero2", 1, 4),
    _lm("llama-small", 256, "zero2", 2, 4),
    _lm("llama-small", 256, "zero1", 2, 4),  # issue 25: ZeRO-1, the same run as the ZeRO-2 case above
    _lm("llama-small", 256, "zero3", 1, 4, optimizer="sgd-momentum"),
    _lm("llama-small", 256, "zero3", 2, 8),
    # the pipeline script (strategies/templates/pp.py): PP 2, 1F1B, 2 micro-batches per step; and PP 2 x DP 2
    _lm("llama-small", 256, "pp", 2, 4, pp_degree=2),
    _lm("llama-small", 256, "pp", 4, 2, pp_degree=2),
    _lm("llama-small", 256, "tp", 2, 2),
    _lm("llama-small", 256, "tp", 2, 8, checkpointing=True),
    _lm("gemma-small", 256, "tp", 2, 4),
    _lm("starcoder2-small", 256, "tp", 2, 4),
    _lm("llama-small", 128, "ddp", 1, 2, precision="bf16"),
    _lm("llama-small", 128, "ddp", 2, 4, precision="bf16"),
    _lm("llama-small", 128, "zero2", 2, 4, precision="bf16"),
    _lm("llama-small", 128, "zero1", 2, 4, precision="bf16"),
    _lm("llama-small", 128, "zero3", 2, 2, precision="bf16"),
    _lm("llama-small", 128, "tp", 2, 4, precision="bf16"),
    # FSDP2 (issue 15): both rows that run on CPU, fp32 and bf16, with and without activation checkpointing, on the
    # small Llama (uniform blocks, a large root: embeddings + LM head) and gpt2 (tied embeddings), plus resnet18
    # (blocks of different sizes, BatchNorm buffers); bf16 only on the small models (emulated on this CPU).
    _lm("llama-small", 256, "fsdp2", 2, 4),
    _lm("llama-small", 256, "fsdp2", 2, 4, checkpointing=True),
    _lm("llama-small", 256, "fsdp2_noreshard", 2, 4),
    _lm("llama-small", 256, "fsdp2_noreshard", 2, 4, checkpointing=True),
    _lm("llama-small", 128, "fsdp2", 2, 4, precision="bf16"),
    _lm("llama-small", 128, "fsdp2", 2, 4, precision="bf16", checkpointing=True),
    _lm("llama-small", 128, "fsdp2_noreshard", 2, 4, precision="bf16"),
    _lm("llama-small", 128, "fsdp2_noreshard", 2, 4, precision="bf16", checkpointing=True),
    _lm("gpt2", 256, "fsdp2", 2, 2),
    _lm("gpt2", 256, "fsdp2", 2, 2, checkpointing=True),
    _lm("gpt2", 256, "fsdp2_noreshard", 2, 2),
    _lm("gpt2", 256, "fsdp2_noreshard", 2, 2, checkpointing=True),
    _vision("resnet18", 64, "fsdp2", 2, 16, optimizer="adamw"),
    _vision("resnet18", 64, "fsdp2_noreshard", 2, 16, optimizer="adamw", checkpointing=True),
    # single (one process, no wrapper): a CNN, a ViT, gpt2, the small Llama in fp32 and bf16, with checkpointing
    _vision("resnet50", 64, "single", 1, 8, optimizer="adamw"),
    _vision("vit_b_16", 224, "single", 1, 2, optimizer="adamw", checkpointing=True),
    _lm("gpt2", 256, "single", 1, 2),
    _lm("llama-small", 256, "single", 1, 4, checkpointing=True),
    _lm("llama-small", 128, "single", 1, 4, precision="bf16"),
    # LoRA (issue 16): ranks 8 and 64, attention-only and all-linear, fp32 and bf16, single, DDP, ZeRO-3 and FSDP2
    _lm("llama-small", 256, "single", 1, 4, lora_rank=8, lora_targets="q_proj,v_proj"),
    _lm("llama-small", 256, "single", 1, 8, lora_rank=8, lora_targets="q_proj,v_proj"),
    _lm("llama-small", 256, "ddp", 2, 4, lora_rank=8, lora_targets="q_proj,v_proj"),
    _lm("llama-small", 256, "ddp", 2, 4, lora_rank=64, lora_targets="all-linear"),
    _lm("llama-small", 256, "zero3", 2, 4, lora_rank=8, lora_targets="q_proj,v_proj"),
    _lm("llama-small", 256, "zero3", 2, 4, lora_rank=64, lora_targets="all-linear"),
    _lm("llama-small", 256, "fsdp2", 2, 4, lora_rank=8, lora_targets="q_proj,v_proj"),
    _lm("llama-small", 128, "single", 1, 4, precision="bf16", lora_rank=64, lora_targets="all-linear"),
    _lm("llama-small", 128, "ddp", 2, 4, precision="bf16", lora_rank=8, lora_targets="q_proj,v_proj"),
    _lm("gpt2", 256, "ddp", 2, 2, lora_rank=8, lora_targets="c_attn"),
    _lm("gpt2", 256, "single", 1, 2, lora_rank=64, lora_targets="all-linear", checkpointing=True),
    # QLoRA: nf4 with and without double quantization (prepare_model_for_kbit_training checkpoints the blocks)
    _lm(
        "llama-small",
        256,
        "single",
        1,
        4,
        checkpointing=True,
        lora_rank=8,
        lora_targets="q_proj,v_proj",
        quantize="nf4",
    ),
    _lm(
        "llama-small",
        256,
        "ddp",
        2,
        4,
        checkpointing=True,
        lora_rank=64,
        lora_targets="all-linear",
        quantize="nf4",
        double_quant=True,
    ),
    # QLoRA x ZeRO-3: the packed 4-bit storage partitioned (bnb_4bit_quant_storage = the module's dtype)
    _lm(
        "llama-small", 256, "zero3", 2, 4, checkpointing=True, lora_rank=8, lora_targets="q_proj,v_proj", quantize="nf4"
    ),
    # 8-bit and paged optimizers (bitsandbytes' CPU kernels)
    _lm("llama-small", 256, "single", 1, 4, optimizer="adamw-8bit"),
    _lm("llama-small", 256, "ddp", 2, 4, optimizer="paged-adamw", lora_rank=16, lora_targets="all-linear"),
)

# Two minutes at most on this machine: one DDP, one ZeRO, one TP run of the small models.
SMOKE: tuple[Case, ...] = (
    _vision("resnet18", 32, "ddp", 1, 4, optimizer="sgd-momentum", steps=2),
    _lm("llama-small", 64, "zero2", 2, 2, steps=2),
    _lm("llama-small", 64, "tp", 2, 2, steps=2),
)
