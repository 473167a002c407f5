"""The rules that name several fields of ``TrainingOptions`` (``advisor.training_options``): the LR scaling pair, the
training budget, the LoRA/QLoRA, pipeline and checkpointing flags against each other, and the free-text
``--lora-targets`` and ``--init-from``. Each field's own type, bounds and choices are checked by ``advisor.schema``'s
``validate_group``, before these rules (one place, naming every flag).

Nothing here imports torch or any other layer of advisor but the bottom data modules.
"""

from __future__ import annotations

from .choices import Dtype, Quant, SelectiveCheckpointing
from .errors import AdvisorError
from .free_text import init_from, lora_targets
from .training_options import TrainingOptions


def validate_training(t: TrainingOptions) -> None:
    """The rules that name several training fields: the LR scaling pair, the training budget, the LoRA/QLoRA
    flags against each other, then the free-text ``--lora-targets`` and ``--init-from``.

    Raises:
        AdvisorError: one line saying what is wrong and what to do.
    """
    if (t.base_lr is None) != (t.base_batch_size is None):
        raise AdvisorError("--base-lr and --base-batch-size go together: give both or neither")
    if (t.epochs is None) != (t.dataset_size is None):
        raise AdvisorError("--epochs and --dataset-size go together: give both or neither")
    budgets = [
        n
        for n, v in (("--train-tokens", t.train_tokens), ("--train-samples", t.train_samples), ("--epochs", t.epochs))
        if v is not None
    ]
    if len(budgets) > 1:
        raise AdvisorError(f"give one training budget, not {' and '.join(budgets)}")
    _validate_adapter(t)
    _validate_pipeline(t)
    _validate_memory_options(t)
    init_from(t.init_from)


def _validate_memory_options(t: TrainingOptions) -> None:
    """The checkpointing flags against each other: one policy, and --checkpoint-every only with the layer policy."""
    if t.selective_checkpointing is not None and t.activation_checkpointing:
        raise AdvisorError(
            "--selective-checkpointing and --activation-checkpointing are two policies: give one of them"
        )
    if t.checkpoint_every is not None and t.selective_checkpointing != SelectiveCheckpointing.LAYER:
        raise AdvisorError("--checkpoint-every goes with --selective-checkpointing layer: add it, or drop the flag")


def _validate_pipeline(t: TrainingOptions) -> None:
    """The pipeline flags against each other: the schedule and its chunks only with a pipeline degree, chunks only
    for the interleaved schedule."""
    for flag, given in (("--pp-schedule", t.pp_schedule is not None), ("--pp-virtual-stages", t.pp_virtual_stages)):
        if given and (t.pp_degree or 1) < 2:
            raise AdvisorError(f"{flag} configures the pipeline row: add --pp-degree N (2 or more), or drop {flag}")
    if t.pp_virtual_stages and not (t.pp_schedule is not None and t.pp_schedule.interleaved):
        raise AdvisorError(
            f"--pp-virtual-stages {t.pp_virtual_stages} splits each rank's blocks into chunks for "
            "--pp-schedule interleaved-1f1b: add it, or drop --pp-virtual-stages"
        )


def _validate_adapter(t: TrainingOptions) -> None:
    """The LoRA/QLoRA flags against each other (one place, naming every flag)."""
    if t.lora_rank is None:
        given = [
            flag
            for flag, on in (
                ("--lora-targets", t.lora_targets is not None),
                ("--lora-dtype", t.lora_dtype != Dtype.AUTO),
                ("--lora-alpha", t.lora_alpha is not None),
                ("--lora-dropout", t.lora_dropout is not None),
                ("--quantize", t.quantize is not None),
            )
            if on
        ]
        if given:
            raise AdvisorError(
                f"{given[0]} configures LoRA adapters: add --lora-rank R (for example 16), or drop "
                f"{given[0]} to size full fine-tuning"
            )
    if t.lora_dropout is not None and not 0.0 <= t.lora_dropout <= 0.9:
        raise AdvisorError(f"--lora-dropout must be between 0 and 0.9, got {t.lora_dropout}")
    if t.quantize is None and (t.double_quant or t.bnb_compute_dtype is not None):
        flag, kinds = (
            ("--double-quant", "nf4 (or fp4)") if t.double_quant else ("--bnb-compute-dtype", "nf4 (or fp4, int8)")
        )
        raise AdvisorError(f"{flag} configures QLoRA's quantized base: add --quantize {kinds}")
    if t.double_quant and t.quantize == Quant.INT8:
        raise AdvisorError("--double-quant applies to 4-bit bases (--quantize nf4 or fp4); int8 has per-row scales")
    lora_targets(t.lora_targets)
