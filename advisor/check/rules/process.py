"""Process-group and device rules: MG001 (DataParallel), MG004 (RANK picks the GPU), MG005 (DDP
before init_process_group), MG013 (no destroy_process_group)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..names import DATA_PARALLEL, DDP, INIT_PG, INITS, last_name
from ..ranks import is_global_rank
from ..registry import Hit, rule
from ..scope import FUNCTIONS, Context, argument, pos, text


@rule(
    "MG001",
    "error",
    (),
    "nn.DataParallel",
    "wrap the model in DistributedDataParallel, one process per GPU launched with torchrun",
)
def data_parallel(ctx: Context) -> Iterator[Hit]:
    """Catches a call of ``nn.DataParallel`` / ``torch.nn.DataParallel`` (any import alias): the
    strategy rules say DDP, never DP (one process, GPU 0 gathers everything).

    docs/decisions.md: the decision rules. Blind spots: DataParallel reached through ``getattr`` or a
    variable holding the class; ``isinstance(m, nn.DataParallel)`` is not a use and stays quiet.
    """
    for call in ctx.calls_to(DATA_PARALLEL):
        yield Hit(
            call,
            "nn.DataParallel runs one process that scatters inputs and gathers outputs on GPU 0: "
            "slower than DDP, and GPU 0 runs out of memory first",
        )


def _elements(expr: ast.AST) -> list[ast.AST]:
    """Items of ``[a, b]`` / ``(a,)``, also inside ``[x] if c else None``."""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return list(expr.elts)
    if isinstance(expr, ast.IfExp):
        return _elements(expr.body) + _elements(expr.orelse)
    return []


def _call_sinks(ctx: Context, call: ast.Call) -> Iterator[tuple[ast.AST, str]]:
    """(device index value, what uses it) for one call."""
    name = ctx.call_name(call)
    if name in ("torch.cuda.set_device", "torch.cuda.device") and call.args:
        yield call.args[0], name
    elif name == "torch.device":
        index = argument(call, 1, "index")
        if index is None and len(call.args) == 1:  # torch.device(3) is cuda:3
            index = call.args[0]
        if index is not None:
            yield index, "torch.device"
    for kw in call.keywords:
        if kw.arg == "device_ids":
            yield from ((e, "device_ids") for e in _elements(kw.value))
        elif kw.arg == "output_device":
            yield kw.value, "output_device"
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("cuda", "to") and len(call.args) == 1:
        yield call.args[0], f".{call.func.attr}()"


def _string_sink(node: ast.AST) -> ast.AST | None:
    """The ``x`` of ``f"cuda:{x}"``, ``"cuda:" + str(x)``, ``"cuda:%d" % x`` or ``"cuda:{}".format(x)``."""
    if isinstance(node, ast.JoinedStr) and len(node.values) == 2:
        head, value = node.values
        if isinstance(head, ast.Constant) and head.value == "cuda:" and isinstance(value, ast.FormattedValue):
            return value.value
    if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
        if (isinstance(node.op, ast.Add) and node.left.value == "cuda:") or (
            isinstance(node.op, ast.Mod) and node.left.value in ("cuda:%d", "cuda:%s")
        ):
            return node.right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
        and node.func.value.value == "cuda:{}"
        and node.args
    ):
        return node.args[0]
    return None


@rule(
    "MG004",
    "error",
    (2,),
    "global RANK used as the GPU index",
    "index the GPU with int(os.environ['LOCAL_RANK']) (torch.cuda.set_device(local_rank), device_ids=[local_rank])",
)
def rank_as_device(ctx: Context) -> Iterator[Hit]:
    """Catches a GPU index taken from the global rank: ``torch.cuda.set_device(x)``,
    ``torch.cuda.device(x)``, ``torch.device("cuda", x)``, ``torch.device(x)``, ``device_ids=[x]``, ``output_device=x``,
    ``.cuda(x)``, ``.to(x)`` and the strings ``f"cuda:{x}"``, ``"cuda:" + str(x)``, ``"cuda:%d" % x``,
    ``"cuda:{}".format(x)``, where ``x`` is traced (through ``int()``/``str()`` and plain assignments)
    to ``os.environ["RANK"]`` / ``os.environ.get("RANK")`` / ``os.getenv("RANK")`` or an argument-less
    ``dist.get_rank()``. On a second node the global rank exceeds the local GPU count.

    docs/pitfalls.md: pitfall 2. Quiet for LOCAL_RANK, for ``rank % torch.cuda.device_count()`` and for
    anything not traced: function parameters (``mp.spawn`` passes the local index as ``rank``),
    ``args.rank``, values read from attributes or returned by functions.
    """
    seen: set[tuple[int, int]] = set()
    for node in ctx.nodes:
        pairs = list(_call_sinks(ctx, node)) if isinstance(node, ast.Call) else []
        value = _string_sink(node)
        if value is not None:
            pairs.append((value, "a 'cuda:N' device string"))
        for value, what in pairs:
            if is_global_rank(ctx, value) and pos(node) not in seen:
                seen.add(pos(node))
                yield Hit(
                    node,
                    f"{what} gets `{text(value)}`, which comes from the global RANK, not LOCAL_RANK: "
                    "on more than one node it names a GPU that does not exist",
                )


@rule(
    "MG005",
    "error",
    (1,),
    "DDP before init_process_group",
    "call dist.init_process_group(...) before wrapping the model in DistributedDataParallel",
)
def ddp_before_init(ctx: Context) -> Iterator[Hit]:
    """Catches ``DistributedDataParallel(...)`` written before the first ``init_process_group(...)``
    (or ``deepspeed.init_distributed()``) of the same function, or at module level before a
    module-level init: DDP raises "Default process group has not been initialized".

    docs/pitfalls.md: pitfall 1. Order is text order, not control flow. Quiet when the function has no
    init call at all (it may be initialised by a caller or a helper such as ``setup()``).
    """
    scopes = [ctx.tree, *(n for n in ctx.nodes if isinstance(n, FUNCTIONS))]
    for scope in scopes:
        calls = ctx.scope_calls(scope)
        inits = [pos(c) for c in calls if ctx.call_name(c) in INITS]
        for call in calls:
            if inits and pos(call) < inits[0] and ctx.call_name(call) == DDP:
                yield Hit(
                    call,
                    f"DistributedDataParallel is built before init_process_group (line {inits[0][0]}): "
                    "it fails with 'Default process group has not been initialized'",
                )


_TEARDOWN = re.compile(r"cleanup|clean_up|destroy|teardown|tear_down|shutdown|finali[sz]e", re.IGNORECASE)


def _names_destroy(ctx: Context, expr: ast.AST) -> bool:
    """``expr`` names ``destroy_process_group`` (through imports, aliases and assignments)."""
    name = (ctx.qualname(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None) or last_name(expr)
    return (name or "").rsplit(".", 1)[-1] == "destroy_process_group"


def _destroys(ctx: Context) -> bool:
    """Whether the file tears its process group down: a call of ``destroy_process_group`` (under any
    import alias or ``X = dist.destroy_process_group`` name), the function handed to another call
    (``atexit.register(dist.destroy_process_group)``), or a call of a function not defined in this
    file (nor torch's: ``rpc.shutdown()``) whose name says teardown (``utils.cleanup_distributed()``:
    its body is out of sight)."""
    for call in ctx.calls:
        if _names_destroy(ctx, call.func):
            return True
        short = last_name(call.func) or ""
        if (
            _TEARDOWN.search(short)
            and short not in ctx.functions
            and not (ctx.call_name(call) or "").startswith("torch.")
        ):
            return True
        handed = [*call.args, *(k.value for k in call.keywords)]
        if any(not isinstance(a, ast.Call) and _names_destroy(ctx, a) for a in handed):
            return True
    return False


@rule(
    "MG013",
    "warning",
    (19,),
    "no destroy_process_group",
    "call dist.destroy_process_group() at the end of training (after the last collective)",
)
def no_destroy(ctx: Context) -> Iterator[Hit]:
    """Catches a file that calls ``torch.distributed.init_process_group`` (any import alias) and never
    calls ``destroy_process_group``: NCCL may hang or warn at exit, and a later group in the same
    process fails.

    Counts as a teardown: ``dist.destroy_process_group()`` under any alias (``from torch.distributed
    import destroy_process_group as cleanup``; ``cleanup()``), the function passed to a call
    (``atexit.register(dist.destroy_process_group)``), and a call of a function defined in another
    file whose name contains cleanup, destroy, teardown, shutdown or finalize
    (``utils.cleanup_distributed()``; torch's own, such as ``rpc.shutdown()``, do not count). Not a
    teardown: the name written without ``()`` (``dist.destroy_process_group`` alone does nothing).
    ``deepspeed.init_distributed()`` is not checked: DeepSpeed's own examples never destroy the group
    it makes.

    docs/pitfalls.md: pitfall 19. Blind spots: a destroy in another file reached through a helper with a
    neutral name (suppress it with ``# advisor: ignore[MG013]`` on the init line); an in-file
    helper is judged by its body, so a ``cleanup()`` defined here that does not destroy still fires.
    Only scripts are checked (an ``if __name__ == "__main__":`` block or calls at module level): a
    library module that defines ``setup()`` leaves the teardown to its caller.
    """
    inits = ctx.calls_to(INIT_PG)
    if inits and _is_entry_point(ctx) and not _destroys(ctx):
        yield Hit(inits[0], "the process group is initialised but never destroyed")


def _is_entry_point(ctx: Context) -> bool:
    """Whether the file runs as a script: an ``if __name__ == "__main__":`` block, or statements at
    module level that call something (beyond imports, definitions and assignments of constants). A
    module that only defines a ``setup()`` helper leaves the teardown to the script that imports it."""
    for stmt in ctx.tree.body:
        if isinstance(stmt, ast.If) and "__name__" in text(stmt.test) and "__main__" in text(stmt.test):
            return True
        if isinstance(stmt, (ast.Expr, ast.For, ast.While, ast.With)) and any(
            isinstance(n, ast.Call) for n in ast.walk(stmt)
        ):
            return True
    return False
