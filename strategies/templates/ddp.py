"""DDP: every rank holds the whole model and all-reduces the gradients. The loop's strategy functions (``loop.py``):
the process group, the wrapper (with SyncBatchNorm where a small per-GPU batch needs it) and ``no_sync`` on the
micro-steps before the last."""

from __future__ import annotations

import contextlib
import gc
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from .collectives import init_torchrun
    from .common import log
    from .constants import GRAD_ACCUM_STEPS, LR, MICRO_BATCH_SIZE, SYNC_BN_MAX_MICRO_BATCH
    from .loop import Run


def start() -> Run:
    """This process's rank, local rank and device, once the process group is up; every rank is a data-parallel
    rank."""
    rank, local_rank, world_size, device = init_torchrun()
    log(f"DDP: world size {world_size}, micro-batch {MICRO_BATCH_SIZE}/GPU, accumulation {GRAD_ACCUM_STEPS} "
        f"-> global batch {MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = "
        f"{MICRO_BATCH_SIZE * world_size * GRAD_ACCUM_STEPS}; lr {LR:g}")
    return Run(rank, local_rank, rank, world_size, device)


def wrap_model__plain(run: Run) -> None:
    """DDP around the model (run.model); it broadcasts rank 0's weights, so every rank starts the same."""
    run.model = DDP(run.module, device_ids=[run.local_rank] if run.device.type == "cuda" else None,
                    gradient_as_bucket_view=True)
    gc.collect()  # DDP's first broadcast can leave a receive buffer in a reference cycle (gloo): free it now


def wrap_model__batchnorm(run: Run) -> None:
    """SyncBatchNorm where the per-GPU batch is small (use_sync_batchnorm), then DDP around the model (run.model); it
    broadcasts rank 0's weights, so every rank starts the same."""
    sync_bn, why = use_sync_batchnorm(run.module, MICRO_BATCH_SIZE, run.device.type)
    log(f"SyncBatchNorm: {'on' if sync_bn else 'off'} ({why})")
    if sync_bn:  # the same parameters in new modules: the optimizer's stay valid
        run.module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(run.module)
    run.model = DDP(run.module, device_ids=[run.local_rank] if run.device.type == "cuda" else None,
                    gradient_as_bucket_view=True)
    gc.collect()  # DDP's first broadcast can leave a receive buffer in a reference cycle (gloo): free it now


def use_sync_batchnorm(model, micro_batch_size: int, device_type: str) -> tuple[bool, str]:
    """SyncBatchNorm where the model has BatchNorm, the per-GPU batch is small and the device is CUDA."""
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not has_bn:
        return False, "no BatchNorm layers"
    if micro_batch_size > SYNC_BN_MAX_MICRO_BATCH:
        return False, f"per-GPU batch {micro_batch_size} is large enough for per-GPU statistics"
    if device_type != "cuda":
        return False, "SyncBatchNorm needs CUDA tensors; on CPU each rank keeps its own BatchNorm statistics"
    return True, f"per-GPU batch {micro_batch_size} is small: BatchNorm statistics synchronised across ranks"


def micro_step_context(run: Run, last_micro: bool):
    """No gradient all-reduce on the accumulation steps before the last: no_sync() keeps them local."""
    return contextlib.nullcontext() if last_micro else run.model.no_sync()


wrap_model = wrap_model__plain
