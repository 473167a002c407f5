"""What the command-line faces (``advisor``, ``advisor check``, ``advisor doctor``) share: an argparse
parser whose errors are one line, the number types of their flags, and the exit-code convention
(bad input: one line on stderr and exit 2, Ctrl-C: 130, never a traceback)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable

from .errors import AdvisorError

EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 2, 130, 141


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` that raises ``AdvisorError`` (one line) instead of printing usage and exiting, and takes no
    shortened flags (a flag added later must not change what a shortened one meant: ``--micro 4``)."""

    def __init__(
        self,
        *,
        prog: str,
        description: str | None = None,
        epilog: str | None = None,
        formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter,
    ) -> None:
        super().__init__(
            prog=prog, description=description, epilog=epilog, formatter_class=formatter_class, allow_abbrev=False
        )

    def error(self, message: str) -> None:  # type: ignore[override]
        raise AdvisorError(f"{message} (see --help)")


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse type); a whole number in exponent form counts (``--train-tokens 1e9``)."""
    try:
        value = int(text)
    except ValueError:
        try:
            as_float = float(text)
        except ValueError:
            as_float = math.nan
        if not (math.isfinite(as_float) and as_float.is_integer() and "e" in text.lower()):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        value = int(as_float)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def finite_float(text: str) -> float:
    """A finite number (argparse type; ranges are checked where the value is used)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse type)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def quiet_library_logs() -> None:
    """Quiet the one library warning that is noise to users: bitsandbytes (imported by peft) tries an optional
    Hub kernel on CPUs with AVX-512 bf16 and logs "Failed to load CPU gemm_4bit_forward from kernels-community"
    when it cannot (bitsandbytes/backends/cpu/ops.py), then runs its built-in kernel; with the ``kernels`` package
    installed (transformers 5.25 requires it) and the Hub offline, as advisor runs it, that attempt also logs
    "Skipping publisher trust check" (kernels/_internals/hf_hub.py). Set at a face's entry, not on import; the
    emitted scripts carry the same lines (``strategies.render.BNB_QUIET``)."""
    import logging

    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    logging.getLogger("kernels._internals.hf_hub").setLevel(logging.ERROR)


def run_face(body: Callable[[], int]) -> int:
    """Run a face's ``body`` and return its exit code; ``AdvisorError`` -> its one line on stderr and
    exit 2, Ctrl-C -> exit 130, a closed pipe on stdout -> exit 141 quietly."""
    try:
        return body()
    except AdvisorError as err:
        print(f"advisor: error: {err}", file=sys.stderr)
        return err.exit_code  # 2 for bad input; 75 for a machine busy with another verification
    except KeyboardInterrupt:
        print("advisor: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `advisor ... | head`: the reader left; say nothing more (Python docs, signal)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
