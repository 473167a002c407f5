"""The emit folder's manifest, ``.advisor-emit.json``: the files an ``--emit`` wrote there and the SHA-256 of each,
so that the next ``--emit --force`` into the folder removes those it does not write again (a ZeRO job's
``ds_config.json`` when the strategy becomes DDP) and nothing else: a file missing from the manifest, or changed
since it was written, is the user's and stays; a file it does write again that was edited since, or that advisor
did not write, is moved aside first (``<name>.edited``), never overwritten.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = ".advisor-emit.json"


def digest(text: str) -> str:
    """The SHA-256 (hex) of ``text`` as written to disk (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _plain_name(name: str) -> bool:
    """A file directly in the folder: no separator, no parent, no hidden name (a manifest edited by hand cannot
    point outside the folder)."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def read_manifest(folder: Path) -> dict[str, str]:
    """File name -> SHA-256 of what an earlier ``--emit`` wrote into ``folder``; empty without a readable manifest
    (a folder emitted before manifests existed, or not by advisor)."""
    try:
        doc = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return {}
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str) and _plain_name(k)}


def _left_behind(folder: Path, names: set[str] | frozenset[str]) -> list[tuple[Path, bool]]:
    """(path, still as advisor wrote it: same SHA-256) for each file of ``folder``'s manifest that a new ``--emit``
    writing ``names`` does not write again (a regular file, not a link; unreadable ones left out), sorted by name."""
    found = []
    for name, sha in sorted(read_manifest(folder).items()):
        path = folder / name
        if name in names or path.is_symlink() or not path.is_file():
            continue
        try:
            found.append((path, hashlib.sha256(path.read_bytes()).hexdigest() == sha))
        except OSError:
            continue
    return found


def stale_files(folder: Path, names: set[str] | frozenset[str]) -> list[Path]:
    """The files of ``folder``'s manifest that a new ``--emit`` writing ``names`` leaves behind, still as advisor
    wrote them (same SHA-256; a regular file, not a link), sorted by name."""
    return [path for path, same in _left_behind(folder, names) if same]


def left_edited(folder: Path, names: set[str] | frozenset[str]) -> list[Path]:
    """The files of ``folder``'s manifest that a new ``--emit`` writing ``names`` neither writes again nor removes,
    because they changed since advisor wrote them (the user's edits: left in place, said; ``stale_files`` are the
    unchanged ones, removed), sorted by name."""
    return [path for path, same in _left_behind(folder, names) if not same]


def edited_files(folder: Path, names: set[str] | frozenset[str]) -> list[Path]:
    """The files of ``folder`` that a new ``--emit --force`` writing ``names`` would overwrite although they are the
    user's: changed since advisor wrote them (a SHA-256 other than the manifest's), or not written by advisor at
    all (absent from the manifest: a hand-written train.py, or a folder emitted before manifests existed).
    ``kept_copy`` names a place for each before the new file is written. Sorted by name."""
    written = read_manifest(folder)
    edited = []
    for name in sorted(names):
        path = folder / name
        if not _plain_name(name) or path.is_symlink() or not path.is_file():
            continue
        if name not in written:
            edited.append(path)
            continue
        try:
            changed = hashlib.sha256(path.read_bytes()).hexdigest() != written[name]
        except OSError:
            continue
        if changed:
            edited.append(path)
    return edited


def kept_copy(path: Path) -> Path:
    """Where an edited ``path`` is moved before ``--emit --force`` writes the new file: ``<name>.edited``, or
    ``<name>.edited.N`` with the first N not taken (an earlier kept copy is never overwritten)."""
    candidate = path.with_name(path.name + ".edited")
    n = 1
    while candidate.exists() or candidate.is_symlink():
        candidate = path.with_name(f"{path.name}.edited.{n}")
        n += 1
    return candidate


def manifest_text(files: dict[str, str]) -> str:
    """The manifest's JSON for the files (name -> text) an ``--emit`` writes."""
    doc = {
        "written_by": "advisor --emit (a later --emit --force here removes these files where it does not write them)",
        "files": {name: digest(text) for name, text in sorted(files.items())},
    }
    return json.dumps(doc, indent=1) + "\n"
