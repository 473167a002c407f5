"""DeepSpeed ZeRO stages 1-3 (stage, offload, buckets and precision are in ds_config.json). The loop's strategy
functions (``loop.py``): DeepSpeed's process group and config, the model built for the engine (ZeRO-3: under
deepspeed.zero.Init where the family allows it), the engine around it (``deepspeed.initialize``), its backward and
step, its own checkpoints (``engine.save_checkpoint`` / ``engine.load_checkpoint``), the export of the weights it
holds (ZeRO-3: gathered) and its teardown. DeepSpeed owns mixed precision (bf16/fp16 and fp16's loss scaling in
ds_config), the gradient accumulation boundaries (no_sync is implicit), the gradient reduction and the clipping.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import json
import os
from typing import TYPE_CHECKING

import torch

from .loop import Run  # ZeroRun's base: the script's own (copied in before it)

if TYPE_CHECKING:  # the script's own names (see loop.py)
    import torch.distributed as dist

    from advisor.models.families.fragments.transformer import (
        build_base,
        build_model,
        compute_loss,
        export_weights,
        save_test_base,
    )

    from .adapters import add_lora, base_dtype, export_merged, save_adapter, trainable_parameters
    from .common import (
        StepLog,
        checkpoint_dir,
        commit_checkpoint,
        evaluate,
        latest_checkpoint,
        log,
        save_training_state,
        unreadable,
    )
    from .constants import (
        COLLECTIVE_TIMEOUT_MINUTES,
        DS_CONFIG_FILE,
        GRAD_ACCUM_STEPS,
        HF_MODEL_CLASS,
        LORA_DTYPE,
        LR,
        MAX_GRAD_NORM,
        MICRO_BATCH_SIZE,
        PRECISION,
    )
    from .torch_steps import checkpoint_activations


class ZeroRun(Run):
    """``Run`` with what DeepSpeed adds: its config, and the transformers object that must outlive the model."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.ds_config: dict = {}  # ds_config.json with this run's batch sizes (read_ds_config)
        self.hf_ds_config = None  # ZeRO-3 with --init-from: transformers' HfDeepSpeedConfig, alive to the end
        self.lr = 0.0  # the LR of the step engine.step() last took (read before it moves the schedule on)


def start() -> ZeroRun:
    """This process's rank and device once DeepSpeed's process group is up. The deepspeed launcher (or torchrun)
    sets RANK/LOCAL_RANK/WORLD_SIZE; LOCAL_RANK picks the GPU. Every rank is a data-parallel rank."""
    import deepspeed

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local_rank)
    # The process group exists before the engine wraps the model; a collective waiting longer than the timeout fails.
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo",
                               timeout=datetime.timedelta(minutes=COLLECTIVE_TIMEOUT_MINUTES))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run = ZeroRun(rank, local_rank, rank, world_size, device)
    run.optimizer_device = optimizer_device(device)
    return run


def optimizer_device__device(device) -> torch.device:
    """Where the client optimizer steps: on the compute device."""
    return device


def optimizer_device__offload(device) -> torch.device:
    """Where the client optimizer steps: DeepSpeed keeps the optimizer states in host memory (ds_config's
    offload_optimizer) and steps them on the CPU."""
    return torch.device("cpu")  # offload: the optimizer steps in host memory


def read_ds_config(args, world_size: int) -> dict:
    """ds_config.json (the deepspeed launcher's --deepspeed_config, else DS_CONFIG_FILE). The batch sizes and the
    clipping norm follow this script's constants and the world size it runs on (ds_config's figures are what advisor
    planned); precision, buckets and offload stay ds_config's."""
    with open(args.deepspeed_config or DS_CONFIG_FILE) as f:
        ds_config = json.load(f)
    ds_config.update(train_micro_batch_size_per_gpu=MICRO_BATCH_SIZE, gradient_accumulation_steps=GRAD_ACCUM_STEPS,
                     train_batch_size=MICRO_BATCH_SIZE * GRAD_ACCUM_STEPS * world_size, gradient_clipping=MAX_GRAD_NORM)
    log(f"ZeRO-{ds_config['zero_optimization']['stage']}: world size {world_size}, micro-batch {MICRO_BATCH_SIZE}/GPU, "
        f"accumulation {GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = "
        f"{ds_config['train_batch_size']}; lr {LR:g}")
    return ds_config


def precision_dtypes() -> tuple[None, torch.dtype | None]:
    """(autocast dtype, input dtype): no autocast (DeepSpeed's bf16/fp16 modes hold the module in 16 bits), so float
    inputs are cast by hand."""
    return None, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)


def prepare_model__full(args, run: ZeroRun) -> tuple[torch.nn.Module, list]:
    """(the model, its parameters), built whole on every rank: deepspeed.initialize partitions what this stage
    partitions. (ZeRO-3 does not build this model under zero.Init: it re-initialises its weights after creation,
    which partitioned weights cannot take; it is small enough to build whole.)"""
    run.ds_config = read_ds_config(args, run.dp_size)
    model = build_model(args.init_from)
    checkpoint_activations(model)
    return model, list(model.parameters())


def prepare_model__full_init(args, run: ZeroRun) -> tuple[torch.nn.Module, list]:
    """(the model, its parameters), partitioned as they are created (zero_init): no rank holds the whole model."""
    run.ds_config = read_ds_config(args, run.dp_size)
    with zero_init(args, run):
        model = build_model(args.init_from)
    checkpoint_activations(model)
    return model, list(model.parameters())


def prepare_model__lora(args, run: ZeroRun) -> tuple[torch.nn.Module, list]:
    """(the model, the adapters): the frozen base in its dtype, whole on every rank, with the adapters."""
    run.ds_config = read_ds_config(args, run.dp_size)
    return with_adapters(build_base(args, base_dtype()))


def prepare_model__lora_init(args, run: ZeroRun) -> tuple[torch.nn.Module, list]:
    """(the model, the adapters): the frozen base partitioned like any parameter (zero_init), with the adapters.
    zero.Init builds in the dtype of ds_config's bf16/fp16 mode; from_pretrained loads in the base's dtype."""
    run.ds_config = read_ds_config(args, run.dp_size)
    with zero_init(args, run):
        model = build_base(args, base_dtype() if args.init_from else None)
    return with_adapters(model)


def prepare_model__qlora(args, run: ZeroRun) -> tuple[torch.nn.Module, list]:
    """(the model, the adapters) on a quantized base. bitsandbytes quantizes the base as from_pretrained loads it
    (build_base), so without --init-from a freshly initialised base is saved first and loaded from there; a quantized
    base is never built under zero.Init."""
    run.ds_config = read_ds_config(args, run.dp_size)
    args.init_from = args.init_from or save_test_base(args.out)
    return with_adapters(build_base(args, base_dtype()))


def zero_init(args, run: ZeroRun):
    """ZeRO-3 partitions the parameters as they are created (deepspeed.zero.Init), so no rank ever holds the full
    model. --init-from loads through transformers' DeepSpeed integration instead: while an HfDeepSpeedConfig is alive
    (run keeps it), from_pretrained builds the model under zero.Init itself and copies the checkpoint into the
    partitions."""
    import deepspeed
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    # The model's class is imported first: zero.Init replaces torch.Tensor's constructor while it is active, and
    # transformers' modeling code imported under it fails (torch._dynamo's polyfills check that constructor).
    getattr(transformers, HF_MODEL_CLASS)
    if args.init_from:
        run.hf_ds_config = HfDeepSpeedConfig(run.ds_config)
        return contextlib.nullcontext()
    return deepspeed.zero.Init(config_dict_or_path=run.ds_config)


def with_adapters(model) -> tuple[torch.nn.Module, list]:
    """(the model with LoRA adapters, the adapters). Outside zero.Init: peft initialises the adapters (lora_B to zero)
    on whole tensors; deepspeed.initialize then partitions them too."""
    model = add_lora(model)
    params = trainable_parameters(model)  # the optimizer (DeepSpeed's fp32 master copies too) sees the adapters
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    if LORA_DTYPE == "auto" and half is not None:
        # DeepSpeed's bf16/fp16 modes hold the module in 16 bits (the fp32 master copies live in its optimizer),
        # but cast nothing of a model zero.Init built: the adapters peft made in fp32 are cast here.
        for p in params:
            p.data = p.data.to(half)
    checkpoint_activations(model)
    return model, params


def wrap_model(run: ZeroRun) -> None:
    """The DeepSpeed engine around the model (run.model; run.module stays the plain model, engine.module), with the
    client optimizer and LR scheduler: the engine steps both. fp16's loss scale is the engine's (in its checkpoint),
    so there is no GradScaler."""
    import deepspeed

    run.model, run.optimizer, _, run.scheduler = deepspeed.initialize(
        model=run.module, optimizer=run.optimizer, model_parameters=run.params, lr_scheduler=run.scheduler,
        config=run.ds_config)
    run.scaler = None


def micro_step_context(run: ZeroRun, last_micro: bool):
    """Nothing to hold back: the engine counts the micro-steps and reduces the gradients at the window's end."""
    return contextlib.nullcontext()


def forward(run: ZeroRun, batch):
    """This micro-step's loss through the engine (ZeRO-3 gathers each module's parameters as it runs)."""
    return compute_loss(run.model, batch, run.device, run.input_dtype)


def backward(run: ZeroRun, loss) -> None:
    """engine.backward (the 1/GRAD_ACCUM_STEPS share, fp16's loss scale), then engine.step() on every micro-step:
    the engine steps the optimizer (and the LR schedule) only at an accumulation boundary, after clipping."""
    run.lr = run.scheduler.get_last_lr()[0]  # the rate this step uses (logged), before engine.step() moves it on
    run.model.backward(loss)
    run.model.step()


def optimizer_step(run: ZeroRun, steps: StepLog) -> None:
    """The end of an accumulation window, which engine.step() has stepped: log it with the LR it used and the
    gradient norm DeepSpeed measured before clipping."""
    steps.end_step(run.lr, run.model.get_global_grad_norm())


def held_out_loss(run: ZeroRun, dataset) -> float:
    """The mean loss over the held-out set (``evaluate``), through the engine."""
    return evaluate(run.model, dataset, run.dp_size, run.dp_rank, run.device, None, run.input_dtype)


def save_checkpoint__full(args, engine, optimizer, state: dict, rank: int) -> None:
    """DeepSpeed's own checkpoint (the engine holds the optimizer): every rank writes its partition of the optimizer
    states (and, under ZeRO-3, of the weights), with the LR schedule; plus every rank's training state."""
    engine.save_checkpoint(os.path.join(args.out, "checkpoints"), tag=f"step-{state['step']}", save_latest=False)
    save_training_state(checkpoint_dir(args.out, state["step"]), rank, state)
    commit_checkpoint(args, state["step"], rank)


def save_checkpoint__lora(args, engine, optimizer, state: dict, rank: int) -> None:
    """DeepSpeed's own checkpoint (the engine holds the optimizer) of the adapters and their optimizer states (the
    frozen base is --init-from's, unchanged), with the LR schedule; plus every rank's training state."""
    engine.save_checkpoint(os.path.join(args.out, "checkpoints"), tag=f"step-{state['step']}", save_latest=False,
                           exclude_frozen_parameters=True)
    save_training_state(checkpoint_dir(args.out, state["step"]), rank, state)
    commit_checkpoint(args, state["step"], rank)


def load_checkpoint__full(out: str, engine, optimizer) -> str:
    """--resume: the latest checkpoint into the engine (weights, optimizer states, LR schedule); returns its path."""
    path = latest_checkpoint(out)
    try:
        engine.load_checkpoint(os.path.dirname(path), tag=os.path.basename(path))
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise unreadable(path, err) from None
    return path


def load_checkpoint__lora(out: str, engine, optimizer) -> str:
    """--resume: the latest checkpoint into the engine (the adapters, their optimizer states, the LR schedule; the
    base stays --init-from's); returns its path."""
    path = latest_checkpoint(out)
    try:
        engine.load_checkpoint(os.path.dirname(path), tag=os.path.basename(path), load_module_strict=False)
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise unreadable(path, err) from None
    return path


def full_state_dict__zero3(run: ZeroRun) -> dict:
    """The whole model's weights in DeepSpeed's 16-bit module dtype, gathered module by module into rank 0's host
    memory (stage3_gather_16bit_weights_on_model_save; every rank takes part)."""
    return run.model._zero3_consolidated_16bit_state_dict()


def full_state_dict__whole(run: ZeroRun) -> dict:
    """The whole model's weights (every rank holds them), in DeepSpeed's 16-bit module dtype under bf16/fp16."""
    return run.module.state_dict()


def export__full(args, run: ZeroRun) -> None:
    """Rank 0 writes the full weights with the names of the plain model (engine.module)."""
    full = full_state_dict(run)
    if run.rank == 0:
        export_weights(run.module, args, full)


def export__lora(args, run: ZeroRun) -> None:
    """Rank 0 writes the adapters (the base is unchanged: --init-from's), with the names of the plain model."""
    adapter = adapter_state_dict(run.module)
    if run.rank == 0:
        save_adapter(run.module, args.out, adapter)


def export__lora_merged(args, run: ZeroRun) -> None:
    """Rank 0 writes the adapters (the base is unchanged: --init-from's) and, with --export-merged, the base with
    them merged in (rank 0 then holds the whole model in host memory)."""
    adapter = adapter_state_dict(run.module)
    if run.rank == 0:
        save_adapter(run.module, args.out, adapter)
    if args.export_merged:
        full = full_state_dict(run)
        if run.rank == 0:
            export_merged(full, args.out)


def adapter_state_dict__zero3(module) -> dict:
    """Every rank: the trainable parameters (the adapters) by name, as whole CPU copies. ZeRO-3 partitions them:
    gathered for the copy (read-only: modifier_rank None; every rank takes part), the frozen base stays partitioned."""
    import deepspeed

    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        return {name: p.detach().cpu().clone() for name, p in named}


def adapter_state_dict__whole(module) -> dict:
    """Every rank: the trainable parameters (the adapters) by name, as whole CPU copies."""
    return {name: p.detach().cpu().clone() for name, p in module.named_parameters() if p.requires_grad}


def teardown(run: ZeroRun) -> None:
    """Clean teardown, so no rank dies on its way out after the work is done. Wait for every rank, let DeepSpeed
    remove its hooks and buffers while the process group still works, drop the references to the engine, then
    destroy the group once through DeepSpeed, which also drops the references to its groups that it keeps. Left to
    the interpreter's exit, all this is freed in no set order while the other rank's connections close."""
    import deepspeed

    dist.barrier()
    run.model.destroy()
    vars(run).clear()  # the engine, the model, the optimizer, the scheduler, ZeRO-3's HfDeepSpeedConfig
    gc.collect()
    deepspeed.comm.destroy_process_group()


optimizer_device = optimizer_device__device
prepare_model = prepare_model__full
save_checkpoint = save_checkpoint__full
load_checkpoint = load_checkpoint__full
full_state_dict = full_state_dict__whole
export = export__full
adapter_state_dict = adapter_state_dict__whole
