"""Rank-0 guards: does a statement run on rank 0 only? (docs/pitfalls.md, pitfall 12)

Counts as a guard (``R`` is anything ``ranks.is_rank_like`` accepts):
- ``if R == 0`` / ``if 0 == R`` / ``if R <= 0`` / ``if R < 1`` / ``if R in (-1, 0)`` / ``if not R``
  / ``if os.environ["RANK"] == "0"``, and the ``else`` of ``if R != 0`` / ``if R > 0`` / ``if R``;
  ``if R == 3`` counts too (one rank writes: no race, the check is about every rank writing);
- a main-process flag: ``if is_main_process``, ``if accelerator.is_main_process``,
  ``if master_process``, ``if trainer.is_global_zero``, ``if is_rank_zero()``;
- ``and`` with a guard among its operands; ``or`` with a guard among its operands (generous:
  ``if not distributed or rank == 0`` is the usual single-process fallback);
- an earlier ``if R != 0: return`` (or ``continue``, ``break``, ``raise``, ``sys.exit()``) in the
  same block or an enclosing one, and ``if R == 0: ... else: return``;
- ``X if R == 0 else Y`` and ``R == 0 and f()``;
- the single-process branch of a script that starts the process group conditionally: the ``else`` of
  ``if ddp: dist.init_process_group(...)`` and the body of ``if not ddp:`` (nanoGPT, timm);
- a function decorated with ``@rank_zero_only`` (or a decorator naming main_process/master);
- code in a function whose every caller or reference in this file is guarded, and code in a
  function this file never calls or references (the caller, elsewhere, decides).

Does not count: ``if R != 1`` / ``if R > 1`` (several ranks); ``if args.save``; ``if epoch % 10 == 0``; ``if __name__ ==
"__main__"``; a guard in another file; a rank test stored in a variable with a neutral name
(``ok = rank == 0; if ok:``); ``while`` loops; ``try``/``with`` blocks.
"""

from __future__ import annotations

import ast
import re

from .names import INITS, last_name
from .ranks import is_main_flag, is_rank_like
from .scope import FUNCTIONS, Context

_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_EXIT_CALLS = {"exit", "quit", "_exit"}
_GUARD_DECORATOR = re.compile(r"rank_?(0|zero)|main_process|master", re.IGNORECASE)
_MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}


def _int(expr: ast.AST) -> int | None:
    """The integer a literal stands for: ``0``, ``-1``, ``"0"``; None otherwise."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        inner = _int(expr.operand)
        return None if inner is None else -inner
    if isinstance(expr, ast.Constant) and not isinstance(expr.value, bool):
        if isinstance(expr.value, int):
            return expr.value
        if isinstance(expr.value, str) and re.fullmatch(r"-?[0-9]{1,18}", expr.value):
            return int(expr.value)
    return None


def _compare(ctx: Context, test: ast.Compare) -> tuple[type[ast.cmpop], ast.AST] | None:
    """``R op value`` with the rank-like side put on the left; None when neither side is a rank."""
    if len(test.ops) != 1:
        return None
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if is_rank_like(ctx, left):
        return op, right
    if is_rank_like(ctx, right) and op in _MIRROR:
        return _MIRROR[op], left
    return None


def _values(expr: ast.AST) -> list[int | None]:
    return [_int(e) for e in expr.elts] if isinstance(expr, (ast.Tuple, ast.List, ast.Set)) else [None]


def _one_rank(op: type[ast.cmpop], value: ast.AST) -> bool:
    """``R == k``, ``R <= 0``, ``R < 1``, ``R in (-1, 0)``: true for rank 0 (or one fixed rank) only."""
    n, values = _int(value), _values(value)
    return (
        (op in (ast.Eq, ast.Is) and n is not None)
        or (op is ast.LtE and n == 0)
        or (op is ast.Lt and n == 1)
        or (op is ast.In and 0 in values and all(v is not None and v <= 0 for v in values))
    )


def _not_rank_zero(op: type[ast.cmpop], value: ast.AST) -> bool:
    """``R != 0``, ``R > 0``, ``R >= 1``, ``R not in (-1, 0)``: true on every rank but 0."""
    n = _int(value)
    return (
        (op in (ast.NotEq, ast.IsNot) and n == 0)
        or (op is ast.Gt and n == 0)
        or (op is ast.GtE and n == 1)
        or (op is ast.NotIn and 0 in _values(value))
    )


def _holds(ctx: Context, test: ast.AST, on_zero: bool) -> bool:
    """``on_zero``: ``test`` holds on rank 0 only; otherwise: on every rank but 0."""
    if isinstance(test, ast.BoolOp):
        return any(_holds(ctx, v, on_zero) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _holds(ctx, test.operand, not on_zero)
    if isinstance(test, (ast.Name, ast.Attribute, ast.Call)):
        return is_main_flag(test) if on_zero else is_rank_like(ctx, test)
    cmp = _compare(ctx, test) if isinstance(test, ast.Compare) else None
    return cmp is not None and (_one_rank(*cmp) if on_zero else _not_rank_zero(*cmp))


def zero_test(ctx: Context, test: ast.AST) -> bool:
    """True when ``test`` holds on rank 0 only, or one fixed rank (see the module docstring)."""
    return _holds(ctx, test, True)


def nonzero_test(ctx: Context, test: ast.AST) -> bool:
    """True when ``test`` holds on every rank but 0: ``R != 0``, ``R > 0``, ``R``, ``not is_main``."""
    return _holds(ctx, test, False)


def exits(block: list[ast.stmt]) -> bool:
    """Whether a block ends by leaving: return, continue, break, raise, sys.exit()/exit()/os._exit()."""
    if not block:
        return False
    last = block[-1]
    return isinstance(last, _EXITS) or (
        isinstance(last, ast.Expr) and last_name(last.value) in _EXIT_CALLS and isinstance(last.value, ast.Call)
    )


def _first_early_exit(
    ctx: Context, parent: ast.AST, field: str, block: list[ast.stmt]
) -> tuple[dict[ast.stmt, int], int | None]:
    """For one block: statement -> its index, and the index of the first ``if R != 0: return`` (or
    ``if R == 0: ... else: return``) in it (None: none). Computed once per block."""

    def index() -> tuple[dict[ast.stmt, int], int | None]:
        first = next(
            (
                i
                for i, stmt in enumerate(block)
                if isinstance(stmt, ast.If)
                and (
                    (nonzero_test(ctx, stmt.test) and exits(stmt.body))
                    or (zero_test(ctx, stmt.test) and exits(stmt.orelse))
                )
            ),
            None,
        )
        return {stmt: i for i, stmt in enumerate(block)}, first

    return ctx.remember(("early-exit", parent, field), index)


def _after_early_exit(ctx: Context, parent: ast.AST, child: ast.AST) -> bool:
    """An earlier sibling ``if R != 0: return`` (or ``if R == 0: ... else: return``) in ``child``'s block."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if not isinstance(block, list):
            continue
        index, first = _first_early_exit(ctx, parent, field, block)
        if child in index:
            return first is not None and first < index[child]
    return False


def _inits(ctx: Context, node: ast.If) -> bool:
    """Whether the body of ``node`` starts a process group (torch's init_process_group or deepspeed's);
    memoised per ``if``, since every statement of its ``else`` asks."""
    return ctx.remember(
        ("inits", node),
        lambda: any(isinstance(n, ast.Call) and ctx.call_name(n) in INITS for s in node.body for n in ast.walk(s)),
    )


def _distributed_flags(ctx: Context) -> set[str]:
    """Texts of ``if X:`` tests whose body starts the process group (``if ddp:``, ``if args.distributed:``):
    ``not X`` then means one process."""
    return ctx.remember(
        "distributed-flags",
        lambda: {ast.unparse(n.test) for n in ctx.nodes if isinstance(n, ast.If) and _inits(ctx, n)},
    )


def _in_else(ctx: Context, parent: ast.If, child: ast.AST) -> bool:
    """Whether ``child`` (a statement directly under ``parent``) is in its ``else`` rather than its body;
    a set per ``if``, so that a block of many statements is not scanned once per statement."""
    return id(child) in ctx.remember(("orelse", parent), lambda: set(map(id, parent.orelse)))


def _single_process_branch(ctx: Context, parent: ast.If, in_else: bool) -> bool:
    """The ``else`` of ``if ddp: init_process_group(...)``, or the body of ``if not ddp:``: one process."""
    if in_else:
        return _inits(ctx, parent)
    test = parent.test
    return (
        isinstance(test, ast.UnaryOp)
        and isinstance(test.op, ast.Not)
        and ast.unparse(test.operand) in _distributed_flags(ctx)
    )


def _branch_guard(ctx: Context, parent: ast.AST, child: ast.AST) -> bool:
    """``child`` is the rank-0 branch of an ``if``, a conditional expression or an ``and``, or the
    single-process branch of an ``if`` that starts the process group."""
    if isinstance(parent, ast.If):
        if child is parent.test:
            return False
        in_else = _in_else(ctx, parent, child)
        return (nonzero_test(ctx, parent.test) if in_else else zero_test(ctx, parent.test)) or _single_process_branch(
            ctx, parent, in_else
        )
    if isinstance(parent, ast.IfExp):
        return (child is parent.body and zero_test(ctx, parent.test)) or (
            child is parent.orelse and nonzero_test(ctx, parent.test)
        )
    if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And) and child in parent.values:
        return any(zero_test(ctx, v) for v in parent.values[: parent.values.index(child)])
    return False


def _locally_guarded(ctx: Context, node: ast.AST) -> bool:
    """A guard between ``node`` and its function (or the module), or a guard decorator."""
    child = node
    for parent in ctx.ancestors(node):
        if _branch_guard(ctx, parent, child) or _after_early_exit(ctx, parent, child):
            return True
        if isinstance(parent, FUNCTIONS):
            return any(_GUARD_DECORATOR.search(last_name(d) or "") for d in getattr(parent, "decorator_list", []))
        child = parent
    return False


def _references(ctx: Context, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """Loads of a function's name (calls and references like ``mp.spawn(main)``), or of a method's
    attribute name (``self.save()``, ``trainer.save()``)."""
    method = isinstance(ctx.parents.get(fn), ast.ClassDef)
    kind = ast.Attribute if method else ast.Name
    return [u for u in ctx.uses.get(fn.name, []) if isinstance(u, kind)]


def rank_zero_only(ctx: Context, node: ast.AST, _seen: frozenset[ast.AST] = frozenset()) -> bool:
    """Whether ``node`` runs on rank 0 only, as far as this file shows (see the module docstring)."""
    if _locally_guarded(ctx, node):
        return True
    fn = ctx.function_of(node)
    if fn is None:
        return False
    if isinstance(fn, ast.Lambda) or fn in _seen or fn.name.startswith("__"):
        return True  # unknown callers: leave it to them
    if _seen:  # inside a chain of callers: the answer depends on the chain, not cached
        return all(rank_zero_only(ctx, site, _seen | {fn}) for site in _references(ctx, fn))
    return ctx.remember(
        ("callers-guarded", fn),
        lambda: all(rank_zero_only(ctx, site, frozenset({fn})) for site in _references(ctx, fn)),
    )
