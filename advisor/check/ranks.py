"""Rank expressions: where a value comes from (``RANK`` vs ``LOCAL_RANK``) and what reads as a rank.

Two questions with opposite biases, both chosen to keep false findings rare:
- ``is_global_rank`` (MG004) is strict: it says yes only when the value is traced to the
  ``RANK`` environment variable or an argument-less ``dist.get_rank()``, through ``int()``/``str()``
  and plain assignments. Arithmetic (``rank % torch.cuda.device_count()``) is not a global rank.
- ``is_rank_like`` / ``is_main_flag`` (rank-0 guards, MG009) are generous: any name containing
  "rank", ``get_rank()``, ``process_index``, ``is_main_process``, ``master_process`` ... counts.
"""

from __future__ import annotations

import ast
import re

from .names import last_name
from .scope import Context

_ENV_READERS = {"os.environ.get", "os.getenv"}
_RANK_WORDS = {
    "gpu",
    "gpu_id",
    "ordinal",
    "get_ordinal",
    "process_index",
    "local_process_index",
    "proc_id",
    "process_id",
}
_MAIN_FLAG = re.compile(
    r"(^|_)(main|master|leader|chief)(_|$)|rank_?(0|zero)|(global|world|process)_?zero", re.IGNORECASE
)
_WRAPPERS = {"int", "str"}


def env_key(ctx: Context, expr: ast.AST) -> str | None:
    """The variable name read by ``os.environ["X"]``, ``os.environ.get("X", ...)`` or
    ``os.getenv("X")``; None for anything else."""
    if isinstance(expr, ast.Subscript) and ctx.qualname(expr.value) == "os.environ":
        key = expr.slice
    elif isinstance(expr, ast.Call) and ctx.call_name(expr) in _ENV_READERS and expr.args:
        key = expr.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _unwrap(expr: ast.AST) -> ast.AST:
    """``int(x)`` / ``str(x)`` -> ``x`` (repeatedly)."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Name)
        and expr.func.id in _WRAPPERS
        and len(expr.args) == 1
    ):
        expr = expr.args[0]
    return expr


def is_global_rank(ctx: Context, expr: ast.AST, depth: int = 0) -> bool:
    """True when ``expr`` is traced to the global rank: ``os.environ["RANK"]`` (any reader) or
    ``dist.get_rank()`` without a group, through ``int()``, ``str()`` and plain assignments."""
    expr = _unwrap(expr)
    if depth > 12:
        return False
    if isinstance(expr, ast.Name):
        value = ctx.lookup(expr)
        return value is not None and is_global_rank(ctx, value, depth + 1)
    if isinstance(expr, ast.Call) and ctx.call_name(expr) == "torch.distributed.get_rank":
        return not expr.args and not expr.keywords
    return env_key(ctx, expr) == "RANK"


def is_rank_like(ctx: Context, expr: ast.AST) -> bool:
    """Generous: a name, attribute or call whose last identifier mentions a rank (``rank``,
    ``args.local_rank``, ``dist.get_rank()``, ``xm.get_ordinal()``, ``accelerator.process_index``),
    an environment variable whose name contains RANK, or ``R % n`` / ``R // n`` of one of those."""
    expr = _unwrap(expr)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mod, ast.FloorDiv)):
        return is_rank_like(ctx, expr.left)  # args.rank % ngpus_per_node: the rank on this node
    key = env_key(ctx, expr)
    if key is not None:
        return "RANK" in key.upper()
    name = last_name(expr)
    return name is not None and ("rank" in name.lower() or name.lower() in _RANK_WORDS)


def is_main_flag(expr: ast.AST) -> bool:
    """A name, attribute or call that reads as "this is the main process": ``is_main_process``,
    ``accelerator.is_local_main_process``, ``master_process``, ``trainer.is_global_zero``,
    ``is_rank_zero()``, ``is_master``."""
    name = last_name(expr)
    return name is not None and bool(_MAIN_FLAG.search(name))
