"""One traced training step (``trace_step``) and the profile of a model from a few of them (``profile_activations``).

A step is one forward + backward under ``FakeTensorMode`` with the dispatch mode of ``advisor.trace.live_bytes``
and the attention mode of ``advisor.trace.attention`` active; the profile traces micro-batch ``BASE_B`` and
``BASE_B + 1``, and deep transformer stacks at 1 and 2 blocks (``advisor.trace.timeline`` extrapolates).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from ..choices import Attention, TraceMode, values
from ..errors import AdvisorError
from ..locks import MODEL_BUILD_LOCK
from ..models import ModelSpec, family_of, make_batch, training_loss
from .attention import _attention_mode_class
from .build import build_for_trace
from .live_bytes import _LiveBytes
from .timeline import BASE_B, ActivationProfile, Timeline

if TYPE_CHECKING:
    import torch

PRECISION_TRACE_MODES = values(TraceMode)
ATTENTION_KERNELS = tuple(a.value for a in Attention if a is not Attention.AUTO)  # flash, mem-efficient, math
TRUNCATE_ABOVE_LAYERS = 4


def _attn_label(model: torch.nn.Module, kernel: Attention, calls: int) -> str:
    """The Training line's attention: the SDPA kernel, a transformers model's eager attention, or none for a model
    without a config that called no scaled-dot-product attention (a CNN read "attention flash")."""
    config = getattr(model, "config", None)
    if config is None and calls == 0:
        return "none (the model has no attention)"
    impl = getattr(config, "_attn_implementation", "sdpa") if config is not None else "sdpa"
    return kernel if impl == "sdpa" else "eager (the model's own attention keeps the s x s scores)"


def trace_step(
    spec: ModelSpec,
    micro_batch: int,
    mode: TraceMode,
    attention: Attention,
    checkpointing: bool,
    layers: int | None = None,
    tp_degree: int = 1,
    cpu_conv_scratch_threads: int = 0,
) -> tuple[Timeline, str, int]:
    """Trace one fwd+bwd of ``spec`` at ``micro_batch`` under fake tensors.

    Args:
        mode: "fp32" (fp32 weights), "autocast" (fp32 weights, bf16 autocast: DDP/TP mixed precision)
            or "half" (bf16 weights: DeepSpeed's bf16/fp16 modes and pure bf16).
        attention: one of ``ATTENTION_KERNELS``.
        layers: build only this many blocks (per stack) instead of the config's.
        tp_degree: build one tensor-parallel rank's shard (heads and MLP width divided).
        cpu_conv_scratch_threads: > 0: add oneDNN's transient weight-gradient scratch of the convolutions
            it computes with its gemm kernel, for runs with that many intra-op threads
            (``cpu_conv_scratch_bytes``; CPU estimates on CPUs without AVX-512 only). 0: none.

    Returns:
        (trace, attention kernel label, number of checkpointed blocks).

    Raises:
        AdvisorError: the model cannot run a step under fake tensors (e.g. data-dependent shapes).
    """
    # The whole trace holds the lock: torch's autocast keeps its cache of weight casts in one
    # process-wide map and clears it whenever any thread leaves its outermost autocast region (also the
    # one checkpoint recomputation enters, autocast on or off), which frees and re-casts another trace's
    # cached weights mid-step (measured: 10 of 24 autocast/checkpointed traces differed run from 24
    # threads at once). Tracing is pure Python under the GIL, so parallel traces were not faster anyway.
    with MODEL_BUILD_LOCK:
        return _trace_step(
            spec, micro_batch, mode, attention, checkpointing, layers, tp_degree, cpu_conv_scratch_threads
        )


def _trace_step(
    spec: ModelSpec,
    micro_batch: int,
    mode: TraceMode,
    attention: Attention,
    checkpointing: bool,
    layers: int | None,
    tp_degree: int,
    cpu_conv_scratch_threads: int = 0,
) -> tuple[Timeline, str, int]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    # FakeTensorMode logs a full traceback for an op that fails on shapes; the user gets our one line.
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    dtype = torch.bfloat16 if mode == TraceMode.HALF else torch.float32
    # LoRA under autocast holds its frozen base in 16 bits (``from_pretrained(..., dtype=...)``); the adapters follow
    # ``advisor.models.adapters.cast_for_trace``.
    build_dtype = torch.bfloat16 if mode == TraceMode.AUTOCAST and spec.adapter is not None else dtype
    model, blocks = build_for_trace(
        spec,
        dtype=build_dtype,
        fake=fake,
        layers=layers,
        tp_degree=tp_degree,
        checkpointing=checkpointing,
        half=mode == TraceMode.HALF,
    )
    exclude = [t.untyped_storage() for t in list(model.parameters()) + list(model.buffers())]
    tracker = _LiveBytes(exclude, cpu_conv_scratch_threads)
    hooks = [p.register_post_accumulate_grad_hook(tracker.on_grad) for p in model.parameters() if p.requires_grad]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if mode == TraceMode.AUTOCAST else contextlib.nullcontext()
    try:
        with fake, _attention_mode_class()(attention, tracker), tracker.mode:
            batch = make_batch(spec, micro_batch, dtype=dtype)
            with autocast:
                loss = training_loss(spec, model, batch)
            tracker.mark_forward_end()
            activations = tracker.cur
            loss.backward()
    except AdvisorError:
        raise
    except Exception as err:
        hints = {
            "custom": ": check --input-shape",
            # a torchvision model whose layers shrink the image below a kernel (alexnet at 16 px, inception_v3 at 224)
            "vision": ": try a larger --image-size" + (" (it is built for 299)" * (spec.model_type == "inception_v3")),
        }
        hint = hints.get(spec.family, "")
        raise AdvisorError(
            f"could not trace a training step of {spec.name} under fake tensors "
            f"({err.__class__.__name__}: {str(err).splitlines()[0][:160]}){hint}"
        )
    finally:
        for h in hooks:
            h.remove()
    grads = sum(p.grad.untyped_storage().nbytes() for p in model.parameters() if p.grad is not None)
    trace = Timeline(
        fwd=tuple(tracker.fwd_events),
        bwd=tuple(tracker.events),
        activations=activations,
        grads=grads,
        flops=tracker.flops,
        attention_calls=tracker.attention_calls,
        fwd_ops=tuple(tracker.fwd_ops),
        bwd_ops=tuple(tracker.ops),
        recompute_flops=tracker.recompute_flops,
    )
    return trace, _attn_label(model, attention, tracker.attention_calls), blocks


def profile_activations(
    spec: ModelSpec,
    mode: TraceMode,
    attention: Attention,
    checkpointing: bool,
    tp_degree: int = 1,
    cpu_conv_scratch_threads: int = 0,
) -> ActivationProfile:
    """Trace at micro-batch 2 and 3 (and, for transformer stacks deeper than 4 blocks, at 1 and 2
    blocks per stack, extrapolated linearly to the real depth). See the module docstring.
    ``cpu_conv_scratch_threads``: as ``trace_step`` (the scratch does not grow with the batch, so it is
    the same at every micro-batch >= 2; at 1 it is extrapolated although PyTorch then skips oneDNN).

    Raises:
        AdvisorError: as ``trace_step``.
    """
    per_stack, stacks = family_of(spec).block_stacks(spec)  # (0, 1): no block stack to truncate
    traced = (1, 2) if per_stack > TRUNCATE_ABOVE_LAYERS else (None,)
    entries, label, blocks = [], "", 0
    for d in traced:
        t1, label, blocks = trace_step(
            spec,
            BASE_B,
            mode,
            attention,
            checkpointing,
            layers=d,
            tp_degree=tp_degree,
            cpu_conv_scratch_threads=cpu_conv_scratch_threads,
        )
        t2, _, _ = trace_step(
            spec,
            BASE_B + 1,
            mode,
            attention,
            checkpointing,
            layers=d,
            tp_degree=tp_degree,
            cpu_conv_scratch_threads=cpu_conv_scratch_threads,
        )
        entries.append((d or per_stack, t1, t2))
    if per_stack:
        blocks = family_of(spec).num_blocks(spec) if checkpointing else 0
    return ActivationProfile(depths=tuple(entries), full_depth=per_stack, attention=label, checkpointed_blocks=blocks)
