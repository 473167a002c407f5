"""The published runs of sources other than llm-foundry (O rows of ../shared/anchors/published_runs.md) as
``bench.published_case.Case`` rows, and the figures that are not expressed, each with its reason."""

from __future__ import annotations

from .published_case import CNN, OVERLAP_DDP, OVERLAP_MEGATRON_CORE, S_EPOCH, SAMPLES_S, SEQ_S, TOK_S_GPU, Case
from .published_models import (
    DEBERTA_V2_XLARGE,
    MEGATRON_FUSED,
    megatron_config,
    megatron_hfu_flops_per_token,
    megatron_model_flops_per_token,
)

_MEG_COMPARE = "tokens/s/GPU, derived from the published TFLOP/s/GPU by the source's FLOP formula (published_models.py)"


def megatron_cases() -> tuple[Case, ...]:
    """O17, O18 (SC21 TP x DP, fp16, full recompute) and O23, O24 (Megatron-core's MFU table on H100)."""
    out = []
    # (id, layers, hidden, heads, GPUs, TP, mb, TFLOP/s/GPU): run_table_1.sh, gbs 512, DP 32 -> GA 1.
    for rid, layers, hidden, heads, gpus, tp, mb, tf in (
        ("O17", 30, 3072, 32, 64, 2, 16, 138.0),
        ("O18", 36, 4096, 32, 128, 4, 16, 142.0),
    ):
        flops = megatron_hfu_flops_per_token(layers, hidden, 2048, 51200)
        out.append(
            Case(
                rid,
                "MEG",
                f"megatron-gpt-l{layers}-h{hidden}",
                2048,
                "A100-80GB",
                8,
                gpus // 8,
                "ib-hdr",
                "tp_dp",
                "fp16",
                True,
                mb,
                512 // (mb * gpus // tp),
                tf * 1e12 / flops,
                TOK_S_GPU,
                _MEG_COMPARE + ": the HFU formula 96 B s l h^2 (1 + s/6h + V/16lh), recompute counted",
                fused=MEGATRON_FUSED,
                config=megatron_config(hidden, heads, layers, 51200, 2048),
                tp=tp,
                overlap=OVERLAP_DDP,
                extra={"attention": "math"},
                note="Selene: 8 HDR IB per node [recalled]; GPT as a Llama block of the same shapes "
                "(megatron_config); --DDP-impl torch: torch DDP's bucketed all-reduce beside backward; math attention "
                "(baddbmm, fused softmax, bmm: Megatron-LM 2021 predates flash attention)",
            )
        )
    # (id, layers, hidden, heads, GPUs, TP, TFLOP/s/GPU): gbs 192, DP 48 -> 4 sequences per rank per step.
    for rid, layers, hidden, heads, gpus, tp, tf in (
        ("O23", 32, 6144, 48, 192, 4, 489.1),
        ("O24", 48, 7168, 56, 384, 8, 459.6),
    ):
        flops = megatron_model_flops_per_token(layers, hidden, 4096, 131072)
        out.append(
            Case(
                rid,
                "MEG",
                f"megatron-core-l{layers}-h{hidden}",
                4096,
                "H100-80GB",
                8,
                gpus // 8,
                "ib-ndr",
                "tp_dp",
                "bf16",
                False,
                1,
                4,
                tf * 1e12 / flops,
                TOK_S_GPU,
                _MEG_COMPARE + ": Megatron-core's 72 B s l h^2 (1 + s/6h + V/12lh), recompute not counted",
                fused=MEGATRON_FUSED,
                config=megatron_config(hidden, heads, layers, 131072, 4096),
                tp=tp,
                note="assumed: a 4h MLP and full multi-head attention (the table states neither), micro-batch 1 x "
                "4 accumulation steps (gbs 192 over DP 48), no activation checkpointing (not stated), bf16, "
                "NDR between nodes; the README's --overlap-grad-reduce, --overlap-param-gather (distributed "
                "optimizer) and --tp-comm-overlap as Case.overlap megatron-core (bench.published.source_overlap)",
                overlap=OVERLAP_MEGATRON_CORE,
            )
        )
    return tuple(out)


def megatron_pp_cases() -> tuple[Case, ...]:
    """O19-O22 (SC21: TP 8 x PP x DP on A100, fp16, full recompute; O20-O22 interleaved) and O25, O26
    (Megatron-core's table on H100) on the estimate-only pipeline row (``strategies/pp.py``, ``--pp-degree``): shown,
    not fitted (the fit's constants stay those of the rows without a pipeline)."""
    out = []
    # (id, layers, hidden, heads, GPUs, PP, v, mb, gbs, TFLOP/s/GPU): run_table_1.sh; DP = GPUs / (8 PP).
    for rid, layers, hidden, heads, gpus, pp, v, mb, gbs, tf in (
        ("O19", 48, 8192, 64, 512, 2, 1, 4, 1536, 138.0),
        ("O20", 60, 10240, 80, 1024, 4, 3, 2, 1792, 140.0),
        ("O21", 96, 16384, 128, 1920, 16, 2, 1, 2160, 155.0),
        ("O22", 105, 20480, 128, 2520, 35, 3, 1, 2520, 163.0),
    ):
        dp = gpus // (8 * pp)
        flops = megatron_hfu_flops_per_token(layers, hidden, 2048, 51200)
        interleaved = f"; interleaved 1F1B with {v} model chunks per rank, as published" if v > 1 else ""
        schedule = {"pp_schedule": "interleaved-1f1b", "pp_virtual_stages": v} if v > 1 else {}
        out.append(
            Case(
                rid,
                "MEG",
                f"megatron-gpt-l{layers}-h{hidden}",
                2048,
                "A100-80GB",
                8,
                gpus // 8,
                "ib-hdr",
                "pp",
                "fp16",
                True,
                mb,
                gbs // (mb * dp),
                tf * 1e12 / flops,
                TOK_S_GPU,
                _MEG_COMPARE + ": the HFU formula 96 B s l h^2 (1 + s/6h + V/16lh), recompute counted",
                fused=MEGATRON_FUSED,
                config=megatron_config(hidden, heads, layers, 51200, 2048),
                tp=8,
                fitted=False,
                extra={"pp_degree": pp, **schedule},
                note=f"TP 8 x PP {pp} x DP {dp} (Megatron's local DDP as torch's DDP); Selene: 8 HDR IB per node "
                f"[recalled]; GPT as a Llama block of the same shapes (megatron_config){interleaved}",
            )
        )
    # (id, layers, hidden, heads, GPUs, PP, gbs, TFLOP/s/GPU): DP 48.
    for rid, layers, hidden, heads, gpus, pp, gbs, tf in (
        ("O25", 92, 10240, 80, 1536, 4, 768, 420.5),
        ("O26", 96, 16384, 128, 3072, 8, 1536, 474.4),
    ):
        flops = megatron_model_flops_per_token(layers, hidden, 4096, 131072)
        out.append(
            Case(
                rid,
                "MEG",
                f"megatron-core-l{layers}-h{hidden}",
                4096,
                "H100-80GB",
                8,
                gpus // 8,
                "ib-ndr",
                "pp",
                "bf16",
                True,
                1,
                gbs // 48,
                tf * 1e12 / flops,
                TOK_S_GPU,
                _MEG_COMPARE + ": Megatron-core's 72 B s l h^2 (1 + s/6h + V/12lh), recompute not counted",
                fused=MEGATRON_FUSED,
                config=megatron_config(hidden, heads, layers, 131072, 4096),
                tp=8,
                fitted=False,
                extra={"pp_degree": pp},
                note=f"TP 8 x PP {pp} x DP 48; assumed (the table states neither): micro-batch 1 with full recompute, "
                "a 4h MLP and full multi-head attention; bf16, NDR between nodes",
            )
        )
    return tuple(out)


_DSE_COMPARE = (
    "samples/s of the whole job against 16 x micro-batch / the predicted step (compute + exposed communication "
    "+ optimizer): the autotuner's metric sums DeepSpeed's forward, backward and step timers only, no data loading"
)
# The autotuning READMEs ran DeepSpeed of late 2021 (before 0.6): ZeRO-3 gathered one parameter at a time.
_DSE_EXTRA: dict[str, object] = {"interconnect": "nvlink", "link_bandwidth_gbps": 120.0, "zero3_fetch": "per-parameter"}
_DSE_NOTE = (
    "16 x V100 in one node (DGX-2 type: NVSwitch joins all 16; V100-32GB assumed, 16 vs 32 GB uncertain); the "
    "all-reduce busbw is the V100 preset's NVLink figure (120 GB/s) for all 16 (--link-bandwidth); block 1024 "
    "(run_clm's default, uncertain); z0 (DeepSpeed's fp16 data parallel) as DDP; DeepSpeed before 0.6: ZeRO-3 "
    "with --zero3-fetch per-parameter"
)


def deepspeed_cases() -> tuple[Case, ...]:
    """O43-O45: DeepSpeed autotuning's best metric per ZeRO stage (16 x V100, HF Trainer)."""
    out = []
    stage = {"z0": "ddp", "z1": "zero1", "z2": "zero2", "z3": "zero3"}
    # (id, model, seq, precision, [(stage, mb, samples/s)]): the README tables' best_exp_name and best_metric_val.
    for rid, model, seq, precision, runs in (
        ("O43", "gpt2-xl", 1024, "fp16", [("z1", 1, 40.1749), ("z2", 1, 33.0472), ("z3", 1, 12.8604)]),
        ("O44", "gpt2-large", 1024, "fp16", [("z0", 2, 59.0229), ("z1", 3, 87.3017), ("z2", 3, 77.8338)]),
        ("O45", "gpt2-medium", 1024, "fp16", [("z0", 5, 167.688), ("z1", 6, 175.46), ("z2", 6, 161.619)]),
        ("O45", "bert-large", 128, "fp32", [("z0", 93, 835.244), ("z1", 93, 842.243), ("z2", 94, 764.524)]),
    ):
        for z, mb, value in runs:
            suffix = f"bert-{z}" if model == "bert-large" else z
            out.append(
                Case(
                    f"{rid}-{suffix}",
                    "DSE",
                    model,
                    seq,
                    "V100-32GB",
                    16,
                    1,
                    None,
                    stage[z],
                    precision,
                    False,
                    mb,
                    1,
                    value,
                    SAMPLES_S,
                    _DSE_COMPARE,
                    extra=_DSE_EXTRA,
                    note=_DSE_NOTE
                    + (
                        "; BERT-large on GLUE (seq 128, fp32) planned with the masked-LM head (the classifier's "
                        "head is smaller: about +10% FLOPs here)"
                        if model == "bert-large"
                        else ""
                    ),
                )
            )
    return tuple(out)


# wikitext-2-raw-v1's train split: 36,718 lines, 2,318 blocks of 1,024 GPT-2 tokens (run_clm's "Num examples =
# 2318" at block 1024), about 2.37M tokens.
_WIKITEXT2_TOKENS = 2318 * 1024
_WIKITEXT2_LINES = 36718
_HF_FSDP_SAMPLES = round(2000 / _WIKITEXT2_LINES * _WIKITEXT2_TOKENS / 12)  # n_train 2000 lines, block 12
_HF_COMPARE = (
    "wall time of one epoch against (samples per epoch / samples per step) x the predicted step; the published "
    "time also holds start-up, warm-up, evaluation and logging, so the row is shown, not fitted"
)


def hf_cases() -> tuple[Case, ...]:
    """O54-O56, O58: Hugging Face's accelerate posts on 2 x TITAN RTX (epoch and run wall times)."""
    out = []
    fsdp_note = (
        f"samples per epoch assumed {_HF_FSDP_SAMPLES:,}: n_train 2000 of wikitext-2's 36,718 train lines "
        "(about 2.37M GPT-2 tokens) in blocks of 12 (the post's --block_size 12, twice; published_runs.md reads it "
        "as probably 128); --num_train_epochs 1; min_num_params (wrapping granularity) not modelled; the link "
        "between the two cards not stated (PCIe assumed)"
    )
    # (id, model, GPUs, strategy, precision, batch, published seconds)
    for rid, model, gpus, strategy, precision, mb, seconds in (
        ("O54-ddp", "gpt2-large", 2, "ddp", "fp32", 7, 15 * 60),
        ("O54-ddp-fp16", "gpt2-large", 2, "ddp", "fp16", 7, 8 * 60),
        ("O54-sgo", "gpt2-large", 2, "fsdp2_noreshard", "fp32", 11, 11 * 60),
        ("O54-full-1M", "gpt2-large", 2, "fsdp2", "fp32", 15, 12 * 60),
        ("O54-full-2K", "gpt2-large", 2, "fsdp2", "fp32", 15, 13 * 60),
        ("O54-offload-1M", "gpt2-large", 2, "fsdp2_offload", "fp32", 20, 23 * 60),
        ("O54-offload-2K", "gpt2-large", 2, "fsdp2_offload", "fp32", 22, 24 * 60),
        ("O55-full", "gpt2-xl", 2, "fsdp2", "fp32", 5, 0.6 * 3600),
        ("O55-offload-1", "gpt2-xl", 1, "fsdp2_offload", "fp32", 10, 3 * 3600),
        ("O55-offload-2", "gpt2-xl", 2, "fsdp2_offload", "fp32", 14, 1.16 * 3600),
    ):
        out.append(
            Case(
                rid,
                "HF",
                model,
                12,
                "TITANRTX",
                gpus,
                1,
                None,
                strategy,
                precision,
                False,
                mb,
                1,
                seconds,
                S_EPOCH,
                _HF_COMPARE,
                samples=_HF_FSDP_SAMPLES,
                fitted=False,
                note=fsdp_note,
            )  # fmt: skip
        )
    deberta = (
        "3,668 MRPC train samples per epoch, padded to max_length 128 (assumed: dynamic padding would be "
        "shorter); DeBERTa-v2-xlarge planned with the masked-LM head over the 128,100-token vocabulary, not the "
        "2-way classifier (about +29% FLOPs); DDP's precision is not stated: fp16 assumed, as the ZeRO-2 run"
    )
    for rid, strategy, mb, seconds in (("O56-ddp", "ddp", 8, 103.57), ("O56-zero2", "zero2", 40, 28.98)):
        out.append(
            Case(
                rid,
                "HF",
                "deberta-v2-xlarge",
                128,
                "TITANRTX",
                2,
                1,
                None,
                strategy,
                "fp16",
                False,
                mb,
                1,
                seconds,
                S_EPOCH,
                _HF_COMPARE,
                config=DEBERTA_V2_XLARGE,
                samples=3668,
                fitted=False,
                note=deberta,
            )  # fmt: skip
        )
    o58 = round(_WIKITEXT2_TOKENS / 128)
    out.append(
        Case(
            "O58",
            "HF",
            "gpt2-xl",
            128,
            "TITANRTX",
            1,
            1,
            None,
            "zero3_offload",
            "fp16",
            False,
            16,
            1,
            6608.35,
            S_EPOCH,
            _HF_COMPARE,
            samples=o58,
            fitted=False,
            note=f"samples per epoch assumed {o58:,}: wikitext-2's train split (about 2.37M GPT-2 tokens) in blocks "
            "of 128; ZeRO-3 with parameters and optimizer offloaded to the CPU",
        )  # fmt: skip
    )
    return tuple(out)


_LAMBDA_COMPARE = "sequences (images) per second of the whole job: GPUs x micro-batch / the predicted step"


def lambda_cases() -> tuple[Case, ...]:
    """O71-O77: Lambda's BERT-large SQuAD (seq 384) and ResNet-50 runs, 1 and N GPUs, AMP."""
    out = []
    bert = "BERT-large planned with the masked-LM head over all 384 tokens (SQuAD's span head is 2 outputs: +10% FLOPs)"
    # (id, GPU, GPUs, batch per GPU, seq/s on 1 GPU, seq/s on all)
    for rid, gpu, gpus, mb, one, many in (
        ("O71", "RTX4090", 2, 28, 93, 139),
        ("O72", "RTX3090", 2, 28, 52, 89),
        ("O73", "A100-80GB", 8, 112, 152, 746),
        ("O74", "H100-80GB", 8, 112, 301, 2167),
        ("O75", "H100-PCIe-80GB", 8, 112, 203, 1522),
        ("O76", "V100-16GB", 8, 16, 57, 286),
    ):
        for n, value in ((1, one), (gpus, many)):
            out.append(
                Case(
                    f"{rid}-{n}",
                    "LAMBDA",
                    "bert-large",
                    384,
                    gpu,
                    n,
                    1,
                    None,
                    "single" if n == 1 else "ddp",
                    "fp16",
                    False,
                    mb,
                    1,
                    value,
                    SEQ_S,
                    _LAMBDA_COMPARE,
                    note=bert,
                )  # fmt: skip
            )
    for gpu, mb, value in (
        ("A10-24GB", 28, 42),
        ("RTXA6000", 64, 68),
        ("RTX6000Ada", 64, 79),
        ("A100-PCIe-40GB", 48, 117),
    ):
        out.append(
            Case(
                f"O77-{gpu}",
                "LAMBDA",
                "bert-large",
                384,
                gpu,
                1,
                1,
                None,
                "single",
                "fp16",
                False,
                mb,
                1,
                value,
                SEQ_S,
                _LAMBDA_COMPARE,
                note=bert,
            )  # fmt: skip
        )
    # Lambda's ResNet-50 runs on the 80 GB cards (lambdal/deeplearning-benchmark pytorch/scripts/config_v1/
    # config_pytorch_80GB.sh, sourced by config_pytorch_8x80GB.sh; pytorch/pytorch-train-bs-fp16.csv: resnet50 1280
    # for A100 80GB SXM4): DeepLearningExamples' ConvNets main.py with --amp --static-loss-scale 256 --batch-size
    # 1280 --data-backend synthetic --training-only, no --memory-format, so its default nchw (main.py), and its
    # default optimizer, SGD with momentum 0.9.
    resnet = (
        "ResNet-50 from O73/O74's notes: AMP, DDP, 224 px; Lambda's config (config_v1/config_pytorch_80GB.sh): "
        "batch 1280 per GPU, synthetic data, DeepLearningExamples' default NCHW layout and SGD with momentum (the "
        "BERT rows' batch 112 comes from the same file)"
    )
    for rid, gpu, one, many in (("O73", "A100-80GB", 1582, 11439), ("O74", "H100-80GB", 2616, 20728)):
        for n, value in ((1, one), (8, many)):
            out.append(
                Case(
                    f"{rid}-rn50-{n}",
                    "LAMBDA",
                    "resnet50",
                    224,
                    gpu,
                    n,
                    1,
                    None,
                    "single" if n == 1 else "ddp",
                    "fp16",
                    False,
                    1280,
                    1,
                    value,
                    SAMPLES_S,
                    _LAMBDA_COMPARE,
                    workload=CNN,
                    note=resnet,
                    extra={"optimizer": "sgd-momentum"},
                )  # fmt: skip
            )
    return tuple(out)


def other_cases() -> tuple[Case, ...]:
    return megatron_cases() + megatron_pp_cases() + deepspeed_cases() + hf_cases() + lambda_cases()


_PP = (
    "pipeline parallelism with ZeRO-1 (BLOOM's memory per GPU and step times): the pipeline row sizes PP x DDP only; "
    "the estimate-only ZeRO-1 x TP x PP policy comes with the layouts work"
)
# Figures of published_runs.md (and of the earlier table) that are not expressed, with the reason.
NOT_EXPRESSED: tuple[tuple[str, str], ...] = (
    ("F25", "amp_fp8 (Transformer Engine FP8): advisor has no FP8 precision"),
    *((rid, _PP) for rid in ("O33", "O34")),
    (
        "O43 end-to-end",
        "HF+DS z1 27.46 samples/s is end to end (Trainer data loading, logging); the autotuner "
        "metric is compared; plain HF DDP 'not runnable' (out of memory) is a memory figure",
    ),  # fmt: skip
    (
        "O44 end-to-end",
        "HF DDP 27.87 (mb 1), HF+DS z1 56.80 (mb 2) and autotuned 69.06 (mb 3) are end to end; "
        "z3 failed (metric 0): no figure",
    ),  # fmt: skip
    ("O45 end-to-end", "BERT-large's HF baseline 742.7 (mb 64) is end to end; z3 failed (0) for both models"),
    ("O55 DDP", "DDP out of memory at batch 1: a memory figure, not a time"),
    (
        "O57",
        "BlenderBot-400M-distill trains 128 source and 64 target tokens; advisor traces an encoder-decoder "
        "at one sequence length for both",
    ),  # fmt: skip
    (
        "O67",
        "torchtune's tokens/s come from packing and torch.compile, which the time fit does not model; its "
        "peak-memory column is re-predicted rung by rung in bench/published_ladder.py",
    ),  # fmt: skip
    ("O77 8x RTX 6000 Ada", "642 seq/s on 8 GPUs is marked uncertain (102% scaling) in published_runs.md"),
    (
        "resnet18 CIFAR-10",
        "the earlier table's 3.4x DDP speed-up on 4 GPUs: the article names no GPU, includes data "
        "loading, and trained a CIFAR ResNet-18 (3x3 stem) where torchvision's has the ImageNet stem",
    ),  # fmt: skip
)
