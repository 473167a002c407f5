"""The strategy registry: the plan's rows, the CLI's and the page's ``--strategy`` choices and every
face's list of strategies come from here. A new strategy is one module plus one line in ``_BUILTIN``.

``REGISTRY.added(strategy)`` registers one more for the duration of a ``with`` block (tests use it to
check that a strategy defined in one module reaches the CLI, the page and the plan).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from advisor.training_options import TrainingOptions

from .base import Strategy
from .ddp import DDP
from .fsdp2 import FSDP2
from .pp import PipelineParallel
from .single import Single
from .tp import TensorParallel
from .zero import Zero

_BUILTIN: tuple[Strategy, ...] = (
    Single(),
    DDP(),
    Zero(1),
    Zero(2),
    Zero(3),
    Zero(2, offload=True),
    Zero(3, offload=True),
    FSDP2(),
    FSDP2(reshard=False),
    FSDP2(offload=True),
    FSDP2(hybrid=True),
    TensorParallel(with_dp=False),
    TensorParallel(with_dp=True),
)


# Rows a plan has only when the user pins them (``Strategy.pinned``: ``--pp-degree``): not --strategy choices, so
# every plan without the pin keeps its rows.
PINNED: tuple[Strategy, ...] = (PipelineParallel(), PipelineParallel(zero_stage=1))


class Registry:
    """The ordered, immutable-by-default tuple of strategies; reads are lock-free snapshots."""

    def __init__(self, strategies: tuple[Strategy, ...]) -> None:
        self._strategies = strategies
        self._lock = threading.Lock()

    def all(self) -> tuple[Strategy, ...]:
        return self._strategies

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._strategies)

    def get(self, name: str) -> Strategy:
        """Raises KeyError for an unknown name."""
        for s in self._strategies:
            if s.name == name:
                return s
        raise KeyError(name)

    @contextlib.contextmanager
    def added(self, strategy: Strategy) -> Iterator[Strategy]:
        with self._lock:
            if strategy.name in self.names():
                raise ValueError(f"a strategy named {strategy.name!r} is registered already")
            self._strategies = self._strategies + (strategy,)
        try:
            yield strategy
        finally:
            with self._lock:
                self._strategies = tuple(s for s in self._strategies if s is not strategy)


REGISTRY = Registry(_BUILTIN)


def all_strategies() -> tuple[Strategy, ...]:
    return REGISTRY.all()


def planned_strategies(options: TrainingOptions) -> tuple[Strategy, ...]:
    """The strategies a plan with ``options`` sizes: every registered one, then the pinned ones it asks for."""
    return REGISTRY.all() + tuple(s for s in PINNED if s.pinned(options))


def strategy_names() -> tuple[str, ...]:
    return REGISTRY.names()


def runnable_names() -> tuple[str, ...]:
    """What --emit and --verify take: every registered strategy and the pinned rows (a plan has them when pinned)."""
    return REGISTRY.names() + tuple(s.name for s in PINNED)


def get_strategy(name: str) -> Strategy:
    """A registered strategy, else a pinned row's (``PINNED``). Raises KeyError for an unknown name."""
    pinned = {s.name: s for s in PINNED}
    return pinned[name] if name in pinned and name not in REGISTRY.names() else REGISTRY.get(name)


__all__ = [
    "PINNED",
    "REGISTRY",
    "Strategy",
    "all_strategies",
    "get_strategy",
    "planned_strategies",
    "runnable_names",
    "strategy_names",
]
