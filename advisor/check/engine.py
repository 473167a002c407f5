"""Run the rules over source text or files: parse (never import or run), apply the rules, drop
what ``# advisor: ignore[...]`` comments silence, sort."""

from __future__ import annotations

import ast
import gc
import io
import re
import sys
import tokenize
import warnings
from collections.abc import Iterable
from pathlib import Path

from .findings import CheckError, Finding
from .rules import RULES
from .rules.saving import is_distributed
from .scope import Context

MAX_BYTES = 10 * 2**20
_IGNORE = re.compile(r"#\s*advisor:\s*ignore\b(?:\[([^\]]*)\])?", re.IGNORECASE)


def _refuse_nul(data: str | bytes, path: str) -> None:
    """A NUL byte means a binary file: say so, with its line."""
    if isinstance(data, str):
        line = data.count("\n", 0, data.index("\x00")) + 1 if "\x00" in data else 0
    else:
        line = data.count(b"\n", 0, data.index(b"\x00")) + 1 if b"\x00" in data else 0
    if line:
        raise CheckError(f"{path}:{line}: cannot parse: NUL byte (a binary file, not Python source)", path, line)


def _parse(text: str, path: str) -> ast.Module:
    _refuse_nul(text, path)
    try:
        with warnings.catch_warnings():  # "invalid escape sequence" and the like are not ours to report
            warnings.simplefilter("ignore")
            return ast.parse(text, filename=path)
    except SyntaxError as err:
        line = err.lineno or 1
        raise CheckError(f"{path}:{line}: cannot parse: {err.msg}{_newer_syntax_hint(err)}", path, line) from None
    except (RecursionError, MemoryError):
        raise CheckError(f"{path}:1: cannot parse: nested too deeply", path, 1) from None


# Python 3.12 syntax the 3.11 grammar rejects: type parameter lists (PEP 695), the ``type`` statement,
# and f-strings that reuse their quote, hold a backslash or a comment (PEP 701).
_PEP695 = re.compile(r"^\s*(?:(?:async\s+)?def|class)\s+\w+\s*\[|^\s*type\s+\w+\s*(?:\[[^=]*\])?\s*=")


def _newer_syntax_hint(err: SyntaxError) -> str:
    """A hint for syntax newer than the running interpreter's grammar (the file is parsed by this
    Python's own ``ast``); empty when the error does not look like it."""
    if sys.version_info >= (3, 12):
        return ""
    here = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    if _PEP695.match(err.text or ""):
        return (
            f" (this looks like Python 3.12 syntax, type parameters or a `type` statement; the checker "
            f"parses with this interpreter's grammar, {here}: run it under Python 3.12 or newer)"
        )
    if (err.msg or "").startswith("f-string"):
        return (
            f" (if this is a Python 3.12 f-string, with nested quotes, a backslash or a comment inside "
            f"{{}}: the checker parses with this interpreter's grammar, {here})"
        )
    return ""


def suppressions(text: str) -> dict[int, frozenset[str] | None]:
    """Line -> rule ids silenced there by ``# advisor: ignore[MG002,MG003]`` (None: every rule,
    from a bare ``# advisor: ignore``)."""
    found: dict[int, frozenset[str] | None] = {}
    if not _IGNORE.search(text):
        return found  # no such comment anywhere: skip tokenizing
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            lists = [m.group(1) for m in _IGNORE.finditer(tok.string)] if tok.type == tokenize.COMMENT else []
            if lists:
                found[tok.start[0]] = (
                    None
                    if None in lists
                    else frozenset(i.strip().upper() for ids in lists for i in ids.split(",") if i.strip())
                )
    except (tokenize.TokenError, SyntaxError):
        pass  # the file parsed, so this does not happen; keep what was read
    return found


def _silenced(finding: Finding, silenced: dict[int, frozenset[str] | None]) -> bool:
    if finding.line not in silenced:
        return False
    ids = silenced[finding.line]
    return ids is None or finding.rule in ids


def _rule_ids(select: Iterable[str] | None, ignore: Iterable[str] | None) -> list[str]:
    chosen = list(RULES) if select is None else [r for r in RULES if r in set(select)]
    skipped = set(ignore or ())
    return [r for r in chosen if r not in skipped]


def check_source(
    text: str,
    path: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    facts: dict[str, object] | None = None,
) -> list[Finding]:
    """Findings for Python source ``text`` (reported under ``path``), sorted by line. ``select`` /
    ``ignore`` restrict the rule ids (unknown ids are simply not run). The text is parsed with
    ``ast`` only: nothing is imported or executed. ``facts``, when given, receives
    ``"distributed"``: whether the file uses torch.distributed, DeepSpeed, DDP or DistributedSampler.

    Raises:
        CheckError: the text is not Python (the message names the line).
    """
    collecting = gc.isenabled()
    gc.disable()  # a big file's tree is a million objects with no cycles: the collector's passes over
    try:  # them made checking superlinear in the file's size
        return _check(text, path, select, ignore, facts)
    finally:
        if collecting:
            gc.enable()


def _check(
    text: str,
    path: str,
    select: Iterable[str] | None,
    ignore: Iterable[str] | None,
    facts: dict[str, object] | None = None,
) -> list[Finding]:
    tree = _parse(text, path)
    silenced = suppressions(text)
    findings: set[Finding] = set()
    try:
        ctx = Context(tree, path)
        if facts is not None:  # launchers that wrap DDP themselves count as distributed too
            facts["distributed"] = is_distributed(ctx) or any(
                m.split(".")[0] in _FRAMEWORKS for m in ctx.imports.modules
            )
        for rule_id in _rule_ids(select, ignore):
            rule = RULES[rule_id]
            for hit in rule.check(ctx):
                finding = Finding(
                    path,
                    getattr(hit.node, "lineno", 1),
                    getattr(hit.node, "col_offset", 0) + 1,
                    rule.id,
                    hit.severity or rule.severity,
                    hit.message,
                    hit.fix or rule.fix,
                    rule.pitfall,
                )
                if not _silenced(finding, silenced):
                    findings.add(finding)
    except RecursionError:
        raise CheckError(f"{path}:1: cannot parse: nested too deeply to check", path, 1) from None
    return sorted(findings, key=lambda f: (f.line, f.col, f.rule))


_FRAMEWORKS = {"accelerate", "lightning", "pytorch_lightning", "deepspeed"}
STDIN = "-"  # the file name that reads the script from standard input
STDIN_PATH = "<stdin>"  # how findings and errors name it


def display_path(path: str | Path) -> str:
    """How findings name ``path``: ``<stdin>`` for ``-``, else the path as given."""
    return STDIN_PATH if str(path) == STDIN else str(path)


def _read_stdin() -> bytes | str:
    """Standard input: its bytes where there is a binary buffer, else its text."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        return sys.stdin.read()
    data = buffer.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise CheckError(
            f"{STDIN_PATH}: cannot read: larger than {MAX_BYTES >> 20} MiB, not a training script", STDIN_PATH
        )
    return data


def read_source(path: str | Path) -> str:
    """The text of a Python file, decoded as Python does (PEP 263 coding cookie, UTF-8 default);
    ``-`` reads standard input (named ``<stdin>`` in messages).

    Raises:
        CheckError: missing, a directory, unreadable, too large, or not text.
    """
    name = display_path(path)
    try:
        if str(path) == STDIN:
            data = _read_stdin()
            if isinstance(data, str):
                _refuse_nul(data, name)
                return data
        else:
            p = Path(path)
            if p.is_dir():
                raise CheckError(f"{name}: cannot read: is a directory (pass the .py files in it)", name)
            if p.stat().st_size > MAX_BYTES:
                raise CheckError(f"{name}: cannot read: larger than {MAX_BYTES >> 20} MiB, not a training script", name)
            data = p.read_bytes()
    except OSError as err:
        raise CheckError(f"{name}: cannot read: {err.strerror or err}", name) from None
    _refuse_nul(data, name)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except SyntaxError as err:  # a bad coding cookie, or undecodable first lines
        raise CheckError(f"{name}:1: cannot parse: {err.msg} (not UTF-8 text: a binary file?)", name, 1) from None
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise CheckError(
            f"{name}:{line}: cannot parse: not {err.encoding} text (byte {data[err.start]:#04x}; a binary file?)",
            name,
            line,
        ) from None


def check_files(
    paths: Iterable[str | Path],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    not_distributed: list[str] | None = None,
) -> tuple[list[Finding], list[CheckError]]:
    """Check every file in ``paths`` (``-``: standard input), in the order given: the findings of
    those that could be read and parsed, and one ``CheckError`` for each that could not.
    ``not_distributed``, when given, receives the paths of files that use no torch.distributed,
    DeepSpeed, DDP or DistributedSampler (most rules only apply to distributed scripts)."""
    findings: list[Finding] = []
    errors: list[CheckError] = []
    for path in paths:
        facts: dict[str, object] = {}
        try:
            findings += check_source(read_source(path), display_path(path), select=select, ignore=ignore, facts=facts)
        except CheckError as err:
            errors.append(err)
        if not_distributed is not None and facts.get("distributed") is False:
            not_distributed.append(display_path(path))
    return findings, errors


def check_paths(
    paths: Iterable[str | Path], *, select: Iterable[str] | None = None, ignore: Iterable[str] | None = None
) -> list[Finding]:
    """Findings for each file in ``paths``, in the order given (``check_files`` goes on past bad files).

    Raises:
        CheckError: the first file that cannot be read or parsed.
    """
    findings, errors = check_files(paths, select=select, ignore=ignore)
    if errors:
        raise errors[0]
    return findings
