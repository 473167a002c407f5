"""The shape of every emitted train.py (read as a syntax tree): exactly one training loop, written once in the shared
skeleton (strategies/templates/loop.py's ``main``) for the strategies built on it; ``main()`` near the top; no
function or class the script never uses; and the skeleton's template modules lint-clean as the Python modules they
are (no undefined name)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from strategies import get_strategy
from tests.test_emitted_lint import emitted  # noqa: F401  (the fixture: every family x strategy x mode)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "strategies" / "templates"
# Every strategy is built on the shared loop (Strategy.script_loop), DeepSpeed's (ZeRO) too.
SKELETON_MODULES = ("loop.py", "torch_steps.py", "single.py", "ddp.py", "fsdp2.py", "tp.py", "zero.py", "pp.py")
# The shared helpers: lint-clean too, their script names imported for the checkers (TYPE_CHECKING, constants.pyi),
# but not importable (their module-level option tables read the model family's help texts).
HELPER_MODULES = ("common.py", "collectives.py", "local.py", "adapters.py", "checkpoint_dcp.py", "checkpoint_local.py")


def _strategy(name: str) -> str:
    """``llama-lora-zero3_offload`` -> ``zero3_offload``: the case names have no underscore, strategies may."""
    return name.split("-")[-1]


def _loops(tree: ast.AST) -> list[ast.While]:
    """The training loops: a ``while`` whose body iterates over the loader and calls ``steps.micro_step``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.While) and any(
            isinstance(n, ast.Attribute) and n.attr == "micro_step" for n in ast.walk(node)
        ):
            found.append(node)
    return found


def _defined(tree: ast.Module) -> dict[str, ast.stmt]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_one_training_loop_in_main_from_the_shared_skeleton(emitted):  # noqa: F811
    skeleton = next(
        n for n in ast.parse((TEMPLATES / "loop.py").read_text()).body if getattr(n, "name", None) == "main"
    )
    want = ast.dump(_loops(skeleton)[0])
    checked = 0
    for name, text in emitted.items():
        tree = ast.parse(text)
        loops = _loops(tree)
        assert len(loops) == 1, (name, len(loops))
        main = _defined(tree)["main"]
        assert loops[0] in list(ast.walk(main)), name  # the loop is main's
        # nothing else iterates the training loader: the micro-steps are main's loop alone
        over_loader = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.For) and "loader" in {x.id for x in ast.walk(n.iter) if isinstance(x, ast.Name)}
        ]
        assert len(over_loader) == 1 and over_loader[0] in list(ast.walk(loops[0])), name
        assert get_strategy(_strategy(name)).script_loop, name
        assert ast.dump(loops[0]) == want, name  # copied from the skeleton, not written again
        checked += 1
    assert checked == len(emitted) >= 40, checked


def _reached(tree: ast.Module) -> set[str]:
    """The top-level functions and classes the script runs: those ``main()`` and the module-level statements name,
    and those they name, transitively (two helpers naming only each other are not reached)."""
    defined = _defined(tree)
    names = {n: {x.id for x in ast.walk(node) if isinstance(x, ast.Name)} for n, node in defined.items()}
    todo = ["main"] + [
        x.id for node in tree.body if node not in defined.values() for x in ast.walk(node) if isinstance(x, ast.Name)
    ]
    seen: set[str] = set()
    while todo:
        n = todo.pop()
        if n in defined and n not in seen:
            seen.add(n)
            todo += names[n]
    return seen


def test_every_function_and_class_of_every_script_is_used(emitted):  # noqa: F811
    """Every top-level function and class of every emitted combination is listed, and each is reached from
    ``main()`` (called, subclassed, passed on by main or by what main reaches): none is written and never run."""
    unused, listed = {}, 0
    for name, text in emitted.items():
        tree = ast.parse(text)
        defined = _defined(tree)
        listed += len(defined)
        never = sorted(set(defined) - _reached(tree))
        if never:
            unused[name] = never
    assert unused == {}
    assert listed > 40 * len(emitted), listed  # the scripts' helpers were all seen


def test_an_unused_helper_is_found():
    text = "def main():\n    a()\n\n\ndef a():\n    pass\n\n\ndef b():\n    c()\n\n\ndef c():\n    b()\n"
    tree = ast.parse(text)
    assert sorted(set(_defined(tree)) - _reached(tree)) == ["b", "c"]


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_main_comes_first(emitted):  # noqa: F811
    for name, text in emitted.items():
        tree = ast.parse(text)
        functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert functions[0].name == "main", (name, functions[0].name)
        assert functions[0].lineno <= 0.4 * len(text.splitlines()), (name, functions[0].lineno)


@pytest.mark.slow  # the emitted fixture (shared with the tests above)
def test_the_launch_line_names_the_planned_node_not_this_one(emitted):  # noqa: F811
    """The docstring said "this node has 2 GPU(s)" for a plan made for a preset on a machine without GPUs (a new
    user's find): it names the node the plan was made for."""
    import re

    for name, text in emitted.items():
        launch = next(line for line in text.splitlines() if line.startswith("Launch ("))
        planned = r"one node of \d+ GPUs?, as planned|one process on one GPU"
        verify = r"(\d+ CPU ranks|one process on the CPU): --verify's run of the job on this machine, not the job to "
        verify += "keep"
        assert re.fullmatch(rf"Launch \(({planned}|{verify})\):", launch), (
            name,
            launch,
        )


def test_skeleton_templates_are_clean_modules():
    """The shared loop's template modules: pyflakes (ruff's F rules: no undefined, unused or redefined name) at the
    emitted scripts' column limit, and each imports as a module. The names they take from the templates not yet
    importable (common.py, collectives.py, local.py, adapters.py, the families' fragments) are imported for the
    checkers only (``TYPE_CHECKING``); those helper modules are checked by ruff too (no undefined name)."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff is not None, "ruff is not installed: it is in the test extra (bash scripts/setup.sh --dev)"
    paths = [str(TEMPLATES / m) for m in (*SKELETON_MODULES, *HELPER_MODULES)]
    done = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F", "--line-length", "120", "--output-format", "concise", *paths],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    # data.py, emitted as it is: ruff's default rules, as the scripts are linted (tests/test_emitted_lint.py)
    data = sorted(str(p) for p in (ROOT / "advisor" / "models" / "families" / "fragments").glob("*_data.py"))
    assert len(data) == 2, data
    done = subprocess.run(
        [ruff, "check", "--isolated", "--line-length", "120", "--output-format", "concise", *data],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    import importlib

    for m in SKELETON_MODULES:
        module = importlib.import_module(f"strategies.templates.{m.removesuffix('.py')}")
        assert callable(getattr(module, "main", None) or getattr(module, "start", None) or module.backward)


@pytest.mark.parametrize("module", SKELETON_MODULES)
def test_no_template_tags_in_the_skeleton(module):
    assert "# [" not in (TEMPLATES / module).read_text()


# --- the picker itself ------------------------------------------------------------------------------------------
SOURCE = '''"""a template module"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .other import helper

LIMIT = 3  # a module-level value


def main():
    return step(LIMIT)


# why step exists
def step__a(n):
    return helper(n)


def step__b(n):
    return n


def unused():
    return 1


step = step__a
'''


def test_pick_copies_what_main_reaches_with_the_chosen_variant_renamed():
    from strategies.pick import pick

    body = pick([("t.py", SOURCE), ("other.py", "def helper(n):\n    return n + 1\n")], {"step": "a"})
    assert body == (
        "LIMIT = 3  # a module-level value\n\n\n"
        "def main():\n    return step(LIMIT)\n\n\n"
        "# why step exists\ndef step(n):\n    return helper(n)\n\n\n"
        "def helper(n):\n    return n + 1\n"
    )
    assert "def step(n):\n    return n\n" in pick([("t.py", SOURCE)], {"step": "b"})  # b needs no helper
    assert "helper" not in pick([("t.py", SOURCE)], {"step": "b"})


def test_pick_refuses_template_bugs():
    from advisor.errors import AdvisorError
    from strategies.pick import pick

    with pytest.raises(AdvisorError, match="no variant chosen for step"):
        pick([("t.py", SOURCE)], {})
    with pytest.raises(AdvisorError, match="variant chosen for nothing"):
        pick([("t.py", SOURCE)], {"step": "a", "nothing": "x"})
    with pytest.raises(AdvisorError, match="only definitions"):
        pick([("t.py", "print('hi')\n\n\ndef main():\n    pass\n")], {})
