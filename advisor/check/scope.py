"""What a rule needs to know about one parsed file: parents, scopes, imports and name bindings.

``Context`` answers the questions rules ask: what does ``model`` hold at this line (the last
visible ``model = ...`` before the use in the same function, else the module's last one), which
qualified name does a call target, is a node inside a loop, which function holds it.

Blind spots: values are followed through plain assignments only (``a = b``, ``a, b = x, y``,
``a: T = x``, ``a := x``); anything else that binds a name (parameters, ``for`` targets, ``with``
targets, ``a += x``, unpacking a call's result) makes the value unknown. Branches are not
reasoned about: "before" means earlier in the text. Attributes (``self.model``) are not followed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator

from .names import Imports

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
SCOPES = (*FUNCTIONS, ast.ClassDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
_HOPS = 12
Pos = tuple[int, int]


def pos(node: ast.AST) -> Pos:
    """Where a node starts: (line, column)."""
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def end(node: ast.AST) -> Pos:
    """Where a node ends: (line, column)."""
    return (getattr(node, "end_lineno", 0) or 0, getattr(node, "end_col_offset", 0) or 0)


@dataclass(frozen=True)
class Binding:
    """``name`` holds ``value`` from ``at`` on; ``value`` is None when we cannot follow it."""

    at: Pos
    value: ast.expr | None


class Context:
    """A parsed file and the lookups rules share. Build once per file."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.tree, self.path = tree, path
        self.imports = Imports(tree)
        self.parents: dict[ast.AST, ast.AST] = {}
        for parent in ast.walk(tree):
            for child in ast.iter_child_nodes(parent):
                self.parents[child] = parent
        nodes = list(ast.walk(tree))
        self.calls = sorted((n for n in nodes if isinstance(n, ast.Call)), key=pos)
        self.identifiers = {n.id for n in nodes if isinstance(n, ast.Name)} | {
            n.attr for n in nodes if isinstance(n, ast.Attribute)}
        self.classes = {n.name: n for n in nodes if isinstance(n, ast.ClassDef)}
        self.uses: dict[str, list[ast.AST]] = defaultdict(list)  # identifier -> loads of it (names, attributes)
        for n in nodes:
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                self.uses[n.id if isinstance(n, ast.Name) else n.attr].append(n)
        self._bindings: dict[tuple[ast.AST, str], list[Binding]] = defaultdict(list)
        self._globals: dict[ast.AST, set[str]] = defaultdict(set)
        for node in nodes:
            if isinstance(node, ast.Global):
                self._globals[self.scope_of(node)].update(node.names)
        for node in nodes:
            self._collect(node)
        for items in self._bindings.values():
            items.sort(key=lambda b: b.at)

    # --- structure --------------------------------------------------------------------------
    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """Parents of ``node``, innermost first, up to the module."""
        while node in self.parents:
            node = self.parents[node]
            yield node

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module holding ``node``."""
        return next((a for a in self.ancestors(node) if isinstance(a, SCOPES)), self.tree)

    def function_of(self, node: ast.AST) -> ast.AST | None:
        """The innermost function or lambda holding ``node``; None at module or class level."""
        scope = self.scope_of(node)
        return scope if isinstance(scope, FUNCTIONS) else None

    def in_scope(self, scope: ast.AST) -> Iterator[ast.AST]:
        """Every node of ``scope``'s own code, not descending into nested functions or classes."""
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            yield node
            if not isinstance(node, SCOPES):
                stack.extend(ast.iter_child_nodes(node))

    def loop_of(self, node: ast.AST) -> ast.AST | None:
        """The innermost loop whose body (or else block) runs ``node``, within its function."""
        child = node
        for parent in self.ancestors(node):
            if isinstance(parent, SCOPES):
                return None
            if isinstance(parent, LOOPS) and child not in (getattr(parent, "iter", None), getattr(parent, "test", None),
                                                           getattr(parent, "target", None)):
                return parent
            child = parent
        return None

    def mentions(self, *words: str) -> bool:
        """Whether any name or attribute in the file is one of ``words``."""
        return any(w in self.identifiers for w in words)

    # --- names --------------------------------------------------------------------------------
    def qualname(self, expr: ast.AST) -> str | None:
        """The canonical dotted name ``expr`` refers to (through imports and ``X = a.b`` aliases)."""
        for _ in range(_HOPS):
            dotted = self.imports.dotted(expr)
            if dotted is not None or not isinstance(expr, ast.Name):
                return dotted
            value = self.lookup(expr)
            if not isinstance(value, (ast.Name, ast.Attribute)):
                return None
            expr = value
        return None

    def call_name(self, node: ast.AST) -> str | None:
        """The canonical qualified name a call targets, or None (not a call / not resolvable)."""
        return self.qualname(node.func) if isinstance(node, ast.Call) else None

    def calls_to(self, *names: str) -> list[ast.Call]:
        """Calls of any of the qualified ``names``, in source order."""
        wanted = set(names)
        return [c for c in self.calls if self.call_name(c) in wanted]

    def lookup(self, name: ast.Name) -> ast.expr | None:
        """The value ``name`` holds where it is used, or None when it is not followable."""
        scope, first = self.scope_of(name), True
        while True:
            if name.id in self._globals.get(scope, ()):
                scope, first = self.tree, False
            found = self._bindings.get((scope, name.id))
            if found:
                if not first:  # an enclosing scope: its code ran before this function is called
                    return found[-1].value
                before = [b for b in found if b.at <= pos(name)]
                return before[-1].value if before else None
            if isinstance(scope, ast.Module):
                return None
            scope, first = self._outer_scope(scope), False

    def resolve(self, expr: ast.expr) -> ast.expr:
        """Follow ``expr`` through names to the value it was assigned; the last name if unknown."""
        for _ in range(_HOPS):
            if not isinstance(expr, ast.Name):
                return expr
            value = self.lookup(expr)
            if value is None:
                return expr
            expr = value
        return expr

    def _outer_scope(self, scope: ast.AST) -> ast.AST:
        """The next function or module scope out (class bodies are not visible to methods)."""
        outer = self.scope_of(scope)
        while isinstance(outer, ast.ClassDef):
            outer = self.scope_of(outer)
        return outer

    # --- binding collection ---------------------------------------------------------------------
    def binds(self, scope: ast.AST, name: str) -> bool:
        """Whether ``scope`` binds ``name`` itself (so an outer ``name`` is hidden inside it)."""
        return bool(self._bindings.get((scope, name)))

    def _bind(self, scope: ast.AST, name: str, at: Pos, value: ast.expr | None) -> None:
        if name in self._globals.get(scope, ()):
            scope = self.tree
        self._bindings[(scope, name)].append(Binding(at, value))

    def _collect(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(self.scope_of(node), target, node.value, end(node))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._bind_target(self.scope_of(node), node.target, node.value, end(node))
        elif isinstance(node, ast.NamedExpr):
            self._bind_target(self.scope_of(node), node.target, node.value, end(node))
        elif isinstance(node, FUNCTIONS):
            self._collect_function(node)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.AugAssign)):
            self._bind_target(self.scope_of(node), node.target, None, pos(node))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind_target(self.scope_of(node.optional_vars), node.optional_vars, None, pos(node.optional_vars))
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self._bind(self.scope_of(node), node.name, pos(node), None)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                self._bind(self.scope_of(node), (alias.asname or alias.name).split(".")[0], pos(node), None)

    def _collect_function(self, node: ast.AST) -> None:
        if not isinstance(node, ast.Lambda):
            self._bind(self.scope_of(node), node.name, pos(node), None)
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
            if arg is not None:
                self._bind(node, arg.arg, pos(node), None)

    def _bind_target(self, scope: ast.AST, target: ast.AST, value: ast.expr | None, at: Pos) -> None:
        if isinstance(target, ast.Name):
            self._bind(scope, target.id, at, value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            pairs = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) and not any(
                isinstance(e, ast.Starred) for e in [*target.elts, *value.elts])
            for i, elt in enumerate(target.elts):
                self._bind_target(scope, elt, value.elts[i] if pairs else None, at)
        elif isinstance(target, ast.Starred):
            self._bind_target(scope, target.value, None, at)


def argument(call: ast.Call, index: int | None, name: str) -> ast.expr | None:
    """The argument passed as keyword ``name`` or at position ``index``; None when absent."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if index is not None and index < len(call.args) and not any(
            isinstance(a, ast.Starred) for a in call.args[:index + 1]):
        return call.args[index]
    return None


def is_const(expr: ast.AST | None, value: object) -> bool:
    """``expr`` is the literal ``value`` (``True`` is not ``1``)."""
    return isinstance(expr, ast.Constant) and type(expr.value) is type(value) and expr.value == value


def source(expr: ast.AST) -> str:
    """Source text of an expression (``...`` for what ``ast.unparse`` cannot write, e.g. a
    5000-digit hex literal)."""
    try:
        return ast.unparse(expr)
    except (ValueError, RecursionError):
        return "..."


def text(expr: ast.AST, limit: int = 60) -> str:
    """Source text of a small expression for messages, cut to ``limit`` characters."""
    out = source(expr)
    return out if len(out) <= limit else out[:limit - 3] + "..."
