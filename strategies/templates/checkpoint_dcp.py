from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from .common import checkpoint_dir, commit_checkpoint, latest_checkpoint, save_training_state, unreadable


# --- Checkpoints (torch.distributed.checkpoint): every rank writes its own part, in parallel ---
def save_checkpoint(args, model, optimizer, state: dict, rank: int) -> None:
    """Model and optimizer states (sharded tensors as each rank's shards, replicated ones once; frozen parameters left
    out: they are --init-from's) and every rank's training state."""
    path = checkpoint_dir(args.out, state["step"])
    model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=path)
    save_training_state(path, rank, state)
    commit_checkpoint(args, state["step"], rank)


def load_checkpoint(out: str, model, optimizer) -> str:
    """--resume: the latest checkpoint's model and optimizer states, loaded in place (each rank reads its part)."""
    path, options = latest_checkpoint(out), StateDictOptions(ignore_frozen_params=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    state = {"model": model_state, "optimizer": optim_state}
    try:
        dcp.load(state, checkpoint_id=path)
    except (OSError, RuntimeError, KeyError, ValueError) as err:  # a missing or cut-short shard, another model's
        raise unreadable(path, err) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=options)
    return path
