"""Importing an emitted train.py in a test process (its main() does not run: the __main__ guard)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_train_py(path: Path, name: str) -> ModuleType:
    """``path`` (a train.py) as module ``name``, with the data.py beside it as its ``data``: each script gets its
    own (the ``data`` an earlier script imported is forgotten first, and again after)."""
    folder = str(path.parent)
    sys.modules.pop("data", None)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
        sys.modules.pop("data", None)
    return module
