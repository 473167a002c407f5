from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from advisor.models.families.fragments.transformer import build_model, compute_loss

    from .common import log
    from .constants import (
        LORA_ALPHA,
        LORA_DROPOUT,
        LORA_DTYPE,
        LORA_RANK,
        LORA_TARGETS,
        LORA_TASK_TYPE,
        MICRO_BATCH_SIZE,
        PRECISION,
    )


# --- LoRA (peft): low-rank adapters trained on a frozen base; only the adapters are optimized and saved ---
def base_dtype():
    """The frozen base's dtype: 16 bits under bf16 / fp16 / pure bf16 (what a base is loaded in with
    from_pretrained(dtype=...)), fp32 under fp32. A QLoRA base is quantized instead (load_quantized_base)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "pure-bf16": torch.bfloat16}.get(PRECISION, torch.float32)


def build_base__state_dict(args, dtype):
    """LoRA's frozen base: build_model(), with --init-from FILE's weights (a state_dict such as the model.pt a full
    fine-tuning script writes) when given, its parameters in ``dtype`` (None: as built)."""
    model = build_model()
    if args.init_from:
        model.load_state_dict(torch.load(args.init_from, map_location="cpu", weights_only=True))
    if dtype is not None:
        for p in model.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    return model


def add_lora(model, quiet: bool = False):
    """``model`` frozen, with LoRA adapters on LORA_TARGETS (peft get_peft_model; None: peft's default modules for
    the architecture), as a PeftModel. The adapters start as peft makes them: lora_A random, lora_B zero (the adapted
    model starts as the base), in fp32 (peft upcasts them) unless LORA_DTYPE names a dtype (pure bf16: bf16)."""
    import peft

    try:  # GPT-2's linear layers (Conv1D) store (in, out) weights: peft's fan_in_fan_out
        from transformers.pytorch_utils import Conv1D

        conv1d = any(isinstance(m, Conv1D) for m in model.modules())
    except ImportError:
        conv1d = False
    config = peft.LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=LORA_DROPOUT, target_modules=LORA_TARGETS,
                             bias="none", task_type=LORA_TASK_TYPE, fan_in_fan_out=conv1d)
    model = peft.get_peft_model(model, config)
    dtype = adapter_dtype()
    if dtype is not None:
        for p in trainable_parameters(model):
            p.data = p.data.to(dtype)
    # from_pretrained returns a model in eval mode: back to training mode, or dropout (LORA_DROPOUT too) and the
    # activation checkpointing of transformers' blocks (it runs only while training) would be off.
    model.train()
    if not quiet:
        trainable, total = model.get_nb_trainable_parameters()
        log(f"LoRA rank {LORA_RANK} on {LORA_TARGETS or 'peft default targets'}: trainable params {trainable:,} || "
            f"all params {total:,} || trainable% {100 * trainable / max(1, total):.4f}")
    return model


def adapter_dtype__as_set():
    """The adapters' dtype: LORA_DTYPE's (auto: None, as peft makes them)."""
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(LORA_DTYPE)


def adapter_dtype__pure_bf16():
    """The adapters' dtype: LORA_DTYPE's; auto is bf16 under pure bf16 (the adapters too)."""
    return {"fp32": torch.float32, "auto": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16}[LORA_DTYPE]


def trainable_parameters(model) -> list:
    """What the optimizer steps: the adapters (the base is frozen)."""
    return [p for p in model.parameters() if p.requires_grad]


def lora_eval_loss(model, dataset, device, input_dtype=None, autocast_dtype=None) -> float:
    """The loss of the trained model on the first micro-batch of the data set (eval mode, no gradients): a test
    loads --out/adapter into a fresh base and expects the same figure."""
    batch = torch.utils.data.default_collate([dataset[i] for i in range(MICRO_BATCH_SIZE)])
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        loss = compute_loss(model, batch, device, input_dtype)
    model.train()
    return loss.item()


def save_adapter(model, out: str, state_dict=None) -> None:
    """Rank 0: the adapters in peft's format (--out/adapter: adapter_model.safetensors + adapter_config.json), from
    ``state_dict`` when the strategy gathered them (sharded parameters), else from the model."""
    path = os.path.join(out, "adapter")
    model.save_pretrained(path, state_dict=state_dict)
    log(f"adapters: {path} (peft.PeftModel.from_pretrained(base, {path!r}) loads them onto the base)")


def export_merged(state: dict, out: str) -> None:
    """Rank 0, --export-merged: the base with the trained adapters merged into its weights (peft merge_and_unload),
    from ``state``, the whole adapted model's state_dict in host memory: --out/merged (save_pretrained for
    transformers models, else merged/model.pt, which loads into build_model())."""
    with torch.device("meta"):
        model = add_lora(build_model(), quiet=True)
    base = model.get_base_model()
    # load_state_dict(assign=True) gives every key its own tensor: tie the head back only where the model ties it
    heads = [getattr(base, f"get_{end}_embeddings", lambda: None)() for end in ("input", "output")]
    tied = None not in heads and heads[0].weight is heads[1].weight
    model.load_state_dict({k: v.detach().cpu() for k, v in state.items()}, strict=False, assign=True)
    if tied:
        base.tie_weights()
    merged = model.merge_and_unload()
    path = os.path.join(out, "merged")
    if hasattr(merged, "save_pretrained"):
        merged.save_pretrained(path)
    else:
        os.makedirs(path, exist_ok=True)
        torch.save(merged.state_dict(), os.path.join(path, "model.pt"))
    log(f"merged export: {path} (the base with the adapters merged in)")


adapter_dtype = adapter_dtype__as_set
