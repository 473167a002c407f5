from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from .common import ResumableSampler
    from .constants import DATA_SEED, GRAD_ACCUM_STEPS, MICRO_BATCH_SIZE, NUM_WORKERS
    from .loop import Run


# --- One process: the collectives the shared helpers use do nothing (no process group exists) ---
def all_reduce_sum(t) -> None:
    pass


def barrier() -> None:
    pass


def teardown(run: Run) -> None:
    pass


def make_eval_loader(dataset, num_replicas: int, rank: int):
    return torch.utils.data.DataLoader(dataset, batch_size=MICRO_BATCH_SIZE)


class EpochShuffle(torch.utils.data.Sampler):
    """Every index once per epoch, in an order drawn from DATA_SEED and the epoch: the same order again when a resumed
    run continues mid-epoch."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples, self.epoch = num_samples, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(DATA_SEED + self.epoch))
                    .tolist())

    def __len__(self) -> int:
        return self.num_samples


def make_loader(dataset, num_replicas: int, rank: int):
    sampler = ResumableSampler(EpochShuffle(len(dataset)))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler, num_workers=NUM_WORKERS,
        pin_memory=torch.cuda.is_available(), persistent_workers=NUM_WORKERS > 0, drop_last=True)
    if len(loader) < GRAD_ACCUM_STEPS:
        raise SystemExit(f"the training set has {len(dataset)} samples: too few for one optimizer step of "
                         f"{MICRO_BATCH_SIZE} x {GRAD_ACCUM_STEPS}: give more data, or lower MICRO_BATCH_SIZE in "
                         "this script (advisor --micro-batch-size)")
    return sampler, loader
