"""ResNet-50 under DDP with 16 images per GPU: SyncBatchNorm shares statistics across GPUs."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torchvision.models import resnet50


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(resnet50(weights=None)).cuda(local_rank)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    for _ in range(50):
        images = torch.randn(16, 3, 224, 224, device="cuda")
        labels = torch.randint(0, 1000, (16,), device="cuda")
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
