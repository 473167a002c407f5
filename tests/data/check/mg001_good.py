"""The DataParallel script moved to DDP: one process per GPU (torchrun --nproc_per_node=4 train.py)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def main() -> None:
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dataset = torchvision.datasets.FakeData(size=1024, image_size=(3, 64, 64), num_classes=10,
                                            transform=torchvision.transforms.ToTensor())
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=2, pin_memory=True)
    model = nn.Sequential(nn.Conv2d(3, 32, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(5):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images.cuda(local_rank)), labels.cuda(local_rank))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}")
    if rank == 0:
        torch.save(model.module.state_dict(), "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
