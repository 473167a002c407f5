"""What a strategy reads of the plan's row it is sized in, as a Protocol (``advisor.rows.StrategyRow`` sits above
strategies). ``strategies.base`` re-exports it."""

from __future__ import annotations

from typing import Protocol


class PlannedRow(Protocol):
    """What a strategy reads of the plan's row it is sized in (``advisor.rows.StrategyRow``, which sits above
    strategies)."""

    @property
    def applicable(self) -> bool: ...

    @property
    def grad_accum_steps(self) -> int | None: ...

    @property
    def dp_size(self) -> int: ...

    @property
    def tp_degree(self) -> int: ...
