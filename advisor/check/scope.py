"""What a rule needs to know about one parsed file: parents, scopes, imports and name bindings.

``Context`` answers the questions rules ask: what does ``model`` hold at this line (the last
visible ``model = ...`` before the use in the same function, else the module's last one), which
qualified name does a call target, is a node inside a loop, which function holds it.

Blind spots: values are followed through plain assignments only (``a = b``, ``a, b = x, y``,
``a: T = x``, ``a := x``); anything else that binds a name (parameters, ``for`` targets, ``with``
targets, ``a += x``, unpacking a call's result) makes the value unknown. Branches are not
reasoned about: "before" means earlier in the text. Attributes (``self.model``) are not followed.

Cost: one pass over the tree builds the indexes (parents, scopes, loops, bindings, calls by target)
and ``memo`` keeps what rules derive from them, so a check stays linear in the file's size.
"""

from __future__ import annotations

import ast
from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeGuard, TypeVar, cast

from .names import Imports

T = TypeVar("T")
N = TypeVar("N", bound=ast.AST)

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
        self.memo: dict[object, object] = {}  # per-file results rules and helpers compute once (``remember``)
        self.parents: dict[ast.AST, ast.AST] = {}
        self._scopes: dict[ast.AST, ast.AST] = {}  # node -> innermost function, lambda, class or module
        nodes: list[ast.AST] = []
        self._loops: dict[ast.AST, ast.AST] = {}  # node -> the loop_of it, where there is one
        self._inner_scopes: dict[ast.AST, list[ast.AST]] = defaultdict(list)  # scope -> scopes directly in it
        queue: deque[tuple[ast.AST, ast.AST, ast.AST | None]] = deque([(tree, tree, None)])  # ast.walk's order
        while queue:
            node, scope, loop = queue.popleft()
            nodes.append(node)
            inner: ast.AST
            if isinstance(node, SCOPES):
                self._inner_scopes[scope].append(node)
                inner, loop = node, None
            else:
                inner = scope
            heads = (
                (getattr(node, "iter", None), getattr(node, "test", None), getattr(node, "target", None))
                if isinstance(node, LOOPS)
                else ()
            )
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self._scopes[child] = inner
                child_loop = node if heads and child not in heads else loop
                if child_loop is not None:
                    self._loops[child] = child_loop
                queue.append((child, inner, child_loop))
        self.nodes = nodes
        self.imports = Imports(tree, nodes)
        self.calls = sorted((n for n in nodes if isinstance(n, ast.Call)), key=pos)
        self.identifiers = {n.id for n in nodes if isinstance(n, ast.Name)} | {
            n.attr for n in nodes if isinstance(n, ast.Attribute)
        }
        self.classes = {n.name: n for n in nodes if isinstance(n, ast.ClassDef)}
        functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = defaultdict(list)
        self.uses: dict[str, list[ast.AST]] = defaultdict(list)  # identifier -> loads of it (names, attributes)
        for n in nodes:
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                self.uses[n.id if isinstance(n, ast.Name) else n.attr].append(n)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[n.name].append(n)
        self.functions = dict(functions)  # name -> the functions and methods defined under it
        self._bindings: dict[tuple[ast.AST, str], list[Binding]] = defaultdict(list)
        self._globals: dict[ast.AST, set[str]] = defaultdict(set)
        # ``a.b = value`` anywhere in the file, by the target's text (None: a value not known, as from unpacking a
        # call): an attribute with one known value is followed by ``resolve`` (``run.model = DDP(...)`` in one
        # function, ``torch.save(run.model, ...)`` in another).
        self._attributes: dict[str, list[ast.expr | None]] = defaultdict(list)
        for node in nodes:
            if isinstance(node, ast.Global):
                self._globals[self.scope_of(node)].update(node.names)
        for node in nodes:
            self._collect(node)
        self._starts: dict[tuple[ast.AST, str], list[Pos]] = {}
        for key, items in self._bindings.items():
            items.sort(key=lambda b: b.at)
            self._starts[key] = [b.at for b in items]
        self._qualnames: dict[ast.AST, str | None] = {}
        self._by_name: dict[str | None, list[ast.Call]] | None = None

    # --- structure --------------------------------------------------------------------------
    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """Parents of ``node``, innermost first, up to the module."""
        while node in self.parents:
            node = self.parents[node]
            yield node

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module holding ``node``."""
        return self._scopes.get(node, self.tree)

    def function_of(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None:
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
        return self._loops.get(node)

    def remember(self, key: object, compute: Callable[[], T]) -> T:
        """``compute()`` once per file and ``key`` (kept in ``memo``; later calls return what it returned). Each key is
        computed by one call site, so what is kept under it has the type that site's ``compute`` returns."""
        if key not in self.memo:
            self.memo[key] = compute()
        return cast(T, self.memo[key])

    def loop_body(self, loop: ast.AST) -> list[ast.AST]:
        """Nodes that ``loop`` itself runs (``loop_of(n) is loop``): not those of loops nested in it,
        of nested functions, nor its own ``iter``/``test``/``target``. Indexed once per file."""

        def index() -> dict[ast.AST, list[ast.AST]]:
            bodies: dict[ast.AST, list[ast.AST]] = defaultdict(list)
            for node, owner in self._loops.items():
                bodies[owner].append(node)
            return bodies

        return self.remember("loop-bodies", index).get(loop, [])

    def scope_calls(self, scope: ast.AST) -> list[ast.Call]:
        """Calls in ``scope``'s own code (``in_scope``), in source order. Indexed once per file."""

        def index() -> dict[ast.AST, list[ast.Call]]:
            by_scope: dict[ast.AST, list[ast.Call]] = defaultdict(list)
            for call in self.calls:
                by_scope[self.scope_of(call)].append(call)
            return by_scope

        return self.remember("scope-calls", index).get(scope, [])

    def loads(self, scope: ast.AST, name: str) -> list[ast.Name]:
        """Loads of the variable ``name`` in ``scope``'s code and in the functions nested in it that
        do not bind ``name`` themselves (where it is the same variable)."""

        def build() -> dict[tuple[ast.AST, str], list[ast.Name]]:
            by_name: dict[tuple[ast.AST, str], list[ast.Name]] = defaultdict(list)
            for uses in self.uses.values():
                for use in uses:
                    if isinstance(use, ast.Name):
                        by_name[(self.scope_of(use), use.id)].append(use)
            return by_name

        index = self.remember("loads", build)
        found: list[ast.Name] = []
        stack = [scope]
        while stack:
            inner = stack.pop()
            found += index.get((inner, name), [])
            stack += (s for s in self._inner_scopes.get(inner, ()) if not self.binds(s, name))
        return found

    def mentions(self, *words: str) -> bool:
        """Whether any name or attribute in the file is one of ``words``."""
        return any(w in self.identifiers for w in words)

    # --- names --------------------------------------------------------------------------------
    def qualname(self, expr: ast.AST) -> str | None:
        """The canonical dotted name ``expr`` refers to (through imports and ``X = a.b`` aliases)."""
        if expr not in self._qualnames:
            self._qualnames[expr] = self._qualname(expr)
        return self._qualnames[expr]

    def _qualname(self, expr: ast.AST) -> str | None:
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
        if self._by_name is None:  # index every call by its target once (rules ask many times)
            self._by_name = defaultdict(list)
            for call in self.calls:
                self._by_name[self.call_name(call)].append(call)
        if len(names) == 1:
            return list(self._by_name.get(names[0], ()))
        return sorted((c for n in set(names) for c in self._by_name.get(n, ())), key=pos)

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
                index = bisect_right(self._starts[(scope, name.id)], pos(name))
                return found[index - 1].value if index else None
            if isinstance(scope, ast.Module):
                return None
            scope, first = self._outer_scope(scope), False

    def resolve(self, expr: N) -> N | ast.expr:
        """Follow ``expr`` through names to the value it was assigned; the last name if unknown."""
        found: N | ast.expr = expr
        for _ in range(_HOPS):
            if isinstance(found, ast.Attribute) and _dotted_names(found):
                # One known value: followed, even beside assignments of unknown values (``run.model, run.params =
                # prepare(...)`` before ``run.model = DDP(...)``); two known values, or none: unknown.
                known = [v for v in self._attributes.get(ast.unparse(found), []) if v is not None]
                if len(known) != 1:
                    return found
                found = known[0]
                continue
            if not isinstance(found, ast.Name):
                return found
            value = self.lookup(found)
            if value is None:
                return found
            found = value
        return found

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

    def _collect_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
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
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else []
            pairs = (
                isinstance(value, (ast.Tuple, ast.List))
                and len(values) == len(target.elts)
                and not any(isinstance(e, ast.Starred) for e in [*target.elts, *values])
            )
            for i, elt in enumerate(target.elts):
                self._bind_target(scope, elt, values[i] if pairs else None, at)
        elif isinstance(target, ast.Starred):
            self._bind_target(scope, target.value, None, at)
        elif isinstance(target, ast.Attribute) and _dotted_names(target):
            self._attributes[ast.unparse(target)].append(value)


def _dotted_names(node: ast.AST) -> bool:
    """Whether ``node`` is a chain of attributes on a plain name (``run.model``, ``self.net.body``)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def argument(call: ast.Call, index: int | None, name: str) -> ast.expr | None:
    """The argument passed as keyword ``name`` or at position ``index``; None when absent."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if (
        index is not None
        and index < len(call.args)
        and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1])
    ):
        return call.args[index]
    return None


def is_const(expr: ast.AST | None, value: object) -> TypeGuard[ast.Constant]:
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
    return out if len(out) <= limit else out[: limit - 3] + "..."
