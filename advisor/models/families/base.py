"""The interface of a model family (transformer, vision, custom factory): each unit owns how a
``ModelSpec`` of its family is built, what one training sample looks like, the loss, which blocks the
trace may truncate, and the fragment of the generated script that does the same (``fragments/``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from ...choices import Optimizer
from ..spec import ModelSpec

if TYPE_CHECKING:
    import torch

FRAGMENTS = Path(__file__).parent / "fragments"


class ModelFamily(ABC):
    name: str  # ModelSpec.family
    default_micro_batch: int  # samples per GPU when the user gives none
    # Generated ZeRO-3 scripts build the model under deepspeed.zero.Init (partitioned as parameters are
    # created). torchvision re-initialises weights after creation, which partitioned weights cannot take.
    zero_init: bool = False
    # Full fp32 copies of the model one process holds while the generated script's ``build_model(init_from)`` loads
    # pretrained weights (``--init-from``): 2 for a ``torch.load``'ed state_dict file, which is alive beside the model
    # until ``load_state_dict`` has copied it in (torchvision's named weights likewise: ``weights.get_state_dict`` then
    # ``load_state_dict``); families whose loader fills the model in place say 1.
    pretrained_copies: int = 2

    @abstractmethod
    def build(self, spec: ModelSpec, *, layers: int | None = None, tp_degree: int = 1) -> torch.nn.Module:
        """``spec`` as an ``nn.Module`` under the current device / fake-tensor mode; ``layers`` blocks per
        stack and one tensor-parallel rank's shard where the family supports them.

        Raises:
            AdvisorError: the model cannot be built.
        """

    @abstractmethod
    def make_batch(
        self,
        spec: ModelSpec,
        micro_batch: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, torch.Tensor]:
        """Synthetic inputs of the right shape for ``micro_batch`` samples."""

    @abstractmethod
    def loss(self, spec: ModelSpec, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Forward pass and loss, as the generated scripts compute them."""

    def block_stacks(self, spec: ModelSpec) -> tuple[int, int]:
        """(identical blocks per stack, stacks) the trace may truncate and extrapolate in depth; (0, 1)
        when the family has no such structure (the whole model is traced)."""
        return 0, 1

    def num_blocks(self, spec: ModelSpec) -> int:
        """Repeated blocks in all stacks (what activation checkpointing wraps); 0 when not known from the spec."""
        return 0

    def attention_dropout(self, spec: ModelSpec) -> float:
        """The attention-probability dropout (it makes CPU SDPA take the math path)."""
        return 0.0

    @abstractmethod
    def script_constants(self, spec: ModelSpec) -> dict[str, object]:
        """The constants the family's script fragment reads (JSON-like values only)."""

    def default_lr(self, spec: ModelSpec, optimizer: Optimizer, global_batch_size: int) -> tuple[float, str]:
        """(learning rate, its source) when the user gives none: SGD 0.1 per 256 samples, linearly scaled (Goyal et
        al. 2017, "Accurate, Large Minibatch SGD", section 2.1); Adam-family 1e-3 (``torch.optim.Adam``'s default).
        Families that know their task better override it."""
        if optimizer.is_sgd:
            return 0.1 * global_batch_size / 256, "SGD 0.1 per 256 samples, linearly scaled (Goyal et al. 2017)"
        return 1e-3, "the default of torch.optim.Adam"

    def script_variants(self, spec: ModelSpec) -> dict[str, str]:
        """The variant of each function the family's script fragment offers in several (``strategies.pick``):
        none unless a family's fragment has ``NAME__VARIANT`` definitions."""
        return {}

    def script_fragment(self) -> str:
        """Source of ``build_model()``, ``make_sample(g)`` and ``compute_loss(...)`` for scripts."""
        return (FRAGMENTS / f"{self.name}.py").read_text()

    def data_module(self) -> str | None:
        """Source of the ``data.py`` a script of this family imports (its --data readers), or None: the family
        reads no data of its own (your model's: load_real_dataset in train.py)."""
        path = FRAGMENTS / f"{self.name}_data.py"
        return path.read_text() if path.exists() else None
