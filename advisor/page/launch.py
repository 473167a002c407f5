"""``advisor page [streamlit run options]``: serve the page of the installed package (``advisor/page/app.py``)
with ``python -m streamlit run``, the same interpreter and the options passed through. Streamlit is optional
(``pip install streamlit``, or the checkout's ``app`` extra): without it, one line and a non-zero exit. Imports no
Streamlit itself."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from advisor.faces import EXIT_INTERRUPTED

PAGE = Path(__file__).resolve().with_name("app.py")
NEEDS_STREAMLIT = "advisor page needs streamlit: pip install streamlit (in a checkout: pip install '.[app]')"
EXIT_NO_STREAMLIT = 1
# The repository's .streamlit/config.toml, which a page served from elsewhere does not read: no usage statistics,
# no file watcher (nothing to reload in an installed package), uploads up to 1 MB (a config.json or a script), a
# minimal toolbar. Given before the caller's options: Streamlit takes the last value of an option given twice.
SETTINGS = (
    "--browser.gatherUsageStats",
    "false",
    "--server.fileWatcherType",
    "none",
    "--server.maxUploadSize",
    "1",
    "--client.toolbarMode",
    "minimal",
)
USAGE = (
    "usage: advisor page [streamlit run options]\n\n"
    "Serve advisor's page (the form, the plan's charts, verify on this machine, the script check) with Streamlit:\n"
    "  advisor page                                   # http://localhost:8501\n"
    "  advisor page --server.port 8600 --server.headless true\n"
    "The options are streamlit run's (python -m streamlit run --help lists them); needs streamlit installed."
)
STOP_WAIT_S = 10.0  # after Ctrl-C: how long Streamlit may take to stop before it is killed


def page_command(argv: Sequence[str]) -> list[str]:
    """The command that serves the page: ``python -m streamlit run PAGE SETTINGS... ARGV...`` (``argv``: streamlit
    run's own options, e.g. ``--server.port 8600``, which win over ``SETTINGS``)."""
    return [sys.executable, "-m", "streamlit", "run", str(PAGE), *SETTINGS, *argv]


def main(argv: Sequence[str]) -> int:
    """Serve the page until Streamlit exits; returns its exit code, ``EXIT_NO_STREAMLIT`` (after one line on
    stderr) when streamlit is not installed, 130 after Ctrl-C (Streamlit, in the same terminal, gets it too
    and stops by itself)."""
    if any(a in ("-h", "--help") for a in argv):  # advisor's usage, not streamlit run's (which names another file)
        print(USAGE)
        return 0
    if importlib.util.find_spec("streamlit") is None:
        print(NEEDS_STREAMLIT, file=sys.stderr)
        return EXIT_NO_STREAMLIT
    proc = subprocess.Popen(page_command(argv))
    # A `kill` of this process (SIGTERM) stops the page too: without it Streamlit, a child, kept serving. The
    # caller's own handler comes back when the page has stopped.
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: proc.terminate())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
