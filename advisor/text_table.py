"""The text tables of the CLI's report (``advisor.text_report.render_text``): the column layout, and the few-character
cells the tables show (GiB, hours and costs, the fits verdict, the phase of the peak)."""

from __future__ import annotations

from .units import gib


def gib_cell(n: int | None) -> str:
    """Bytes as GiB with 2 decimals (2**30 bytes); '-' for None."""
    return "-" if n is None else f"{gib(n):.2f}"


def table(columns: list[tuple[str, str, int, str]], rows: list[list[str] | str]) -> list[str]:
    """A text table: the header, a rule and one line per row, each column as wide as its widest cell.

    ``columns``: (title, "<" or ">", minimum width, gap written before the column); a right-aligned column keeps
    one space before its widest cell. ``rows``: cells as strings, or a string for a line that is written as it is
    (an "n/a" row, a note under a row), indented to the second column when it names no strategy first.
    """
    widths = []
    for i, (title, align, least, _) in enumerate(columns):
        cells = [title, *(row[i] for row in rows if not isinstance(row, str))]
        widths.append(max(least, *(len(c) + (align == ">") for c in cells)))
    widths[-1] = 0 if columns[-1][1] == "<" else widths[-1]  # a last left-aligned column needs no padding

    def line(cells: list[str]) -> str:
        return "".join(f"{gap}{cell:{align}{width}}" for (_, align, _, gap), width, cell in zip(columns, widths, cells))

    head = line([c[0] for c in columns])
    out = [head, "-" * len(head)]
    for row in rows:
        if isinstance(row, str):
            first, _, rest = row.partition(" ")
            out.append(f"{first:<{widths[0]}} {rest}" if rest.startswith("n/a:") else f"{'':<{widths[0]}}{row}")
        else:
            out.append(line(row))
    return out


def amount(x: float | None, cents: bool = False) -> str:
    """Hours, GPU-hours or a cost for the budget columns, without scientific notation: thousands with separators
    (12,345), smaller figures with 1 decimal (cents: 2), tiny ones with 2 significant digits; '-' for None."""
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 1:
        return f"{x:.2f}" if cents else f"{x:.1f}"
    return f"{x:.2g}"


def fits_word(fits: bool | None, short_of: str | None = None) -> str:
    """yes / NO (GPU memory) / RAM! (host RAM) / ? (it depends on host RAM nobody gave)."""
    return "?" if fits is None else "yes" if fits else "RAM!" if short_of == "host RAM" else "NO"


def short_phase(phase: str) -> str:
    """A strategy's phase label (``Breakdown.phase``) in the table's few characters."""
    for prefix, short in (
        ("forward", "fwd"),
        ("backward", "bwd"),
        ("end of backward", "bwd-end"),
        ("optimizer step (flatten)", "step-flat"),
        ("optimizer step", "step"),
    ):
        if phase.startswith(prefix):
            return short
    return phase[:9]
