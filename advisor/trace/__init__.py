"""The meta trace: one forward + backward under ``FakeTensorMode``, no real memory allocated.

What it measures (bytes, beyond the parameters and buffers themselves):

* ``activations``: everything still alive at the end of the forward pass (the tensors autograd
  saved for backward, the batch, the loss): what a training step holds between forward and backward.
* ``peak``: the largest live total at any point of forward + backward, split at that moment into
  the forward-retained activations still alive, the parameter gradients accumulated so far, and
  the rest ("other": temporaries, logits, the recompute of one block under activation checkpointing).
* FLOPs with ``torch.utils.flop_counter``'s per-op formulas (``flop_registry``, 2 FLOPs per multiply-add),
  counted in the same pass.
* per op, its FLOPs and the bytes it reads and writes (``_op_bytes``), per phase (``Timeline.fwd_ops`` /
  ``bwd_ops``), and the FLOPs of activation checkpointing's recompute (``recompute_flops``): the inputs of the
  step-time roofline (``ActivationProfile.compute_time``, ``advisor.timing.compute``), linear in the
  micro-batch and extrapolated in depth like every other figure. No second trace. Cached entries made before
  these fields existed are recomputed: the cache key holds a hash of this package's files
  (``advisor.trace.keys.code_hash``). Not ``FlopCounterMode`` itself: it keeps references to tensors (measured:
  +8% backward peak on gpt2) and sees nothing inside the fused-attention stand-in, which therefore
  counts itself with the library's ``sdpa_flop_count`` / ``sdpa_backward_flop_count``.

Live bytes are tracked per storage with a dispatch mode and weak references, the approach of
``torch.distributed._tools.mem_tracker.MemTracker``. We do not use MemTracker itself: it attributes
memory per module rather than per phase, has no notion of "retained at end of forward", and cannot
swap in the fused attention kernel's saved tensors (below), which changes the answer by 10-100x.

Attention: on ``meta``/fake tensors SDPA takes the math path and keeps the s x s scores. The trace
routes ``F.scaled_dot_product_attention`` through a ``torch.overrides.TorchFunctionMode``
(``_attention_mode_class``) to a stand-in that saves what the fused kernels save (q, k, v, output and
the fp32 log-sum-exp; FlashAttention-2 paper, Dao 2023, section 3.1) for ``flash``/``mem-efficient``,
or to the math path for ``math``: ``aten::_scaled_dot_product_attention_math`` called directly, with
the boolean-mask conversion and autocast casts that SDPA's own kernels do first, so the ops and saved
tensors are those of ``sdpa_kernel([SDPBackend.MATH])`` without setting its process-wide backend flags.
A torch-function mode rather than a ``TorchDispatchMode`` on ``aten._scaled_dot_product_flash_attention_for_cpu``:
the dispatch mode sits below autograd, so it cannot change what autograd saves (the real CPU kernel's
formula decides), flop_counter has no formula for the CPU kernel, and SDPA picks its backend in a
DispatchStub call no mode sees, so ``math`` would still need the global flags; the function mode
reproduces the previous figures exactly. Torch-function modes are
per thread, but torch neither keeps them inside a Python-level torch function it dispatches (so
``F.multi_head_attention_forward``, which calls SDPA, runs as a private copy bound to the stand-in)
nor carries them into backward (so checkpointed blocks recompute under a copy of the mode, passed as
checkpoint's ``context_fn``).

Mixture of experts: transformers' default ``grouped_mm`` experts path, whose shapes are those of balanced
top-k routing whatever the (fake) router picks; the dispatch mode runs its fp32 case, which FakeTensor's
meta kernel rejects, and counts its FLOPs, which flop_counter does not (see ``_grouped_mm_fp32``).

Construction (``build_for_trace``): on ``meta`` (torch's init functions do nothing there and
transformers skips weight initialisation, so nothing is patched), with floating tensors in the trace
dtype where the default dtype would apply (``BuildDtypeMode``: a per-thread stand-in for
``torch.set_default_dtype``; BatchNorm statistics bf16, rotary ``inv_freq`` fp32, as before), then
every parameter and buffer is re-created as a fake CPU tensor, shared ones staying shared.

Threads: nothing above touches process-wide state; ``advisor.locks.MODEL_BUILD_LOCK`` is held for
each whole trace all the same, because torch's autocast cache of weight casts is process-wide (see
``trace_step``). Plans from several threads give the plans made one after another
(``tests/test_concurrency.py``).

CPU convolution scratch (``cpu_conv_scratch_threads`` > 0; only for CPU verification estimates): on CPUs
without AVX-512, oneDNN computes some convolutions' weight gradient with its ``x64:gemm:jit`` kernel, whose
scratch buffer comes from the c10 allocator while ``aten::convolution_backward`` runs and is freed before
it returns, so no fake-tensor trace can see it. ``cpu_conv_scratch_bytes`` gives its size and the dispatch
mode adds it as a transient event right after that op (see the function for the rule and its sources).

Cost control: transformer stacks deeper than 4 blocks are traced at 1 and 2 blocks and extrapolated
linearly in depth (blocks are identical); every figure is
linear in the micro-batch (no op's memory depends on the batch otherwise), traced at 2 and 3.

Modules: ``timeline`` (``Timeline``, ``StepTrace``, ``ActivationProfile``: the events and their peaks),
``live_bytes`` (the dispatch mode), ``op_costs`` (per-op bytes for the roofline), ``attention`` (the SDPA
stand-ins), ``grouped_mm`` (mixture of experts), ``onednn`` (the CPU convolution scratch), ``build``
(``build_for_trace``), ``step`` (``trace_step``, ``profile_activations``) and ``keys`` (the disk cache's keys
and the JSON of a stored profile).
"""

from .build import build_for_trace
from .onednn import cpu_conv_scratch_bytes, onednn_gemm_bwd_weights_machine
from .step import ATTENTION_KERNELS, PRECISION_TRACE_MODES, TRUNCATE_ABOVE_LAYERS, profile_activations, trace_step
from .timeline import BASE_B, ActivationProfile, StepTrace, Timeline, evaluate

__all__ = [
    "ATTENTION_KERNELS",
    "BASE_B",
    "PRECISION_TRACE_MODES",
    "TRUNCATE_ABOVE_LAYERS",
    "ActivationProfile",
    "StepTrace",
    "Timeline",
    "build_for_trace",
    "cpu_conv_scratch_bytes",
    "evaluate",
    "onednn_gemm_bwd_weights_machine",
    "profile_activations",
    "trace_step",
]
