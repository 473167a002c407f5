"""The loop's steps where the strategy keeps torch's own optimizer, autocast and state dicts (one process, DDP): the
model built for the job (full weights, LoRA on a 16/32-bit base, QLoRA), the precision, the backward pass, the
optimizer step and the export.

A function named ``NAME__VARIANT`` is one variant of ``NAME``: the renderer (``strategies.pick``) copies the job's
variant into the script under the name ``NAME`` (``strategies.render.variants`` says which); the assignments at the
end make this module importable with one of each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from advisor.checkpointing import enable_activation_checkpointing
    from advisor.selective_ac import op_context_fn
    from advisor.models.families.fragments.transformer import (
        build_base,
        build_model,
        compute_loss,
        export_weights,
        load_quantized_base,
        save_test_base,
    )

    from .adapters import add_lora, base_dtype, export_merged, save_adapter, trainable_parameters
    from .common import StepLog, evaluate, log
    from .constants import CHECKPOINT_EVERY, GRAD_ACCUM_STEPS, MAX_GRAD_NORM, PRECISION
    from .local import barrier
    from .loop import Run


def precision_dtypes__mixed() -> tuple[torch.dtype | None, None]:
    """(autocast dtype, input dtype): bf16/fp16 autocast casts per op (the inputs too); fp32: neither."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION), None


def precision_dtypes__pure_bf16() -> tuple[None, torch.dtype]:
    """(autocast dtype, input dtype) under pure bf16: no autocast, so float inputs are cast by hand."""
    return None, torch.bfloat16


def prepare_model__full(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(model on the device, the parameters the optimizer steps): every weight trains."""
    model = build_model(args.init_from).to(run.device)
    checkpoint_activations(model)
    return model, list(model.parameters())


def prepare_model__pure_bf16(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(model on the device, its parameters): weights, gradients and optimizer states all in bf16."""
    model = build_model(args.init_from)
    model = model.to(torch.bfloat16).to(run.device)
    checkpoint_activations(model)
    return model, list(model.parameters())


def prepare_model__lora(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(model on the device, the adapters): the base frozen in its dtype, the LoRA adapters trainable."""
    model = add_lora(build_base(args, base_dtype())).to(run.device)
    checkpoint_activations(model)
    params = trainable_parameters(model)  # the adapters only: clipping, the optimizer and DDP's buckets see them alone
    return model, params


def prepare_model__qlora(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(model on the device, the adapters): the base quantized as it loads onto the device (every rank holds it)."""
    base_dir = args.init_from or save_test_base(args.out)
    model = add_lora(load_quantized_base(base_dir, run.device)).to(run.device)
    checkpoint_activations(model)
    params = trainable_parameters(model)  # the adapters only: clipping, the optimizer and DDP's buckets see them alone
    return model, params


def checkpoint_activations__on(model) -> None:
    """Activation checkpointing: each repeated block's activations are recomputed in backward instead of kept."""
    log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")


def checkpoint_activations__op(model) -> None:
    """Selective activation checkpointing, torchtitan's op policy: each block keeps the outputs of attention and of
    every second matmul (op_policy) and recomputes the rest in backward, less memory than none, less recompute than
    full checkpointing."""
    blocks = enable_activation_checkpointing(model, {"context_fn": op_context_fn})
    log(f"selective activation checkpointing (op policy) on {blocks} blocks")


def checkpoint_activations__layer(model) -> None:
    """Selective activation checkpointing, torchtitan's layer policy: every CHECKPOINT_EVERY-th block is
    checkpointed whole (its activations recomputed in backward); the others keep theirs."""
    blocks = enable_activation_checkpointing(model, every=CHECKPOINT_EVERY)
    log(f"selective activation checkpointing: every {CHECKPOINT_EVERY}-th block, {blocks} blocks")


def checkpoint_activations__off(model) -> None:
    """Activation checkpointing is off (advisor --activation-checkpointing writes the script with it on)."""


def forward(run: Run, batch):
    """This micro-step's loss, under autocast where mixed precision uses it."""
    dtype = run.autocast_dtype
    with torch.autocast(run.device.type, dtype=dtype, enabled=dtype is not None):
        return compute_loss(run.model, batch, run.device, run.input_dtype)


def backward(run: Run, loss) -> None:
    """Backward of this micro-step's share of the window's mean loss (scaled by the GradScaler under fp16)."""
    run.scaler.scale(loss / GRAD_ACCUM_STEPS).backward()


def optimizer_step__clipped(run: Run, steps: StepLog) -> None:
    """The end of an accumulation window: clip the true gradients (unscale first: a no-op unless fp16; with DDP
    they are already averaged over the ranks, so every rank computes the same norm), step through the GradScaler,
    release the gradients, move the LR schedule on, log the step with the LR it used."""
    run.scaler.unscale_(run.optimizer)
    norm = torch.nn.utils.clip_grad_norm_(run.params, MAX_GRAD_NORM)
    step_with(run, steps, norm)


def optimizer_step__in_backward(run: Run, steps: StepLog) -> None:
    """The end of a step whose parameters each stepped in backward as their gradients arrived (OptimizerInBackward):
    no gradient is left to clip or release; move the LR schedule on and log the step with the LR it used."""
    lr = run.scheduler.get_last_lr()[0]
    run.optimizer.step()  # nothing to do: it keeps the LR schedule's count of optimizer steps
    run.scheduler.step()
    steps.end_step(lr)


def step_with(run: Run, steps: StepLog, norm) -> None:
    """After the caller unscaled and clipped the gradients (``norm``: their global norm): step through the
    GradScaler, release the gradients, move the LR schedule on and log the step with the LR it used."""
    lr = run.scheduler.get_last_lr()[0]
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    steps.end_step(lr, norm)


def held_out_loss(run: Run, dataset) -> float:
    """The mean loss over the held-out set (``evaluate``), on the plain model."""
    return evaluate(run.module, dataset, run.dp_size, run.dp_rank, run.device, run.autocast_dtype, run.input_dtype)


def export__full(args, run: Run) -> None:
    """Rank 0 writes the plain module's trained weights (no wrapper prefix in the names); the others wait."""
    if run.rank == 0:
        export_weights(run.module, args)
    barrier()


def export__lora(args, run: Run) -> None:
    """Rank 0 writes the adapters (the base is unchanged: --init-from's); the others wait."""
    if run.rank == 0:
        save_adapter(run.module, args.out)
    barrier()


def export__lora_merged(args, run: Run) -> None:
    """Rank 0 writes the adapters (the base is unchanged: --init-from's) and, with --export-merged, the base with
    them merged in; the others wait."""
    if run.rank == 0:
        save_adapter(run.module, args.out)
        if args.export_merged:
            export_merged(run.module.state_dict(), args.out)
    barrier()


precision_dtypes = precision_dtypes__mixed
prepare_model = prepare_model__full
optimizer_step = optimizer_step__clipped
checkpoint_activations = checkpoint_activations__off
export = export__full
