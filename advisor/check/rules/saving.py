"""Checkpoint and output rules: MG006 (torch.save of a module), MG007 (DDP state_dict with the
``module.`` prefix), MG008 (torch.load without map_location), MG009 (saves and prints on every rank)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..guards import rank_zero_only
from ..names import DATA_PARALLEL, DDP, INITS, SAMPLER, last_name
from ..ranks import is_rank_like
from ..registry import Hit, rule
from ..scope import Context, argument, source, text

_CONVENTIONAL = {"model", "net", "ddp_model", "network"}
_PASSTHROUGH = {"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train", "eval", "requires_grad_"}
_WRAPPERS = {DDP, DATA_PARALLEL, "torch.distributed.fsdp.FullyShardedDataParallel"}
_STATE_LIKE = {"state_dict", "dict", "OrderedDict"}
_LOG_LEVELS = {"info", "debug"}


# Modules under torch.distributed that a one-process script uses without any process group: activation
# checkpointing's wrapper (torch.distributed.algorithms._checkpoint.checkpoint_wrapper).
NOT_DISTRIBUTED = ("torch.distributed.algorithms._checkpoint",)


def is_distributed(ctx: Context) -> bool:
    """Whether the file is a distributed script: it imports or uses ``torch.distributed``,
    ``deepspeed``, DistributedDataParallel or DistributedSampler, or calls an init."""

    def find() -> bool:
        markers = ("torch.distributed", "deepspeed")
        names = set(ctx.imports.modules) | set(ctx.imports.table.values())
        names |= {q for n in ctx.nodes if isinstance(n, ast.Attribute) and (q := ctx.imports.dotted(n))}
        names = {n for n in names if not n.startswith(NOT_DISTRIBUTED)}
        return any(n.startswith(markers) or n in (DDP, SAMPLER) for n in names) or bool(ctx.calls_to(DDP, *INITS))

    return ctx.remember("distributed", find)


def _nn_module_class(ctx: Context, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether the in-file class ``name`` derives from ``torch.nn.Module`` (also through in-file classes)."""
    cls = ctx.classes.get(name)
    if cls is None or name in seen:
        return False
    return any(
        ctx.qualname(b) == "torch.nn.Module" or (isinstance(b, ast.Name) and _nn_module_class(ctx, b.id, seen | {name}))
        for b in cls.bases
    )


def module_construction(ctx: Context, expr: ast.AST) -> ast.Call | None:
    """The call that built the module ``expr`` holds, through names and ``.to()``/``.cuda()``-style
    chains: DDP/DP/FSDP, ``torch.nn.X(...)``, a torchvision builder, ``transformers.*.from_pretrained``
    or an in-file ``nn.Module`` subclass. None when ``expr`` is not visibly a module."""
    for _ in range(12):
        expr = ctx.resolve(expr)
        if not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _PASSTHROUGH):
            break
        expr = expr.func.value
    if not isinstance(expr, ast.Call):
        return None
    name = ctx.call_name(expr) or ""
    parts = name.split(".")
    if (
        name in _WRAPPERS
        or (parts[:2] == ["torch", "nn"] and len(parts) == 3 and parts[2][:1].isupper() and parts[2] != "Parameter")
        or (name.startswith("torchvision.models.") and parts[-1][:1].islower() and "weight" not in parts[-1])
        or (name.startswith("transformers.") and parts[-1] in ("from_pretrained", "from_config") and "Model" in name)
        or (isinstance(expr.func, ast.Name) and _nn_module_class(ctx, expr.func.id))
    ):
        return expr
    return None


def _saved_objects(call: ast.Call) -> list[ast.AST]:
    """What ``torch.save`` writes: its first argument, or the values of a dict literal there."""
    obj = argument(call, 0, "obj")
    if isinstance(obj, ast.Dict):
        return [v for v in obj.values if v is not None]
    return [obj] if obj is not None else []


def _state_like(ctx: Context, expr: ast.AST) -> bool:
    """A value that is visibly data, not a module: a literal, a dict, ``x.state_dict()``."""
    value = ctx.resolve(expr)
    if isinstance(value, ast.Call):
        func = value.func
        return (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in _STATE_LIKE
    return isinstance(value, (ast.Constant, ast.Dict, ast.DictComp, ast.List, ast.Tuple, ast.ListComp))


def _saves_module(ctx: Context, obj: ast.AST) -> bool:
    base = obj.value if isinstance(obj, ast.Attribute) and obj.attr == "module" else obj
    if module_construction(ctx, base) is not None:
        return True
    return isinstance(base, ast.Name) and base.id in _CONVENTIONAL and not _state_like(ctx, base)


@rule(
    "MG006",
    "warning",
    (7,),
    "torch.save of a whole module",
    "save model.module.state_dict() (DDP) or model.state_dict() and rebuild the model before loading",
)
def save_module(ctx: Context) -> Iterator[Hit]:
    """Catches ``torch.save(X, ...)`` (or ``torch.save({"model": X}, ...)``) where ``X`` or ``X.module``
    is visibly a module: a name assigned DDP/DP/FSDP(...), ``nn.Linear(...)``-style ``torch.nn``
    classes, torchvision builders, ``transformers`` ``from_pretrained``/``from_config``, or an in-file
    ``nn.Module`` subclass (through ``.to()``/``.cuda()`` chains); or the names ``model``, ``net``,
    ``ddp_model``, ``network`` when they are not visibly a dict or ``state_dict()`` (they hold a module
    in practice). Pickling the module ties the checkpoint to the class's import path.

    docs/pitfalls.md: pitfall 7. Blind spots: other names holding modules that come from function calls
    (``m = build()``), attributes (``self.model``).
    """
    for call in ctx.calls_to("torch.save"):
        for obj in _saved_objects(call):
            if _saves_module(ctx, obj):
                yield Hit(
                    obj,
                    f"`{text(obj)}` is a module: torch.save pickles the whole object, not its "
                    "state_dict, so loading needs the same class at the same import path",
                )


def _call_of(ctx: Context, use: ast.AST) -> ast.AST | None:
    """The call a name is an argument of (positional or keyword), else its parent."""
    parent = ctx.parents.get(use)
    return ctx.parents.get(parent) if isinstance(parent, ast.keyword) else parent


def _handed_elsewhere(ctx: Context, name: str) -> bool:
    """Whether ``name`` is an argument of some call other than torch.save (it may be rewritten there)."""
    for use in ctx.uses.get(name, []):
        call = _call_of(ctx, use)
        if (
            isinstance(use, ast.Name)
            and isinstance(call, ast.Call)
            and use is not call.func
            and ctx.call_name(call) != "torch.save"
        ):
            return True
    return False


def _ddp_state_dict(ctx: Context, obj: ast.AST) -> str | None:
    """``X`` (as text) when ``obj`` is ``X.state_dict()``, directly or through a name that no other
    call receives, and ``X`` was assigned DistributedDataParallel/DataParallel."""
    if isinstance(obj, ast.Name) and _handed_elsewhere(ctx, obj.id):
        return None
    value = ctx.resolve(obj)
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "state_dict"):
        return None
    owner = module_construction(ctx, value.func.value)
    return text(value.func.value) if owner is not None and ctx.call_name(owner) in (DDP, DATA_PARALLEL) else None


def _loads_into_ddp(ctx: Context) -> bool:
    """Whether the file loads a state dict back into a DDP/DataParallel-bound name
    (``ddp_model.load_state_dict(...)``): its checkpoints are meant for the wrapped model, prefix and all."""
    for call in ctx.calls:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "load_state_dict":
            owner = module_construction(ctx, func.value)
            if owner is not None and ctx.call_name(owner) in (DDP, DATA_PARALLEL):
                return True
    return False


@rule(
    "MG007",
    "warning",
    (7,),
    "DDP state_dict saved with the module. prefix",
    "save ddp_model.module.state_dict() so the keys load into the plain model",
)
def ddp_prefix(ctx: Context) -> Iterator[Hit]:
    """Catches ``torch.save(X.state_dict(), ...)`` (also as a dict value, or through ``sd = X.state_dict()``)
    where ``X`` was assigned ``DistributedDataParallel(...)`` (or DataParallel): every key gets a
    ``module.`` prefix and the checkpoint no longer loads into the single-GPU model.

    docs/pitfalls.md: pitfall 7. Quiet for ``X.module.state_dict()``, for dict comprehensions that rewrite
    the keys, when the state dict is passed to any other call before saving (e.g.
    ``consume_prefix_in_state_dict_if_present``) or the file mentions that function, when ``X``
    comes from a parameter or attribute (unknown wrapper), and when the same file loads a state dict
    back into a DDP-bound name (``ddp_model.load_state_dict(torch.load(...))``, the PyTorch DDP
    tutorial's checkpointing): the prefixed keys are what that load expects. Blind spot: such a file
    that also hands the checkpoint to single-GPU code elsewhere is not flagged.
    """
    if ctx.mentions("consume_prefix_in_state_dict_if_present") or _loads_into_ddp(ctx):
        return
    for call in ctx.calls_to("torch.save"):
        for obj in _saved_objects(call):
            owner = _ddp_state_dict(ctx, obj)
            if owner:
                yield Hit(obj, f"`{owner}` is DistributedDataParallel: its state_dict keys start with 'module.'")


# Words that say a torch.load holds small CPU-side state (scheduler, scaler, RNG, sampler/dataloader
# position, step/epoch counters) or a model/optimizer checkpoint; matched in lower-case text.
_CPU_STATE = re.compile(r"sched|scaler|rng|random|sampler|data|step|epoch")
_MODEL_STATE = re.compile(r"model|net|ckpt|checkpoint|optim|weight|param|module|best|pretrained")


def _load_target(ctx: Context, call: ast.Call) -> tuple[ast.AST | None, ast.AST | None]:
    """(the receiver of ``R.load_state_dict(torch.load(...))``, the target of ``T = torch.load(...)``);
    None where there is none. ``torch.load(f)["scheduler"]`` has neither: the whole file is loaded,
    whatever part is kept."""
    node: ast.AST = call
    parent = ctx.parents.get(node)
    if isinstance(parent, ast.keyword):
        parent = ctx.parents.get(parent)
    if (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Attribute)
        and parent.func.attr == "load_state_dict"
        and node is not parent.func
    ):
        return parent.func.value, None
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        return None, targets[0] if len(targets) == 1 else None
    return None, None


def _state_words(expr: ast.AST) -> tuple[bool, bool]:
    """Whether the text of ``expr`` names (CPU-side state, a model/optimizer/checkpoint)."""
    words = source(expr).lower()
    return bool(_CPU_STATE.search(words)), bool(_MODEL_STATE.search(words))


def _cpu_state_load(ctx: Context, call: ast.Call) -> bool:
    """Whether a ``torch.load`` visibly reads CPU-side state: the first of (the receiver of its
    ``load_state_dict``, the name it is assigned to, its path) that says something names only
    scheduler/scaler/RNG/sampler/data/step/epoch state. A receiver or name that names both kinds
    (``checkpoint_rng_state``) leaves it to the next; a path that names both is a checkpoint."""
    receiver, target = _load_target(ctx, call)
    path = argument(call, 0, "f")
    for expr in (receiver, target, path):
        if expr is None:
            continue
        cpu, model = _state_words(expr)
        if cpu and not model:
            return True
        if model and (not cpu or expr is path):
            return False
    return False


@rule(
    "MG008",
    "warning",
    (7, 14),
    "torch.load without map_location",
    "pass map_location (e.g. map_location='cpu' or {'cuda:0': f'cuda:{local_rank}'}) to torch.load",
)
def load_without_map_location(ctx: Context) -> Iterator[Hit]:
    """Catches ``torch.load(f)`` with no ``map_location`` (keyword or second argument) in a distributed
    file (imports/uses torch.distributed, deepspeed, DDP or DistributedSampler): tensors saved from
    cuda:0 load onto cuda:0 on every rank, so GPU 0 fills up (rank-0 memory imbalance).

    Quiet when ``**kwargs`` are passed, and when the load visibly holds small CPU-side state, judged
    by words in, first, the receiver of ``R.load_state_dict(torch.load(...))``, then the name of
    ``T = torch.load(...)``, then the path expression's text: ``sched`` (``lr_scheduler``), ``scaler``,
    ``rng``, ``random``, ``sampler``, ``data`` (``dataloader``), ``step``, ``epoch``. It keeps firing
    when the first of those that says anything names a model, network, checkpoint/``ckpt``,
    optimizer, weights, parameters, module or ``best``/``pretrained`` (a receiver or name with both
    kinds of word, ``checkpoint_rng_state``, defers to the next; a path with both, ``ckpt_epoch3.pt``,
    is a checkpoint), when none says anything (``state = torch.load(args.resume)``), and when the
    load is subscripted (``sched.load_state_dict(torch.load(f)["scheduler"])`` loads the whole file).

    docs/pitfalls.md: pitfalls 7 and 14. Blind spots: the words are a guess: a full checkpoint saved
    under a CPU-state name (``torch.load(f"step_{n}.pt")``, ``data = torch.load(path)``) is missed,
    a GPU-saved scheduler under a neutral name still fires; other loaders (``safetensors``,
    ``load_state_dict_from_url``) are not checked.
    """
    if not is_distributed(ctx):
        return
    for call in ctx.calls_to("torch.load"):
        if (
            argument(call, 1, "map_location") is None
            and not any(k.arg is None for k in call.keywords)
            and not _cpu_state_load(ctx, call)
        ):
            yield Hit(
                call,
                "torch.load without map_location puts every rank's copy on the GPU it was saved from (usually cuda:0)",
            )


def _output_kind(ctx: Context, call: ast.Call) -> str | None:
    """``save`` for torch.save, ``print`` for print() to stdout, ``log`` for info/debug logging."""
    name = ctx.call_name(call)
    if name == "torch.save":
        return "save"
    func = call.func
    if isinstance(func, ast.Name) and func.id == "print" and "print" not in ctx.imports.table:
        dest = argument(call, None, "file")
        return None if dest is not None and "stderr" in text(dest) else "print"
    if isinstance(func, ast.Attribute) and func.attr in _LOG_LEVELS:
        if name and name.startswith("logging."):
            return "log"
        owner = ctx.resolve(func.value)
        if isinstance(owner, ast.Call) and ctx.call_name(owner) == "logging.getLogger":
            return "log"
    return None


_RANK_TAGS = {"device_id", "device_index"}  # besides what ranks.is_rank_like accepts
_NOT_MESSAGE = {"file", "sep", "end", "flush", "exc_info", "stack_info", "stacklevel", "extra"}


def _tags_rank(ctx: Context, call: ast.Call) -> bool:
    """Whether a print/log line carries a rank-like value (``f"[rank {rank}] ..."``,
    ``"[GPU{}]".format(self.gpu_id)``, ``"%d" % dist.get_rank()``, ``logger.info("rank %d", rank)``):
    a per-rank line, which is what the fix recommends for output every rank should give."""
    args = [*call.args, *(k.value for k in call.keywords if k.arg not in _NOT_MESSAGE)]
    return any(
        isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
        and (is_rank_like(ctx, n) or last_name(n) in _RANK_TAGS)
        for arg in args
        for n in ast.walk(arg)
    )


_PRINT_SILENCERS = {"init_distributed_mode", "setup_for_distributed"}


def _silences_print(ctx: Context) -> bool:
    """Whether the file calls the torchvision/DETR/DeiT helper that replaces ``print`` with a no-op on
    ranks other than 0 (``utils.init_distributed_mode`` -> ``setup_for_distributed``)."""
    return any(last_name(call.func) in _PRINT_SILENCERS for call in ctx.calls)


def _per_rank_file(ctx: Context, call: ast.Call) -> bool:
    """Whether ``torch.save(obj, path)`` names its file by rank (``f"shard_rank{rank}.pt"``): every rank
    writes its own file (sharded checkpoints), which is correct."""
    path = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "f"), None)
    return path is not None and any(
        isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) and is_rank_like(ctx, n)
        for n in ast.walk(path)
    )


_PRINT_FIX = "do it on rank 0 only: `if dist.get_rank() == 0:` (or print per-rank lines with the rank in them)"
_OUTPUT = {
    "save": ("warning", "torch.save runs on every rank: all processes write the same file", None),
    "print": ("info", "print runs on every rank: each line appears once per process", _PRINT_FIX),
    "log": ("info", "this log call runs on every rank: each record appears once per process", _PRINT_FIX),
}


@rule(
    "MG009",
    "warning",
    (12,),
    "torch.save (warning) or print/log (info) on every rank",
    "do it on rank 0 only: `if dist.get_rank() == 0:` (then dist.barrier() before other ranks read the file)",
)
def output_on_every_rank(ctx: Context) -> Iterator[Hit]:
    """Catches, in a distributed file, ``torch.save(...)`` (warning) and ``print(...)`` to stdout or
    ``logging``/``logger`` ``info``/``debug`` calls (info: they print but do not fail the check) that
    are not under a rank-0 guard. Guards (full list in ``advisor.check.guards``): ``if R == 0``,
    ``if R in (-1, 0)``, ``if not R``, ``if R <= 0``, main-process flags (``is_main_process``,
    ``master_process``), an earlier ``if R != 0: return``, ``@rank_zero_only``, ``and``/``or`` with
    one of those, callers that are all guarded; code in functions this file never calls or
    references is left alone. Not guards: ``if R != 1``, ``if epoch % 10 == 0``, ``if __name__ ==
    "__main__"``, a rank test saved under a neutral name (``ok = rank == 0``). A print or log line
    whose arguments carry a rank-like value (``f"[rank {rank}] ..."``, ``f"[GPU{self.gpu_id}]"``,
    ``"{}".format(dist.get_rank())``, ``os.environ["LOCAL_RANK"]``, ``device_id``: any name with
    "rank" in it and the other spellings of ``advisor.check.ranks.is_rank_like``) is a per-rank
    line, as the fix recommends, and stays quiet; so does a ``torch.save`` whose file name carries the
    rank (``f"shard_rank{rank}.pt"``: each rank writes its own file). Prints and logs are not checked
    in a file that calls torchvision's ``init_distributed_mode`` / ``setup_for_distributed``, which
    silence ``print`` on ranks other than 0 (the helper lives in another file; saves are still checked).

    docs/pitfalls.md: pitfall 12. Blind spots: ``print(..., file=sys.stderr)`` and warning/error logs are
    left alone (every rank may report its own failure); guards in other files; writes through other
    APIs (``json.dump``, ``np.save``, ``model.save_pretrained``).
    """
    if not is_distributed(ctx):
        return
    quiet_print = _silences_print(ctx)
    for call in ctx.calls:
        kind = _output_kind(ctx, call)
        if kind in ("print", "log") and quiet_print:
            continue
        per_rank = _per_rank_file(ctx, call) if kind == "save" else _tags_rank(ctx, call)
        if kind and not per_rank and not rank_zero_only(ctx, call):
            severity, message, fix = _OUTPUT[kind]
            yield Hit(call, message, severity, fix)
