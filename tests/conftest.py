import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Tests take their own verification lock, so a developer's benchmark run does not make them busy.
os.environ["ADVISOR_VERIFY_LOCK"] = str(ROOT / ".pytest-verify.lock")
# Tests never write the user's trace cache (~/.cache/advisor); tests of the cache set their own directory.
os.environ["ADVISOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="advisor-test-cache-")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def no_what_if_traces(monkeypatch):
    """Plans skip the what-if traces: the tensor-parallel shards of other GPU counts that ``plan()`` traces into
    the disk cache for later questions (``Strategy.what_if_traces``). They are no part of the plan (nothing in it
    reads them) and cost a trace each, so tests of a plan's figures do without them; tests of the cache
    (tests/test_trace_cache.py) keep them."""
    from strategies import all_strategies

    for cls in {type(s) for s in all_strategies()}:
        monkeypatch.setattr(cls, "what_if_traces", lambda self, ctx: [])
