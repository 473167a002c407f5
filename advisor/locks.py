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
``hf_config``). Only construction is serialised: the forward and backward of traces run in parallel.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

MODEL_BUILD_LOCK = threading.RLock()


@dataclass(frozen=True)
class Transformers:
    """transformers' names advisor uses, resolved once under ``MODEL_BUILD_LOCK``."""

    module: ModuleType  # ``transformers``
    AutoConfig: type
    CONFIG_MAPPING: Any  # transformers.CONFIG_MAPPING (model_type -> config class, lazily imported)
    modeling_auto: ModuleType  # transformers.models.auto.modeling_auto (the *_MAPPING_NAMES tables)
    logging: ModuleType  # transformers.utils.logging

    def model_class(self, name: str) -> type:
        """``getattr(transformers, name)`` (which imports the model's module on first use) under the lock.

        Raises:
            AttributeError: transformers has no such name.
        """
        with MODEL_BUILD_LOCK:
            return getattr(self.module, name)

    def config_class(self, model_type: str) -> type:
        """``CONFIG_MAPPING[model_type]`` (imports the config's module on first use) under the lock.

        Raises:
            KeyError: transformers does not know ``model_type``.
        """
        with MODEL_BUILD_LOCK:
            return self.CONFIG_MAPPING[model_type]


_TRANSFORMERS: Transformers | None = None


def import_transformers() -> Transformers:
    """Import transformers and resolve the lazy names advisor uses, once per process, under
    ``MODEL_BUILD_LOCK``; later calls return the same object without taking the lock.

    Raises:
        ImportError: transformers is not installed.
    """
    global _TRANSFORMERS
    names = _TRANSFORMERS
    if names is None:
        with MODEL_BUILD_LOCK:
            if _TRANSFORMERS is None:
                import transformers
                from transformers import CONFIG_MAPPING, AutoConfig
                from transformers.models.auto import modeling_auto
                from transformers.utils import logging as hf_logging

                _TRANSFORMERS = Transformers(module=transformers, AutoConfig=AutoConfig,
                                             CONFIG_MAPPING=CONFIG_MAPPING, modeling_auto=modeling_auto,
                                             logging=hf_logging)
            names = _TRANSFORMERS
    return names
