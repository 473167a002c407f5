"""The skeleton every generated train.py is built around: ``main()`` with the one training loop, and ``Run``, what
the loop trains with. The renderer (``strategies.pick``) copies ``main`` to the top of the script, then the functions
it calls in the order it calls them; the strategy's own (``start``, ``wrap_model``, ``micro_step_context``) come from
its template module, the rest from ``torch_steps.py``, ``common.py`` and the model family's fragment.

This module is importable Python: the names below the ``TYPE_CHECKING`` guard are the script's, written by the
renderer (constants) or copied from the other template modules; only the functions are copied, never these imports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names: the constants block and the other template modules' functions
    from .common import (
        Preemption,
        StepLog,
        checkpoint_due,
        final_checkpoint_due,
        log,
        lr_at,
        lr_schedule,
        make_datasets,
        make_optimizer,
        parse_args,
        restore_training_state,
        training_state,
    )
    from .constants import GRAD_ACCUM_STEPS, LR, MICRO_BATCH_SIZE, PRECISION, SEED
    from .ddp import micro_step_context, start, wrap_model
    from .local import load_checkpoint, make_loader, save_checkpoint, teardown
    from .torch_steps import backward, export, forward, held_out_loss, optimizer_step, precision_dtypes, prepare_model


def main() -> None:
    """Setup, the model, the data, the training loop (with evaluation and checkpoints), then the export."""
    args = parse_args()
    run = start()  # the process group first (if any), this process's rank and device; LOCAL_RANK picks the GPU
    torch.manual_seed(SEED)  # the same initial weights on every rank
    run.autocast_dtype, run.input_dtype = precision_dtypes()
    run.model, run.params = prepare_model(args, run)
    run.module = run.model
    run.optimizer = make_optimizer(run.params, run.optimizer_device)
    schedule = lr_schedule(args.steps)  # --resume carries on the checkpoint's (resume_lr_schedule)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda s: lr_at(s, schedule) / LR)
    # fp16 needs a GradScaler to keep small gradients from underflowing; bf16 does not (a pass-through then).
    run.scaler = torch.amp.GradScaler(run.device.type, enabled=PRECISION == "fp16")
    wrap_model(run)  # the strategy's wrapper, if any, in run.model; run.module stays the plain model
    dataset, held_out = make_datasets(args)
    sampler, loader = make_loader(dataset, run.dp_size, run.dp_rank)
    # An epoch's micro-batches that fill whole accumulation windows: a remainder would carry its gradients into the
    # next epoch's first step (a step of more than GRAD_ACCUM_STEPS micro-batches), so it is left out.
    whole_windows = len(loader) // GRAD_ACCUM_STEPS * GRAD_ACCUM_STEPS
    torch.manual_seed(SEED + run.dp_rank)  # per-rank randomness for augmentation and dropout

    steps, preemption = StepLog(args.steps, run.device, run.dp_size), Preemption()
    epoch, done_micro = 0, 0
    if args.resume:
        path = load_checkpoint(args.out, run.model, run.optimizer)
        epoch, done_micro = restore_training_state(path, run.rank, steps, schedule, run.scheduler, run.scaler)
    while not steps.done:
        # A new order every epoch (set_epoch); a resumed run starts where its checkpoint stopped.
        sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)
        for micro, batch in enumerate(loader, start=done_micro + 1):
            if micro > whole_windows:
                break
            last_micro = micro % GRAD_ACCUM_STEPS == 0
            with micro_step_context(run, last_micro):
                loss = forward(run, batch)
                backward(run, loss)
            steps.micro_step(loss)
            if not last_micro:
                continue  # accumulate: the gradients add up until the last micro-step of the window
            optimizer_step(run, steps)
            steps.evaluate(args.eval_every, held_out_loss, run, held_out)
            if checkpoint_due(args, steps, preemption, run.device, epoch, micro):
                state = training_state(steps, schedule, run.scheduler, run.scaler)
                save_checkpoint(args, run.model, run.optimizer, state, run.rank)
                steps.restart_clock()
            if steps.done:
                break
        epoch, done_micro = epoch + 1, 0

    if steps.stopped:
        log(f"SIGTERM: stopped after step {steps.step} with a checkpoint; continue with --resume")
        teardown(run)
        return
    os.makedirs(args.out, exist_ok=True)
    if final_checkpoint_due(args, steps):
        state = training_state(steps, schedule, run.scheduler, run.scaler)
        save_checkpoint(args, run.model, run.optimizer, state, run.rank)
    if not args.no_save:
        export(args, run)
    teardown(run)


class Run:
    """This process's place in the run (set by ``start``) and what the loop trains with (set by ``main``).
    ``model`` is what the loop calls (the strategy's wrapper, e.g. DDP's), ``module`` the plain model inside it
    (evaluation and export: names without a wrapper's prefix). The data-parallel rank and size decide the data each
    process reads; ``rank`` its checkpoint files and who writes the exports."""

    def __init__(self, rank: int, local_rank: int, dp_rank: int, dp_size: int, device) -> None:
        self.rank, self.local_rank, self.dp_rank, self.dp_size, self.device = rank, local_rank, dp_rank, dp_size, device
        self.optimizer_device = device  # where the optimizer steps (the CPU where the shards are offloaded)
        self.mesh = None  # the device mesh of a strategy that shards over one
        self.model = self.module = None  # set by main(), then wrap_model
        self.params: list = []  # what the optimizer steps and clipping sees (only the trainable parameters)
        self.optimizer = self.scheduler = self.scaler = None  # set by main(); the strategy's wrapper may replace them
        self.autocast_dtype = None  # mixed precision's compute dtype (None: no autocast)
        self.input_dtype = None  # float inputs cast by hand (pure bf16: no autocast casts them)
