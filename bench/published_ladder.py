"""O67 of published_runs.md re-predicted rung by rung: torchtune's "Optimization flags" table (pytorch/torchtune
README): Llama 3.2 3B, full fine-tuning on one A100 80 GB in pure bf16, batch 2 of 4096 packed tokens, each flag
added to the previous, peak active memory and tokens/s per rung.

advisor's ladder (``advisor.ladder``) is evaluated in O67's own order (chunked cross-entropy, activation
checkpointing, optimizer in backward, activation offload, 8-bit AdamW), then LoRA (rank 8, alpha 16, all linear
layers: q/k/v/o and the MLP) and QLoRA (nf4). Targets (issue 29): the "+packed" peak (60.0 GiB, eager) within 15%;
each later rung's saving against the published delta within 15% or 1 GiB, whichever is larger; LoRA and QLoRA peaks
within 15%; speeds as savings ratios within 25% where the time model expresses the rung. torch.compile's own
-9.0 GiB (51.0 after 60.0) is not modelled: advisor's figures are eager, so its activations still hold what compile
removed, and checkpointing, which drops those activations, saves that much more here: carried as a stated offset
on the checkpointing rung's saving.

Stated misses (tested as misses): 8-bit AdamW saves 5.9 GiB here (bitsandbytes' 1-byte moments for the bf16 ones:
2 bytes per parameter) against the published 4.2. The chunked loss is sized as advisor's scripts compute it (the
output head once, then the logits' whole 16-bit gradient beside them: ``advisor.memory_options.chunked_ce_bytes``),
2 bytes per logit (1.96 GiB at 8192 x 128256) more than torchtune's per-chunk output head keeps; its own saving still
holds (7.3 GiB against 8.1), but the rungs above it carry it: the peak stays at the loss's backward, before any
gradient exists, so the optimizer step in backward saves next to nothing (1.8 GiB published), and LoRA's and QLoRA's
peaks are about 2 GiB over torchtune's (QLoRA's also holds about 0.8 GiB of peft's ``prepare_model_for_kbit_training``
upcasting the tied 128256 x 3072 embedding to fp32, which torchtune's QLoRA, torchao NF4 with bf16 embeddings, does
not do).

``python -m bench.published_ladder`` prints the table (markdown); tests/test_published_ladder.py checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
# O67's figures (published_runs.md): peak active GiB and tokens/s per rung.
PUBLISHED: dict[str, tuple[float, float]] = {
    "packed": (60.0, 7075.0),
    "compile": (51.0, 8998.0),
    "chunked_ce": (42.9, 9174.0),
    "ac_full": (24.9, 7210.0),
    "optimizer_in_backward": (23.1, 7309.0),
    "activation_offload": (21.8, 7301.0),
    "adamw_8bit": (17.6, 6960.0),
    "lora": (8.5, 8210.0),
    "qlora": (4.6, 8035.0),
}
ORDER = ("chunked_ce", "ac_full", "optimizer_in_backward", "activation_offload", "adamw_8bit")
COMPILE_OFFSET_GIB = PUBLISHED["packed"][0] - PUBLISHED["compile"][0]  # 9.0 GiB, on the checkpointing rung
# The rungs whose speed the time model expresses: checkpointing's recompute (the others' changes are below its
# resolution, or come from compile: chunked cross-entropy's +2% is the compiled loss).
TIMED = ("ac_full",)


@dataclass(frozen=True)
class RungResult:
    """One rung: the published and predicted peak (GiB) and saving against the rung before (GiB), the target it is
    held to and whether it holds; tokens/s both ways."""

    rung: str
    published_gib: float
    predicted_gib: float
    published_saving: float | None
    predicted_saving: float | None
    offset: float
    error: float  # relative: peak (packed, LoRA, QLoRA) or saving (the others)
    within: bool
    target: str
    published_tok_s: float
    predicted_tok_s: float | None


def evaluate() -> list[RungResult]:
    """Plan O67 (one trace per profile: plain, checkpointed, LoRA, QLoRA; cached) and compare each rung."""
    from advisor.cache import open_cache
    from advisor.ladder import build_ladder
    from advisor.plan import plan
    from advisor.schema import plan_inputs

    p = plan(
        plan_inputs(
            model="llama-3.2-3b",
            gpus=1,
            gpu="A100-80GB",
            seq_len=4096,
            micro_batch_size=2,
            precision="pure-bf16",
            # assumed: the table does not state the host; activation offload's pinned memory needs the node's RAM,
            # and a rung the RAM may not hold is not built on (a DGX A100 node has 1 TB)
            host_mem_gib=1024,
            detect_hardware=False,
        )
    )
    ladder = build_ladder(p.context(), p.rows, open_cache(True), 0, "single", order=ORDER)
    assert ladder is not None, "single applies"
    rungs = {r.key: r for r in ladder.rungs if r.blocker is None and r.peak_bytes is not None}
    out = []
    base = rungs["base"]
    assert base.peak_bytes is not None
    pub, tok = PUBLISHED["packed"]
    pred = base.peak_bytes / GIB
    err = pred / pub - 1
    out.append(
        RungResult("packed", pub, pred, None, None, 0.0, err, abs(err) <= 0.15, "peak 15%", tok, base.throughput)
    )
    prev_pub = PUBLISHED["compile"][0]
    for key in (*ORDER, "lora", "qlora"):
        r = rungs[key]
        assert r.peak_bytes is not None
        pub, tok = PUBLISHED[key]
        pred = r.peak_bytes / GIB
        if key in ("lora", "qlora"):
            err = pred / pub - 1
            out.append(
                RungResult(key, pub, pred, None, None, 0.0, err, abs(err) <= 0.15, "peak 15%", tok, r.throughput)
            )
            continue
        offset = COMPILE_OFFSET_GIB if key == "ac_full" else 0.0
        saving_pub, saving = prev_pub - pub, r.saved_bytes / GIB - offset
        err = saving / saving_pub - 1
        ok = abs(saving - saving_pub) <= max(0.15 * saving_pub, 1.0)
        out.append(
            RungResult(key, pub, pred, saving_pub, saving, offset, err, ok, "saving 15% or 1 GiB", tok, r.throughput)
        )
        prev_pub = pub
    return out


def speed_ratios(results: list[RungResult]) -> dict[str, tuple[float, float | None]]:
    """(published, predicted) tokens/s ratio of each ``TIMED`` rung to the rung before it."""
    out: dict[str, tuple[float, float | None]] = {}
    for before, r in zip(results, results[1:]):
        if r.rung in TIMED:
            pred = r.predicted_tok_s / before.predicted_tok_s if r.predicted_tok_s and before.predicted_tok_s else None
            pub_before = PUBLISHED["chunked_ce"][1] if before.rung == "chunked_ce" else before.published_tok_s
            out[r.rung] = (r.published_tok_s / pub_before, pred)
    return out


def render(results: list[RungResult]) -> str:
    """The markdown table of ``evaluate``'s results."""
    lines = [
        "| rung | published GiB | predicted GiB | published saving | predicted saving | error | target | holds |"
        " tok/s published | tok/s predicted |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in results:
        pub_s = f"{r.published_saving:.1f}" if r.published_saving is not None else ""
        pred_s = f"{r.predicted_saving:.2f}" if r.predicted_saving is not None else ""
        if r.offset:
            pred_s += f" (after the -{r.offset:.1f} compile offset)"
        tok = f"{r.predicted_tok_s:,.0f}" if r.predicted_tok_s else ""
        lines.append(
            f"| {r.rung} | {r.published_gib:.1f} | {r.predicted_gib:.2f} | {pub_s} | {pred_s} | {100 * r.error:+.1f}% "
            f"| {r.target} | {'yes' if r.within else 'NO'} | {r.published_tok_s:,.0f} | {tok} |"
        )
    for rung, (pub, pred) in speed_ratios(results).items():
        shown = f"{pred:.3f}" if pred is not None else "-"
        lines.append(f"\n{rung} speed ratio: published {pub:.3f}, predicted {shown}")
    return "\n".join(lines)


def main() -> int:
    print(render(evaluate()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
