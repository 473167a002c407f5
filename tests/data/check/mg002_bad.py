"""DDP fine-tuning where the DataLoader was left with shuffle=True next to the sampler."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train(epochs: int = 3) -> None:
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dataset = TensorDataset(torch.randn(4096, 32), torch.randint(0, 2, (4096,)))
    train_sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64,
                        shuffle=True,
                        sampler=train_sampler)
    eval_loader = DataLoader(dataset, batch_size=256, shuffle=True, sampler=DistributedSampler(dataset, shuffle=False))
    model = DistributedDataParallel(torch.nn.Linear(32, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        train_sampler.set_epoch(epoch)
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        correct = sum((model(x.cuda()).argmax(1) == y.cuda()).sum().item() for x, y in eval_loader)
    if dist.get_rank() == 0:
        print(f"rank-0 shard accuracy {correct / (len(dataset) / dist.get_world_size()):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
