"""Hand-rolled data parallelism: gradients are summed across ranks, then divided by the world size."""
import os

import torch
import torch.distributed as dist


def average_gradients(model: torch.nn.Module) -> None:
    world_size = float(dist.get_world_size())
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
            param.grad.data /= world_size


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(100):
        x = torch.randn(32, 10)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        average_gradients(model)
        optimizer.step()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    if int(os.environ["RANK"]) == 0:
        print("final gradient norm", flat.norm().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
