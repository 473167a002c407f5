"""DDP training where rank 0 alone logs and writes checkpoints."""
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

logger = logging.getLogger(__name__)


def save_checkpoint(model: DDP, step: int) -> None:
    if dist.get_rank() != 0:
        return
    torch.save({"step": step, "model": model.module.state_dict()}, "checkpoint.pt")


def report(message: str) -> None:
    print(message, flush=True)


def main() -> None:
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    is_main_process = rank == 0
    torch.cuda.set_device(local_rank)
    model = DDP(torch.nn.Linear(512, 512).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    print(f"rank {rank}: starting", file=sys.stderr)
    for step in range(1000):
        loss = model(torch.randn(64, 512, device="cuda")).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            if is_main_process:
                logger.info("step %d loss %.4f", step, loss.item())
                report(f"step {step}")
            save_checkpoint(model, step)
    if rank == 0 and not os.environ.get("NO_SAVE"):
        torch.save(model.module.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
