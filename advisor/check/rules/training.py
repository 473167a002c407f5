"""Training-loop rules: MG010 (BatchNorm without SyncBatchNorm), MG011 (gradient accumulation
without no_sync), MG012 (hand-written gradient all_reduce without division)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator

from ..guards import exits
from ..names import DDP, last_name
from ..registry import Hit, rule
from ..scope import FUNCTIONS, LOOPS, Context, argument, pos, source, text

_BN_CLASSES = {f"torch.nn.{lazy}BatchNorm{d}d" for lazy in ("", "Lazy") for d in (1, 2, 3)}
_BN_MODELS = re.compile(
    r"^(resnet\d+|resnext\w+|wide_resnet\w+|densenet\d+|vgg\d+_bn|mobilenet_v[23]\w*|"
    r"efficientnet_\w+|regnet_\w+|inception_v3|googlenet|shufflenet_v2\w*|mnasnet\w*)$"
)
_WORLD = re.compile(r"world|nranks|n_ranks|num_replicas|num_processes|n_?gpus|num_gpus|dp_size|^ws$", re.I)
_GRAD_NAME = re.compile(r"(^|_)grads?$|^grads?_", re.I)
_NOT_GRAD = re.compile(r"norm|num|count|none|clip|scale|hook|fn", re.I)
_DIVIDERS = {"div_", "div", "true_divide_", "true_divide"}


def _batchnorm(ctx: Context, call: ast.Call) -> str | None:
    """What BatchNorm a call builds: ``nn.BatchNorm2d`` or a torchvision model with BatchNorm layers."""
    name = ctx.call_name(call) or ""
    if name in _BN_CLASSES:
        return name.removeprefix("torch.")
    if not name.startswith("torchvision.models."):
        return None
    model = name.rsplit(".", 1)[1]
    if model == "get_model":
        arg = argument(call, 0, "name")
        model = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""
    return f"torchvision {model}" if _BN_MODELS.match(model) else None


@rule(
    "MG010",
    "info",
    (8,),
    "BatchNorm under DDP without SyncBatchNorm",
    "with a small per-GPU batch (about 8-32) convert: model = nn.SyncBatchNorm.convert_sync_batchnorm(model) "
    "before DDP, or use GroupNorm/LayerNorm",
)
def batchnorm_not_synced(ctx: Context) -> Iterator[Hit]:
    """Catches, once per file, the first BatchNorm construction (``nn.BatchNorm1d/2d/3d``, the lazy
    variants, torchvision ``resnet*``, ``resnext*``, ``wide_resnet*``, ``densenet*``, ``vgg*_bn``,
    ``mobilenet_v2/v3*``, ``efficientnet_*``, ``regnet_*``, ``inception_v3``, ``googlenet``,
    ``shufflenet_v2*``, ``mnasnet*``, also via ``get_model("resnet50")``) in a file that builds a
    DistributedDataParallel and never mentions ``convert_sync_batchnorm`` or ``SyncBatchNorm``
    (a conditional conversion counts). Each GPU then normalises with its own small batch.

    docs/pitfalls.md: pitfall 8. Info only: with a large per-GPU batch per-GPU statistics are fine.
    Blind spots: models defined in other files, timm/other model zoos.
    """
    if not ctx.calls_to(DDP) or ctx.mentions("convert_sync_batchnorm", "SyncBatchNorm"):
        return
    for call in ctx.calls:
        what = _batchnorm(ctx, call)
        if what:
            yield Hit(call, f"{what} under DistributedDataParallel keeps per-GPU BatchNorm statistics")
            return


def _within(ctx: Context, loop: ast.AST) -> Iterator[ast.AST]:
    """Nodes run by ``loop`` itself (not by a loop nested in it, nor by nested functions)."""
    return iter(ctx.loop_body(loop))


def _optimizer_step(node: ast.AST) -> bool:
    """``optimizer.step()``, ``opt.step()``, ``scaler.step(optimizer)``, ``optimizer_step(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "step":
        owner = (last_name(func.value) or "").lower()
        return ("optim" in owner or owner == "opt" or "scaler" in owner) and "sched" not in owner
    name = (last_name(func) or "").lower()
    return "step" in name and "optim" in name


def _conditional_step(ctx: Context, loop: ast.AST) -> bool:
    """The loop steps the optimizer only when an ``if`` with ``%`` allows it (in its body, or after
    an ``if ...%...: continue``)."""
    for node in _within(ctx, loop):
        if not isinstance(node, ast.If) or not any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(node.test)
        ):
            continue
        if any(_optimizer_step(n) for stmt in node.body for n in ast.walk(stmt)):
            return True
        if exits(node.body) and any(_optimizer_step(n) for n in _within(ctx, loop)):
            return True
    return False


_SYNC_WORDS = ("no_sync", "require_backward_grad_sync")


def _names(nodes: Iterable[ast.AST]) -> set[str]:
    """Identifiers (names and attributes) among ``nodes``."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in nodes if isinstance(n, (ast.Name, ast.Attribute))}


def _sync_helpers(ctx: Context) -> set[str]:
    """Names that stand for ``no_sync`` in this file: functions whose body mentions it (also through
    other such functions) and names or attributes assigned an expression that mentions it
    (``self.sync_context = model.no_sync``)."""

    def find() -> set[str]:
        helpers: set[str] = set()
        bodies = {fn: _names(ast.walk(fn)) for fns in ctx.functions.values() for fn in fns}
        assigned = [(_names(ast.walk(n.value)), n.targets) for n in ctx.nodes if isinstance(n, ast.Assign)]
        while True:
            known = helpers | set(_SYNC_WORDS)
            grown = {fn.name for fn, names in bodies.items() if names & known}
            grown |= {
                t.id if isinstance(t, ast.Name) else t.attr
                for names, targets in assigned
                if names & known
                for t in targets
                if isinstance(t, (ast.Name, ast.Attribute))
            }
            if grown <= helpers:
                break
            helpers |= grown
        return helpers

    return ctx.remember("sync-helpers", find)


def _skips_sync(ctx: Context, loop: ast.AST) -> bool:
    """Whether the code around an accumulating loop may skip the all-reduce: its outermost enclosing
    function (the module's own code at top level) mentions ``no_sync`` or
    ``require_backward_grad_sync``, or a name that stands for them (``_sync_helpers``)."""
    region = next((a for a in reversed(list(ctx.ancestors(loop))) if isinstance(a, FUNCTIONS)), ctx.tree)
    names = ctx.remember(
        ("region-names", region), lambda: _names(ast.walk(region) if region is not ctx.tree else ctx.in_scope(ctx.tree))
    )
    return bool(names & (set(_SYNC_WORDS) | _sync_helpers(ctx)))


@rule(
    "MG011",
    "warning",
    (16,),
    "gradient accumulation without no_sync",
    "wrap the non-final micro-steps in `with ddp_model.no_sync():` so only the last one all-reduces",
)
def accumulation_without_no_sync(ctx: Context) -> Iterator[Hit]:
    """Catches a loop that calls ``.backward()`` and steps the optimizer only under an ``if`` whose
    test uses ``%`` (``if (i + 1) % accum == 0: optimizer.step()``, or ``if i % accum: continue``
    before the step), in a file that builds a DistributedDataParallel, when the function holding the
    loop does not mention ``no_sync``: every micro-step all-reduces gradients, N-1 of them for
    nothing. Reported on the ``backward()``.

    Quiet when the outermost function around the loop (for top-level loops, the module's own code)
    mentions ``no_sync`` or nanoGPT's ``require_backward_grad_sync``, or a name that stands for them
    in this file: a function whose body mentions them (``with self.sync_context(i):``) or a name or
    attribute assigned from an expression that does (``self.maybe_sync = model.no_sync``). Another
    function of the same file that uses ``no_sync`` does not silence this one.

    docs/pitfalls.md: pitfall 16. Blind spots: accumulation tests without ``%`` (counters compared with
    ``==``), optimizer steps through helpers not named like ``optimizer_step``, DDP built in
    another file, a no_sync context made by a helper in another file under a neutral name.
    """
    if not ctx.calls_to(DDP):
        return
    for loop in (n for n in ctx.nodes if isinstance(n, LOOPS)):
        backward = min(
            (
                n
                for n in _within(ctx, loop)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
            ),
            key=pos,
            default=None,
        )
        if backward is not None and _conditional_step(ctx, loop) and not _skips_sync(ctx, loop):
            yield Hit(
                backward,
                "gradient accumulation under DDP all-reduces on every backward(), not just before optimizer.step()",
            )


def _key(expr: ast.AST) -> str:
    """A tensor expression compared by text, ``.data`` removed: ``p.grad.data`` -> ``p.grad``."""
    while isinstance(expr, ast.Attribute) and expr.attr == "data":
        expr = expr.value
    return source(expr)


def _gradient_name(name: str) -> bool:
    """``grad``, ``grads``, ``flat_grads``, ``grad_buffer``; not ``grad_norm``, ``num_grad_none``."""
    return bool(_GRAD_NAME.search(name)) and not _NOT_GRAD.search(name)


def _grad_like(ctx: Context, expr: ast.AST) -> bool:
    """``p.grad``, a gradient-named variable, or a name assigned from an expression with ``.grad``
    (comparisons such as ``p.grad is None`` do not count)."""
    for candidate in (expr, ctx.resolve(expr)):
        stack = [candidate]
        while stack:
            n = stack.pop()
            if isinstance(n, ast.Compare):
                continue
            if isinstance(n, ast.Attribute) and n.attr == "grad":
                return True
            if isinstance(n, ast.Name) and _gradient_name(n.id):
                return True
            stack.extend(ast.iter_child_nodes(n))
    return False


def _divisions(node: ast.AST) -> Iterator[tuple[ast.AST | None, ast.AST]]:
    """(what is divided, the divisor) for ``x / d``, ``x /= d``, ``x.div_(d)``, ``x *= 1 / d``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        yield node.left, node.right
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.Mult)):
        yield node.target, node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _DIVIDERS:
        yield node.func.value, node.args[0] if node.args else node.func
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "mul_" and node.args:
        yield node.func.value, node.args[0]


def _divided(ctx: Context, region: ast.AST, key: str) -> bool:
    """Whether ``region`` divides the tensor ``key`` by anything, or anything by a world-size-like value."""
    # (what is divided, by a world size?) for each division, once per region
    divisions = ctx.remember(
        ("divisions", region),
        lambda: [
            (
                None if divided is None else _key(divided),
                any(_WORLD.search(last_name(n) or "") for n in ast.walk(divisor)),
            )
            for node in ast.walk(region)
            for divided, divisor in _divisions(node)
        ],
    )
    return any(world or divided == key for divided, world in divisions)


@rule(
    "MG012",
    "error",
    (6,),
    "gradient all_reduce without division by world size",
    "divide after the sum (p.grad /= dist.get_world_size()) or pass op=dist.ReduceOp.AVG",
)
def allreduce_without_average(ctx: Context) -> Iterator[Hit]:
    """Catches ``dist.all_reduce(T)`` where ``T`` is a gradient (``p.grad``, ``p.grad.data``, a name
    like ``grad``/``grads``/``flat_grads``, or a name assigned from an expression with ``.grad``),
    summed (no ``op`` or a SUM op), when the enclosing function (the module for top-level code) never
    divides ``T`` (``T /= n``, ``T.div_(n)``, ``T / n``, ``T *= ...``) nor divides anything by a
    world-size-like value (``world_size``, ``dist.get_world_size()``, ``num_replicas``,
    ``dp_size``). The sum is world-size times the mean gradient, so the effective learning rate grows.

    docs/pitfalls.md: pitfall 6. Quiet with ``op=ReduceOp.AVG`` or any op that is not SUM. Blind spots:
    division done in another function, all_reduce through wrappers.
    """
    for call in ctx.calls_to("torch.distributed.all_reduce"):
        tensor = argument(call, 0, "tensor")
        op = argument(call, 1, "op")
        if tensor is None or not _grad_like(ctx, tensor):
            continue
        if op is not None and ("AVG" in source(op) or "SUM" not in source(op)):
            continue
        if not _divided(ctx, ctx.function_of(call) or ctx.tree, _key(tensor)):
            yield Hit(
                call,
                f"all_reduce sums `{text(tensor)}` over ranks and nothing divides it by the world size: "
                "the gradient is world-size times too large",
            )
