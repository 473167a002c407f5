"""Requests advisor does not support yet, as data: each with a one-line pointer to what it does instead
today. The CLI checks its arguments against this table before argparse would answer "unrecognized
arguments" or "invalid choice" (``advisor.cli``); the messages name no face, so another face can show
them too.

One entry per request. When a request becomes supported (a real flag, or a new choice of an existing
one), delete its entry here and its row in ``tests/test_bad_input.py``: a test there fails while an
entry shadows something the CLI accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Unsupported:
    """``flags``: the flags that ask for it (any value). With ``values``: only these values of the flag
    (an existing flag whose other values are supported), compared case-insensitively with ``_`` as ``-``."""

    flags: tuple[str, ...]
    message: str
    values: tuple[str, ...] = ()


UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(
        ("--lora", "--qlora"),
        "LoRA is --lora-rank R (with --lora-targets, --lora-alpha, --lora-dropout); QLoRA adds --quantize nf4 "
        "(and --double-quant)",
    ),
    Unsupported(
        ("--load-in-4bit", "--load-in-8bit"),
        "a quantized frozen base is --quantize nf4 (or fp4, int8) with --lora-rank R (QLoRA)",
    ),
    Unsupported(
        ("--optimizer",),
        "the 8-bit optimizers are spelled adamw-8bit and paged-adamw-8bit (bitsandbytes)",
        values=("adam-8bit", "adamw8bit", "adam8bit", "paged-adamw8bit", "pagedadamw8bit"),
    ),
    Unsupported(
        ("--strategy",),
        "FSDP (the first version, FullyShardedDataParallel) is not a strategy here: use fsdp2 "
        "(fully_shard, its successor; fsdp2_noreshard is SHARD_GRAD_OP) or hsdp across nodes",
        values=("fsdp", "fsdp1"),
    ),
    Unsupported(
        ("--pipeline-parallel", "--pipeline-parallel-degree"),
        "pipeline parallelism is --pp-degree N (short: --pp N): a PP x DP row with every stage's memory "
        "(--strategy pp emits and verifies its script)",
    ),
    Unsupported(
        ("--inference",),
        "inference memory is not sized: advisor plans training only (weights, gradients, optimizer "
        "states and activations of a training step)",
    ),
)


def _norm(value: str) -> str:
    return value.strip().lower().replace("_", "-")


def find_unsupported(argv: Sequence[str], table: Sequence[Unsupported] = UNSUPPORTED) -> str | None:
    """The pointer of the first unsupported request in ``argv`` (``--flag``, ``--flag=value`` or
    ``--flag value``), or None. Stops at ``--`` (what follows is positional)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if not arg.startswith("--"):
            continue
        flag, eq, inline = arg.partition("=")
        for entry in table:
            if flag not in entry.flags:
                continue
            if not entry.values:
                return entry.message
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            if _norm(value) in entry.values:
                return entry.message
    return None
