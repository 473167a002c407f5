"""The page's "Check my training script" tab: the single-to-multi-GPU pitfalls ``advisor check`` finds in a
pasted or uploaded script (parsed as a syntax tree, never run), one row per finding."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import streamlit as st

from advisor.errors import AdvisorError
from advisor.page.form import upload_or_paste
from advisor.page.words import md, say

if TYPE_CHECKING:
    from advisor.check import Finding

MAX_SCRIPT_BYTES = 1 << 20


def _script_text() -> tuple[str | None, str]:
    """Uploaded .py file, else pasted text, else None. Returns (text, file name for the findings)."""
    pasted = st.text_area(
        "Paste your training script", key="check_text", height=260, placeholder="import torch.distributed as dist\n..."
    )
    upload = st.file_uploader("or upload a .py file", type=["py"], key="check_file")
    text, name = upload_or_paste(upload, pasted, MAX_SCRIPT_BYTES, "the training script itself (Python source)")
    return text, name or "train.py"


FINDING_COLUMNS = ("line", "rule", "severity", "message", "fix", "pitfall")


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """One row per finding: line, rule, severity, message, fix, and the pitfall of docs/pitfalls.md it is
    (``Finding.pitfall``, e.g. "pitfall 3")."""
    return pd.DataFrame(
        [
            {
                "line": f.line,
                "rule": f.rule,
                "severity": f.severity,
                "message": f.message,
                "fix": f.fix,
                "pitfall": f.pitfall,
            }
            for f in findings
        ],
        columns=list(FINDING_COLUMNS),
    )


def show_check() -> None:
    """The 'Check my script' tab: the single-to-multi-GPU pitfalls in a pasted or uploaded script
    (``advisor.check``: the file is parsed as a syntax tree, never run)."""
    from advisor.check import FAILING, RULES, check_source

    st.caption(
        f"Finds the pitfalls of moving a one-GPU script to many ({len(RULES)} rules from the field "
        "notes: samplers, ranks, DDP order, checkpoints, accumulation...). The script is parsed, never "
        "run. Same as `python -m advisor check train.py`."
    )  # static text: markdown on purpose
    try:
        text, name = _script_text()
        if text is None:
            return
        findings = check_source(text, name)
    except AdvisorError as err:
        st.error(say(str(err)))
        return
    if not findings:
        st.success(f"No findings: none of the {len(RULES)} rules fired on {name}")
        return
    failing = sum(f.severity in FAILING for f in findings)
    (st.error if failing else st.info)(
        md(f"{len(findings)} finding(s) in {name}: {failing} error(s)/warning(s), {len(findings) - failing} info")
    )
    st.dataframe(findings_frame(findings), hide_index=True, width="stretch")
    for rule_id in dict.fromkeys(f.rule for f in findings):
        with st.expander(f"{rule_id}: {RULES[rule_id].title}"):
            st.text(RULES[rule_id].doc)
