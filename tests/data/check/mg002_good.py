"""DDP fine-tuning: the sampler shuffles, the DataLoader does not (shuffle only without a sampler)."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train(epochs: int = 3) -> None:
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group(backend="nccl")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dataset = TensorDataset(torch.randn(4096, 32), torch.randint(0, 2, (4096,)))
    train_sampler = DistributedSampler(dataset) if distributed else None
    loader = DataLoader(dataset, batch_size=64, shuffle=train_sampler is None, sampler=train_sampler)
    model = torch.nn.Linear(32, 2).cuda()
    if distributed:
        model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if not distributed or dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    train()
