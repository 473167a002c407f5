"""The rule table. Each rule is a function ``check(ctx) -> Iterable[Hit]`` registered with ``@rule``;
its docstring says what it catches, its pitfall (docs/pitfalls.md) and its blind spots."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .scope import Context


@dataclass(frozen=True)
class Hit:
    """A rule's raw result: where, the specific message, and a severity when it differs from the rule's."""

    node: ast.AST
    message: str
    severity: str | None = None
    fix: str | None = None  # when it differs from the rule's


Check = Callable[[Context], Iterable[Hit]]


@dataclass(frozen=True)
class Rule:
    """One check: id (MG001...), default severity, pitfall numbers of docs/pitfalls.md (empty: the
    decision rules of docs/decisions.md), a short title and the fix in one sentence."""

    id: str
    severity: str
    pitfalls: tuple[int, ...]
    title: str
    fix: str
    check: Check = field(repr=False, compare=False)

    @property
    def pitfall(self) -> str:
        """``pitfall 3``, ``pitfalls 7, 14`` (docs/pitfalls.md) or ``decision rules`` (docs/decisions.md)."""
        if not self.pitfalls:
            return "decision rules"
        label = "pitfall" if len(self.pitfalls) == 1 else "pitfalls"
        return f"{label} {', '.join(map(str, self.pitfalls))}"

    @property
    def doc(self) -> str:
        """What it catches and its blind spots (the check function's docstring)."""
        return inspect.cleandoc(self.check.__doc__ or "")


REGISTRY: dict[str, Rule] = {}


def rule(rule_id: str, severity: str, pitfalls: tuple[int, ...], title: str, fix: str) -> Callable[[Check], Check]:
    """Register the decorated check function under ``rule_id``."""

    def register(check: Check) -> Check:
        REGISTRY[rule_id] = Rule(rule_id, severity, pitfalls, title, fix, check)
        return check

    return register
