"""The estimates people use today, applied to the same model as our estimate.

* DeepSpeed's own model-state estimators (``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs``, through ``advisor.plan.deepspeed_model_states``) at the
  run's world size. They assume fp16/bf16 weights + Adam and leave out activations, whatever the
  run really uses: shown anyway, since that is what they tell a user.
* ``accelerate estimate-memory``'s "Training using Adam" figure: the maximum of
  ``accelerate.commands.estimate.estimate_training_usage(total_size, dtype)`` (accelerate 1.x,
  ``accelerate/commands/estimate.py``), where ``total_size`` is the model's fp32 bytes from
  ``accelerate.utils.calculate_maximum_sizes`` (parameters + buffers). For float32 that is
  4 x the model size (weights + grads + 2 Adam moments), for float16/bf16 2 x; one GPU, batch 1,
  no activations, no sharding.
* The usual rule of thumb (ZeRO paper section 3.1): 16 bytes per parameter x the 1.2 safety factor, unsharded.
"""

from __future__ import annotations

from advisor.context import StrategyContext
from advisor.hardware import Hardware
from advisor.memory import RULE_OF_THUMB_BYTES_PER_PARAM
from advisor.training_options import TrainingOptions

RULE_OF_THUMB_SAFETY = 1.2


def model_sizes(spec) -> tuple[int, int]:
    """(parameters, accelerate's total size in bytes) of ``spec`` built on the meta device."""
    import torch
    from accelerate.utils import calculate_maximum_sizes

    from advisor.models import build_model

    with torch.device("meta"):
        model = build_model(spec)
    total, _largest = calculate_maximum_sizes(model)
    return sum(p.numel() for p in model.parameters()), int(total)


def accelerate_training_bytes(total_size: int, precision: str) -> int:
    """What ``accelerate estimate-memory`` prints under "Training using Adam" for this dtype row:
    fp32 runs read the float32 row, mixed-precision runs the float16 row."""
    from accelerate.commands.estimate import estimate_training_usage

    dtype = "float32" if precision == "fp32" else "float16"
    return int(max(estimate_training_usage(total_size, dtype).values()))


def deepspeed_bytes(profile, strategy_name: str, world: int) -> int | None:
    """DeepSpeed's estimator's per-GPU bytes for the strategy at ``world`` ranks on one node
    (``Strategy.deepspeed_estimate``); ``None`` where DeepSpeed has no estimator for it."""
    from strategies import get_strategy

    hw = Hardware(
        gpu_name="CPU",
        gpu_memory_bytes=0,
        gpus_per_node=world,
        num_nodes=1,
        interconnect="nvlink",
        network=None,
        bf16_tflops=0.0,
        link_gbps=0.0,
        host_mem_bytes=0,
    )
    ctx = StrategyContext(profile, hw, TrainingOptions(), "cpu")
    estimate = get_strategy(strategy_name).deepspeed_estimate(ctx)
    return None if estimate is None else estimate["gpu_bytes"]


def rule_of_thumb_bytes(num_params: int) -> int:
    """16 bytes per parameter (mixed-precision Adam, ZeRO paper section 3.1) x 1.2 safety factor."""
    return int(RULE_OF_THUMB_BYTES_PER_PARAM * num_params * RULE_OF_THUMB_SAFETY)
