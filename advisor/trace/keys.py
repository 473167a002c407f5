"""The disk cache's keys and the JSON form of a stored trace.

A cached entry (a trace, a parameter count, a model fact) depends, besides the model (``model_key``), on the
libraries that build and trace it (``advisor.cache.library_versions``) and on this program's own tracing code
(``code_hash``; its version string does not change with every edit). ``to_json`` and
``activation_profile_from_json`` write and read an ``ActivationProfile`` (``advisor.profile`` stores them).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, overload

from ..cache import library_versions
from ..models import ModelSpec
from .timeline import ActivationProfile, Timeline

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")

# The source a cached trace or count depends on, relative to the ``advisor`` package: these files, and every
# ``.py`` file of these packages (script fragments excluded).
_CODE_FILES = ("profile.py", "checkpointing.py", "locks.py", "bnb_layout.py")
# The layout of a stored trace's per-op records (``Timeline.fwd_ops``): bump it when what an op records changes, so
# traces cached in an older layout miss. 2: GEMMs, convolutions and fused attention record their shapes
# (``advisor.trace.shapes``). 3: convolutions record their layout transposes first, batch norms their statistics
# pass. 4: convolutions record their call (input, weight, stride, padding, ...) after the layout transposes.
TRACE_FORMAT = 4
_CODE_PACKAGES = ("trace", "models")


def code_files() -> list[Path]:
    """The files ``code_hash`` reads: ``_CODE_FILES``, then every file of ``_CODE_PACKAGES`` (sorted)."""
    here = Path(__file__).parent.parent
    packaged = sorted(
        p for package in _CODE_PACKAGES for p in (here / package).rglob("*.py") if "fragments" not in p.parts
    )
    return [here / f for f in _CODE_FILES] + packaged


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 (16 hex digits) of the source files whose behaviour a cached trace or count depends on
    (``code_files``: their paths relative to ``advisor`` and their bytes)."""
    here = Path(__file__).parent.parent
    digest = hashlib.sha256()
    for f in code_files():
        digest.update(f.relative_to(here).as_posix().encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def factory_hash(factory: str | None) -> str | None:
    """sha256 (16 hex digits) of a ``--model-factory`` module's file; finding it imports only its parent
    packages. None when there is no factory or its file cannot be read (then the key still has its name)."""
    if not factory:
        return None
    try:
        found = importlib.util.find_spec(factory.split(":")[0])
        origin = found.origin if found else None
        return hashlib.sha256(Path(origin).read_bytes()).hexdigest()[:16] if origin else None
    except (ImportError, ValueError, OSError):
        return None


def model_key(spec: ModelSpec) -> dict[str, object]:
    """Everything about ``spec`` that changes a trace or a count (not its display name or source)."""
    return {
        "family": spec.family,
        "model_type": spec.model_type,
        "config": spec.config,
        "seq_len": spec.seq_len,
        "input_shape": list(spec.input_shape) if spec.input_shape else None,
        "factory": spec.factory,
        "factory_hash": factory_hash(spec.factory),
        "versions": library_versions(),
        "code": code_hash(),
        "trace_format": TRACE_FORMAT,
        "adapter": asdict(spec.adapter) if spec.adapter is not None else None,
    }


@overload
def to_json(obj: DataclassInstance) -> dict[str, object]: ...


@overload
def to_json(obj: object) -> object: ...


def to_json(obj: object) -> object:
    """A (nested) frozen dataclass of ints, strs and tuples as JSON-able lists and dicts (a dataclass: a dict)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_json(x) for x in obj]
    return obj


def tuples_from_json(obj: object) -> object:
    """``obj`` read from JSON with its (nested) lists back as tuples (which ``to_json`` wrote as lists)."""
    return tuple(tuples_from_json(x) for x in obj) if isinstance(obj, list) else obj


def _construct(cls: type[T], fields: Mapping[str, object]) -> T:
    """``cls(**fields)``: a dataclass from field values read from JSON, of whatever types the document held.

    Raises:
        TypeError: a field ``cls`` does not have, or one it needs missing.
    """
    return cls(**fields)


def dataclass_from_json(cls: type[T], doc: Mapping[str, object]) -> T:
    """The inverse of ``to_json`` for a flat dataclass ``cls`` of ints, strs and (nested) tuples: ``cls(**doc)`` with
    every list back as a tuple (``tuples_from_json``).

    Raises:
        TypeError: a field ``cls`` does not have, or one it needs missing.
    """
    return _construct(cls, {k: tuples_from_json(v) for k, v in doc.items()})


def activation_profile_from_json(doc: Mapping[str, object]) -> ActivationProfile:
    """The inverse of ``to_json`` for an ``ActivationProfile`` (lists back to tuples).

    Raises:
        KeyError, TypeError: the document is not of this shape.
    """

    def timeline(d: Mapping[str, object]) -> Timeline:
        return dataclass_from_json(Timeline, d)

    stored = doc["depths"]
    if not isinstance(stored, list):
        raise TypeError(f"depths must be a list, not {type(stored).__name__}")
    depths = tuple((int(depth), timeline(t1), timeline(t2)) for depth, t1, t2 in stored)
    return _construct(ActivationProfile, {**doc, "depths": depths})
