"""Model profile: parameter statistics from a ``meta`` build plus lazily traced activation profiles."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

from .models import ModelSpec, build_model
from .trace import ActivationProfile, _skip_init, profile_activations

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

    with torch.device("meta"), _skip_init():
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


@dataclass
class ModelProfile:
    """``spec`` + its parameter statistics + activation profiles traced on demand and cached.

    ``attention`` and ``checkpointing`` are fixed per profile (they change every trace).
    """

    spec: ModelSpec
    stats: ParamStats
    attention: str
    checkpointing: bool
    _activations: dict = field(default_factory=dict, repr=False)
    _tp_stats: dict = field(default_factory=dict, repr=False)

    def flops_per_sample(self, mode: str) -> int:
        """Forward + backward FLOPs per sample under a precision trace mode (from the same traces as
        the activations; ``ActivationProfile.flops_per_sample``)."""
        return self.activations(mode).flops_per_sample

    def activations(self, mode: str, tp_degree: int = 1) -> ActivationProfile:
        """Traced activation profile for a precision trace mode ("fp32", "autocast", "half")."""
        key = (mode, tp_degree)
        if key not in self._activations:
            self._activations[key] = _cached_activations(_spec_key(self.spec), self.spec, mode, self.attention,
                                                         self.checkpointing, tp_degree)
        return self._activations[key]

    def tp_stats(self, tp_degree: int) -> ParamStats:
        if tp_degree == 1:
            return self.stats
        if tp_degree not in self._tp_stats:
            self._tp_stats[tp_degree] = param_stats(self.spec, tp_degree)
        return self._tp_stats[tp_degree]


def _spec_key(spec: ModelSpec) -> str:
    return json.dumps(asdict(spec), sort_keys=True, default=str)


_TRACE_CACHE: "OrderedDict[tuple, ActivationProfile]" = OrderedDict()
_TRACE_CACHE_SIZE = 64
_TRACE_LOCK = threading.Lock()


def _cached_activations(key: str, spec: ModelSpec, mode: str, attention: str, checkpointing: bool,
                        tp_degree: int) -> ActivationProfile:
    """Traces are pure functions of their inputs and immutable: keep the last few (the page and
    repeated plans of one model re-use them)."""
    full_key = (key, mode, attention, checkpointing, tp_degree)
    with _TRACE_LOCK:
        if full_key in _TRACE_CACHE:
            _TRACE_CACHE.move_to_end(full_key)
            return _TRACE_CACHE[full_key]
    result = profile_activations(spec, mode, attention, checkpointing, tp_degree=tp_degree)
    with _TRACE_LOCK:
        _TRACE_CACHE[full_key] = result
        while len(_TRACE_CACHE) > _TRACE_CACHE_SIZE:
            _TRACE_CACHE.popitem(last=False)
    return result


def build_profile(spec: ModelSpec, attention: str, checkpointing: bool) -> ModelProfile:
    return ModelProfile(spec=spec, stats=param_stats(spec), attention=attention, checkpointing=checkpointing)
