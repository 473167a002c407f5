"""``advisor.layout``: the degrees, their one validation (torchtitan's ParallelDims product rule, heads and key/value
heads by tp, pp at most the blocks), the uneven split, and the layouts a cluster admits."""

from __future__ import annotations

import pytest

from advisor.errors import AdvisorError
from advisor.layout import Layout, layouts_for


def test_product_is_the_world_size_and_the_error_prints_the_formula():
    assert Layout(dp_replicate=2, dp_shard=4, tp=8, pp=2).world_size == 128
    assert Layout(dp_shard=4, tp=2, pp=2).validate(16) == Layout(dp_shard=4, tp=2, pp=2)
    with pytest.raises(AdvisorError) as err:
        Layout(dp_replicate=2, dp_shard=4, tp=8, pp=2).validate(64)
    msg = str(err.value)
    assert "\n" not in msg
    assert "dp_replicate(2) * dp_shard(4) * tp(8) * pp(2) = 128 != world size 64" in msg


def test_tp_must_divide_heads_and_kv_heads():
    Layout(dp_shard=2, tp=8).validate(16, heads=64, kv_heads=8)  # Llama-2-70B: GQA with 8 KV heads
    with pytest.raises(AdvisorError) as err:
        Layout(dp_shard=1, tp=16).validate(16, heads=64, kv_heads=8)
    msg = str(err.value)
    assert "\n" not in msg and "tp(16)" in msg and "64 attention heads and the 8 key/value heads" in msg
    assert "8 % 16 = 8" in msg
    with pytest.raises(AdvisorError, match=r"25 % 2 = 1"):
        Layout(tp=2).validate(2, heads=25)  # kv heads default to the heads (no GQA)


def test_pp_at_most_the_blocks_and_the_uneven_split():
    with pytest.raises(AdvisorError) as err:
        Layout(pp=8).validate(8, layers=4)
    assert str(err.value) == "invalid layout: pp(8) exceeds the model's 4 blocks (at least one block per stage)"
    assert Layout(pp=4).stage_blocks(32) == (8, 8, 8, 8)
    assert not Layout(pp=4).is_uneven(32)
    # 30 blocks over 4 stages: 30 = 4 x 7 + 2, the first two stages one more (torchtitan's extra_layers rule)
    assert Layout(pp=4).stage_blocks(30) == (8, 8, 7, 7)
    assert Layout(pp=4).is_uneven(30)
    # Megatron's 96-layer GPT-3 175B on PP 8 (O-rows): 12 each
    assert Layout(dp_shard=1, tp=8, pp=8).stage_blocks(96) == (12,) * 8
    with pytest.raises(AdvisorError, match="pp\\(5\\) exceeds the model's 4 blocks"):
        Layout(pp=5).stage_blocks(4)
    # interleaved: pp x v stages, rank r holding stages r, r + pp, ... (torchtitan's "loop" placement)
    assert Layout(pp=2).stage_blocks(10, virtual=2) == (5, 5)  # stages 3, 3, 2, 2: ranks 3 + 2 and 3 + 2
    assert Layout(pp=2).stage_blocks(7, virtual=2) == (4, 3)  # stages 2, 2, 2, 1
    assert Layout(pp=35).stage_blocks(105, virtual=3) == (3,) * 35  # Megatron's O22: 1 block per virtual stage
    assert Layout(pp=2).is_uneven(7, virtual=2) and not Layout(pp=2).is_uneven(8, virtual=2)
    with pytest.raises(AdvisorError, match=r"pp\(2\) x 3 virtual stages exceeds the model's 4 blocks"):
        Layout(pp=2).stage_blocks(4, virtual=3)


def test_degrees_are_positive_ints():
    for bad in ({"tp": 0}, {"pp": -1}, {"dp_shard": 1.5}):
        with pytest.raises(ValueError):
            Layout(**bad)


def test_placement_on_the_cluster():
    assert Layout(dp_shard=1, tp=8, pp=2).pp_crosses_nodes(8)  # 16 GPUs on 2 nodes: stage 1 is the second node
    assert not Layout(dp_shard=1, tp=4, pp=2).pp_crosses_nodes(8)  # one node
    assert Layout(dp_shard=2, tp=2, pp=4).pp_crosses_nodes(8)  # stages of 4 ranks: the 1->2 boundary crosses
    assert not Layout(dp_shard=16).pp_crosses_nodes(8)  # no pipeline
    assert Layout(tp=8).tp_inside_node(8) and not Layout(tp=16).tp_inside_node(8)
    assert Layout(dp_replicate=2, dp_shard=4, tp=2, pp=2).label() == "dp 2x4 x tp 2 x pp 2"
    assert Layout(dp_shard=8).label() == "dp 8" and Layout().label() == "dp 1"


def test_the_layouts_of_a_cluster():
    # 2 nodes of 4 GPUs, a model with 8 heads, 2 KV heads and 4 blocks: tp in {1, 2} (4 does not divide the 2 KV
    # heads), pp in {1, 2, 4} (8 exceeds the 4 blocks), tp dividing the 8 / pp GPUs of a stage.
    got = [(x.dp, x.tp, x.pp) for x in layouts_for(4, 2, heads=8, kv_heads=2, layers=4)]
    assert got == [(8, 1, 1), (4, 2, 1), (4, 1, 2), (2, 2, 2), (2, 1, 4), (1, 2, 4)]
    everything = layouts_for(4, 2)
    assert len(everything) == 9  # pp 1: tp 1, 2, 4; pp 2: tp 1, 2, 4; pp 4: tp 1, 2; pp 8: tp 1
    assert all(x.world_size == 8 and 4 % x.tp == 0 for x in everything)
    assert {(x.tp, x.pp) for x in everything if x.pp == 8} == {(1, 8)}
    # Llama-2-70B on 8 nodes of 8: 64 heads, 8 KV heads, 80 blocks
    big = layouts_for(8, 8, heads=64, kv_heads=8, layers=80)
    assert Layout(dp_shard=8, tp=8, pp=1) in big and Layout(dp_shard=1, tp=8, pp=8) in big
    assert all(x.pp <= 80 and x.tp <= 8 for x in big)
    assert [x.pp for x in layouts_for(8, 8, max_tp=1, max_pp=2)] == [1, 2]
    with pytest.raises(ValueError):
        layouts_for(0, 1)
