import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Tests take their own verification lock, so a developer's benchmark run does not make them busy.
os.environ["ADVISOR_VERIFY_LOCK"] = str(ROOT / ".pytest-verify.lock")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
