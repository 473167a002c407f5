"""``advisor check``: a linter for the pitfalls of moving PyTorch training from one GPU to many.

It reads scripts as syntax trees (``ast``) and never imports, executes or runs them. Each rule
(``RULES``, MG001-MG015) maps to a numbered pitfall of docs/pitfalls.md; each finding names the
line, the rule, what is wrong and the fix in one sentence.

    from advisor.check import check_source
    for finding in check_source(open("train.py").read(), "train.py"):
        print(finding.format())
"""

from .engine import check_files, check_paths, check_source
from .findings import FAILING, SEVERITIES, CheckError, Finding
from .registry import Rule
from .rules import RULES

__all__ = [
    "FAILING",
    "RULES",
    "SEVERITIES",
    "CheckError",
    "Finding",
    "Rule",
    "check_files",
    "check_paths",
    "check_source",
]
