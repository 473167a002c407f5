"""Streaming token shards: the IterableDataset shards itself by rank and DataLoader worker."""
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class TokenStream(IterableDataset):
    def __init__(self, paths: list[str], seq_len: int) -> None:
        self.paths, self.seq_len = paths, seq_len

    def __iter__(self):
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        shard = dist.get_rank() * workers + worker_id
        for path in self.paths[shard::dist.get_world_size() * workers]:
            tokens = torch.load(path, map_location="cpu")
            for start in range(0, len(tokens) - self.seq_len, self.seq_len):
                yield tokens[start:start + self.seq_len]


def main() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    stream = TokenStream([f"shard{i:03d}.pt" for i in range(64)], seq_len=1024)
    loader = DataLoader(stream, batch_size=8, num_workers=2)
    for _ in range(2):
        for batch in loader:
            batch.cuda(non_blocking=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
