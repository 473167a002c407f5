"""What the renderer reads of the finished plan it is handed, as protocols (``advisor.plan.Plan`` and its rows,
``advisor.rows.StrategyRow``, import strategies, so strategies cannot import them): ``RenderedPlan`` and its rows
as ``RenderedRow``. What a strategy itself reads of a row or a job is ``strategies.base.PlannedRow`` /
``ScriptJob``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .base import PlannedRow

if TYPE_CHECKING:
    from advisor.context import StrategyContext
    from advisor.hardware import Hardware
    from advisor.memory import StrategyMemory
    from advisor.models import ModelSpec
    from advisor.timing.step import StepTime
    from advisor.training_options import TrainingOptions


class RenderedRow(PlannedRow, Protocol):
    """What the renderer reads of a plan's row (``advisor.rows.StrategyRow``) beyond a strategy's own reading:
    why it does not apply, its learning rate, global batch, memory (bytes per GPU) and step time."""

    @property
    def reason(self) -> str | None: ...

    @property
    def learning_rate(self) -> float | None: ...

    @property
    def global_batch_size(self) -> int | None: ...

    @property
    def memory(self) -> StrategyMemory | None: ...

    @property
    def time(self) -> StepTime | None: ...


class RenderedPlan(Protocol):
    """What the renderer reads of a finished plan (``advisor.plan.Plan``)."""

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def options(self) -> TrainingOptions: ...

    @property
    def hardware(self) -> Hardware: ...

    @property
    def device(self) -> str: ...

    @property
    def attention(self) -> str: ...

    def row(self, name: str) -> RenderedRow:
        """The row of strategy ``name``.

        Raises:
            KeyError: a strategy the plan has no row for.
        """
        ...

    def context(self) -> StrategyContext:
        """The plan's ``StrategyContext`` (profile, hardware, resolved options, device)."""
        ...
