from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from .common import ResumableSampler
    from .constants import COLLECTIVE_TIMEOUT_MINUTES, DATA_SEED, GRAD_ACCUM_STEPS, MICRO_BATCH_SIZE, NUM_WORKERS
    from .loop import Run


# --- The process group: torchrun's environment, the sampler by rank, and the collectives the shared helpers use ---
def init_torchrun():
    """Rank, local rank, world size and device from torchrun's environment, then the process group (before anything
    wraps the model or loads a checkpoint). LOCAL_RANK, not RANK (which counts across nodes), picks the GPU."""
    if "RANK" not in os.environ:
        raise SystemExit("no RANK in the environment: start this script with its launcher (bash launch.sh, torchrun)")
    rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local_rank)
    # An explicit timeout: a rank left waiting in a collective (another died or hangs) fails instead of holding the job.
    dist.init_process_group(backend="nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(minutes=COLLECTIVE_TIMEOUT_MINUTES))
    return rank, local_rank, world_size, device



def make_loader(dataset, num_replicas: int, rank: int):
    """DistributedSampler by data-parallel rank (it shuffles: no shuffle=True on the DataLoader)."""
    sampler = ResumableSampler(torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=DATA_SEED, drop_last=True))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler, num_workers=NUM_WORKERS,
        pin_memory=torch.cuda.is_available(), persistent_workers=NUM_WORKERS > 0, drop_last=True)
    if len(loader) < GRAD_ACCUM_STEPS:
        raise SystemExit(f"the training set has {len(dataset)} samples: too few for one optimizer step of "
                         f"{MICRO_BATCH_SIZE} x {GRAD_ACCUM_STEPS} samples on each of {num_replicas} ranks: give more "
                         "data, or lower MICRO_BATCH_SIZE in this script (advisor --micro-batch-size)")
    return sampler, loader


def make_eval_loader(dataset, num_replicas: int, rank: int):
    """The held-out set in a fixed order, split between the data-parallel ranks without repeats, the same number of
    samples each (sharded models run the same forward passes on every rank); a set smaller than the ranks is padded
    with repeats instead."""
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=len(dataset) >= num_replicas)
    return torch.utils.data.DataLoader(dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler)


def all_reduce_sum(t) -> None:
    dist.all_reduce(t)


def barrier() -> None:
    dist.barrier()


def teardown(run: Run) -> None:
    """Finished or stopped: destroy the process group, so no rank is left waiting."""
    dist.destroy_process_group()
