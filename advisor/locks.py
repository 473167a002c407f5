"""Process-wide locks (placeholder until the trace work lands)."""

from __future__ import annotations

import threading

MODEL_BUILD_LOCK = threading.RLock()
