"""The house rules a reviewer would otherwise check by hand: ruff's lint and format (rules in pyproject.toml), mypy
with zero errors at the strictness pyproject.toml states, every parameter annotated and ``Any`` nearly gone, no
module above 450 lines doing several jobs, no issue numbers in the code and no "field notes" (a document users do
not have) in anything they read."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Pieces of generated scripts (linted as the scripts they become, tests/test_emitted_lint.py) and the probe that
# runs beside them: not modules of this program.
NOT_MODULES = ("templates", "fragments", "probe")
MAX_LINES = 450
# Modules allowed above MAX_LINES: data tables, and the script renderer that the one-loop scripts rewrite.
LONG_ALLOWED = {"advisor/gpu_presets.py", "advisor/model_presets.py", "strategies/render.py"}
MAX_ANY = 10


def _modules() -> list[Path]:
    files = [ROOT / "app.py", *(ROOT / "advisor").rglob("*.py"), *(ROOT / "strategies").rglob("*.py")]
    return sorted(f for f in files if not any(part in NOT_MODULES for part in f.relative_to(ROOT).parts))


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: it is in the test extra (bash scripts/setup.sh --dev)")
    return found


@pytest.mark.parametrize(
    "args", [["check", "--output-format", "concise", "."], ["format", "--check", "."]], ids=["lint", "format"]
)
def test_ruff_finds_nothing(args: list[str]) -> None:
    done = subprocess.run([_tool("ruff"), *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_no_error() -> None:
    # A checkout without mypy's cache (CI's fresh clone) would spend a sixth of the check writing one it never reads
    # again (measured here: 41 s writing, 35 s not); a checkout with one reads it (a few seconds) and keeps it fresh.
    cache = [] if (ROOT / ".mypy_cache").is_dir() else ["--cache-dir", os.devnull]
    done = subprocess.run([_tool("mypy"), "--no-error-summary", *cache], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def _annotations(tree: ast.AST) -> tuple[int, list[str]]:
    """(uses of ``Any``, parameters and returns without an annotation) in one module's syntax tree."""
    uses = sum(
        1
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and n.id == "Any" or isinstance(n, ast.Attribute) and n.attr == "Any"
    )
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
            missing += [
                f"{node.name}({p.arg})"
                for i, p in enumerate(params)
                if p.annotation is None and not (i == 0 and p.arg in ("self", "cls"))
            ]
            if node.returns is None and node.name != "__init__":
                missing.append(f"{node.name} -> ?")
    return uses, missing


def test_every_parameter_is_annotated_and_any_is_rare() -> None:
    any_uses, missing = {}, []
    for path in _modules():
        uses, absent = _annotations(ast.parse(path.read_text()))
        if uses:
            any_uses[str(path.relative_to(ROOT))] = uses
        missing += [f"{path.relative_to(ROOT)}: {m}" for m in absent]
    assert not missing, "\n".join(missing)
    assert sum(any_uses.values()) <= MAX_ANY, any_uses


def test_the_annotation_scan_sees_a_missing_annotation() -> None:
    uses, missing = _annotations(ast.parse("from typing import Any\ndef f(a, b: int) -> Any:\n    pass\n"))
    assert missing == ["f(a)"] and uses == 1


def test_no_module_is_long() -> None:
    long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES and str(p.relative_to(ROOT)) not in LONG_ALLOWED
    ]
    assert not long, "\n".join(long)


ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? \d+")  # ours; an upstream "issue #123" with its project stays a citation


def test_no_issue_numbers_in_the_code() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
        for p in _modules()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if ISSUE_NUMBER.search(line)
    ]
    assert not found, "\n".join(found)


def test_no_field_notes_in_what_users_read() -> None:
    texts = [
        *_modules(),
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "strategies" / "templates").glob("*.py"),
        *(ROOT / "bench").glob("*.md"),
    ]
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in texts
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"field[ -]notes?", line, re.I)
    ]
    assert not found, "\n".join(found)
