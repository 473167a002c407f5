"""DDP over a token stream that shards itself by rank (an IterableDataset needs no sampler); rank 0 alone
evaluates on a plain DataLoader."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, IterableDataset, TensorDataset


class RankStream(IterableDataset):
    def __iter__(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        for i in range(rank, 4096, world):
            yield torch.randn(32), i % 2


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    loader = DataLoader(RankStream(), batch_size=64)
    model = DistributedDataParallel(torch.nn.Linear(32, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        held_out = DataLoader(TensorDataset(torch.randn(256, 32), torch.randint(0, 2, (256,))), batch_size=64)
        with torch.no_grad():
            for x, y in held_out:
                print(torch.nn.functional.cross_entropy(model.module(x.cuda()), y.cuda()).item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
