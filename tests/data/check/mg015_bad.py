"""DDP fine-tuning whose DataLoader shuffles the whole dataset on every rank: the GPUs train on the same batches."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(4096, 32), torch.randint(0, 2, (4096,)))
    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    model = DistributedDataParallel(torch.nn.Linear(32, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
