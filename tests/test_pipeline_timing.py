"""``advisor.timing.pipeline`` by hand arithmetic: the bubble (Narayanan et al. 2021, sections 2.2.1-2.2.2), the
micro-batches in flight per stage (Megatron-LM's warm-up counts and interleaving penalty), the p2p message and its
time over the link it crosses."""

from __future__ import annotations

import pytest

from advisor.choices import PipelineSchedule as S
from advisor.gpu_presets import GPU_PRESETS
from advisor.timing.comm import NCCL_BASE_LATENCY_S, NCCL_STEP_LATENCY_S, Fabric
from advisor.timing.pipeline import (
    bubble_fraction,
    in_flight,
    in_flight_count,
    interleaving_penalty,
    p2p_bytes,
    p2p_s,
    pipeline_time,
)


@pytest.mark.parametrize(
    "schedule, p, m, v, want",
    [
        (S.GPIPE, 4, 8, 1, 3 / 8),
        (S.ONE_F_ONE_B, 4, 8, 1, 3 / 8),
        (S.ONE_F_ONE_B, 8, 64, 1, 7 / 64),
        (S.ONE_F_ONE_B, 2, 1, 1, 1.0),  # one micro-batch on 2 stages: half the time idle
        (S.INTERLEAVED_1F1B, 4, 8, 2, 3 / 16),
        (S.INTERLEAVED_1F1B, 8, 64, 4, 7 / 256),
        (S.INTERLEAVED_1F1B, 16, 32, 3, 15 / 96),
        (S.ONE_F_ONE_B, 1, 5, 1, 0.0),  # no pipeline, no bubble
    ],
)
def test_bubble_fraction(schedule, p, m, v, want):
    assert bubble_fraction(schedule, p, m, v) == pytest.approx(want, rel=1e-12)


def test_in_flight_per_stage():
    # GPipe holds every micro-batch on every stage
    assert [in_flight(S.GPIPE, 4, 8, i) for i in range(4)] == [8, 8, 8, 8]
    # 1F1B: p - stage (warm-up p - stage - 1, plus one), capped at m
    assert [in_flight(S.ONE_F_ONE_B, 4, 8, i) for i in range(4)] == [4, 3, 2, 1]
    assert [in_flight(S.ONE_F_ONE_B, 4, 2, i) for i in range(4)] == [2, 2, 2, 1]
    assert in_flight(S.ONE_F_ONE_B, 8, 64, 0) == 8
    # interleaved, p = 4, v = 2, m = 8: stage 0 warms up 2 x 3 + 1 x 4 = 10 chunk micro-batches, holds 11 halves
    assert in_flight(S.INTERLEAVED_1F1B, 4, 8, 0, 2) == pytest.approx(11 / 2)
    assert in_flight(S.INTERLEAVED_1F1B, 4, 8, 3, 2) == pytest.approx(5 / 2)  # 0 + 4 + 1 over 2
    # ... which on stage 0 is p x Megatron's penalty 1 + (p - 1) / (p v) = 4 x (1 + 3/8) = 5.5
    assert interleaving_penalty(4, 2) == pytest.approx(1 + 3 / 8)
    for p, v in [(2, 2), (4, 2), (8, 4), (16, 3)]:
        assert in_flight(S.INTERLEAVED_1F1B, p, 4 * p, 0, v) == pytest.approx(p * interleaving_penalty(p, v))
    # capped at every chunk micro-batch of the step: m v = 2 x 2 = 4 chunks = 2 stage micro-batches
    assert in_flight(S.INTERLEAVED_1F1B, 4, 2, 0, 2) == pytest.approx(2.0)
    assert in_flight_count(S.INTERLEAVED_1F1B, 4, 8, 0, 2) == 6  # Megatron's ceil(1.375 x 4)
    assert in_flight_count(S.ONE_F_ONE_B, 4, 8, 1) == 3


def test_bad_counts():
    with pytest.raises(ValueError):
        bubble_fraction(S.ONE_F_ONE_B, 4, 8, 2)  # v > 1 needs interleaving
    with pytest.raises(ValueError):
        bubble_fraction(S.GPIPE, 0, 8)
    with pytest.raises(ValueError):
        in_flight(S.GPIPE, 4, 8, 4)  # stage out of range


def test_p2p_message():
    # Llama-2-70B: s 4096, b 1, h 8192, bf16: 64 MiB per micro-batch per boundary; sequence parallel on TP 8: 8 MiB
    assert p2p_bytes(4096, 1, 8192, 2) == 4096 * 8192 * 2 == 64 * 2**20
    assert p2p_bytes(4096, 1, 8192, 2, tp=8, sp=True) == 8 * 2**20
    assert p2p_bytes(4096, 1, 8192, 2, tp=8) == 64 * 2**20  # without SP every TP rank sends the whole tensor
    assert p2p_bytes(3, 1, 1, 1, tp=2, sp=True) == 2  # ceil


def test_p2p_time_over_the_link():
    fabric = Fabric(gpus_per_node=8, intra_busbw_gbps=200.0, nodes=2, inter_gbps=100.0)
    n = 64 * 10**6
    inside = p2p_s(n, fabric, crosses_nodes=False)
    assert inside == pytest.approx(n / 200e9 + NCCL_BASE_LATENCY_S + NCCL_STEP_LATENCY_S["nvlink"])
    # across nodes the 8 GPUs of a node send at once, each with 1/8 of the node's 100 GB/s
    across = p2p_s(n, fabric, crosses_nodes=True, senders_per_node=8)
    assert across == pytest.approx(n / 12.5e9 + NCCL_BASE_LATENCY_S + NCCL_STEP_LATENCY_S["net"])
    assert p2p_s(0, fabric, True) == 0.0
    # a preset's fabric: DGX A100 nodes on HDR InfiniBand, 8 NICs of 24 GB/s (NCCL's reach) = 192 GB/s per node,
    # 24 GB/s for each of its 8 senders; NVLink inside at the preset's 200 GB/s all-reduce bus bandwidth
    a100 = Fabric.from_preset(GPU_PRESETS["a100-80gb"], 8, 2, network="ib-hdr")
    assert p2p_s(n, a100, True, 8) == pytest.approx(n / 24e9 + 8.4e-6 + 9.6e-6)
    assert p2p_s(n, a100, False) == pytest.approx(n / 200e9 + 8.4e-6 + 3.4e-6)


def test_pipeline_step_time():
    # 1F1B, p 4, m 8: ideal 8 x (1 + 2) s = 24 s, bubble 3/8 of it = 9 s, 2 (4 - 1) = 6 sends of 0.1 s exposed
    t = pipeline_time(S.ONE_F_ONE_B, 4, 8, 1.0, 2.0, p2p_message_bytes=1000, p2p_one_s=0.1)
    assert (t.ideal_s, t.bubble_s, t.p2p_exposed_s) == pytest.approx((24.0, 9.0, 0.6))
    assert t.total_s == pytest.approx(33.6)  # = (m + p - 1) (t_f + t_b) + 0.6: 11 x 3 + 0.6
    assert (t.p2p_sends, t.p2p_bytes) == (16, 1000)  # 8 forward + 8 backward on a middle stage
    assert t.p2p_total_s == pytest.approx(1.6)
    # interleaved v 2: the bubble halves, the critical path crosses 2 (4 x 2 - 1) = 14 boundaries
    ti = pipeline_time(S.INTERLEAVED_1F1B, 4, 8, 1.0, 2.0, 1000, 0.1, v=2)
    assert (ti.bubble_s, ti.p2p_exposed_s, ti.p2p_sends) == pytest.approx((4.5, 1.4, 32))
    # GPipe has 1F1B's bubble
    assert pipeline_time(S.GPIPE, 4, 8, 1.0, 2.0).bubble_s == pytest.approx(9.0)
    # one stage: no bubble, no sends
    one = pipeline_time(S.ONE_F_ONE_B, 1, 8, 1.0, 2.0, 1000, 0.1)
    assert (one.total_s, one.p2p_sends, one.p2p_bytes) == (24.0, 0, 0)
