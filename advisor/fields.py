"""One input field of the schema (``advisor.schema``): how it is shown and checked (``Opt``, attached to a
dataclass field by ``option``), what it is (``Field``: its group, name, type read from the annotation, default)
and one value checked against it (``check_value``). Nothing here knows the schema's groups."""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from functools import cache
from typing import TYPE_CHECKING, Concatenate, Literal, ParamSpec, TypeVar, Union, get_args, get_origin, get_type_hints

from .errors import AdvisorError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

FACES = ("cli", "page", "bench")
# Resolved by the faces from the strategies registry (advisor.schema's doc).
STRATEGY_CHOICES: Literal["strategies"] = "strategies"

# What a field can hold (``Field.kind`` names which): the JSON-like values the faces pass.
FieldValue = bool | int | float | str | tuple[int, ...] | dict[str, object] | None

_T = TypeVar("_T")
_P = ParamSpec("_P")


@dataclass(frozen=True)
class Opt:
    """How one input field is shown and checked.

    ``flag``: the CLI flag (``None``: positional, or not on the CLI); ``short``: a second, shorter spelling of it
    (``--pp`` for ``--pp-degree``). ``label``: the page widget's label.
    ``faces``: which of ``FACES`` show it. ``choices``: the allowed values, or ``STRATEGY_CHOICES``.
    ``low``/``high``: bounds for numbers (``None``: unbounded), both inclusive except a ``low`` of ``0.0``, which
    is exclusive (the value must be above 0: ``check_value``). ``high_message``: a custom
    message when above ``high`` (``{value}`` is filled in). ``none``: what an empty value means (help
    text and the page's placeholder). ``metavar``: the CLI metavar. ``strict``: the value must be one of
    ``choices`` (GPU presets are not: they match case-insensitively and by substring, with suggestions, in
    ``get_gpu_preset``). ``positional``: the CLI takes it without a flag.
    """

    help: str
    flag: str | None = None
    short: str | None = None
    label: str | None = None
    faces: tuple[str, ...] = ("cli",)
    choices: tuple[str, ...] | Literal["strategies"] | None = None
    low: float | None = None
    high: float | None = None
    high_message: str | None = None
    none: str | None = None
    metavar: str | None = None
    strict: bool = True
    positional: bool = False


def _carrying(make: Callable[_P, Opt]) -> Callable[Concatenate[_T, _P], _T]:
    """``option`` for the ``Opt`` that ``make`` builds: its keyword arguments are checked as ``make``'s."""

    def option(default: _T, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return field(default=default, metadata={"opt": make(*args, **kwargs)})

    return option


# ``option(default, help=..., flag=..., ...)``: a dataclass field carrying its ``Opt`` (keyword arguments:
# ``Opt``'s); mutable defaults are not allowed (all inputs are frozen).
option = _carrying(Opt)


# The annotations a field may have, without ``None``, and the kind each is.
_KINDS: dict[object, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    dict[str, object]: "dict",
    tuple[int, ...]: "shape",
}


def _is_union(annotation: object) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _without_none(annotation: object) -> object:
    """The annotation without ``None`` (``Precision | None`` -> ``Precision``); None for a union of several."""
    if not _is_union(annotation):
        return annotation
    rest = tuple(a for a in get_args(annotation) if a is not type(None))
    return rest[0] if len(rest) == 1 else None


def _enum_of(annotation: object) -> type[StrEnum] | None:
    """The ``StrEnum`` (``advisor.choices``) a field's annotation names, else None."""
    base = _without_none(annotation)
    return base if isinstance(base, type) and issubclass(base, StrEnum) else None


@dataclass(frozen=True)
class Field:
    """One schema field: its group, name, type (the annotation, resolved: ``str | None``, ``tuple[int, ...]``),
    default and ``Opt``."""

    group: str
    name: str
    type: object
    default: FieldValue
    opt: Opt

    @property
    def optional(self) -> bool:
        """Whether ``None`` is a value (the annotation is a union with ``None``)."""
        return _is_union(self.type) and type(None) in get_args(self.type)

    @property
    def kind(self) -> str:
        """``bool``, ``int``, ``float``, ``str`` (a ``StrEnum`` of ``advisor.choices`` too), ``shape`` (a tuple of
        ints) or ``dict``: the value's type without ``None``.

        Raises:
            TypeError: an annotation the schema does not support.
        """
        if _enum_of(self.type) is not None:
            return "str"
        base = _without_none(self.type)
        if base not in _KINDS:
            raise TypeError(f"schema field {self.name} has an unsupported type {self.type}")
        return _KINDS[base]

    @property
    def label(self) -> str:
        """The page widget's label (``opt.label``; every field the page shows has one)."""
        assert self.opt.label is not None, f"schema field {self.name} has no label"
        return self.opt.label

    @property
    def flag_name(self) -> str:
        """What messages call it: the CLI flag, else the field name."""
        return self.opt.flag or self.name


@cache
def _hints(cls: type) -> dict[str, object]:
    """The resolved annotations of a schema dataclass (``typing.get_type_hints``: strings under
    ``from __future__ import annotations`` evaluated once)."""
    return get_type_hints(cls)


def group_fields(group: str, cls: type) -> Iterator[Field]:
    """The fields of one schema dataclass ``cls`` (group ``group``), in declaration order."""
    hints = _hints(cls)
    for f in fields(cls):
        default = f.default if f.default is not MISSING else None
        yield Field(group, f.name, hints[f.name], default, f.metadata["opt"])


def as_members(obj: DataclassInstance) -> None:
    """Give each field of the frozen schema dataclass ``obj`` that is typed with a ``StrEnum`` (``advisor.choices``)
    and holds one of its values as a plain ``str`` (from the CLI, the page or JSON) the member instead, in place
    (its ``__post_init__`` calls this). Any other value is left as it is, for ``check_value`` to refuse with its
    message."""
    hints = _hints(type(obj))
    for f in fields(obj):
        enum, value = _enum_of(hints[f.name]), getattr(obj, f.name)
        if enum is not None and isinstance(value, str) and not isinstance(value, enum):
            try:
                object.__setattr__(obj, f.name, enum(value))
            except ValueError:
                pass


def resolve_choices(f: Field, strategy_names: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The field's allowed values; ``STRATEGY_CHOICES`` becomes ``strategy_names`` (the faces pass
    ``strategies.strategy_names()``)."""
    choices = f.opt.choices
    if isinstance(choices, str):  # the one text value Opt.choices takes: STRATEGY_CHOICES
        return tuple(strategy_names)
    return choices


def check_value(f: Field, value: FieldValue, strategy_names: tuple[str, ...]) -> FieldValue:
    """One value against its field; returns it unchanged.

    Raises:
        AdvisorError: wrong type, outside the bounds or not among the choices (one line naming the flag).
    """
    if value is None:
        if not f.optional:
            raise AdvisorError(f"{f.flag_name} needs a value")
        return None
    kind, flag = f.kind, f.flag_name
    if kind == "bool" and not isinstance(value, bool):
        raise AdvisorError(f"{flag} is on or off, got {value!r}")
    if kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
            raise AdvisorError(f"{flag} must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}")
        if not math.isfinite(value):
            raise AdvisorError(f"{flag} must be a finite number, got {value}")
        lo, hi = f.opt.low, f.opt.high
        # a low of 0.0 is exclusive (the field's docs): say so, as the CLI's own type check does
        between = (
            f"{flag} must be above 0 and at most {hi}, got {value}"
            if lo == 0.0
            else f"{flag} must be between {lo} and {hi}, got {value}"
        )
        if lo is not None and (value <= 0 if lo == 0.0 else value < lo):
            raise AdvisorError(
                between
                if hi is not None
                else f"{flag} must be {'a positive integer' if kind == 'int' else 'a positive number'}, got {value}"
            )
        if hi is not None and value > hi:
            raise AdvisorError(f.opt.high_message.format(value=value) if f.opt.high_message else between)
    if kind == "str" and not isinstance(value, str):
        raise AdvisorError(f"{flag} must be text, got {value!r}")
    choices = resolve_choices(f, strategy_names)
    if choices and kind == "str" and isinstance(value, str) and not value.strip():  # (a str: checked above)
        raise AdvisorError(f"{flag} needs a value: one of {', '.join(map(str, choices))}")
    if choices and f.opt.strict and value not in choices:
        raise AdvisorError(f"{flag} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value
