"""GPT-style DDP training with gradient accumulation that all-reduces on every micro-step."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM_STEPS = 8


def main() -> None:
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    layer = nn.TransformerEncoderLayer(d_model=256, nhead=8, batch_first=True)
    model = DDP(nn.TransformerEncoder(layer, num_layers=4).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler("cuda")
    for i in range(1000):
        x = torch.randn(8, 128, 256, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).pow(2).mean() / ACCUM_STEPS
        scaler.scale(loss).backward()
        if (i + 1) % ACCUM_STEPS == 0:
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
