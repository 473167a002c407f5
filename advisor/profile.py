"""Model profile: parameter statistics from a ``meta`` build plus lazily traced activation profiles.

Thread safety (the page plans each browser session in its own thread, and plans share profiles): every
lazily computed value (a ``ModelProfile``'s activation profiles and tensor-parallel statistics, the
process-wide trace cache) lives in a ``OnceCache``: the first thread to ask for a key computes it while
later askers of that key wait and get the same object; different keys compute in parallel. Values are
immutable (frozen dataclasses of tuples). Model construction holds ``advisor.locks.MODEL_BUILD_LOCK``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, TypedDict

from .cache import DiskCache, NullCache
from .choices import Attention, TraceMode
from .locks import MODEL_BUILD_LOCK
from .models import ModelSpec, build_model, family_of
from .once_cache import OnceCache
from .trace import ActivationProfile, profile_activations
from .trace.keys import activation_profile_from_json, dataclass_from_json, model_key, to_json

if TYPE_CHECKING:
    import torch

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
    # Mixture of experts (``routed_experts``): parameters one token uses, every non-expert parameter plus
    # top-k / n of the routed experts' (= num_params for a dense model); num_experts and experts_per_token
    # are 0 for a dense model. FLOPs follow the active count, memory the total.
    num_active_params: int
    num_experts: int
    experts_per_token: int
    # Modules with a parameter of at least ZERO3_PERSISTENCE_THRESHOLD elements: the modules whose parameters
    # ZeRO-3 gathers, one coalesced all-gather each, in forward and in backward (0: not counted).
    num_gathered_modules: int = 0
    # FSDP2's units (``strategies.fsdp2``): the root first (every parameter outside the repeated blocks), then one
    # per repeated block (``advisor.checkpointing.repeated_blocks``: what generated FSDP2 scripts ``fully_shard``),
    # each a tuple of (dim 0 size, numel, trainable, late) per parameter: FSDP2 pads dim 0 to a multiple of the shard
    # world size (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, ``_init_sharded_param``); ``late``: the input
    # embedding (``get_input_embeddings``), whose gradient reaches ``.grad`` last: untied, its backward runs last;
    # tied to the LM head, autograd holds the head's contribution in its input buffer (a temporary the trace counts)
    # until the embedding's backward adds the second.
    fsdp_units: tuple[tuple[tuple[int, int, bool, bool], ...], ...] = ()
    # The trainable parameters' shapes (optimizer states per tensor: 8-bit optimizers keep small tensors in fp32,
    # Adafactor factors matrices; ``advisor.bnb_layout.optimizer_state_bytes``).
    trainable_shapes: tuple[tuple[int, ...], ...] = ()
    # QLoRA (``ModelSpec.adapter.quantize``): the frozen weights bitsandbytes quantizes
    # (``advisor.models.adapters.quantized_weights``): their elements, the bytes their quantized storage and quant
    # states hold (``advisor.bnb_layout.quantized_weight_bytes``), and the largest one (its dequantized copy is the
    # temporary a quantized layer's forward and backward make). All 0 without quantization.
    quantized_numel: int = 0
    quantized_bytes: int = 0
    largest_quantized_numel: int = 0
    # Each quantized weight's (out_features, in_features), and the largest module's parameters not counting quantized
    # weights: ZeRO-3 partitions and gathers every quantized weight as its packed storage
    # (``advisor.bnb_layout.quant_storage_numel``), each tensor on its own (``strategies.zero``). () and 0 without
    # quantization.
    quantized_shapes: tuple[tuple[int, ...], ...] = ()
    largest_unquantized_module_params: int = 0
    # Frozen elements of a mixture of experts' routed experts that bitsandbytes leaves unquantized: transformers stores
    # them as fused 3-D parameters of the experts module (``routed_experts``), not ``nn.Linear`` weights, and
    # ``replace_with_bnb_linear`` replaces ``nn.Linear`` modules only. 0 without quantization or experts.
    unquantized_expert_numel: int = 0

    @property
    def num_frozen(self) -> int:
        return self.num_params - self.num_trainable

    @property
    def late_trainable_numel(self) -> int:
        """Trainable elements whose gradient is ready only when backward ends: the input embedding's
        (``fsdp_units``' ``late`` flag; 0 without a unit list)."""
        root = self.fsdp_units[0] if self.fsdp_units else ()
        return sum(size for _dim0, size, trainable, late in root if trainable and late)


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
    num_params = sum(p.numel() for p in params)
    experts = routed_experts(model)
    expert_params = {id(p): p for m, _, _ in experts for p in m.parameters()}  # shared ones once
    active = num_params - sum(p.numel() for p in expert_params.values())
    active += sum(sum(p.numel() for p in m.parameters()) * k // n for m, n, k in experts)
    return ParamStats(
        num_params=num_params,
        num_trainable=sum(p.numel() for p in params if p.requires_grad),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        num_param_tensors=len(params),
        largest_param_numel=max((p.numel() for p in params), default=0),
        largest_module_params=largest_module,
        persistent_params=sum(p.numel() for p in params if p.numel() < ZERO3_PERSISTENCE_THRESHOLD),
        has_batchnorm=any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()),
        num_active_params=active,
        num_experts=max((n for _, n, _ in experts), default=0),
        experts_per_token=max((k for _, _, k in experts), default=0),
        num_gathered_modules=sum(
            1
            for m in model.modules()
            if any(p.numel() >= ZERO3_PERSISTENCE_THRESHOLD for p in m.parameters(recurse=False))
        ),
        fsdp_units=fsdp_units(model),
        trainable_shapes=tuple(tuple(int(d) for d in p.shape) for p in params if p.requires_grad),
        **_quantized(model, spec),
    )


class _QuantizedFields(TypedDict, total=False):
    """``ParamStats``' quantization fields, as ``_quantized`` returns them (none: the defaults, zeros)."""

    quantized_numel: int
    quantized_bytes: int
    largest_quantized_numel: int
    quantized_shapes: tuple[tuple[int, ...], ...]
    largest_unquantized_module_params: int
    unquantized_expert_numel: int


def _quantized(model: torch.nn.Module, spec: ModelSpec) -> _QuantizedFields:
    """``ParamStats``' quantization fields of ``model`` (zeros without ``spec.adapter.quantize``)."""
    a = spec.adapter
    if a is None or not a.quantize:
        return {}
    from .bnb_layout import quantized_weight_bytes
    from .models.adapters import quantized_weights

    found = quantized_weights(model)
    quantized = {id(w) for w, _ in found}
    plain = max(
        (sum(p.numel() for p in m.parameters(recurse=False) if id(p) not in quantized) for m in model.modules()),
        default=0,
    )
    return {
        "quantized_numel": sum(w.numel() for w, _ in found),
        "quantized_bytes": sum(quantized_weight_bytes(shape, a.quantize, a.double_quant) for _, shape in found),
        "largest_quantized_numel": max((w.numel() for w, _ in found), default=0),
        "quantized_shapes": tuple(tuple(shape) for _, shape in found),
        "largest_unquantized_module_params": plain,
        "unquantized_expert_numel": sum(
            p.numel()
            for p in {id(p): p for m, _, _ in routed_experts(model) for p in m.parameters()}.values()
            if not p.requires_grad and id(p) not in quantized
        ),
    }


def fsdp_units(model: torch.nn.Module) -> tuple[tuple[tuple[int, int, bool, bool], ...], ...]:
    """``ParamStats.fsdp_units`` of ``model``: the root unit, then one per repeated block; shared (tied)
    parameters once, in the first unit that owns them, as ``fully_shard`` assigns them."""
    from .checkpointing import repeated_blocks

    seen: set[int] = set()
    late: set[int] = set()
    get_in = getattr(model, "get_input_embeddings", None)
    emb = get_in() if callable(get_in) else None
    if emb is not None and getattr(emb, "weight", None) is not None:
        late.add(id(emb.weight))

    def unit(params: Iterable[torch.nn.Parameter]) -> tuple[tuple[int, int, bool, bool], ...]:
        out = []
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                out.append((int(p.shape[0]) if p.dim() else 1, p.numel(), bool(p.requires_grad), id(p) in late))
        return tuple(out)

    blocks = [unit(b.parameters()) for b in repeated_blocks(model)]
    return (unit(model.parameters()),) + tuple(blocks)


def routed_experts(model: torch.nn.Module) -> list[tuple[torch.nn.Module, int, int]]:
    """The routed-experts modules of a mixture-of-experts model as (module, experts n, experts per token k):
    transformers' ``@use_experts_implementation`` classes (Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE, ...),
    which hold every expert's weights stacked along a first dimension of n and mark themselves with
    ``has_gate`` and ``_is_expert_parallel``; k is the config's ``num_experts_per_tok``. Shared experts and
    routers are ordinary modules (used by every token). Empty for a dense model."""
    found = []
    for m in model.modules():
        config = getattr(m, "config", None)
        n = getattr(m, "num_experts", None)
        k = getattr(config, "num_experts_per_tok", None)
        if (
            hasattr(m, "has_gate")
            and hasattr(m, "_is_expert_parallel")
            and isinstance(n, int)
            and isinstance(k, int)
            and 0 < k <= n
        ):
            found.append((m, n, k))
    return found


@dataclass
class ModelProfile:
    """``spec`` + its parameter statistics + activation profiles traced on demand and cached.

    ``attention``, ``checkpointing`` and ``cpu_conv_scratch_threads`` are fixed per profile (they change
    every trace). ``cpu_conv_scratch_threads``: > 0 adds oneDNN's transient convolution weight-gradient
    scratch of CPU runs with that many threads (``advisor.trace.cpu_conv_scratch_bytes``); 0 (every GPU
    plan) none. Safe to share between threads: the lazily filled caches are ``OnceCache``s.
    """

    spec: ModelSpec
    stats: ParamStats
    attention: Attention
    checkpointing: bool
    cpu_conv_scratch_threads: int = 0
    cache: DiskCache | NullCache = field(default_factory=NullCache, repr=False, compare=False)
    _activations: OnceCache[ActivationProfile] = field(default_factory=OnceCache, repr=False, compare=False)
    _tp_stats: OnceCache[ParamStats] = field(default_factory=OnceCache, repr=False, compare=False)

    def flops_per_sample(self, mode: TraceMode) -> int:
        """Forward + backward FLOPs per sample under a precision trace mode (from the same traces as
        the activations; ``ActivationProfile.flops_per_sample``)."""
        return self.activations(mode).flops_per_sample

    def activations(self, mode: TraceMode, tp_degree: int = 1) -> ActivationProfile:
        """Traced activation profile for a precision trace mode ("fp32", "autocast", "half")."""
        return self._activations.get(
            (mode, tp_degree),
            lambda: _cached_activations(
                _spec_key(self.spec),
                self.spec,
                mode,
                self.attention,
                self.checkpointing,
                tp_degree,
                self.cache,
                self.cpu_conv_scratch_threads,
            ),
        )

    def tp_stats(self, tp_degree: int) -> ParamStats:
        if tp_degree == 1:
            return self.stats
        return self._tp_stats.get(tp_degree, lambda: cached_param_stats(self.spec, tp_degree, self.cache))


def _spec_key(spec: ModelSpec) -> str:
    return json.dumps(asdict(spec), sort_keys=True, default=str)


_TRACE_CACHE_SIZE = 64
_TRACE_CACHE: OnceCache[ActivationProfile] = OnceCache(maxsize=_TRACE_CACHE_SIZE)

# Kernels whose trace is another kernel's: the trace stands in for both fused kernels with one autograd function
# (``advisor.trace``: ``FusedAttention`` saves q, k, v, the output and the log-sum-exp, and counts the same FLOPs and
# bytes, for FlashAttention-2 and the memory-efficient kernel alike), so their traces differ only in the kernel's
# name in the label. The memory-efficient profile is the flash one relabelled: one trace (and one disk entry) for both.
_TRACED_AS: dict[Attention, Attention] = {Attention.MEM_EFFICIENT: Attention.FLASH}


def _cached_activations(
    key: str,
    spec: ModelSpec,
    mode: TraceMode,
    attention: Attention,
    checkpointing: bool,
    tp_degree: int,
    cache: DiskCache | NullCache | None = None,
    cpu_conv_scratch_threads: int = 0,
) -> ActivationProfile:
    """Traces are pure functions of their inputs and immutable: keep the last few (the page and
    repeated plans of one model re-use them) and, with a ``DiskCache``, keep them on disk. Threads asking
    for the same trace at once trace (or read) it once. A kernel in ``_TRACED_AS`` gets the profile of the
    kernel it is traced as, with its own label."""
    cache = cache or NullCache()
    threads = int(cpu_conv_scratch_threads)
    traced_as = _TRACED_AS.get(attention)
    if traced_as is not None:
        same = _cached_activations(key, spec, mode, traced_as, checkpointing, tp_degree, cache, threads)
        # The label is the kernel's name for a model that calls SDPA, else the model's own attention's.
        return replace(same, attention=attention) if same.attention == traced_as else same
    # Per cache location: a process that planned with --no-cache and then with the cache still writes it.
    full_key = (key, mode, attention, checkpointing, tp_degree, threads, _where(cache))

    def compute() -> ActivationProfile:
        disk_key = {
            "model": model_key(spec),
            "mode": mode,
            "attention": attention,
            "checkpointing": checkpointing,
            "tp_degree": tp_degree,
            "cpu_conv_scratch_threads": threads,
        }
        stored = cache.get("activations", disk_key)
        if isinstance(stored, dict):  # (a list: an entry of another shape, as below)
            try:
                return activation_profile_from_json(stored)
            except (KeyError, TypeError, ValueError):  # an entry of another shape: trace again, overwrite
                pass
        # The keyword only when set: the traces of GPU plans call exactly what they called before.
        scratch = {"cpu_conv_scratch_threads": threads} if threads else {}
        profile = profile_activations(spec, mode, attention, checkpointing, tp_degree=tp_degree, **scratch)
        cache.put("activations", disk_key, to_json(profile))
        return profile

    return _TRACE_CACHE.get(full_key, compute)


def clear_trace_cache() -> None:
    """Forget the in-process traces and counts (tests that must trace again)."""
    _TRACE_CACHE.clear()
    _STATS_CACHE.clear()


def build_profile(
    spec: ModelSpec,
    attention: Attention,
    checkpointing: bool,
    cache: DiskCache | NullCache | None = None,
    cpu_conv_scratch_threads: int = 0,
) -> ModelProfile:
    """The profile of ``spec`` for one attention kernel and checkpointing choice; ``cache`` (a
    ``DiskCache``; default none) keeps counts and traces between runs; ``cpu_conv_scratch_threads`` as
    ``ModelProfile`` (0 unless estimating a CPU run).

    Raises:
        AdvisorError: the model cannot be built.
    """
    cache = cache or NullCache()
    return ModelProfile(
        spec=spec,
        stats=cached_param_stats(spec, 1, cache),
        attention=attention,
        checkpointing=checkpointing,
        cpu_conv_scratch_threads=int(cpu_conv_scratch_threads),
        cache=cache,
    )


_STATS_CACHE: OnceCache[ParamStats] = OnceCache(maxsize=_TRACE_CACHE_SIZE)


def cached_param_stats(spec: ModelSpec, tp_degree: int, cache: DiskCache | NullCache | None = None) -> ParamStats:
    """``param_stats`` kept in-process and, with a ``DiskCache``, on disk (no model is built on a hit)."""
    cache = cache or NullCache()

    def compute() -> ParamStats:
        key = {"model": model_key(spec), "tp_degree": tp_degree}
        stored = cache.get("param_stats", key)
        if isinstance(stored, dict) and set(stored) == {f.name for f in dataclasses.fields(ParamStats)}:
            return dataclass_from_json(ParamStats, stored)
        stats = param_stats(spec, tp_degree)
        cache.put("param_stats", key, dataclasses.asdict(stats))
        return stats

    return _STATS_CACHE.get((_spec_key(spec), tp_degree, _where(cache)), compute)


def _where(cache: DiskCache | NullCache) -> str | None:
    """The disk cache's directory (None: no disk cache), part of the in-process keys."""
    return None if isinstance(cache, NullCache) else str(cache.directory)


def attention_dropout(spec: ModelSpec, cache: DiskCache | NullCache | None = None) -> float:
    """The model's attention-probability dropout (``ModelFamily.attention_dropout``; it decides the CPU
    attention kernel), kept on disk like the traces: reading it builds the transformers config class."""
    cache = cache or NullCache()
    key = {"model": model_key(spec)}
    stored = cache.get("facts", key)
    if isinstance(stored, dict) and isinstance(stored.get("attention_dropout"), (int, float)):
        return float(stored["attention_dropout"])
    value = family_of(spec).attention_dropout(spec)
    cache.put("facts", key, {"attention_dropout": value})
    return value
