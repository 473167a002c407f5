import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from advisor.faces import collect_garbage_less_often

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Tests take their own verification lock, so a developer's benchmark run does not make them busy.
# Under pytest-xdist each worker has its own (PYTEST_XDIST_WORKER): two workers' verifications may run side by side.
os.environ["ADVISOR_VERIFY_LOCK"] = str(ROOT / f".pytest-verify{os.environ.get('PYTEST_XDIST_WORKER', '')}.lock")
# Tests never write the user's trace cache (~/.cache/advisor); tests of the cache set their own directory.
# pytest-xdist's workers share one: the controller (the process without PYTEST_XDIST_WORKER, or a plain run) makes it
# and exports it to the workers it starts, so a trace or CPU calibration one worker made serves the other, as the
# cache serves two users' processes (tests/test_concurrency.py); the controller removes it at the end of the run
# (temporary folders left by every run filled the disk).
if os.environ.get("PYTEST_XDIST_WORKER") is None:
    _OWN_CACHE: str | None = tempfile.mkdtemp(prefix="advisor-test-cache-")
    os.environ["ADVISOR_TEST_CACHE"] = _OWN_CACHE
else:
    _OWN_CACHE = None  # a worker: its controller exported ADVISOR_TEST_CACHE
os.environ["ADVISOR_CACHE_DIR"] = os.environ["ADVISOR_TEST_CACHE"]
# Each pytest-xdist worker plans hundreds of models in one process, as the CLI plans one: the same garbage-collector
# threshold as the CLI's (advisor.faces.collect_garbage_less_often; the suite's golden, MoE and LoRA tests took 152 s
# with CPython's default and 129 s with it, one process, measured here).
collect_garbage_less_often()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session", autouse=True)
def one_cpu_calibration_per_session() -> Iterator[None]:
    """Verification runs reuse the session's CPU calibration (``advisor.timing.calibrate``, one per rank count, in the
    session's cache) however busy the machine was while it was measured. A calibration measured beside other load is
    ``contended`` and, for users, measured again after ``CONTENDED_TTL_S`` (10 minutes): on a shared machine every
    verification more than 10 minutes after the last measurement paid another one (worker processes importing torch,
    10-20 s). No test reads the predicted step time's value; tests/test_cpu_calibration.py tests the renewal with
    ages of its own."""
    from advisor.timing import calibrate

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "CONTENDED_TTL_S", 24 * 3600.0)
        # Each benchmark of a calibration the suite measures runs 0.15 s instead of 0.5: a rank's calibration takes
        # 3.7 s instead of 6.3 (one rank, measured here), and the 4-rank one of test_tp_dp_runs_on_four_ranks shares
        # two cores. Only bench smoke's re-prediction reads a predicted value, from the same calibration.
        mp.setattr(calibrate, "SECONDS_PER_BENCHMARK", 0.15)
        yield


@pytest.fixture(autouse=True)
def no_what_if_traces(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans skip the what-if traces: the tensor-parallel shards of other GPU counts that ``plan()`` traces into
    the disk cache for later questions (``Strategy.what_if_traces``, 3 shards of 4 traces each for a model with a TP
    plan). They are no part of the plan (nothing in it reads them), so every test does without them (autouse: in
    the suite they cost a minute or more of 2 busy cores); tests of the cache keep them with
    ``@pytest.mark.what_if_traces`` (tests/test_trace_cache.py). Processes a test launches (the CLI) trace them."""
    if request.node.get_closest_marker("what_if_traces"):
        return
    from strategies import all_strategies

    for cls in {type(s) for s in all_strategies()}:
        monkeypatch.setattr(cls, "what_if_traces", lambda self, ctx: [])
