"""The package as users install it: a wheel built from this checkout holds every module, and the installed copy
(not the checkout) plans, emits a script and checks one.

Why ``python -S`` with ``PYTHONPATH=DIR:<dev site-packages>``: the dev venv installs advisor editable, and its
finder (a ``.pth`` file) would serve the checkout and hide a module missing from the wheel; ``-S`` skips every
``.pth`` while the dev venv's site-packages still provides torch and the other dependencies. A
``--system-site-packages`` venv would not see the dev venv's packages at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _build_wheel(where: Path) -> Path:
    """A wheel built from a copy of the checkout's files (tracked and untracked, not ignored): building in the
    checkout itself would reuse a stale ``build/`` folder and hide a module the package list misses."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    source = where / "source"
    for f in files:
        if (ROOT / f).is_file():
            (source / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, source / f)
    # --no-build-isolation: build with this venv's setuptools (no download); the wheel is the same.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(source),
            "-w",
            str(where),
        ],
        check=True,
        cwd=where,
    )
    (wheel,) = where.glob("advisor-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, installed with ``pip install --no-deps --target``; returns the target."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    return target


def _run(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": f"{target}{os.pathsep}{sysconfig.get_paths()['purelib']}"}
    return subprocess.run([sys.executable, "-S", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_wheel_holds_every_module_of_the_checkout(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "advisor", "strategies"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    missing = [f for f in tracked if f.endswith(".py") and f not in names]
    assert not missing, f"not in the wheel: {missing}"


def test_the_installed_copy_plans_emits_and_checks(installed: Path, tmp_path: Path) -> None:
    where = _run(installed, tmp_path, "-c", "import advisor, strategies; print(advisor.__file__, strategies.__file__)")
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).resolve().is_relative_to(installed.resolve()), path

    planned = _run(installed, tmp_path, "-m", "advisor", "resnet50", "--gpus", "4", "--json")
    assert planned.returncode == 0, planned.stderr[-2000:]
    doc = json.loads(planned.stdout)
    assert doc["inputs"]["model"]["model"] == "resnet50"
    assert doc["recommendation"]["strategy"]

    out = tmp_path / "emitted"
    emitted = _run(
        installed, tmp_path, "-m", "advisor", "resnet50", "--gpus", "2", "--strategy", "ddp", "--emit", str(out)
    )
    assert emitted.returncode == 0, emitted.stderr[-2000:]
    assert {"train.py", "launch.sh", "slurm.sbatch"} <= {p.name for p in out.iterdir()}
    compile((out / "train.py").read_text(), "train.py", "exec")

    checked = _run(installed, tmp_path, "-m", "advisor", "check", "--json", str(out / "train.py"))
    assert checked.returncode in (0, 1), checked.stderr[-2000:]
    assert isinstance(json.loads(checked.stdout), list)
