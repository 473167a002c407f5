"""Process-wide locks for what advisor cannot make thread-safe itself.

The Streamlit page plans each browser session in its own thread, so plans run concurrently. Everything a
trace changes is thread-local (``advisor.trace``: a ``TorchFunctionMode`` for attention and for the build
dtype, ``FakeTensorMode`` and the memory-tracking dispatch mode live on this thread's mode stacks), except
what other libraries do while a model is *constructed*:

* transformers replaces the ``torch.nn.init`` functions process-wide while it initialises weights
  (``PreTrainedModel.initialize_weights`` runs under ``transformers.initialization.guard_torch_init_functions``,
  which patches ``torch.nn.init`` and nine ``torch.nn.modules.*`` modules and restores them afterwards; it
  skips this on the ``meta`` device, where advisor builds, but not on a real or fake device). Two
  overlapping constructions can save each other's patched functions as "originals" and leave them patched.
* transformers sets the process default dtype around ``from_pretrained`` / ``from_config(dtype=...)``
  (``modeling_utils.local_torch_dtype``), which every other thread's factory calls would see.
* transformers' top-level module is a lazy module that imports submodules on first attribute access and
  is not safe to do so from several threads at once (16 threads at once raised ``ImportError: cannot
  import name 'AutoConfig' from 'transformers'``); ``AutoConfig.for_model`` and the model classes resolve
  lazily too.
* a user's ``--model-factory`` function may do anything (set the default dtype, patch init functions).

``MODEL_BUILD_LOCK`` serialises all of that: hold it for the whole construction of any model (the trace's
build and ``advisor.profile.param_stats``) and around any first access to transformers' lazy names.
It is re-entrant, so code that holds it can call helpers that take it again (``build_model`` ->
``hf_config``). Each whole trace holds it too (``advisor.trace.trace_step``): torch's autocast cache of
weight casts is one process-wide map that any thread leaving its outermost autocast region clears, so
concurrent autocast traces freed each other's cached casts.
"""

from __future__ import annotations

import threading

MODEL_BUILD_LOCK = threading.RLock()
