# ---------------------------------------------------------------------------------------------
# One process: the collectives the shared helpers use are the identity (no process group exists).
# ---------------------------------------------------------------------------------------------
def all_reduce_sum(t) -> None:
    """One process: the sum over ranks is the value itself."""


def barrier() -> None:
    """One process: nothing to wait for."""


def teardown() -> None:
    """One process: no process group to destroy."""


def make_eval_loader(dataset, num_replicas: int, rank: int):
    """One process: the whole held-out set in a fixed order."""
    return torch.utils.data.DataLoader(dataset, batch_size=MICRO_BATCH_SIZE)


class EpochShuffle(torch.utils.data.Sampler):
    """Every index once per epoch, in an order drawn from DATA_SEED and the epoch (set_epoch): a new order every
    epoch, and the same one again when a resumed run continues mid-epoch."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples, self.epoch = num_samples, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(DATA_SEED + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=g).tolist())

    def __len__(self) -> int:
        return self.num_samples


def make_loader(dataset, num_replicas: int, rank: int):
    """One process reads the whole data set: nothing to shard, only a shuffle per epoch that a resumed run can
    continue part-way (EpochShuffle)."""
    sampler = ResumableSampler(EpochShuffle(len(dataset)))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler, num_workers=NUM_WORKERS,
        pin_memory=torch.cuda.is_available(), persistent_workers=NUM_WORKERS > 0, drop_last=True)
    if len(loader) < GRAD_ACCUM_STEPS:
        raise SystemExit(f"the training set has {len(dataset)} samples: too few for one optimizer step of "
                         f"{MICRO_BATCH_SIZE} x {GRAD_ACCUM_STEPS}: give more data, or lower MICRO_BATCH_SIZE in "
                         "this script (advisor --micro-batch-size)")
    return sampler, loader
