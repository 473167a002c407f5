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


# The cyclic garbage collector's youngest generation is collected after every 700 new container objects (CPython's
# default); a plan makes millions (the trace's fake tensors and op records), and those collections, with the full ones
# they trigger, took 15% of `advisor llama-3.1-8b --gpus 8` (1.42 s of 9.5 s measured here; 0.50 s at 10,000) and
# 13.7 s of the test suite's golden, MoE and LoRA tests in one process (4.7 s). Reference counting still frees
# everything without a cycle at once; only cycles wait longer.
GC_GEN0_THRESHOLD = 10_000


def collect_garbage_less_often() -> None:
    """Raise the collector's youngest-generation threshold to ``GC_GEN0_THRESHOLD`` (the older generations' stay).
    Process-wide: called at the CLI's entry (the process is the CLI's), never on import or inside ``plan()``."""
    import gc

    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


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
