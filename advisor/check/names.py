"""Import aliases: which dotted name a local name stands for.

``Imports(tree)`` reads every ``import`` and ``from ... import`` in a file (at any depth: the
generated ZeRO script imports ``deepspeed`` inside ``main``) and maps the local name to the
qualified name, so that after ``import torch.distributed as dist`` the expression
``dist.init_process_group`` reads as ``torch.distributed.init_process_group``.

``canonical`` folds the module paths torch re-exports under a shorter name into one spelling
(``torch.nn.parallel.distributed.DistributedDataParallel`` and ``torch.nn.parallel.
DistributedDataParallel`` are the same class), so rules compare one string.

Blind spots: one table per file (a name imported differently in two functions keeps the last
import), relative imports and ``import *`` are not followed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

DDP = "torch.nn.parallel.DistributedDataParallel"
DATA_PARALLEL = "torch.nn.parallel.DataParallel"
SAMPLER = "torch.utils.data.DistributedSampler"
DATALOADER = "torch.utils.data.DataLoader"
ITERABLE_DATASET = "torch.utils.data.IterableDataset"
INIT_PG = "torch.distributed.init_process_group"
DS_INIT = "deepspeed.init_distributed"
INITS = frozenset({INIT_PG, DS_INIT})

# Longest prefix first; each rewrites a module path torch re-exports to the public spelling.
_PREFIXES = (
    ("torch.distributed.distributed_c10d.", "torch.distributed."),
    ("torch.nn.parallel.distributed.", "torch.nn.parallel."),
    ("torch.nn.parallel.data_parallel.", "torch.nn.parallel."),
    ("torch.nn.modules.batchnorm.", "torch.nn."),
    ("torch.utils.data.distributed.", "torch.utils.data."),
    ("torch.utils.data.dataloader.", "torch.utils.data."),
    ("torch.utils.data.dataset.", "torch.utils.data."),
    ("deepspeed.comm.", "deepspeed."),
)
_EXACT = {"torch.nn.DataParallel": DATA_PARALLEL}


def canonical(name: str) -> str:
    """The one spelling rules compare against for a qualified name."""
    for old, new in _PREFIXES:
        if name.startswith(old):
            name = new + name[len(old) :]
            break
    return _EXACT.get(name, name)


class Imports:
    """Local name -> qualified dotted name, from every import statement in ``tree`` (``nodes``: the
    tree's nodes in ``ast.walk`` order, when the caller has them already)."""

    def __init__(self, tree: ast.AST, nodes: Iterable[ast.AST] | None = None) -> None:
        self.table: dict[str, str] = {}
        self.modules: set[str] = set()
        for node in ast.walk(tree) if nodes is None else nodes:
            if isinstance(node, ast.Import):
                self._add_import(node)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                self._add_from(node)

    def _add_import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.modules.add(alias.name)
            if alias.asname:
                self.table[alias.asname] = alias.name
            else:  # ``import a.b.c`` binds ``a``
                top = alias.name.split(".")[0]
                self.table[top] = top

    def _add_from(self, node: ast.ImportFrom) -> None:
        assert node.module is not None, "called for imports that name their module"
        self.modules.add(node.module)
        for alias in node.names:
            if alias.name != "*":
                self.table[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(self, expr: ast.AST) -> str | None:
        """``a.b.c`` with ``a`` resolved through the imports, or None (not a name chain / not imported)."""
        parts: list[str] = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if not isinstance(expr, ast.Name) or expr.id not in self.table:
            return None
        return canonical(".".join([self.table[expr.id], *reversed(parts)]))


def last_name(expr: ast.AST) -> str | None:
    """The rightmost identifier of a name, attribute or call: ``args.local_rank`` -> ``local_rank``,
    ``dist.get_rank()`` -> ``get_rank``; None for anything else."""
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None
