"""Whole functions out of template modules: the body of a generated ``train.py`` is ``main()`` and, after it, every
function, class and module-level value it uses, each copied whole from the template sources, in the order ``main``
first reaches them (a reader meets a helper after its first caller). Nothing unused is written.

A template module is Python: its imports (the script's names under ``TYPE_CHECKING``) and module docstring are not
copied. A function or module-level value named ``NAME__VARIANT`` is one variant of ``NAME`` and is written, renamed
``NAME``, only where ``variants[NAME] == VARIANT``; a module-level ``NAME = NAME__VARIANT`` (what makes the module
importable with one variant) is not copied.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from advisor.errors import AdvisorError


@dataclass(frozen=True)
class Item:
    """One top-level definition: its names, its text and the names it refers to."""

    names: tuple[str, ...]
    text: str
    uses: tuple[str, ...]  # in the order of first use
    is_value: bool  # a module-level assignment (written before the functions: it runs at import)
    bases: tuple[str, ...] = ()  # a class's base classes: written before it (they are needed when it is defined)


def _is_guard(node: ast.stmt) -> bool:
    """``if TYPE_CHECKING:`` or ``if __name__ == "__main__":`` (neither is copied)."""
    if not isinstance(node, ast.If):
        return False
    test = ast.unparse(node.test)
    return test in ("TYPE_CHECKING", "__name__ == '__main__'")


def _alias(node: ast.stmt) -> bool:
    """``NAME = NAME__VARIANT``: the importable module's default variant."""
    return (
        isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Name)
        and node.value.id.startswith(node.targets[0].id + "__")
    )


def _target_names(node: ast.Assign | ast.AnnAssign) -> tuple[str, ...]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names: list[str] = []
    for t in targets:
        elts = t.elts if isinstance(t, ast.Tuple) else [t]
        names += [e.id for e in elts if isinstance(e, ast.Name)]
    return tuple(names)


def _start_line(node: ast.stmt, lines: list[str]) -> int:
    """The first line (0-based) of ``node`` with its decorators and the comment lines right above it."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while first > 0 and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    return first


def items_of(source: str, variants: Mapping[str, str], where: str, offered: set[str] | None = None) -> dict[str, Item]:
    """name -> ``Item`` for every top-level definition of ``source`` (a template module's text) that this job writes;
    the names offered in variants are added to ``offered``.

    Raises:
        AdvisorError: a statement that is neither a definition, an import nor a guard (a template bug).
    """
    tree = ast.parse(source)
    lines = source.splitlines()
    out: dict[str, Item] = {}
    for i, node in enumerate(tree.body):
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_guard(node) or _alias(node):
            continue
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the module's docstring
        end = node.end_lineno or node.lineno
        text = "\n".join(lines[_start_line(node, lines) : end])
        found = sorted((n.lineno, n.col_offset, n.id) for n in ast.walk(node) if isinstance(n, ast.Name))
        uses = tuple(dict.fromkeys(name for _, _, name in found))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
            base, sep, variant = name.partition("__")
            if sep and base and variant and not name.endswith("__"):
                if offered is not None:
                    offered.add(base)
                if variants.get(base) != variant:
                    continue
                text = text.replace(f"def {name}(", f"def {base}(", 1)
                name = base
            bases = tuple(b.id for b in node.bases if isinstance(b, ast.Name)) if isinstance(node, ast.ClassDef) else ()
            out[name] = Item((name,), text, tuple(u for u in uses if u != name), is_value=False, bases=bases)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            names = _target_names(node)
            base, sep, variant = names[0].partition("__") if len(names) == 1 else ("", "", "")
            if sep and base and variant and not names[0].endswith("__"):  # NAME__VARIANT = ...: a value's variant
                if offered is not None:
                    offered.add(base)
                if variants.get(base) != variant:
                    continue
                text = text.replace(f"{names[0]} =", f"{base} =", 1)
                names = (base,)
            item = Item(names, text, tuple(u for u in uses if u not in names), is_value=True)
            out.update(dict.fromkeys(names, item))
        else:
            raise AdvisorError(f"template {where}, line {node.lineno}: only definitions can be copied into a script")
    return out


def pick(sources: Sequence[tuple[str, str]], variants: Mapping[str, str], root: str = "main") -> str:
    """The script body: ``root`` and everything it reaches in ``sources`` ((where, text) pairs; a later definition of
    a name replaces an earlier one), values first, then ``root`` and the functions and classes in the order of first
    use (depth first; a class's base classes and the values a value reads before it). Names no source defines are
    left alone (the constants, builtins, imports).

    Raises:
        AdvisorError: ``root`` is not defined, a chosen variant that no source has, or a function offered in
            variants that the script uses with none chosen (a template bug).
    """
    defined: dict[str, Item] = {}
    offered: set[str] = set()
    for where, text in sources:
        defined.update(items_of(text, variants, where, offered))
    if root not in defined:
        raise AdvisorError(f"no {root}() in the templates")
    missing = sorted(name for name in variants if name not in defined)
    if missing:
        raise AdvisorError(f"no template defines the variant chosen for {', '.join(missing)}")
    order: list[Item] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        item = defined.get(name)
        if item is None or name in seen:
            return
        seen.update(item.names)
        for base in item.bases:  # a base class is defined before the class
            visit(base)
        if item.is_value:  # run at import: the values it reads are written before it
            for used in item.uses:
                visit(used)
        order.append(item)
        for used in item.uses:
            visit(used)

    visit(root)
    unchosen = sorted({u for item in order for u in item.uses if u in offered and u not in defined})
    if unchosen:
        raise AdvisorError(f"no variant chosen for {', '.join(unchosen)}")
    values = [i for i in order if i.is_value]
    functions = [i for i in order if not i.is_value]
    head = "\n".join(i.text for i in values)
    return (head + "\n\n\n" if head else "") + "\n\n\n".join(i.text for i in functions) + "\n"
