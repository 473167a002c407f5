"""Per-layer overlap of ZeRO-3's and FSDP2's parameter gathers (issue 31): a prefetched gather hides only behind the
compute of the layer it is issued ahead of (``advisor.timing.step.prefetched_exposed_s``), so at micro-batch 1 a
module whose gather outlasts its neighbour's compute exposes the difference. Hand arithmetic on the schedule, then
GPT-3 175B (Brown et al. 2020, table 2.1: 96 layers, d_model 12288, 96 heads, context 2048) on 1024 A100s."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor.plan import plan
from advisor.profile import ZERO3_PERSISTENCE_THRESHOLD
from advisor.schema import plan_inputs
from advisor.timing.step import Layer, exposed_s, prefetched_exposed_s
from advisor.units import fmt_s
from strategies.base import fabric_of, timing_of

ROOT = Path(__file__).resolve().parents[1]
GPT3 = str(ROOT / "tests" / "data" / "gpt3_175b.json")


def test_one_ahead_prefetch_hides_a_gather_only_behind_the_layer_before_it():
    # Gathers 2, 1, 4 s before computes of 3, 1, 2 s: the first gather (2) waits, the second (1) hides behind the
    # first compute (3), the third (4) behind the second compute (1) only: 3 s more. 2 + 0 + 3 = 5.
    layers = [Layer(2.0, 3.0), Layer(1.0, 1.0), Layer(4.0, 2.0)]
    assert prefetched_exposed_s(layers) == pytest.approx(5.0)
    # One queue over the whole pass (``exposed_s``) lends the first compute's idle link to the third gather:
    # 2 + (5 - 6 x 2 / 3) = 3 s.
    assert exposed_s(7.0, 6.0, 3, first_s=2.0) == pytest.approx(3.0)
    # Two ahead: the third gather is issued when the first compute starts (t = 2) and queues behind the second
    # (link free at 3), arriving at 7; the second compute ends at 6, so 1 s waits: 2 + 1 = 3.
    assert prefetched_exposed_s(layers, ahead=2) == pytest.approx(3.0)
    # Gathers that never outlast the compute before them: only the first is exposed.
    assert prefetched_exposed_s([Layer(1.0, 5.0)] * 4) == pytest.approx(1.0)
    assert prefetched_exposed_s([]) == 0.0


def test_reduce_scatters_wait_for_their_gradients_and_share_the_link():
    # Backward: gather 1, compute 2 (the gathers of layer 1 hidden behind it), layer 1 computes 2 then issues a
    # 1.5 s reduce-scatter at t = 5, the epilogue's 1 s bucket follows: the link ends at 7.5; compute 4 s in all.
    layers = [Layer(1.0, 2.0), Layer(1.0, 2.0, 1.5), Layer(0.0, 0.0, 1.0)]
    assert prefetched_exposed_s(layers) == pytest.approx(1.0 + 1.5 + 1.0)
    # A reduce-scatter issued mid-pass delays the next gather on the shared link: layer 0's 3 s reduce-scatter
    # (t 3 to 6) runs before layer 2's gather is issued (t 3, queued to 6 + 1 = 7); layer 2 waits from 5 to 7.
    layers = [Layer(1.0, 2.0, 3.0), Layer(1.0, 2.0), Layer(1.0, 2.0)]
    assert prefetched_exposed_s(layers) == pytest.approx(1.0 + 2.0)


@pytest.fixture(scope="module")
def gpt3():
    def at(network: str, global_batch: int = 1024):
        return plan(
            plan_inputs(
                detect_hardware=False,
                config_path=GPT3,
                gpus=8,
                nodes=128,
                gpu="A100-80GB",
                network=network,
                precision="bf16",
                micro_batch_size=1,
                seq_len=2048,
                global_batch_size=global_batch,
            )
        )

    return at


@pytest.mark.slow
def test_zero3_at_micro_batch_1_on_1024_gpus_exposes_what_a_module_gather_outlasts(gpt3):
    """GPT-3 175B, ZeRO-3, 128 DGX A100 nodes (8 HDR NICs each), micro-batch 1: a block's forward gathers its
    linears one module ahead (each holds more than the 5e7-element prefetch bucket): c_fc's 604M-element gather
    hides only behind attn.c_proj's compute, a twelfth of the block's (151M of its 1,812M gathered elements), so
    every block exposes at least the difference. One queue over the pass (before) hid all but 23 ms of 10.3 s."""
    p = gpt3("ib-hdr")
    row = p.row("zero3")
    ctx, t = p.context(), timing_of(p.context())
    assert t is not None
    c = row.strategy.compute_time(ctx, t)
    units = p.profile.stats.fsdp_units
    assert c.blocks == len(units) - 1 == 96
    block = [size for _d, size, _t, _l in units[1] if size >= 100_000]
    assert block == [3 * 12288**2, 12288**2, 4 * 12288**2, 4 * 12288**2]  # c_attn, attn.c_proj, c_fc, mlp.c_proj
    fabric = fabric_of(ctx, t, 8, 128)
    c_fc_gather = fabric.time_s("all_gather", 2 * 4 * 12288**2)
    c_proj_compute = c.block_fwd_s * 12288**2 / sum(block)
    assert c_fc_gather > c_proj_compute
    floor = 96 * (c_fc_gather - c_proj_compute)
    st = row.time
    assert st.micro_steps == 1 and st.comm_s == pytest.approx(10.4, abs=0.3)
    assert st.exposed_comm_s >= floor > 0.25
    for coll in st.collectives:
        assert 0 <= coll.exposed_s <= coll.seconds * (1 + 1e-9), coll.what
    # Each micro-step pays its own gathers and reduce-scatters: 4 micro-steps expose 4 times one.
    four = gpt3("ib-hdr", global_batch=4096).row("zero3").time
    assert four.micro_steps == 4
    assert four.exposed_comm_s == pytest.approx(4 * st.exposed_comm_s, rel=1e-9)


@pytest.mark.slow
def test_gathers_longer_than_every_layer_compute_are_mostly_exposed(gpt3):
    """On one 100 GbE NIC per node every module's gather outlasts the compute before it: most of the collective
    time is exposed, in ZeRO-3 and FSDP2 alike, and no collective is exposed longer than it runs (before, ZeRO-3's
    gathers were charged the reduce-scatters' overrun: 80.9 s exposed of 61.4 s)."""
    p = gpt3("100gbe")
    for name in ("zero3", "fsdp2"):
        st = p.row(name).time
        assert st.exposed_comm_s > 0.5 * st.comm_s, name
        assert st.exposed_comm_s <= st.comm_s * (1 + 1e-9), name
        for coll in st.collectives:
            assert 0 <= coll.exposed_s <= coll.seconds * (1 + 1e-9), (name, coll.what)


def test_the_hooks_cpu_time_hides_under_longer_compute_or_adds_when_the_host_waits():
    # CPU ahead of the GPU (coalesced fetch): of hooks of 0.5 s before computes of 1 s only the first shows (the
    # others run while the GPU computes); hooks of 2 s make the CPU the bottleneck: compute starts at 2, 4, 6 and
    # ends at 7, of which 3 s compute: 4 s exposed.
    assert prefetched_exposed_s([Layer(0.0, 1.0, host_s=0.5)] * 3) == pytest.approx(0.5)
    assert prefetched_exposed_s([Layer(0.0, 1.0, host_s=2.0)] * 3) == pytest.approx(4.0)
    # The CPU waits for each gather and all queued work (a synchronize per gather): each 0.5 s hook adds.
    assert prefetched_exposed_s([Layer(0.0, 1.0, host_s=0.5)] * 3, host_waits=True) == pytest.approx(1.5)
    # Beside a 1 s gather that is exposed anyway (the first layer's), the hook still adds when the host waits.
    assert prefetched_exposed_s([Layer(1.0, 1.0, host_s=0.5)], host_waits=True) == pytest.approx(1.5)


def test_zero3_hooks_per_parameter_add_their_cpu_time_to_the_step():
    """DeepSpeed before 0.6 (``--zero3-fetch per-parameter``: DeepSpeedExamples' autotuning runs of 2021, row O43 of
    published_runs.md) gathered one parameter tensor at a time with a host synchronize after each: every tensor
    costs ``ZERO3_PER_PARAMETER_HOST_S`` in forward and again in backward, on top of the step. Coalesced (today's
    DeepSpeed) the CPU runs ahead and a 0.3 ms hook per module hides under gpt2's compute on a V100."""
    from strategies.zero.timing import ZERO3_FETCH_HOST_S, ZERO3_PER_PARAMETER_HOST_S

    def zero3(fetch: str):
        p = plan(
            plan_inputs(
                detect_hardware=False,
                model="gpt2",
                gpus=16,
                gpu="V100-32GB",
                precision="fp16",
                seq_len=1024,
                micro_batch_size=1,
                zero3_fetch=fetch,
            )
        )
        return p, p.row("zero3").time

    p, old = zero3("per-parameter")
    _, new = zero3("coalesced")
    tensors = p.profile.stats.num_param_tensors
    # The plan says what the flag did, with the arithmetic (forward and backward: 2 passes).
    line = next(w for w in p.warnings if w.startswith("--zero3-fetch per-parameter: ZeRO-3 is timed as DeepSpeed"))
    assert f"0.5 ms x {tensors} tensors x 2 passes = {fmt_s(2 * tensors * ZERO3_PER_PARAMETER_HOST_S)}" in line
    zero2 = p.row("zero2").time  # the same 16-bit compute, no hooks
    # The host waits: nearly all of it adds (a prefetched gather in flight runs beside a hook: 0.6% hides here),
    # as the GPU waiting for the CPU, in compute; communication is unchanged.
    stall = old.compute_s - zero2.compute_s
    assert 0.98 * 2 * tensors * ZERO3_PER_PARAMETER_HOST_S <= stall <= 2 * tensors * ZERO3_PER_PARAMETER_HOST_S
    assert old.comm_s == pytest.approx(new.comm_s) and old.exposed_comm_s <= old.comm_s
    assert any(f"{2 * tensors * ZERO3_PER_PARAMETER_HOST_S * 1e3:.3g} ms of CPU time" in n for n in old.notes)
    # Coalesced, 0.3 ms per gathered module and pass: gpt2's modules compute longer at seq 1024 on a V100, so only
    # the first hook of each pass shows.
    # The gathered modules: a linear's weight or an embedding, each at least the persistence threshold (50 in gpt2).
    modules = sum(n >= ZERO3_PERSISTENCE_THRESHOLD for unit in p.profile.stats.fsdp_units for _, n, _, _ in unit)
    assert modules == 12 * 4 + 2 and any(
        f"{2 * modules * ZERO3_FETCH_HOST_S * 1e3:.3g} ms of CPU time" in n for n in new.notes
    )
    assert new.compute_s - zero2.compute_s <= 2 * ZERO3_FETCH_HOST_S * 1.0001
    assert new.exposed_comm_s <= new.comm_s


def test_zero3_fetch_without_a_zero3_row_says_it_is_not_used():
    p = plan(
        plan_inputs(
            detect_hardware=False, model="gpt2", gpus=4, seq_len=128, framework="torch", zero3_fetch="per-parameter"
        )
    )
    assert "--zero3-fetch per-parameter is not used: no ZeRO-3 row applies" in p.warnings
    assert not any("ZeRO-3 is timed as" in w for w in p.warnings)
