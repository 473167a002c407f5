"""A DDP script that wraps the model before the process group exists."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = nn.parallel.DistributedDataParallel(MLP().cuda(), device_ids=[local_rank])
    dist.init_process_group(backend="nccl")
    data = TensorDataset(torch.randn(1000, 20), torch.randn(1000, 1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=50, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(5):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
