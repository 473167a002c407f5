"""Memory per pipeline stage: the blocks a stage holds, its model states sharded by the data-parallel policy,
its activations times the micro-batches it holds in flight, and the receive buffers of the point-to-point
transfers. Pure arithmetic over per-block figures (``StageModel``) that come from the model's own counts and the
trace (``strategies.pipeline.stage_model``: ``ParamStats.fsdp_units``' per-block numels, the one- and two-block
traces' difference for a block's activations), never a formula of the model's shape.

Per stage (``stage_memory``):

* blocks: ``Layout.stage_blocks`` (the first ``L % pp`` stages one more); the first stage adds the input embedding,
  the last the final norm and the LM head (torchtitan's manual stages, torchtitan/distributed/pipeline_parallel.py
  ``_generate_llm_fqn_per_model_part``). A model whose head is tied to its embedding holds two copies once split:
  the first stage's embedding and the last stage's head, each with its own gradient and optimizer states (torch's
  pipelining does not share a parameter across stages; the script all-reduces the two gradients between them);
  on one stage, one copy (``model.parameters()`` counts a tied weight once).
* model states: weights, gradients and optimizer states (master weights included) per element as the data-parallel
  policy holds them (``StatePolicy``: bytes per element and the ranks each is sharded over; DDP none, ZeRO-1 the
  optimizer states, ZeRO-2 and gradients, ZeRO-3 / FSDP2 all three; Rajbhandari et al. 2020, section 5), ceil per
  stage.
* activations: (blocks x one block's retained bytes + the embedding's on the first stage + the head's on the last)
  x the micro-batches in flight for the schedule (``advisor.timing.pipeline.in_flight``).
* receive buffers: torch's ``PipelineStage`` allocates, per model chunk, one activation receive buffer per
  micro-batch (every chunk but the model's first) and one gradient receive buffer per micro-batch (every chunk but
  the model's last) when it prepares its schedule (torch 2.14 torch/distributed/pipelining/stage.py,
  ``PipelineStage._prepare_forward_infra`` and ``_create_grad_recv_info``): ``m`` x the p2p message each.
* temporaries: the head's (the fp32 logits and loss of the trace's backward peak) on the last stage, one
  block's (``StageModel.block_temp_bytes``) on every stage, and with more than one micro-batch per step the
  gradient of the stage's largest weight as its backward makes it, before autograd adds it into the accumulated
  ``.grad`` (torch/csrc/autograd/functions/accumulate_grad.h: ``variable_grad += new_grad`` once a gradient exists;
  the first micro-batch's gradient becomes ``.grad`` itself): the embedding's on the first stage, the head's on
  the last (measured on CPU, small Llama, PP 2: the stages' peaks rise by the embedding's and the head's fp32
  gradient from the second micro-batch on).

The row's peak is the most-loaded stage (``StageMemory.total``); every stage is listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .choices import PipelineSchedule
from .timing.pipeline import in_flight


@dataclass(frozen=True)
class StageModel:
    """Per-block figures of one TP rank's model shard. Parameter counts are elements: ``block_params`` per repeated
    block in order, ``embed_params`` the input embedding, ``head_params`` the final norm and LM head on the last
    stage (tied: the LM head's own copy of the embedding included), ``tied_params`` the elements the head shares
    with the embedding (0 untied: what one stage holding both counts once). Activation bytes per micro-batch at the
    planned micro-batch: ``block_activation_bytes`` one block's retained tensors, ``embed_activation_bytes`` the
    first stage's beyond its blocks (the batch), ``head_activation_bytes`` the last stage's (final norm, logits,
    loss); ``head_temp_bytes`` / ``block_temp_bytes`` the transient bytes beyond them (the fp32 logits in backward;
    one block's backward temporaries)."""

    block_params: tuple[int, ...]
    embed_params: int
    head_params: int
    block_activation_bytes: int
    embed_activation_bytes: int = 0
    head_activation_bytes: int = 0
    head_temp_bytes: int = 0
    block_temp_bytes: int = 0
    tied_params: int = 0
    # elements of the largest single weight of a block, of the embedding, and of the final norm and head (the
    # accumulation temporary, module docstring; 0: not counted)
    largest_block_param: int = 0
    largest_embed_param: int = 0
    largest_head_param: int = 0

    @property
    def layers(self) -> int:
        return len(self.block_params)


@dataclass(frozen=True)
class StatePolicy:
    """How a data-parallel policy holds model states: bytes per element of the weights (``weight_bytes``), their
    gradients (``grad_bytes``) and the optimizer states with any master copy (``optim_bytes``; fractional for
    bitsandbytes' 8-bit blocks, ``advisor.bnb_layout.state_bytes_per_element``), and over how many ranks each is
    sharded (1: replicated)."""

    weight_bytes: int
    grad_bytes: int
    optim_bytes: float
    weight_shards: int = 1
    grad_shards: int = 1
    optim_shards: int = 1

    @classmethod
    def zero(cls, stage: int, dp: int, weight_bytes: int, grad_bytes: int, optim_bytes: float) -> StatePolicy:
        """DDP (``stage`` 0) and ZeRO stages 1-3 over ``dp`` ranks (Rajbhandari et al. 2020, section 5: P_os, P_os+g,
        P_os+g+p); FSDP2 shards as stage 3.

        Raises:
            ValueError: ``stage`` outside 0-3 or ``dp`` below 1.
        """
        if stage not in (0, 1, 2, 3) or dp < 1:
            raise ValueError(f"ZeRO stage must be 0-3 and dp >= 1, got {stage}, {dp}")
        return cls(
            weight_bytes,
            grad_bytes,
            optim_bytes,
            weight_shards=dp if stage >= 3 else 1,
            grad_shards=dp if stage >= 2 else 1,
            optim_shards=dp if stage >= 1 else 1,
        )


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's bytes per GPU at its peak (``total``: the sum, as every term is alive at the last
    forward before the first backward of the 1F1B steady state). ``in_flight``: the micro-batches its
    activations are multiplied by; ``params_numel``: the elements it holds (before data-parallel sharding)."""

    stage: int
    blocks: int
    first: bool
    last: bool
    params_numel: int
    in_flight: float
    params: int
    grads: int
    optimizer_states: int
    activations: int
    buffers: int
    other: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer_states + self.activations + self.buffers + self.other

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer_states


def _shard(numel: int, elem: float, shards: int) -> int:
    return int(round(-(-numel // shards) * elem))


def stage_memory(
    model: StageModel,
    stage_blocks: Sequence[int],
    policy: StatePolicy,
    schedule: PipelineSchedule,
    micro_batches: int,
    p2p_message_bytes: int,
    virtual: int = 1,
) -> list[StageMemory]:
    """Every stage's ``StageMemory`` (module docstring), first stage first. ``stage_blocks``: blocks per stage
    (``Layout.stage_blocks``); ``micro_batches``: per optimizer step and pipeline; ``p2p_message_bytes``: one
    receive buffer (``advisor.timing.pipeline.p2p_bytes``).

    Raises:
        ValueError: the stages' blocks do not sum to the model's, a stage has none, or the schedule's counts are
        invalid (``advisor.timing.pipeline.in_flight``).
    """
    p = len(stage_blocks)
    if p < 1 or sum(stage_blocks) != model.layers or min(stage_blocks) < 1:
        raise ValueError(f"stage blocks {tuple(stage_blocks)} do not split the model's {model.layers} blocks")
    out, start = [], 0
    for i, k in enumerate(stage_blocks):
        first, last = i == 0, i == p - 1
        numel = sum(model.block_params[start : start + k])
        start += k
        numel += (model.embed_params if first else 0) + (model.head_params if last else 0)
        if first and last:
            numel -= model.tied_params  # one stage: the tied weight is one tensor
        flight = in_flight(schedule, p, micro_batches, i, virtual)
        per_mb = (
            k * model.block_activation_bytes
            + (model.embed_activation_bytes if first else 0)
            + (model.head_activation_bytes if last else 0)
        )
        # Receive buffers per micro-batch: one per chunk that has a chunk before it (activations) and one per chunk
        # that has a chunk after it (gradients): rank 0's first chunk receives no activations, the last rank's
        # last chunk no gradients.
        recv = (virtual - (1 if first else 0)) + (virtual - (1 if last else 0))
        largest = max(
            model.largest_block_param if k else 0,
            model.largest_embed_param if first else 0,
            model.largest_head_param if last else 0,
        )
        accumulate = _shard(largest, policy.grad_bytes, policy.grad_shards) if micro_batches > 1 else 0
        out.append(
            StageMemory(
                stage=i,
                blocks=k,
                first=first,
                last=last,
                params_numel=numel,
                in_flight=flight,
                params=_shard(numel, policy.weight_bytes, policy.weight_shards),
                grads=_shard(numel, policy.grad_bytes, policy.grad_shards),
                optimizer_states=_shard(numel, policy.optim_bytes, policy.optim_shards),
                activations=int(round(flight * per_mb)),
                buffers=recv * micro_batches * p2p_message_bytes if p > 1 else 0,
                other=model.block_temp_bytes + (model.head_temp_bytes if last else 0) + accumulate,
            )
        )
    return out


def peak_stage(stages: Sequence[StageMemory]) -> StageMemory:
    """The most-loaded stage (the row's peak; the first of equals).

    Raises:
        ValueError: no stages.
    """
    if not stages:
        raise ValueError("no stages")
    return max(stages, key=lambda s: s.total)
