"""Pipeline-parallel schedule arithmetic: the bubble, the micro-batches a stage holds in flight, and the
point-to-point transfers between stages. Pure formulas.

Notation (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", section 2.2): ``p`` pipeline stages (ranks), ``m`` micro-batches per optimizer step and pipeline,
``v`` model chunks per rank (virtual stages; 1 without interleaving). ``stage`` counts ranks from 0 (the first,
which holds the embeddings).

* Bubble (section 2.2.1, 2.2.2): GPipe and 1F1B idle ``(p - 1)`` forward + backward slots of one micro-batch per
  step, a fraction ``(p - 1) / m`` of the ideal time ``m (t_f + t_b)``; interleaving cuts each slot to ``1 / v``
  of a rank's layers: ``(p - 1) / (v m)``.
* In flight (what a stage's activations are multiplied by at its peak, in micro-batches of the stage's whole
  layers): GPipe runs every forward before any backward, so ``m`` (Huang et al. 2019, GPipe);
  1F1B's warm-up runs ``p - stage - 1`` forwards, then one more before the first backward, so ``min(m, p - stage)``
  (Megatron-LM megatron/core/pipeline_parallel/schedules.py ``get_pp_rank_microbatches``; the first stage holds
  ``p``, as megatron/training/theoretical_memory_usage.py ``compute_activation_memory`` counts it, with its
  ``min(1, m / p)`` discount); interleaved 1F1B warms up ``2 (p - stage - 1) + (v - 1) p`` chunk micro-batches
  (``get_pp_rank_microbatches``, ``microbatch_group_size_per_vp_stage`` = p), each ``1 / v`` of the stage's layers,
  plus one: ``(2 (p - stage - 1) + (v - 1) p + 1) / v``, which on the first stage is ``p (1 + (p - 1) / (p v))``:
  the penalty ``theoretical_memory_usage.py`` applies (after Korthikanti et al. 2022). Capped at every chunk
  micro-batch of the step (``m v``).
* Point-to-point (section 4.1): a boundary sends the ``s x b x h`` hidden states of each micro-batch forward and
  their gradient backward, in the activations' dtype; under sequence parallelism each TP rank sends its ``1 / tp``
  sequence shard (Korthikanti et al. 2022, sequence parallelism). A send is one message over the link the boundary
  crosses (nccl-tests doc/PERFORMANCE.md: for SendRecv the bus bandwidth is the algorithm bandwidth), with NCCL's base
  latency and one step of that link (``advisor.timing.comm``). torch's schedules post sends asynchronously
  (``torch.distributed.pipelining``: ``dist.isend``/``irecv`` batched per action), so in the steady state a
  transfer overlaps the next micro-batch's compute; the critical path (the first micro-batch's forward through
  every virtual stage, the last one's backward back) waits for ``2 (p v - 1)`` of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..choices import PipelineSchedule
from .comm import GB, Fabric


def _check(schedule: PipelineSchedule, p: int, m: int, v: int) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"pipeline stages, micro-batches and virtual stages must be >= 1, got p={p}, m={m}, v={v}")
    if v > 1 and not schedule.interleaved:
        raise ValueError(f"{schedule} runs one model chunk per rank (v = 1), got v={v}")


def bubble_fraction(schedule: PipelineSchedule, p: int, m: int, v: int = 1) -> float:
    """The pipeline bubble as a fraction of the ideal compute time ``m (t_f + t_b)``: ``(p - 1) / m`` for GPipe
    and 1F1B, ``(p - 1) / (v m)`` for interleaved 1F1B (Narayanan et al. 2021, sections 2.2.1 and 2.2.2).

    Raises:
        ValueError: a count below 1, or ``v`` > 1 on a schedule without chunks.
    """
    _check(schedule, p, m, v)
    return (p - 1) / (v * m)


def in_flight(schedule: PipelineSchedule, p: int, m: int, stage: int = 0, v: int = 1) -> float:
    """Micro-batches of the stage's whole layers whose activations ``stage`` holds at its peak (module docstring:
    GPipe ``m``; 1F1B ``min(m, p - stage)``; interleaved ``min(m v, 2 (p - stage - 1) + (v - 1) p + 1) / v``, the
    first stage's ``p (1 + (p - 1) / (p v))``, Megatron-LM's interleaving penalty). A float: interleaving holds
    fractions of a stage's layers.

    Raises:
        ValueError: a count below 1, ``v`` > 1 on a schedule without chunks, or ``stage`` outside [0, p).
    """
    _check(schedule, p, m, v)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in [0, {p}), got {stage}")
    if schedule is PipelineSchedule.GPIPE:
        return float(m)
    if not schedule.interleaved:
        return float(min(m, p - stage))
    chunks = 2 * (p - stage - 1) + (v - 1) * p + 1
    return min(m * v, chunks) / v


def interleaving_penalty(p: int, v: int) -> float:
    """Megatron-LM's interleaved-schedule activation factor on the first stage, ``1 + (p - 1) / (p v)``
    (megatron/training/theoretical_memory_usage.py ``compute_activation_memory``): ``in_flight`` of stage 0 over
    ``p``."""
    if p < 1 or v < 1:
        raise ValueError(f"p and v must be >= 1, got p={p}, v={v}")
    return 1 + (p - 1) / (p * v)


def p2p_bytes(seq_len: int, micro_batch: int, hidden: int, element_bytes: int, tp: int = 1, sp: bool = False) -> int:
    """Bytes one stage boundary sends per micro-batch in each direction, per TP rank: the ``s x b x h`` hidden states
    (forward) or their gradient (backward) in the activations' dtype (``element_bytes``: 2 under bf16/fp16 autocast,
    4 in fp32), divided by ``tp`` under sequence parallelism (``sp``; ceil) (Narayanan et al. 2021, section 4.1;
    Korthikanti et al. 2022, sequence parallelism).

    Raises:
        ValueError: a size below 0 or ``tp`` below 1.
    """
    if min(seq_len, micro_batch, hidden, element_bytes) < 0 or tp < 1:
        raise ValueError(f"sizes must be >= 0 and tp >= 1, got s={seq_len}, b={micro_batch}, h={hidden}, tp={tp}")
    whole = seq_len * micro_batch * hidden * element_bytes
    return -(-whole // tp) if sp else whole


def p2p_s(nbytes: int, fabric: Fabric, crosses_nodes: bool, senders_per_node: int = 1) -> float:
    """Seconds of one point-to-point send of ``nbytes`` between adjacent stages: over the node's network share
    (``fabric.inter_gbps / senders_per_node``: every GPU of a node sends across the boundary at once, each TP rank
    its own copy) with NCCL's base latency and one network step when the boundary ``crosses_nodes``, else over the
    intra-node link (``fabric.intra_busbw_gbps``: nccl-tests' SendRecv bus bandwidth is its algorithm bandwidth) with
    one step of that link (module docstring; ``advisor.timing.comm``). 0 for an empty message.

    Raises:
        ValueError: ``nbytes`` below 0, ``senders_per_node`` below 1, or no bandwidth for the link.
    """
    if nbytes < 0 or senders_per_node < 1:
        raise ValueError(f"need nbytes >= 0 and senders_per_node >= 1, got {nbytes}, {senders_per_node}")
    if nbytes == 0:
        return 0.0
    if crosses_nodes:
        gbps = fabric.inter_gbps / senders_per_node
        step = fabric.inter_step_latency_s
    else:
        gbps, step = fabric.intra_busbw_gbps, fabric.intra_step_latency_s
    if not gbps > 0:
        raise ValueError("the link a stage boundary crosses needs a bandwidth > 0 GB/s")
    return nbytes / (gbps * GB) + fabric.base_latency_s + step


@dataclass(frozen=True)
class PipelineTime:
    """One optimizer step of a pipeline (one data-parallel replica), seconds: ``ideal_s`` the ``m`` micro-batches'
    forward + backward on one stage, ``bubble_s`` its idle slots (``bubble_fraction`` x ideal), ``p2p_exposed_s``
    the transfers on the critical path (``2 (p v - 1)`` sends); ``p2p_sends`` how many sends the busiest rank posts
    per step (``2 m v``: each chunk's activations forward and gradients backward), ``p2p_bytes`` each one's size."""

    schedule: PipelineSchedule
    stages: int
    micro_batches: int
    virtual: int
    bubble_fraction: float
    ideal_s: float
    bubble_s: float
    p2p_bytes: int
    p2p_sends: int
    p2p_total_s: float
    p2p_exposed_s: float

    @property
    def total_s(self) -> float:
        return self.ideal_s + self.bubble_s + self.p2p_exposed_s


def pipeline_time(
    schedule: PipelineSchedule,
    p: int,
    m: int,
    stage_fwd_s: float,
    stage_bwd_s: float,
    p2p_message_bytes: int = 0,
    p2p_one_s: float = 0.0,
    v: int = 1,
) -> PipelineTime:
    """A pipeline step from one micro-batch's forward (``stage_fwd_s``) and backward (``stage_bwd_s``) on the
    slowest stage (all its chunks), and one send's size and time (``p2p_bytes``, ``p2p_s``): ideal ``m (t_f +
    t_b)``, the bubble ``bubble_fraction`` of it, and ``2 (p v - 1)`` sends exposed (module docstring). One stage
    (``p`` = 1) has neither bubble nor sends.

    Raises:
        ValueError: as ``bubble_fraction``, or a negative time.
    """
    if min(stage_fwd_s, stage_bwd_s, p2p_one_s) < 0:
        raise ValueError("times must be >= 0")
    frac = bubble_fraction(schedule, p, m, v)
    ideal = m * (stage_fwd_s + stage_bwd_s)
    sends = 2 * m * v if p > 1 else 0
    exposed = 2 * (p * v - 1) * p2p_one_s if p > 1 else 0.0
    return PipelineTime(
        schedule=schedule,
        stages=p,
        micro_batches=m,
        virtual=v,
        bubble_fraction=frac,
        ideal_s=ideal,
        bubble_s=frac * ideal,
        p2p_bytes=p2p_message_bytes if p > 1 else 0,
        p2p_sends=sends,
        p2p_total_s=sends * p2p_one_s,
        p2p_exposed_s=exposed,
    )


def in_flight_count(schedule: PipelineSchedule, p: int, m: int, stage: int = 0, v: int = 1) -> int:
    """``in_flight`` rounded up to whole micro-batches (Megatron-LM's ``in_flight_microbatches = ceil(penalty x
    p)`` for interleaving, theoretical_memory_usage.py), for display."""
    return math.ceil(in_flight(schedule, p, m, stage, v) - 1e-12)


__all__ = [
    "PipelineTime",
    "bubble_fraction",
    "in_flight",
    "in_flight_count",
    "interleaving_penalty",
    "p2p_bytes",
    "p2p_s",
    "pipeline_time",
]
