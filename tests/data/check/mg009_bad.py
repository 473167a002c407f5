"""DDP training where every rank logs and writes the same checkpoint file."""
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

logger = logging.getLogger(__name__)


def save_checkpoint(model: DDP, step: int) -> None:
    torch.save({"step": step, "model": model.module.state_dict()}, "checkpoint.pt")


def main() -> None:
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(512, 512).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    print("starting training")  # every rank prints the same line
    for step in range(1000):
        loss = model(torch.randn(64, 512, device="cuda")).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            logger.info("step %d loss %.4f", step, loss.item())
            save_checkpoint(model, step)
    if os.environ.get("SAVE_FINAL", "1") == "1":
        torch.save(model.module.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
