# ---------------------------------------------------------------------------------------------
# The process group: torchrun's environment, the sampler by rank, and the collectives the shared helpers use.
# ---------------------------------------------------------------------------------------------
def init_torchrun():
    """Rank, local rank, world size and device from torchrun's environment, then the process group.

    LOCAL_RANK (not RANK, which counts across nodes) picks the GPU; the process group exists before anything
    wraps the model or loads a checkpoint.
    """
    if "RANK" not in os.environ:
        raise SystemExit("no RANK in the environment: start this script with its launcher (bash launch.sh, torchrun)")
    rank, local_rank, world_size = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local_rank)
    # An explicit timeout: a rank that waits longer than this in a collective (another rank died or hangs) fails
    # instead of holding the job until the scheduler kills it.
    dist.init_process_group(backend="nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(minutes=COLLECTIVE_TIMEOUT_MINUTES))
    return rank, local_rank, world_size, device


def make_loader(dataset, num_replicas: int, rank: int):
    """DistributedSampler by data-parallel rank (the sampler shuffles, so the DataLoader gets no shuffle=True);
    workers about CPU cores / GPUs, pinned memory on CUDA."""
    sampler = ResumableSampler(torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=DATA_SEED, drop_last=True))
    workers = NUM_WORKERS
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler, num_workers=workers,
        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0, drop_last=True)
    if len(loader) < GRAD_ACCUM_STEPS:
        raise SystemExit(f"the training set has {len(dataset)} samples: too few for one optimizer step of "
                         f"{MICRO_BATCH_SIZE} x {GRAD_ACCUM_STEPS} samples on each of {num_replicas} ranks: give more "
                         "data, or lower MICRO_BATCH_SIZE in this script (advisor --micro-batch-size)")
    return sampler, loader


def make_eval_loader(dataset, num_replicas: int, rank: int):
    """The held-out set in a fixed order, split between the data-parallel ranks without repeats (drop_last: every
    rank gets the same number of samples, so the same number of forward passes); a set smaller than the ranks is
    padded with repeats instead, so every rank evaluates something."""
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=len(dataset) >= num_replicas)
    return torch.utils.data.DataLoader(dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler)


def all_reduce_sum(t) -> None:
    """Sum ``t`` over every rank, in place."""
    dist.all_reduce(t)


def barrier() -> None:
    """Wait for every rank."""
    dist.barrier()


def teardown() -> None:
    """The end of every run, finished or stopped: destroy the process group, so no rank is left waiting."""
    dist.destroy_process_group()
