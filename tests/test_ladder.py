"""The memory-savings ladder (advisor.ladder): its order and first fitting rung for an LLM and a vision job that do
not fit one GPU, the figures of the rules it applies (hand arithmetic), the JSON and the nothing-fits answer, the
rungs a strategy cannot compose with, and no ladder for a job that fits unless asked."""

from __future__ import annotations

import pytest

from advisor.candidates import TIE
from advisor.document import plan_to_dict
from advisor.memory_options import ce_saving
from advisor.plan import plan
from advisor.schema import plan_inputs

# Each plans a model of its own with the ladder's extra traces (over 5 s on 2 cores).
pytestmark = pytest.mark.slow


def _keys(p):  # noqa: ANN001, ANN202
    assert p.ladder is not None
    return [r.key for r in p.ladder.rungs if r.blocker is None], {r.key: r for r in p.ladder.rungs}


def _llm(**more):  # noqa: ANN003, ANN202
    # Llama 3.2 3B, pure bf16 as torchtune trains, 2 x 1024 tokens on one 24 GB GPU: 31.3 GiB, does not fit.
    given = dict(gpus=1, gpu="RTX4090", seq_len=1024, micro_batch_size=2, precision="pure-bf16", detect_hardware=False)
    return plan(plan_inputs(model="llama-3.2-3b", **{**given, **more}))


@pytest.fixture(scope="module")
def llm():  # noqa: ANN201
    return _llm()


def test_llm_ladder_order_and_first_fit(llm) -> None:  # noqa: ANN001
    assert llm.recommendation.strategy is None
    # A preset GPU's node has no known RAM: offload's rung fits only if it allows ("?") and is not built on, so
    # full checkpointing after it still saves, and the rungs after it are sized without its pinned memory.
    order, rungs = _keys(llm)
    assert order == [
        "base",
        "adamw_8bit",
        "chunked_ce",
        "activation_offload",
        "ac_full",
        "optimizer_in_backward",
        "lora",
        "qlora",
        "more_gpus",  # FSDP2 shards a pure-bf16 model across 2 (ZeRO does not take pure bf16)
    ]
    assert rungs["more_gpus"].flags == "--gpus 2", rungs["more_gpus"]
    assert rungs["activation_offload"].short_of == "host RAM unknown" and rungs["ac_full"].saved_bytes > 0
    # ... and says so: checkpointing's peak sits above offload's with a saving, against the rung before offload
    assert not rungs["activation_offload"].built_on
    assert rungs["activation_offload"].note.endswith("; not built on: the rungs below add to chunked cross-entropy")
    assert rungs["ac_full"].peak_bytes > rungs["activation_offload"].peak_bytes
    assert rungs["ac_full"].saved_bytes == rungs["chunked_ce"].peak_bytes - rungs["ac_full"].peak_bytes
    # With a workstation's 64 GiB of RAM (--ladder: FSDP2 + CPU offload then fits), offload is built on.
    hosted = _llm(host_mem_gib=64, ladder=True)
    order, rungs = _keys(hosted)
    # The recommended offload row is 3x slower than one GPU with two free savings: the reasons say so (a new user's
    # --host-mem hid it), with the options together and their flags.
    assert hosted.recommendation.strategy == "fsdp2_offload"
    faster = next(r for r in hosted.recommendation.reasons if r.startswith("faster without offload"))
    assert (
        "Single GPU fits with 8-bit AdamW and chunked cross-entropy (--optimizer adamw-8bit --chunked-cross-" in faster
    )
    assert float(faster.split("x the throughput")[0].rsplit(" ", 1)[1]) > 1 + TIE, faster
    # Least added seconds per GiB first: 8-bit AdamW (no slower), chunked cross-entropy (no slower) and there it
    # fits; then offload (PCIe partly exposed) before the optimizer step in backward, which saves only once offload
    # has lowered the start-of-backward peak below the end-of-backward one; then LoRA and QLoRA.
    assert order == [
        "base",
        "adamw_8bit",
        "chunked_ce",
        "activation_offload",
        "optimizer_in_backward",
        "lora",
        "qlora",
    ]
    assert [r.key for r in llm.ladder.rungs if r.first_fit] == ["chunked_ce"]
    assert rungs["more_gpus"].blocker == "not searched: the job fits as planned"  # FSDP2 + CPU offload, 64 GiB
    assert not rungs["base"].fits and not rungs["adamw_8bit"].fits and rungs["chunked_ce"].fits
    # Chunked cross-entropy saves exactly its rule at 2 x 1024 rows of a 128256 vocabulary in 16 bits, the head's
    # bf16 weight gradient (3072 wide, pure bf16) beside the logits' gradients its largest moment.
    assert rungs["chunked_ce"].saved_bytes == ce_saving(2048, 128256, 2, 8, 3072, 2)
    # 8-bit AdamW: bf16 moments (2 x 2 bytes) become 1-byte blocks (2 x 1 byte) for every large tensor: about 2
    # bytes per parameter (3.21B parameters), bitsandbytes' block scales and its fp32 small tensors on top.
    saved = rungs["adamw_8bit"].saved_bytes
    assert 2 * 3.21e9 * 0.97 < saved < 2 * 3.21e9 * 1.01
    # Slower rungs say so: offload's exposed PCIe time, and each rung's step is the previous one's or more.
    assert rungs["activation_offload"].slowdown > 0
    assert "pinned host memory" in rungs["activation_offload"].note
    # Checkpointing saves nothing once offload has moved the activations off the GPU: said, not hidden.
    assert "saves nothing" in (rungs["ac_full"].blocker or "")


def test_activation_offload_needs_the_nodes_ram() -> None:
    """Offloaded activations live in pinned host memory, one GPU's worth per GPU of the node: the rung does not fit
    a node whose RAM is short (a new user's 767B config was offered 647 GiB per GPU of pinned memory, "hidden under
    compute", as a fit) and fits only if the RAM allows where it is unknown (a preset GPU: as the rows say)."""
    from advisor.units import fmt_gib

    rungs = {r.key: r for r in _llm().ladder.rungs}  # a preset GPU: the host RAM is unknown
    unknown = rungs["activation_offload"]
    assert unknown.host_bytes > 0 and not unknown.fits and unknown.short_of == "host RAM unknown"
    assert f"fits only if the host RAM allows: needs {fmt_gib(unknown.host_bytes)} of host RAM per node" in unknown.note
    # not built on: LoRA after it is sized without the pinned memory, and fits
    assert rungs["lora"].fits and rungs["lora"].host_bytes == 0
    # 4 x 1024 tokens: more pinned activations (about 13 GiB) than building the model takes (12 GiB); 12.5 GiB of RAM
    long = {r.key: r for r in _llm(micro_batch_size=4, host_mem_gib=12.5).ladder.rungs}
    rung = long["activation_offload"]
    assert not rung.fits and rung.short_of == "host RAM" and rung.host_bytes > 12.5 * 2**30
    assert f"does not fit in host RAM: needs {fmt_gib(rung.host_bytes)} per node, the node has 12.50 GiB" in rung.note
    # where building the model is what the RAM cannot hold, every rung is short of it, said once under the first
    small = _llm(host_mem_gib=8).ladder.rungs
    sized = [r for r in small if r.blocker is None and r.peak_bytes]
    assert not any(r.fits for r in sized) and {r.short_of for r in sized} == {"GPU memory", "host RAM"}
    assert {r.key: r.short_of for r in sized}["chunked_ce"] == "host RAM"  # (it fits the GPU: chunked_ce's rung)
    assert [("building the model takes" in r.note) for r in small if r.blocker is None][:3] == [True, False, False]


def test_llm_ladder_in_json_and_answer(llm) -> None:  # noqa: ANN001
    doc = plan_to_dict(llm)
    assert [row["rung"] for row in doc["ladder"]][:3] == ["base", "adamw_8bit", "chunked_ce"]
    first = next(row for row in doc["ladder"] if row["first_fit"])
    assert first["rung"] == "chunked_ce" and first["strategy"] == "single"
    reason, fix = llm.recommendation.reasons[1], "Single GPU fits with 8-bit AdamW and chunked cross-entropy "
    assert reason.startswith(f"cheapest fix before more GPUs: {fix}")
    assert "--optimizer adamw-8bit --chunked-cross-entropy 8" in reason


def test_vision_ladder_order_and_first_fit() -> None:
    p = plan(plan_inputs(model="resnet50", gpus=1, gpu="RTX4090", micro_batch_size=640, detect_hardware=False))
    assert p.recommendation.strategy is None
    order, rungs = _keys(p)
    assert order == ["base", "adamw_8bit", "ac_full", "optimizer_in_backward", "activation_offload"]
    assert [r.key for r in p.ladder.rungs if r.first_fit] == ["ac_full"]  # type: ignore[union-attr]
    # No vocabulary-wide loss, no Llama block: each says why in one line.
    for key in ("chunked_ce", "sac_op"):
        assert rungs[key].blocker and "\n" not in rungs[key].blocker
    # ResNet-50's trainable parameters (25.6M): 8-bit AdamW saves about 6 of the 8 bytes of fp32 moments each.
    assert 25.5e6 * 6 * 0.9 < rungs["adamw_8bit"].saved_bytes < 25.6e6 * 6 * 1.01


def test_the_answer_names_the_fewest_options_that_fit() -> None:
    """The ladder stacks 8-bit AdamW (nearly free in speed) below full checkpointing, but checkpointing alone fits:
    the nothing-fits answer names that one flag first (a new user was told to change the optimizer as well), with
    its own figures, and still quotes the ladder's cumulative rung."""
    p = plan(plan_inputs(model="resnet50", gpus=1, gpu="RTX4090", micro_batch_size=640, detect_hardware=False))
    ladder = p.ladder
    assert ladder is not None and ladder.fewest is not None
    few, fit = ladder.fewest, ladder.first_fit
    assert fit is not None and fit.key == "ac_full" and few.flags == "--activation-checkpointing"
    # without 8-bit AdamW's saving: more memory than the cumulative rung, still inside the 24 GiB card
    assert fit.device_bytes < few.device_bytes <= p.hardware.gpu_memory_bytes
    ac = plan(
        plan_inputs(
            model="resnet50", gpus=1, gpu="RTX4090", micro_batch_size=640, detect_hardware=False,
            activation_checkpointing=True,
        )
    )  # fmt: skip
    assert few.device_bytes == ac.row("single").memory.device_total  # the figures of the plan with that flag
    reason = p.recommendation.reasons[1]
    assert reason.startswith(
        "fewest changes before more GPUs: Single GPU fits with activation checkpointing (full) "
        "(--activation-checkpointing): "
    )
    assert "(--optimizer adamw-8bit --activation-checkpointing: " in reason


def test_ddp_ladder_refuses_optimizer_in_backward_and_fitting_job_has_none() -> None:
    values = dict(model="gpt2", gpus=2, gpu="A100-80GB", seq_len=256, detect_hardware=False)
    quiet = plan(plan_inputs(**values))
    assert quiet.ladder is None and "ladder" not in plan_to_dict(quiet)
    p = plan(plan_inputs(**values, ladder=True))
    assert p.ladder is not None and p.ladder.strategy == "ddp"
    _, rungs = _keys(p)
    blocker = rungs["optimizer_in_backward"].blocker
    assert blocker is not None and "DDP" in blocker and "\n" not in blocker


def test_cumulative_flags_drop_what_a_later_rung_replaces() -> None:
    """The cheapest-fix line's flags are one command the CLI takes: full checkpointing replaces the op policy
    (--selective-checkpointing with --activation-checkpointing is refused), QLoRA's flags replace LoRA's."""
    from advisor.cli import build_parser, inputs_from_args
    from advisor.ladder import LABELS, Rung, cumulative_flags

    def rung(key: str, blocker: str | None = None) -> Rung:
        return Rung(key, LABELS[key][0], LABELS[key][1], blocker=blocker)

    rungs = [rung("chunked_ce"), rung("sac_op"), rung("activation_offload", "saves nothing"), rung("ac_full")]
    assert cumulative_flags(rungs) == "--chunked-cross-entropy 8 --activation-checkpointing"
    both = cumulative_flags([rung("sac_op"), rung("lora"), rung("qlora")])
    assert both == "--selective-checkpointing op " + LABELS["qlora"][1] and both.count("--lora-rank") == 1
    # the flags of every rung together, as the ladder composes them, are one set of inputs the checks take (the
    # two checkpointing flags together were refused: "two policies")
    every = cumulative_flags([rung(k) for k in LABELS if LABELS[k][1]])
    inputs, _ = inputs_from_args(build_parser().parse_args(["llama-3.2-3b", *every.split()]))
    assert inputs.training.activation_checkpointing and inputs.training.selective_checkpointing is None
    assert inputs.training.quantize is not None and inputs.training.lora_dropout == 0


def test_a_fused_expert_model_gets_lora_rungs(tmp_path) -> None:  # noqa: ANN001
    """Mixtral's experts are fused 3-D weights, which peft wraps with lora.ParamWrapper; it takes no LoRA dropout,
    so the ladder's rungs use none (as torchtune's recipes) and have figures instead of peft's refusal."""
    import json

    config = tmp_path / "tiny_mixtral.json"
    config.write_text(json.dumps({
        "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 1000, "max_position_embeddings": 64, "tie_word_embeddings": False,
    }))  # fmt: skip
    p = plan(
        plan_inputs(
            config_path=str(config),
            gpus=1,
            gpu_mem_gib=0.05,
            seq_len=64,
            micro_batch_size=2,
            precision="fp32",
            ladder=True,
            detect_hardware=False,
        )  # fmt: skip
    )
    _, rungs = _keys(p)
    for key in ("lora", "qlora"):
        assert rungs[key].blocker is None and rungs[key].peak_bytes, (key, rungs[key].blocker)
        assert "--lora-dropout 0" in rungs[key].flags


def test_a_rung_that_peaks_while_loading_says_so() -> None:
    """Llama 2 70B on 32 A100s, nothing fits: the ladder runs on ZeRO-3, whose QLoRA rung peaks while each rank
    loads the whole quantized base, before DeepSpeed partitions it (34 GiB), above the LoRA rung's 6.75 GiB; a new
    user read that as a contradiction. The rung says where its peak is."""
    p = plan(
        plan_inputs(
            model="llama-2-70b", gpus=8, nodes=4, network="ib-hdr", global_batch_size=256, detect_hardware=False
        )
    )
    rungs = {r.key: r for r in p.ladder.rungs}
    assert p.ladder.strategy == "zero3" and rungs["qlora"].peak_bytes > rungs["lora"].peak_bytes
    assert "the peak is loading (the whole quantized base, before deepspeed.initialize partitions it)" in (
        rungs["qlora"].note
    ), rungs["qlora"].note
    assert "the peak is" not in rungs["lora"].note
