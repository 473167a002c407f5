"""What the checker reports: ``Finding`` (one line of output) and ``CheckError`` (a file it cannot read)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import AdvisorError

SEVERITIES = ("error", "warning", "info")
FAILING = frozenset({"error", "warning"})  # info findings print but do not fail the exit code


class CheckError(AdvisorError):
    """A file cannot be read or parsed. ``str(err)`` is one line: ``PATH:LINE: cannot parse: MSG``
    (``PATH: cannot read: MSG`` when there is no line); ``line`` is None in that case."""

    def __init__(self, message: str, path: str, line: int | None = None) -> None:
        super().__init__(message)
        self.path, self.line = path, line


@dataclass(frozen=True)
class Finding:
    """One problem at one place: ``line`` and ``col`` count from 1; ``severity`` is error, warning
    or info (info does not fail the check); ``pitfall`` names its entry of docs/pitfalls.md (``pitfall 3``)."""

    path: str
    line: int
    col: int
    rule: str
    severity: str
    message: str
    fix: str
    pitfall: str

    def format(self) -> str:
        """``path:line: RULE message (pitfall ..., docs/pitfalls.md); fix: ...`` on one line."""
        return (
            f"{self.path}:{self.line}: {self.rule} {self.message} ({self.pitfall}, docs/pitfalls.md); fix: {self.fix}"
        )

    def to_dict(self) -> dict[str, object]:
        """The fields as a JSON-ready dict (path, line, col, rule, severity, message, fix, pitfall)."""
        return asdict(self)
