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


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural past one: ``counted(1, "node")`` -> ``'1 node'``, ``counted(4, "GPU")`` ->
    ``'4 GPUs'``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def fmt_count(n: int) -> str:
    """Human count: 6738415616 -> '6.74B'."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def fmt_s(seconds: float) -> str:
    """Seconds for display: ``'562 ms'``, ``'4.3 ms'``, ``'1.34 s'``, ``'85 us'``, ``'8.5 us'`` (one decimal below 10
    of a unit: "4 ms vs 4 ms" hid a 12% difference)."""
    if seconds <= 0:
        return "0 us"
    if seconds < 1e-3:
        us = seconds * 1e6
        return f"{us:.1f} us" if us < 9.95 else f"{us:.0f} us"
    if seconds < 1.0:
        ms = seconds * 1e3
        return f"{ms:.1f} ms" if ms < 9.95 else f"{ms:.0f} ms"
    return f"{seconds:.2f} s"


def fmt_rate(per_s: float) -> str:
    """A rate for display: 871234.5 -> '871K', 12.3 -> '12.3'."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if float(f"{per_s:.3g}") >= div:  # 999.7 rounds to 1e+03 at 3 digits: show it as 1K
            return f"{per_s / div:.3g}{suffix}"
    return f"{per_s:.3g}"
