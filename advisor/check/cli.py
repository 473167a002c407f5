"""``advisor check FILE.py [...]``: print the findings, one line each, and exit 0/1/2.

Exit codes: 0 no findings, or info findings only; 1 at least one error or warning; 2 a file
cannot be read or parsed (every other file is still checked and its findings printed; one line
on stderr per bad file), no files, or a bad option (one line on stderr, no traceback). ``-`` reads
one script from standard input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..errors import AdvisorError
from ..faces import EXIT_BAD_INPUT, OneLineParser, run_face
from .engine import check_files
from .findings import FAILING, SEVERITIES, Finding
from .rules import RULES

EXIT_CLEAN, EXIT_FINDINGS = 0, 1

_EPILOG = """\
exit codes:
  0  no findings, or info findings only (they print but do not fail the check)
  1  at least one error or warning
  2  a file cannot be read or parsed (the other files are still checked and their findings
     printed; one `advisor: error:` line per bad file on stderr), no files were given, or an
     option is wrong

`-` as a file name reads one script from standard input (findings name it <stdin>):
  cat train.py | advisor check -

Silence one line with a trailing comment: `# advisor: ignore[MG002]` (several: [MG002,MG003]),
or `# advisor: ignore` for every rule. Rules: --list-rules. Files are parsed, never run.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``advisor check`` argument parser."""
    p = OneLineParser(
        prog="advisor check",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check PyTorch training scripts for single-to-multi-GPU pitfalls (DDP, samplers, "
        "ranks, checkpoints) by reading their syntax tree.",
    )
    p.add_argument("files", nargs="*", metavar="FILE.py", help="Python files to check; - reads one from stdin")
    p.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list of findings (path, line, col, rule, severity, message, fix, pitfall)",
    )
    p.add_argument("--select", metavar="RULE,RULE", help="run only these rules (e.g. MG002,MG003)")
    p.add_argument("--ignore", metavar="RULE,RULE", help="skip these rules")
    p.add_argument("--list-rules", action="store_true", help="list the rules (id, severity, pitfall, title) and exit")
    return p


def _rule_ids(value: str | None, flag: str) -> list[str] | None:
    if value is None:
        return None
    ids = [x.strip().upper() for x in value.split(",") if x.strip()]
    if not ids:
        raise AdvisorError(
            f"{flag} needs at least one rule id (e.g. {flag} MG002,MG003); valid ids: {', '.join(RULES)}"
        )
    unknown = [x for x in ids if x not in RULES]
    if unknown:
        raise AdvisorError(f"{flag}: unknown rule id {unknown[0]!r}; valid ids: {', '.join(RULES)}")
    return ids


def _list_rules(as_json: bool) -> str:
    if as_json:
        return json.dumps(
            [
                {"id": r.id, "severity": r.severity, "pitfall": r.pitfall, "title": r.title, "fix": r.fix}
                for r in RULES.values()
            ],
            indent=2,
        )
    return "\n".join(f"{r.id}  {r.severity:<8} {r.pitfall:<24} {r.title}" for r in RULES.values())


def _summary(findings: list[Finding], files: int, failed: int = 0) -> str:
    unread = f"; {failed} more could not be checked (see above)" if failed else ""
    if not findings:
        return f"advisor check: {files} file(s), no findings{unread}"
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    parts = ", ".join(f"{n} {s}{'s' if n > 1 and s != 'info' else ''}" for s, n in counts.items() if n)
    return f"advisor check: {len(findings)} finding(s) in {files} file(s) ({parts}){unread}"


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: returns the exit code (0 clean or info only, 1 errors/warnings, 2 bad input)."""
    return run_face(lambda: _check(argv))


def _check(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help printed its text
        return int(done.code or 0)
    select, ignore = _rule_ids(args.select, "--select"), _rule_ids(args.ignore, "--ignore")
    if args.list_rules:
        print(_list_rules(args.json))
        return EXIT_CLEAN
    if not args.files:
        raise AdvisorError("no files to check: pass one or more Python files, e.g. advisor check train.py")
    single: list[str] = []
    findings, errors = check_files(args.files, select=select, ignore=ignore, not_distributed=single)
    checked = len(args.files) - len(errors)
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        for finding in findings:
            print(finding.format())
    for err in errors:  # after the findings, so that they are the last thing a terminal shows
        print(f"advisor: error: {err}", file=sys.stderr)
    if not args.json and checked:
        print(_summary(findings, checked, len(errors)), file=sys.stderr)
    if not args.json and single:
        print(
            f"advisor check: {', '.join(single[:3])}{' ...' if len(single) > 3 else ''} use(s) no torch.distributed, "
            "DeepSpeed, DDP or DistributedSampler, so most rules had nothing to check: for a multi-GPU "
            "starting point, `python -m advisor MODEL --gpus N --emit DIR` writes a train.py that checks clean",
            file=sys.stderr,
        )
    if errors:
        return EXIT_BAD_INPUT
    return EXIT_FINDINGS if any(f.severity in FAILING for f in findings) else EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
