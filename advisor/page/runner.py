"""Verification from the page: the "Verify on this machine" section, its run folders (a new one per run, never
an existing one), the worker thread that runs ``advisor.verify.verify`` (``VerifyJob``, kept in the session so a
rerun resumes following it) and its progress and result as shown."""

from __future__ import annotations

import importlib
import logging
import queue
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from advisor.errors import AdvisorError
from advisor.page.form import Form
from advisor.page.words import gib, md, one_line, say
from advisor.schema import PlanInputs, get_field

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator

    from advisor.verify import VerifyResult

log = logging.getLogger("advisor.app")

DEFAULT_RUNS_DIR = "advisor-runs"  # what the CLI's --verify uses without --emit (advisor.verify), from the cwd
_DONE_OF_TOTAL = re.compile(r"\b(\d+)\s*/\s*(\d+)\b")


class Progress:
    """Shows ``verify``'s progress reports inside an ``st.status``: strings become the status text; a
    fraction in [0, 1], a ``(done, total)`` pair of numbers or "N/M" in the text moves the bar. Accepts
    any call shape.
    Called from the script thread only (see ``follow_verify``)."""

    def __init__(self, status: DeltaGenerator) -> None:
        self._bar = status.progress(0.0)
        self._text = status.empty()
        self._elapsed = status.empty()
        self._start = time.monotonic()

    def __call__(self, *args: object, **kwargs: object) -> None:
        values = list(args) + list(kwargs.values())
        texts = [str(v) for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        fraction = None
        if len(numbers) >= 2 and numbers[1]:
            fraction = numbers[0] / numbers[1]
        elif len(numbers) == 1 and 0 <= numbers[0] <= 1:
            fraction = float(numbers[0])
        elif texts and (m := _DONE_OF_TOTAL.search(" ".join(texts))) and int(m.group(2)):
            fraction = int(m.group(1)) / int(m.group(2))  # "step 3/6 loss 2.1"
        if fraction is not None:
            self._bar.progress(min(max(fraction, 0.0), 1.0))
        elif numbers:
            texts += [str(n) for n in numbers]
        if texts:
            self._text.text(" ".join(texts))

    def tick(self) -> None:
        """Show the seconds since the run started."""
        self._elapsed.caption(f"{time.monotonic() - self._start:.0f} s")


@dataclass
class VerifyJob:
    """A verification running in a worker thread. Kept in ``st.session_state``: a rerun of the page
    (any widget change) resumes following it instead of losing it, and sessions never share one."""

    run_key: str
    strategy: str
    steps: int
    future: Future[VerifyResult]
    messages: queue.SimpleQueue[tuple[tuple[object, ...], dict[str, object]]]


@dataclass(frozen=True)
class VerifyOutcome:
    """A finished verification as the page shows it (what it reads of ``advisor.verify.VerifyResult``):
    ``per_rank`` holds each rank's ``measured_peak_bytes`` and ``estimated_peak_bytes`` (bytes) by ``rank``;
    ``relative_error`` is (estimate - measured) / measured, None when nothing was measured."""

    ok: bool
    message: str
    per_rank: list[dict[str, int | float | None]]
    relative_error: float | None
    log_dir: str


def new_run_dir(folder: str, model: str, strategy: str) -> Path:
    """A folder for one verification run that does not exist yet: ``folder/MODEL-STRATEGY-TIME``, with
    ``-2``, ``-3``... when that is taken (an existing run is never written into).

    Raises:
        AdvisorError: ``folder`` exists and is not a folder.
    """
    label = get_field("runs_dir").label
    try:
        base = runs_base(folder)
        if base.exists() and not base.is_dir():
            raise AdvisorError(f"{label} {base}: exists and is not a folder: choose another")
        stem = f"{run_stem(model, strategy)}-{time.strftime('%Y%m%d-%H%M%S')}"
        run, n = base / stem, 2
        while run.exists():
            run, n = base / f"{stem}-{n}", n + 1
    except (OSError, ValueError) as err:  # a path the OS refuses (a NUL byte, too long, no permission)
        raise AdvisorError(f"{label} {folder[:200]!r}: not a usable folder ({err}): choose another")
    return run


def runs_base(folder: str) -> Path:
    """The runs folder as an absolute path (empty: the default, from the server's working directory)."""
    return Path(folder.strip() or DEFAULT_RUNS_DIR).expanduser().resolve()


def run_stem(model: str, strategy: str) -> str:
    """MODEL-STRATEGY as a run folder's name starts (advisor.verify names its runs the same way)."""
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', model)}-{strategy}"


def start_verify(
    inputs: PlanInputs, strategy: str, steps: int, timeout_s: int, run_key: str, run_dir: Path
) -> VerifyJob | None:
    """Import ``advisor.verify`` (optional: it may not exist yet) and start ``verify`` in a worker
    thread, writing into ``run_dir`` (a new folder: never ``force``); its progress reports are queued for
    the script thread. None after showing why not."""
    try:
        verify = importlib.import_module("advisor.verify").verify
    except (ImportError, AttributeError) as err:
        st.info(md(f"verification is not available yet ({err})"))
        return None
    messages: queue.SimpleQueue[tuple[tuple[object, ...], dict[str, object]]] = queue.SimpleQueue()
    future: Future[VerifyResult] = Future()

    def work() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(
                verify(
                    inputs,
                    strategy,
                    steps=steps,
                    timeout_s=timeout_s,
                    out_dir=str(run_dir),
                    force=False,
                    progress=lambda *a, **k: messages.put((a, k)),
                )
            )
        except BaseException as err:  # handed to the script thread, which shows it
            future.set_exception(err)

    threading.Thread(target=work, name=f"advisor-verify-{strategy}", daemon=True).start()
    return VerifyJob(run_key, strategy, steps, future, messages)


def follow_verify(job: VerifyJob) -> VerifyOutcome | None:
    """Show the job's progress until it ends; return its outcome, or None after
    showing the error. Polls from the script thread (Streamlit calls from the worker would be lost)."""
    # The progress lines count the timed steps too (step 1/11 .. 11/11 for 6 measured ones).
    timed = getattr(importlib.import_module("advisor.verify"), "TIMING_STEPS", 0)
    label = f"{job.steps} steps measured for memory" + (f", then {timed} timed" if timed else "")
    with st.status(f"Verifying {job.strategy} on this machine ({label})...", expanded=True) as status:
        progress = Progress(status)
        while True:
            done = job.future.done()
            while not job.messages.empty():
                args, kwargs = job.messages.get()
                progress(*args, **kwargs)
            if done:
                break
            progress.tick()  # a Streamlit call, so a rerun request can end this wait (the job goes on)
            time.sleep(0.3)
        err = job.future.exception()
        if isinstance(err, AdvisorError):
            busy = type(err).__name__ == "VerifyBusy"
            status.update(label="another verification is running" if busy else "verification failed", state="error")
            (st.warning if busy else st.error)(say(str(err)))
            return None
        if err is not None:
            log.error("verify failed", exc_info=err)
            status.update(label="verification failed", state="error")
            st.error(md(f"verification failed: {one_line(err)}"))
            return None
        result = job.future.result()
        ok = bool(getattr(result, "ok", False))
        status.update(label="verification finished", state="complete" if ok else "error")
    return VerifyOutcome(
        ok=ok,
        message=str(getattr(result, "message", "")),
        per_rank=list(getattr(result, "per_rank", []) or []),
        relative_error=getattr(result, "relative_error", None),
        log_dir=str(getattr(result, "log_dir", "") or ""),
    )


def show_verify_result(result: VerifyOutcome) -> None:
    """Verdict, estimate vs measured peak per rank, relative error and where the logs are."""
    (st.success if result.ok else st.error)(say(result.message or ("verified" if result.ok else "failed")))
    rows = []
    for r in result.per_rank:
        measured, estimated = r.get("measured_peak_bytes"), r.get("estimated_peak_bytes")
        err = (estimated - measured) / measured if estimated is not None and measured else None
        rows.append(
            {
                "rank": r.get("rank"),
                "estimated peak (GiB)": gib(estimated),
                "measured peak (GiB)": gib(measured),
                "estimate error": None if err is None else f"{err:+.1%}",
            }
        )
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    if result.relative_error is not None:
        st.metric(
            "Relative error of the estimate",
            f"{result.relative_error:+.1%}",
            help="(estimate - measured) / measured peak allocated, as advisor.verify reports it",
        )
    if result.log_dir:
        st.caption(md(f"logs: {result.log_dir}"))


def show_verify(form: Form, strategy: str, model: str) -> None:
    """The "verify on this machine" button and where the run goes; the last result stays while the
    inputs are unchanged."""
    st.subheader("Verify on this machine")
    st.caption(
        "Runs the chosen strategy's training for a few steps on this machine's devices and compares "
        "the measured peak memory per rank with the estimate."
    )
    c1, c2 = st.columns(2)
    sf, tf = get_field("steps"), get_field("timeout")
    assert sf.opt.low is not None and sf.opt.high is not None and tf.opt.high is not None, "bounded in the schema"
    steps = int(
        c1.number_input(
            sf.label, min_value=int(sf.opt.low), max_value=int(sf.opt.high), value=6, key="steps", help=sf.opt.help
        )
    )
    timeout_s = int(
        c2.number_input(tf.label, min_value=1, max_value=int(tf.opt.high), value=600, key="timeout", help=tf.opt.help)
    )
    rf = get_field("runs_dir")
    folder = st.text_input(rf.label, value=str(Path(DEFAULT_RUNS_DIR).resolve()), key="runs_dir", help=rf.opt.help)
    try:
        where = str(runs_base(folder) / f"{run_stem(model, strategy)}-TIME")
    except (OSError, ValueError):
        where = f"{folder[:200]}/..."
    st.caption(
        md(
            f"a run goes into a new folder {where} (train.py, launch.sh, run.log, the report); existing "
            "runs are never overwritten"
        )
    )
    run_key = f"{form.key()}|{strategy}"
    job: VerifyJob | None = st.session_state.get("verify_job")
    if st.button("Verify on this machine", key="verify"):
        if job is not None:
            st.warning("a verification started from this page is still running: its progress is below")
        else:
            st.session_state.pop("verify_result", None)
            try:
                run_dir = new_run_dir(folder, model, strategy)
            except AdvisorError as err:
                st.error(say(str(err)))
                return
            job = start_verify(form.to_inputs(), strategy, steps, timeout_s, run_key, run_dir)
            if job is not None:
                st.session_state["verify_job"] = job
    if job is not None:
        if job.run_key != run_key:
            st.caption(md(f"following the verification of {job.strategy} started with other inputs"))
        result = follow_verify(job)
        del st.session_state["verify_job"]
        if result is not None:
            st.session_state["verify_result"] = (job.run_key, result)
    saved = st.session_state.get("verify_result")
    if saved and saved[0] == run_key:
        show_verify_result(saved[1])
