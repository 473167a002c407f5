"""The page's words: core messages name CLI flags, the page names its widgets; text shown through Streamlit's
markdown is escaped; sizes are shown in GiB (2**30 bytes)."""

from __future__ import annotations

import re

from advisor.schema import field_labels, get_field
from advisor.units import GiB


def md(text: str) -> str:
    """Escape text for Streamlit markdown (messages contain ``_``, ``*``, ``$``, brackets)."""
    return "".join("\\" + c if c in "\\`*_[]<>$|~#" else c for c in text)


# The core's messages name CLI flags; on this page the same choice is a widget (the schema gives both).
# Flags without a widget here (--tp-degree, --attention, ...) stay as they are: they are CLI options.
# --emit: on this page verification writes its run into a new folder of the runs folder.
FLAG_WIDGETS = field_labels() | {"--config": "the config.json box", "--emit": get_field("runs_dir").label}
# "pass --host-mem" / "give --host-mem" -> "set 'Host RAM per node (GiB)'"; "flag --host-mem" -> the label.
_FLAG = re.compile(r"(?:\b(pass|give|add|flag) )?(--[a-z][a-z0-9-]*)")


def _widget_words(m: re.Match[str]) -> str:
    verb, flag = m.group(1), m.group(2)
    if flag not in FLAG_WIDGETS:
        return m.group(0)
    label = f"'{FLAG_WIDGETS[flag]}'"
    return label if verb == "flag" else f"set {label}" if verb else label


def page_text(text: str) -> str:
    """A core message in this page's words: CLI flags that have a widget here become the widget's label
    (in quotes); "pass/give/add --flag" becomes "set 'label'". Not escaped (see ``say``)."""
    return _FLAG.sub(_widget_words, text)


def say(text: str) -> str:
    """``page_text``, markdown-escaped: for st.markdown, st.error and the like."""
    return md(page_text(text))


def one_line(err: BaseException) -> str:
    """An unexpected exception as one line: its type and the first line of its message."""
    text = str(err).strip()
    return f"{err.__class__.__name__}: {text.splitlines()[0][:300]}" if text else err.__class__.__name__


def gib(n_bytes: float | None) -> float | None:
    """Bytes -> GiB (2**30) for display, or None."""
    return None if n_bytes is None else round(n_bytes / GiB, 3)
