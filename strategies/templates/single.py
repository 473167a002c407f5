"""One process on one device: no launcher, no process group, no wrapper. The loop's strategy functions
(``loop.py``): the device, the model as it is, and no gradient to hold back."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from .common import log
    from .constants import GRAD_ACCUM_STEPS, LR, MICRO_BATCH_SIZE
    from .loop import Run


def start() -> Run:
    """Rank 0 of 1 on the first GPU, else the CPU."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    log(f"single process on {device}: micro-batch {MICRO_BATCH_SIZE}, accumulation {GRAD_ACCUM_STEPS} -> "
        f"batch {MICRO_BATCH_SIZE} x {GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * GRAD_ACCUM_STEPS}; lr {LR:g}")
    return Run(0, 0, 0, 1, device)


def wrap_model(run: Run) -> None:
    """One process trains the model itself: nothing wraps it."""


def micro_step_context(run: Run, last_micro: bool):
    """Nothing to hold back between micro-steps: no gradient is communicated."""
    return contextlib.nullcontext()
