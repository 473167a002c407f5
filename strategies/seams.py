"""What strategies read of the objects the layers above them hand in, as protocols (the real classes import
strategies, so strategies cannot import them): the plan's row a strategy is sized in (``PlannedRow``:
``advisor.rows.StrategyRow``), the job its script is rendered for (``ScriptJob``: ``strategies.render.Job``), and
the finished plan the renderer reads (``RenderedPlan``: ``advisor.plan.Plan``, with its rows as ``RenderedRow``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from advisor.context import StrategyContext
    from advisor.hardware import Hardware
    from advisor.memory import StrategyMemory
    from advisor.models import ModelSpec
    from advisor.schema import TrainingOptions
    from advisor.timing.step import StepTime

    from .base import Strategy


class PlannedRow(Protocol):
    """What a strategy reads of the plan's row it is sized in (``advisor.rows.StrategyRow``)."""

    @property
    def applicable(self) -> bool: ...

    @property
    def grad_accum_steps(self) -> int | None: ...

    @property
    def dp_size(self) -> int: ...

    @property
    def tp_degree(self) -> int: ...


class ScriptJob(Protocol):
    """What a strategy reads of the job its script is rendered for (``strategies.render.Job``): sizes per GPU."""

    @property
    def strategy(self) -> str: ...

    @property
    def spec(self) -> ModelSpec: ...

    @property
    def precision(self) -> str: ...

    @property
    def optimizer(self) -> str: ...

    @property
    def micro_batch_size(self) -> int: ...

    @property
    def grad_accum_steps(self) -> int: ...

    @property
    def gpus_per_node(self) -> int: ...

    @property
    def num_nodes(self) -> int: ...

    @property
    def dp_size(self) -> int: ...

    @property
    def tp_degree(self) -> int: ...

    @property
    def ds_config(self) -> dict[str, object] | None: ...

    @property
    def master_port(self) -> int: ...

    @property
    def fsdp_grad_sync(self) -> str: ...

    @property
    def strategy_unit(self) -> Strategy: ...


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
