"""advisor doctor: a 2-rank all-reduce and a 2-step DDP loop, launched by torchrun."""

import datetime
import os
import sys

import torch
import torch.distributed as dist

backend, timeout_s = sys.argv[1], float(sys.argv[2])
rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def say(line: str) -> None:
    """One write() a line: both ranks share the log, and print() may split text and newline."""
    os.write(1, (line + "\n").encode())


say(f"DOCTOR_PID {os.getpid()}")
device = torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(local)  # LOCAL_RANK, not RANK (docs/pitfalls.md, pitfall 2)
    device = torch.device("cuda", local)
dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
t = torch.ones(4, device=device)
dist.all_reduce(t)
reduced = bool(torch.all(t == world))
model = torch.nn.Linear(8, 1).to(device)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if backend == "nccl" else None)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
torch.manual_seed(1 + rank)  # different data on each rank
for _ in range(2):
    opt.zero_grad()
    ddp(torch.randn(4, 8, device=device)).pow(2).mean().backward()
    opt.step()
w = torch.cat([p.detach().flatten() for p in model.parameters()])
ref = w.clone()
dist.broadcast(ref, 0)
in_sync = bool(torch.allclose(w, ref))
say(f"DOCTOR_OK rank={rank} allreduce={t[0].item():g} expected={world} ok={reduced and in_sync}")
dist.destroy_process_group()
sys.exit(0 if reduced and in_sync else 3)
