"""Byte units. Internally every size is an ``int`` number of bytes; these only format for display."""

GiB = 2**30
MiB = 2**20
GB = 10**9


def gib(n_bytes: int | float) -> float:
    """Bytes -> GiB (2**30) as a float, for display only."""
    return n_bytes / GiB


def fmt_gib(n_bytes: int | float, digits: int = 2) -> str:
    """Format bytes as ``'12.34 GiB'``."""
    return f"{n_bytes / GiB:.{digits}f} GiB"


def fmt_count(n: int) -> str:
    """Human count: 6738415616 -> '6.74B'."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)
