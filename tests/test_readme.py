"""The README's example output is what the CLI prints today (a stale example is a wrong promise)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from advisor.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_matches_cli_output(capsys):
    block = re.search(r"```text\n\$ (\.venv/bin/python -m advisor [^\n]+)\n(.*?)```", README.read_text(), re.S)
    assert block, "README has no example block"
    argv = shlex.split(block.group(1))[3:]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    shown = [line for line in block.group(2).splitlines() if line.strip() and line.strip() != "..."]
    missing = [line for line in shown if line not in printed]
    assert not missing, missing
