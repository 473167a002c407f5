"""``advisor page`` (the installed Streamlit page, served by ``python -m streamlit run``) and ``advisor --version``,
without serving anything: the subprocess is a stand-in that records its command line."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import advisor
from advisor.cli import main
from advisor.page import launch


class FakePopen:
    """Records the command instead of starting Streamlit; exits with ``code``."""

    calls: list[list[str]] = []
    code = 0

    def __init__(self, cmd: list[str]) -> None:
        FakePopen.calls.append(cmd)

    def wait(self, timeout: float | None = None) -> int:
        return FakePopen.code

    def terminate(self) -> None:
        FakePopen.calls.append(["terminate"])


@pytest.fixture
def popen(monkeypatch: pytest.MonkeyPatch) -> type[FakePopen]:
    FakePopen.calls, FakePopen.code = [], 0
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    return FakePopen


def test_page_runs_the_installed_page_with_streamlit(popen: type[FakePopen]) -> None:
    assert main(["page", "--server.port", "8600", "--server.headless", "true"]) == 0
    page = Path(advisor.__file__).parent / "page" / "app.py"
    assert popen.calls == [
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(launch.PAGE),
            *launch.SETTINGS,
            "--server.port",
            "8600",
            "--server.headless",
            "true",
        ]
    ]
    assert "--browser.gatherUsageStats" in launch.SETTINGS  # .streamlit/config.toml's settings, as from the checkout
    assert launch.PAGE == page.resolve() and launch.PAGE.is_file()  # the page inside the imported package


def test_page_help_is_advisors_and_starts_nothing(popen: type[FakePopen], capsys: pytest.CaptureFixture[str]) -> None:
    """`advisor page --help` printed streamlit run's help ("assumed to be streamlit_app.py"; a new user's find)."""
    for flag in ("--help", "-h"):
        assert main(["page", flag]) == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: advisor page [streamlit run options]") and "streamlit_app" not in out
    assert popen.calls == []


def test_page_passes_streamlits_exit_code_on(popen: type[FakePopen]) -> None:
    popen.code = 3
    assert main(["page"]) == 3
    assert popen.calls[0][5:] == list(launch.SETTINGS)  # no extra arguments


def test_page_after_ctrl_c_waits_for_streamlit_to_stop(popen: type[FakePopen], monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float | None] = []

    def wait(self: FakePopen, timeout: float | None = None) -> int:
        waits.append(timeout)
        if len(waits) == 1:
            raise KeyboardInterrupt  # Ctrl-C reaches both processes; Streamlit then stops by itself
        return 0

    monkeypatch.setattr(FakePopen, "wait", wait)
    assert main(["page"]) == 130
    assert waits == [None, launch.STOP_WAIT_S]


def test_a_kill_of_the_page_stops_streamlit(popen: type[FakePopen], monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM to ``advisor page`` terminates its Streamlit child (a plain kill used to leave it serving), and the
    handler before the page is back afterwards."""
    before = signal.getsignal(signal.SIGTERM)

    def wait(self: FakePopen, timeout: float | None = None) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # `kill <pid of advisor page>` while Streamlit serves
        return -signal.SIGTERM

    monkeypatch.setattr(FakePopen, "wait", wait)
    assert main(["page"]) == -signal.SIGTERM
    assert popen.calls[-1] == ["terminate"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_page_without_streamlit_is_one_line(
    popen: type[FakePopen], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streamlit" else real(name, *a))
    code = main(["page", "--server.port", "8600"])
    out, err = capsys.readouterr()
    assert code != 0 and not popen.calls and out == ""
    assert err == "advisor page needs streamlit: pip install streamlit (in a checkout: pip install '.[app]')\n"


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"advisor {importlib.metadata.version('advisor')}\n"


def test_version_without_distribution_metadata(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"advisor {advisor.__version__}\n"


def test_version_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "advisor", "--version"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("advisor ") and done.stderr == ""


def test_page_settings_are_the_checkouts_streamlit_config() -> None:
    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parents[1] / ".streamlit" / "config.toml").read_text())
    given = dict(zip(launch.SETTINGS[::2], launch.SETTINGS[1::2]))
    wanted = {
        f"--{section}.{key}": str(value).lower()
        for section, options in config.items()
        for key, value in options.items()
    }
    assert given == wanted
