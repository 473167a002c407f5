from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from .common import checkpoint_dir, commit_checkpoint, latest_checkpoint, save_training_state, unreadable


# --- Checkpoints (one process: torch.save of the model's and the optimizer's state dicts) ---
def save_checkpoint(args, model, optimizer, state: dict, rank: int) -> None:
    """The trainable parameters and the optimizer states (frozen parameters left out: they are --init-from's),
    plus the training state; then commit_checkpoint."""
    path = checkpoint_dir(args.out, state["step"])
    os.makedirs(path, exist_ok=True)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    weights = {k: v for k, v in model.state_dict().items() if k not in frozen}  # buffers stay
    torch.save({"model": weights, "optimizer": optimizer.state_dict()}, os.path.join(path, "model_and_optimizer.pt"))
    save_training_state(path, rank, state)
    commit_checkpoint(args, state["step"], rank)


def load_checkpoint(out: str, model, optimizer) -> str:
    """--resume: the latest checkpoint's weights and optimizer states; returns its path."""
    path = latest_checkpoint(out)
    try:
        saved = torch.load(os.path.join(path, "model_and_optimizer.pt"), map_location="cpu", weights_only=True)
        # strict=False: the frozen parameters are not in it; a name it has that the model lacks is another model's
        unexpected = model.load_state_dict(saved["model"], strict=False).unexpected_keys
        if unexpected:
            raise KeyError(f"the model has no {unexpected[0]}")
        optimizer.load_state_dict(saved["optimizer"])
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise unreadable(path, err) from None
    return path
