"""The training text train.py reads with --data: a .txt file, a .jsonl file with a 'text' field per line, or a
datasets directory (save_to_disk) with a 'text' column, tokenized, packed into blocks of one sequence length and split
into training and held-out blocks. train.py passes its constants in."""

import json
import os

import torch


class PackedText(torch.utils.data.Dataset):
    """Consecutive ``seq_len``-token blocks of one token stream (documents joined by EOS): no padding."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.blocks = tokens[: len(tokens) // seq_len * seq_len].view(-1, seq_len)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


def read_documents(path: str) -> list[str]:
    """A datasets directory's 'text' column (its train split), a JSONL file's 'text' fields, or a text file."""
    if os.path.isdir(path):
        try:
            import datasets  # optional: only for directories written by Dataset.save_to_disk
        except ImportError:
            raise SystemExit(f"--data {path}: a directory is read as a datasets save_to_disk directory: pip install "
                             "datasets, or pass a .txt or .jsonl file") from None
        try:
            data = datasets.load_from_disk(path)
        except FileNotFoundError:
            raise SystemExit(f"--data {path}: not a datasets save_to_disk directory: pass one, or a .txt or .jsonl "
                             "file") from None
        data = data["train"] if isinstance(data, datasets.DatasetDict) else data
        if "text" not in data.column_names:
            raise SystemExit(f"--data {path}: no 'text' column (columns: {', '.join(data.column_names)})")
        return list(data["text"])
    number = 0
    try:
        with open(path, encoding="utf-8") as f:
            if not path.endswith((".jsonl", ".json")):
                return [f.read()]
            docs = []
            for number, line in enumerate(f, start=1):
                if line.strip():
                    record = json.loads(line)
                    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                        raise SystemExit(f"--data {path}:{number}: each line needs a 'text' string")
                    docs.append(record["text"])
            return docs
    except UnicodeDecodeError:
        raise SystemExit(f"--data {path}: not UTF-8 text: pass a .txt or .jsonl file") from None
    except json.JSONDecodeError as err:
        raise SystemExit(f"--data {path}:{number}: not JSON ({err.msg})") from None


def packed_blocks(path: str, tokenizer, source: str, seq_len: int, vocab_size: int,
                  held_out_fraction: float) -> tuple[PackedText, PackedText, str]:
    """(training blocks, held-out blocks, a line saying what was read): --data ``path`` tokenized with ``tokenizer``
    (from ``source``, named in errors), EOS after each document, the last ``held_out_fraction`` of the blocks held
    out. Every rank tokenizes the same file the same way, so the blocks agree without communication (for many GB,
    tokenize once ahead into a datasets directory)."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = []
    for doc in read_documents(path):
        ids += tokenizer(doc, add_special_tokens=False)["input_ids"] + eos
    tokens = torch.tensor(ids, dtype=torch.long)
    if len(tokens) and int(tokens.max()) >= vocab_size:
        raise SystemExit(f"--tokenizer {source}: token id {int(tokens.max())} is outside the model's vocabulary "
                         f"({vocab_size}): use the model's own tokenizer")
    blocks = len(tokens) // seq_len
    held_out = max(1, round(blocks * held_out_fraction))
    if blocks - held_out < 1:
        raise SystemExit(f"--data {path}: {len(tokens)} tokens make {blocks} blocks of {seq_len}: too few to "
                         "train and hold some out")
    split = (blocks - held_out) * seq_len
    said = f"data: {len(tokens):,} tokens -> {blocks - held_out} training and {held_out} held-out blocks of {seq_len}"
    return PackedText(tokens[:split], seq_len), PackedText(tokens[split:], seq_len), said
