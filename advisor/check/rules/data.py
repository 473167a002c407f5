"""Data-loading rules: MG002 (sampler with shuffle=True), MG003 (no set_epoch), MG014 (sampler over
an IterableDataset), MG015 (DDP without a sampler)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..guards import rank_zero_only
from ..names import DATALOADER, DDP, ITERABLE_DATASET, SAMPLER, last_name
from ..registry import Hit, rule
from ..scope import Context, argument, is_const, text

_HARMLESS = {"len", "print", "isinstance", "type", "str", "repr", "id", "hasattr"}
_LOADER_USES = {"enumerate", "iter", "next", "len", "zip", "tqdm", "print"}


def _sampler_call(ctx: Context, expr: ast.AST | None) -> ast.Call | None:
    """The ``DistributedSampler(...)`` call ``expr`` is (or one branch of ``X if c else None``, or the first argument
    of a call wrapping it, such as a sampler that resumes mid-epoch: ``Resumable(DistributedSampler(...))``)."""
    if isinstance(expr, ast.IfExp):
        return _sampler_call(ctx, expr.body) or _sampler_call(ctx, expr.orelse)
    if not isinstance(expr, ast.Call):
        return None
    if ctx.call_name(expr) == SAMPLER:
        return expr
    return _sampler_call(ctx, expr.args[0]) if expr.args else None


@rule(
    "MG002",
    "error",
    (3,),
    "DistributedSampler with shuffle=True",
    "drop shuffle=True from the DataLoader (DistributedSampler shuffles) and call sampler.set_epoch(epoch) each epoch",
)
def sampler_and_shuffle(ctx: Context) -> Iterator[Hit]:
    """Catches ``DataLoader(..., shuffle=True, sampler=S)`` where ``S`` is a ``DistributedSampler(...)``
    call, or a name assigned one (also ``DistributedSampler(...) if c else None``). The DataLoader
    raises "sampler option is mutually exclusive with shuffle". Reported on the ``shuffle=True``.

    docs/pitfalls.md: pitfall 3. Quiet for ``shuffle=`` anything but the literal True (the usual
    ``shuffle=(sampler is None)`` is right), and for samplers reached through attributes or
    function results.
    """
    for call in ctx.calls_to(DATALOADER):
        shuffle, sampler = argument(call, 2, "shuffle"), argument(call, 3, "sampler")
        if is_const(shuffle, True) and sampler is not None and _sampler_call(ctx, ctx.resolve(sampler)):
            yield Hit(shuffle, "DistributedSampler and shuffle=True are exclusive: the DataLoader refuses both")


def _named_samplers(ctx: Context) -> Iterator[tuple[ast.stmt, str]]:
    """``name = DistributedSampler(...)`` statements whose sampler shuffles (set_epoch matters)."""
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        call = _sampler_call(ctx, value)
        if isinstance(target, ast.Name) and call is not None and not is_const(argument(call, 3, "shuffle"), False):
            yield node, target.id


def _visible_loads(ctx: Context, scope: ast.AST, name: str) -> list[ast.Name]:
    """Loads of ``name`` in ``scope`` and in nested functions that do not bind ``name`` themselves."""
    return ctx.loads(scope, name)


def _loader_escapes(ctx: Context, call: ast.Call) -> bool:
    """Whether the DataLoader built by ``call`` goes where we cannot see (returned, stored, handed to
    a function), so that ``loader.sampler.set_epoch()`` may happen there."""
    parent = ctx.parents.get(call)
    if isinstance(parent, (ast.For, ast.AsyncFor)) and parent.iter is call:
        return False
    if not isinstance(parent, ast.Assign):
        return True
    names = [t for t in parent.targets if isinstance(t, ast.Name)]
    if len(names) < len(parent.targets):
        return True
    for target in names:
        for use in _visible_loads(ctx, ctx.scope_of(parent), target.id):
            user = ctx.parents[use]
            iterated = isinstance(user, (ast.For, ast.AsyncFor)) and user.iter is use
            read = isinstance(user, ast.Attribute) and isinstance(user.ctx, ast.Load) and user.attr != "sampler"
            wrapped = isinstance(user, ast.Call) and use is not user.func and last_name(user.func) in _LOADER_USES
            if not (iterated or read or wrapped):
                return True
    return False


def _use_kind(ctx: Context, use: ast.Name) -> str:
    """How one load of the sampler is used: ``epoch`` (a set_epoch per epoch), ``once`` (set_epoch
    with a literal outside loops), ``ok`` (harmless) or ``escape`` (goes where we cannot follow)."""
    parent = ctx.parents[use]
    if isinstance(parent, ast.Attribute):
        call = ctx.parents.get(parent)
        if parent.attr != "set_epoch":
            return "ok" if isinstance(parent.ctx, ast.Load) else "escape"
        if not (isinstance(call, ast.Call) and call.func is parent):
            return "escape"
        literal = bool(call.args) and isinstance(call.args[0], ast.Constant)
        return "once" if literal and ctx.loop_of(call) is None else "epoch"
    if isinstance(parent, ast.keyword):
        parent = ctx.parents[parent]
    if isinstance(parent, ast.Call) and use is not parent.func:
        if ctx.call_name(parent) == DATALOADER:
            return "escape" if _loader_escapes(ctx, parent) else "ok"
        return "ok" if isinstance(parent.func, ast.Name) and parent.func.id in _HARMLESS else "escape"
    if isinstance(parent, (ast.Compare, ast.UnaryOp)) or (
        isinstance(parent, (ast.If, ast.While, ast.IfExp)) and use is parent.test
    ):
        return "ok"
    return "escape"


def _iterated(ctx: Context, use: ast.AST) -> ast.AST | None:
    """The ``for`` statement that iterates ``use`` (directly or through enumerate/iter/zip/tqdm)."""
    while True:
        parent = ctx.parents.get(use)
        if isinstance(parent, (ast.For, ast.AsyncFor)) and parent.iter is use:
            return parent
        if not (isinstance(parent, ast.Call) and use is not parent.func and last_name(parent.func) in _LOADER_USES):
            return None
        use = parent


def _reused_across_epochs(ctx: Context, call: ast.Call) -> bool:
    """Whether the DataLoader built by ``call`` is kept in a name that a ``for`` iterates inside an
    outer loop the DataLoader was built outside of: the same loader, and sampler, every epoch."""
    assign = ctx.parents.get(call)
    if not isinstance(assign, ast.Assign) or _loader_escapes(ctx, call):
        return False
    built_in = set(ctx.ancestors(assign))
    for target in (t for t in assign.targets if isinstance(t, ast.Name)):  # all of them (_loader_escapes)
        for use in _visible_loads(ctx, ctx.scope_of(assign), target.id):
            loop = _iterated(ctx, use)
            epochs = ctx.loop_of(loop) if loop is not None else None
            if epochs is not None and epochs not in built_in:
                return True
    return False


def _inline_samplers(ctx: Context) -> Iterator[ast.Call]:
    """``loader = DataLoader(ds, sampler=DistributedSampler(ds))`` (shuffling) looped over epochs
    in a file that never mentions ``set_epoch``."""
    if ctx.mentions("set_epoch"):
        return
    for call in ctx.calls_to(DATALOADER):
        sampler = argument(call, 3, "sampler")
        inner = _sampler_call(ctx, sampler) if sampler is not None else None
        shuffles = inner is not None and not is_const(argument(inner, 3, "shuffle"), False)
        if shuffles and _reused_across_epochs(ctx, call):
            yield call


@rule(
    "MG003",
    "warning",
    (4,),
    "DistributedSampler without set_epoch",
    "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader",
)
def no_set_epoch(ctx: Context) -> Iterator[Hit]:
    """Catches ``name = DistributedSampler(...)`` (shuffling, the default) whose ``name.set_epoch(...)``
    is never called, or only with a literal outside any loop: every epoch then sees the same order.
    Reported on the assignment. Also catches a sampler made inline,
    ``loader = DataLoader(ds, sampler=DistributedSampler(ds))``, when a ``for`` iterates ``loader``
    (directly or through enumerate/tqdm) inside an outer loop that the DataLoader was built outside
    of, and the file never mentions ``set_epoch`` at all. Reported on the DataLoader.

    docs/pitfalls.md: pitfall 4. Quiet (precision over recall) when the sampler escapes where it cannot be
    followed: passed to any call but DataLoader/len/print/isinstance, returned, yielded, stored in a
    container or attribute, aliased, or given to a DataLoader that itself is returned, stored or
    handed to a function other than enumerate/iter/len/zip/tqdm (its ``.sampler`` may get
    ``set_epoch`` there); when any ``X.sampler.set_epoch(...)``-style call (receiver not a
    plain name) appears in the file; for ``shuffle=False`` samplers; for samplers stored only in
    attributes (``self.sampler = ...``). An inline sampler is quiet when its DataLoader is built
    inside the loop that iterates it (a loader per dataset is not a loader per epoch), iterated in
    another function, or escapes as above.
    """
    for call in _inline_samplers(ctx):
        yield Hit(
            call,
            "this DataLoader's DistributedSampler never gets set_epoch(epoch): every epoch sees the same order",
            fix="keep the sampler in a variable (or use loader.sampler) and call "
            "sampler.set_epoch(epoch) at the start of every epoch",
        )
    if any(
        isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch" and not isinstance(c.func.value, ast.Name)
        for c in ctx.calls
    ):
        return
    for stmt, name in _named_samplers(ctx):
        kinds = {_use_kind(ctx, u) for u in _visible_loads(ctx, ctx.scope_of(stmt), name)}
        if not kinds & {"epoch", "escape"}:
            if "once" in kinds:
                yield Hit(
                    stmt,
                    f"`{name}` is a DistributedSampler and `{name}.set_epoch(...)` is called, but not "
                    "inside the epoch loop (once, with a constant): every epoch sees the same order",
                )
            else:
                yield Hit(
                    stmt,
                    f"`{name}` is a DistributedSampler but `{name}.set_epoch(epoch)` is never called: "
                    "every epoch sees the same order",
                )


def _iterable_class(ctx: Context, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether the class ``name`` defined in this file derives from ``IterableDataset``."""
    cls = ctx.classes.get(name)
    if cls is None or name in seen:
        return False
    return any(
        ctx.qualname(b) == ITERABLE_DATASET or (isinstance(b, ast.Name) and _iterable_class(ctx, b.id, seen | {name}))
        for b in cls.bases
    )


def _iterable_dataset(ctx: Context, expr: ast.AST) -> str | None:
    """Why ``expr`` is an IterableDataset, or None: an in-file subclass, ``IterableDataset`` itself,
    ``load_dataset(..., streaming=True)`` or ``.to_iterable_dataset()``."""
    if not isinstance(expr, ast.Call):
        return None
    if isinstance(expr.func, ast.Name) and _iterable_class(ctx, expr.func.id):
        return f"{expr.func.id} is an IterableDataset"
    if ctx.call_name(expr) == ITERABLE_DATASET:
        return "it is an IterableDataset"
    if is_const(argument(expr, None, "streaming"), True):
        return "a streaming dataset is an IterableDataset"
    if isinstance(expr.func, ast.Attribute) and expr.func.attr == "to_iterable_dataset":
        return "to_iterable_dataset() returns an IterableDataset"
    return None


@rule(
    "MG014",
    "error",
    (5,),
    "DistributedSampler over an IterableDataset",
    "drop the DistributedSampler and shard inside the IterableDataset by rank and DataLoader worker "
    "(dist.get_rank(), torch.utils.data.get_worker_info())",
)
def sampler_on_iterable(ctx: Context) -> Iterator[Hit]:
    """Catches ``DistributedSampler(ds)`` where ``ds`` (directly or through plain assignments) is an
    instance of a class in this file deriving from ``IterableDataset`` (also through other in-file
    classes), ``IterableDataset(...)`` itself, ``load_dataset(..., streaming=True)`` or
    ``x.to_iterable_dataset()``. An IterableDataset has no length or indices to sample.

    docs/pitfalls.md: pitfall 5. Blind spots: IterableDataset subclasses imported from other files or
    libraries (webdataset, torchdata), datasets built by functions, wrapped datasets.
    """
    for call in ctx.calls_to(SAMPLER):
        dataset = argument(call, 0, "dataset")
        if dataset is None:
            continue
        why = _iterable_dataset(ctx, ctx.resolve(dataset))
        if why:
            yield Hit(call, f"DistributedSampler(`{text(dataset)}`): {why}, which has no indices to sample")


@rule(
    "MG015",
    "warning",
    (21,),
    "DDP without a DistributedSampler",
    "give the training DataLoader sampler=DistributedSampler(dataset) (and no shuffle=True), and call "
    "sampler.set_epoch(epoch) every epoch",
)
def no_sampler_under_ddp(ctx: Context) -> Iterator[Hit]:
    """Catches ``DataLoader(dataset, ...)`` with neither ``sampler=`` nor ``batch_sampler=`` in a file that wraps a
    model in DistributedDataParallel and never names DistributedSampler: every rank then reads the whole dataset in
    the same order (the same seed on every rank), so the GPUs train on the same batches and the run does one GPU's
    work N times. Reported on the DataLoader.

    docs/pitfalls.md: pitfall 21. Quiet (precision over recall) when the file names DistributedSampler anywhere (a
    held-out loader without one is normal), shards by hand (``split_dataset_by_node``, a ``.shard(...)`` call), when
    the dataset is an IterableDataset (it shards itself), and for a DataLoader that only rank 0 builds. Blind spots:
    samplers from other libraries (accelerate's prepare, Lightning) and datasets sharded in other files.
    """
    if not ctx.calls_to(DDP) or ctx.mentions("DistributedSampler", "split_dataset_by_node", "shard"):
        return
    for call in ctx.calls_to(DATALOADER):
        if argument(call, 3, "sampler") is not None or argument(call, 4, "batch_sampler") is not None:
            continue
        dataset = argument(call, 0, "dataset")
        if dataset is not None and _iterable_dataset(ctx, ctx.resolve(dataset)):
            continue
        if rank_zero_only(ctx, call):
            continue
        yield Hit(
            call,
            "this DataLoader has no DistributedSampler in a DDP script: every rank reads the same batches, so the "
            "GPUs repeat one GPU's work",
        )
