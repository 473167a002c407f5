"""Streaming token shards: an IterableDataset wrapped in a DistributedSampler."""
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset


class TokenStream(IterableDataset):
    def __init__(self, paths: list[str], seq_len: int) -> None:
        self.paths, self.seq_len = paths, seq_len

    def __iter__(self):
        for path in self.paths:
            tokens = torch.load(path, map_location="cpu")
            for start in range(0, len(tokens) - self.seq_len, self.seq_len):
                yield tokens[start:start + self.seq_len]


class ShuffledStream(TokenStream):
    pass


def main() -> None:
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    stream = ShuffledStream([f"shard{i:03d}.pt" for i in range(64)], seq_len=1024)
    sampler = DistributedSampler(stream)
    loader = DataLoader(stream, batch_size=8, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for batch in loader:
            batch.cuda(non_blocking=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
