"""The inputs given as free text, parsed and checked: ``--lora-targets`` (module names), ``--init-from`` (a path
or hub id written into generated scripts) and ``--input-shape`` (comma-separated integers). Each raises
``AdvisorError`` with one line naming the flag."""

from __future__ import annotations

import re
import unicodedata

from .errors import AdvisorError

_TARGET_NAME = re.compile(r"[A-Za-z0-9_.]+")


def lora_targets(text: str | None) -> tuple[str, ...]:
    """``--lora-targets`` as module names: ``"q_proj, v_proj"`` -> ``("q_proj", "v_proj")``, ``all-linear`` ->
    ``("all-linear",)``, None -> ``()`` (peft's default).

    Raises:
        AdvisorError: an empty list or a name that is not a module path.
    """
    if text is None:
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if names == ("all-linear",):
        return names
    bad = [n for n in names if not _TARGET_NAME.fullmatch(n)]
    if not names or bad:
        raise AdvisorError(
            f"--lora-targets takes module names separated by commas (q_proj,v_proj) or all-linear, got {text[:60]!r}"
        )
    return names


INIT_FROM_MAX_CHARS = 512
# What ``--init-from`` may not contain: control and format characters (Unicode categories C*, which include
# newlines, NUL and bidirectional overrides), line and paragraph separators, quotes and backslashes. The value is
# written into a generated script; a plain path or hub id needs none of them.
_INIT_FROM_BAD = re.compile(r"[\"'\\\u2028\u2029]")


def init_from(text: str | None) -> str | None:
    """``--init-from`` as given, checked: a path or hub id on one line, at most ``INIT_FROM_MAX_CHARS`` characters,
    without control characters, quotes or backslashes (advisor never reads or downloads it). None: not given.

    Raises:
        AdvisorError: an empty value, one over the length limit, or one with a character it may not contain.
    """
    if text is None:
        return None
    if not text.strip():
        raise AdvisorError(
            "--init-from needs a path or hub id (a save_pretrained directory, a state_dict file or "
            "an org/name id): give one, or drop --init-from to size a freshly initialised model"
        )
    if len(text) > INIT_FROM_MAX_CHARS:
        raise AdvisorError(
            f"--init-from is {len(text)} characters long, more than {INIT_FROM_MAX_CHARS}: give a "
            "shorter path (a symlink, or a path relative to where the script runs)"
        )
    if _INIT_FROM_BAD.search(text) or any(unicodedata.category(c).startswith("C") for c in text):
        raise AdvisorError(
            f"--init-from must be a path or hub id on one line without control characters, quotes "
            f"or backslashes, got {text[:60]!r}: rename or link the directory (use / between "
            "folders)"
        )
    return text


def parse_shape(text: str | None) -> tuple[int, ...] | None:
    """``"3,224,224"`` -> ``(3, 224, 224)``.

    Raises:
        AdvisorError: not comma-separated integers.
    """
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise AdvisorError(f"--input-shape must be comma-separated integers like 3,224,224, got {text[:40]!r}")
