"""Model profile: parameter statistics from a ``meta`` build plus lazily traced activation profiles.

Thread safety (the page plans each browser session in its own thread, and plans share profiles): every
lazily computed value (a ``ModelProfile``'s activation profiles and tensor-parallel statistics, the
process-wide trace cache) lives in a ``OnceCache``: the first thread to ask for a key computes it while
later askers of that key wait and get the same object; different keys compute in parallel. Values are
immutable (frozen dataclasses of tuples). Model construction holds ``advisor.locks.MODEL_BUILD_LOCK``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from .locks import MODEL_BUILD_LOCK
from .models import ModelSpec, build_model
from .trace import ActivationProfile, profile_activations

# DeepSpeed ZeRO-3 keeps parameters smaller than this gathered on every rank
# (``stage3_param_persistence_threshold`` default 1e5, DeepSpeed ZeRO config docs).
ZERO3_PERSISTENCE_THRESHOLD = 100_000


@dataclass(frozen=True)
class ParamStats:
    """Counts from the module itself (tied weights counted once, as ``model.parameters()`` does)."""

    num_params: int
    num_trainable: int
    buffer_bytes: int  # model buffers as built (fp32), e.g. BatchNorm running statistics
    num_param_tensors: int
    largest_param_numel: int
    largest_module_params: int  # params owned directly by one module (a ZeRO-3 gather unit)
    persistent_params: int  # params in tensors under ZERO3_PERSISTENCE_THRESHOLD elements
    has_batchnorm: bool

    @property
    def num_frozen(self) -> int:
        return self.num_params - self.num_trainable


def param_stats(spec: ModelSpec, tp_degree: int = 1) -> ParamStats:
    """Build ``spec`` on the meta device (no memory) and count. ``tp_degree`` > 1 counts one
    tensor-parallel rank's shard (attention heads and MLP width divided, embeddings replicated).

    Raises:
        AdvisorError: the model cannot be built.
    """
    import torch

    # On meta, torch's init functions are no-ops and transformers skips weight initialisation: the
    # build patches nothing. The lock serialises it with every other construction (advisor.locks).
    with MODEL_BUILD_LOCK, torch.device("meta"):
        model = build_model(spec, tp_degree=tp_degree)
    params = list(model.parameters())
    largest_module = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return ParamStats(
        num_params=sum(p.numel() for p in params),
        num_trainable=sum(p.numel() for p in params if p.requires_grad),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        num_param_tensors=len(params),
        largest_param_numel=max((p.numel() for p in params), default=0),
        largest_module_params=largest_module,
        persistent_params=sum(p.numel() for p in params if p.numel() < ZERO3_PERSISTENCE_THRESHOLD),
        has_batchnorm=any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()),
    )


class OnceCache:
    """``key -> value`` computed at most once at a time per key, thread-safe.

    ``get(key, compute)`` returns the stored value; otherwise the first caller runs ``compute()`` (outside
    the lock) while concurrent callers of the same key wait for it and receive the same object (or the
    same exception; failures are not stored, so a later call tries again). ``maxsize``: keep that many
    values, least recently used dropped first (None: all).
    """

    def __init__(self, maxsize: int | None = None) -> None:
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, Any] = OrderedDict()
        self._running: dict[Hashable, Future] = {}
        self._maxsize = maxsize

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key]
            future = self._running.get(key)
            owner = future is None
            if owner:
                future = self._running[key] = Future()
        if not owner:
            return future.result()
        try:
            value = compute()
        except BaseException as err:
            with self._lock:
                del self._running[key]
            future.set_exception(err)
            raise
        with self._lock:
            self._done[key] = value
            del self._running[key]
            while self._maxsize is not None and len(self._done) > self._maxsize:
                self._done.popitem(last=False)
        future.set_result(value)
        return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The stored value of ``key`` (no compute, no LRU update), else ``default``."""
        with self._lock:
            return self._done.get(key, default)

    def clear(self) -> None:
        """Drop the stored values (computations in progress still finish and store theirs)."""
        with self._lock:
            self._done.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)


@dataclass
class ModelProfile:
    """``spec`` + its parameter statistics + activation profiles traced on demand and cached.

    ``attention`` and ``checkpointing`` are fixed per profile (they change every trace). Safe to share
    between threads: the lazily filled caches are ``OnceCache``s.
    """

    spec: ModelSpec
    stats: ParamStats
    attention: str
    checkpointing: bool
    _activations: OnceCache = field(default_factory=OnceCache, repr=False, compare=False)
    _tp_stats: OnceCache = field(default_factory=OnceCache, repr=False, compare=False)

    def flops_per_sample(self, mode: str) -> int:
        """Forward + backward FLOPs per sample under a precision trace mode (from the same traces as
        the activations; ``ActivationProfile.flops_per_sample``)."""
        return self.activations(mode).flops_per_sample

    def activations(self, mode: str, tp_degree: int = 1) -> ActivationProfile:
        """Traced activation profile for a precision trace mode ("fp32", "autocast", "half")."""
        return self._activations.get((mode, tp_degree), lambda: _cached_activations(
            _spec_key(self.spec), self.spec, mode, self.attention, self.checkpointing, tp_degree))

    def tp_stats(self, tp_degree: int) -> ParamStats:
        if tp_degree == 1:
            return self.stats
        return self._tp_stats.get(tp_degree, lambda: param_stats(self.spec, tp_degree))


def _spec_key(spec: ModelSpec) -> str:
    return json.dumps(asdict(spec), sort_keys=True, default=str)


_TRACE_CACHE_SIZE = 64
_TRACE_CACHE = OnceCache(maxsize=_TRACE_CACHE_SIZE)


def _cached_activations(key: str, spec: ModelSpec, mode: str, attention: str, checkpointing: bool,
                        tp_degree: int) -> ActivationProfile:
    """Traces are pure functions of their inputs and immutable: keep the last few (the page and
    repeated plans of one model re-use them). Threads asking for the same trace at once trace it once."""
    full_key = (key, mode, attention, checkpointing, tp_degree)
    return _TRACE_CACHE.get(full_key, lambda: profile_activations(spec, mode, attention, checkpointing,
                                                                  tp_degree=tp_degree))


def clear_trace_cache() -> None:
    """Forget the in-process traces (tests that must trace again)."""
    _TRACE_CACHE.clear()


def build_profile(spec: ModelSpec, attention: str, checkpointing: bool) -> ModelProfile:
    return ModelProfile(spec=spec, stats=param_stats(spec), attention=attention, checkpointing=checkpointing)
