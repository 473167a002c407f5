"""Strategy registry: the CLI's ``--strategy`` choices and the plan's rows come from here."""

from __future__ import annotations

from .base import Strategy
from .ddp import DDP
from .tp import TensorParallel
from .zero import Zero

STRATEGIES: tuple[Strategy, ...] = (
    DDP(),
    Zero(1),
    Zero(2),
    Zero(3),
    Zero(2, offload=True),
    Zero(3, offload=True),
    TensorParallel(with_dp=False),
    TensorParallel(with_dp=True),
)
STRATEGY_NAMES: tuple[str, ...] = tuple(s.name for s in STRATEGIES)


def get_strategy(name: str) -> Strategy:
    for s in STRATEGIES:
        if s.name == name:
            return s
    raise KeyError(name)
