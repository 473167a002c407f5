"""Resuming DDP training: every rank loads the checkpoint onto the GPU it was saved from."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", default="checkpoint.pt")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = build_model()
    state = torch.load(args.resume)
    model.load_state_dict(state["model"])
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    optimizer.load_state_dict(torch.load("optimizer.pt", weights_only=True))
    for _ in range(100):
        loss = model(torch.randn(32, 256, device="cuda")).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
