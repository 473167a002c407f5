"""ResNet-style training under torchrun where the sampler never gets set_epoch."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EPOCHS = 20


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    train_set = TensorDataset(torch.randn(10_000, 128), torch.randint(0, 10, (10_000,)))
    val_set = TensorDataset(torch.randn(1_000, 128), torch.randint(0, 10, (1_000,)))
    train_sampler = DistributedSampler(train_set, shuffle=True, drop_last=True)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=128, sampler=train_sampler, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=256, sampler=val_sampler)
    model = DDP(torch.nn.Linear(128, 10).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9)
    for epoch in range(EPOCHS):
        model.train()
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x.cuda(local_rank)), y.cuda(local_rank))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            stats = torch.zeros(2, device=f"cuda:{local_rank}")
            for x, y in val_loader:
                stats += torch.tensor([(model(x.cuda(local_rank)).argmax(1).cpu() == y).sum(), len(y)],
                                      device=stats.device)
        dist.all_reduce(stats)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: val accuracy {stats[0] / stats[1]:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
