"""DDP training that saves state_dicts, which load into a freshly built model."""
import os

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def main() -> None:
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dataset = torchvision.datasets.FakeData(size=512, image_size=(3, 32, 32), num_classes=10,
                                            transform=torchvision.transforms.ToTensor())
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    net = torchvision.models.vit_b_16(image_size=32, num_classes=10).cuda(local_rank)
    model = DDP(net, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images.cuda()), labels.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            torch.save(model.module.state_dict(), f"epoch{epoch}.pt")
    if rank == 0:
        torch.save({"model": net.state_dict(), "optimizer": optimizer.state_dict()}, "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
