"""Script generation entry points (filled in by the script-generation work).

``render_files(plan, strategy)`` -> {file name: text} (``train.py``, ``launch.sh`` and, for ZeRO,
``ds_config.json``); ``launch_command(plan, strategy)`` -> the launch line.
"""

from __future__ import annotations


def render_files(plan, strategy: str) -> dict[str, str]:
    raise NotImplementedError("script generation is not implemented yet")


def launch_command(plan, strategy: str) -> str | None:
    return None
