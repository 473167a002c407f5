"""The published GPU training runs ``python -m bench.published`` re-predicts, as typed data: one ``Case`` per
published figure with the advisor inputs it was measured under, the figure and its unit, and how it is compared.

Rows and ids follow ../shared/anchors/published_runs.md (F: llm-foundry; O: the other sources); the three sources
of the earlier step-time table (nanoGPT, Megatron-LM's 2020 weak-scaling table, transformers' DP-vs-DDP) are
folded in. Figures that cannot be expressed are in ``NOT_EXPRESSED`` with the reason (bench/published_other.py has
the O rows and that list; bench/published_case.py the ``Case`` type).
"""

from __future__ import annotations

from .published_case import (
    CNN,
    S_EPOCH,
    S_ITER,
    S_RUN,
    SAMPLES_S,
    SEQ_S,
    THROUGHPUT_UNITS,
    TOK_S_GPU,
    TRANSFORMER,
    Case,
)
from .published_models import MEGATRON_FUSED, megatron_config, mpt_config
from .published_other import NOT_EXPRESSED, other_cases

__all__ = [
    "CNN",
    "NOT_EXPRESSED",
    "S_EPOCH",
    "S_ITER",
    "S_RUN",
    "SAMPLES_S",
    "SEQ_S",
    "THROUGHPUT_UNITS",
    "TOK_S_GPU",
    "TRANSFORMER",
    "Case",
    "cases",
]

SOURCES: dict[str, str] = {
    "LF": "mosaicml/llm-foundry scripts/train/benchmarking/README.md @8c8dd48f (MPT on A100 40/80 GB and H100, "
    "Composer FSDP)",
    "MEG": "NVIDIA/Megatron-LM images/cases_april2021.png with examples/academic_paper_scripts/sc21/run_table_1.sh "
    "@f2e72c8a (O17, O18); images/model_table.png @f2e5db40 (O23, O24)",
    "DSE": "deepspeedai/DeepSpeedExamples training/autotuning/hf/{gpt2-xl,gpt2-large,gpt2-medium,bert-large}/README.md "
    "@b90ffabe: the autotuner's best metric per ZeRO stage (16 x V100, one DGX-2-type node)",
    "HF": "huggingface/blog pytorch-fsdp.md (Tables 1-2) and accelerate-deepspeed.md (Tables 1, 3): 2 x TITAN RTX 24GB",
    "LAMBDA": "lambdal/deeplearning-benchmark pytorch/*.csv @4e11f689 (NVIDIA DeepLearningExamples scripts, AMP, DDP)",
    "nanoGPT": "karpathy/nanoGPT README ('reproducing GPT-2 (124M)': 8 x A100 40GB) and issue #110: ~562 ms per "
    "iteration at batch 12 x 1024 x 5 accumulation x 8 GPUs, bf16, flash attention, torch.compile",
    "MEG2020": "NVIDIA/Megatron-LM README (2020 weak-scaling table): GPT-2-style models, DGX A100 (NVSwitch), fp16, "
    "activation recompute, batch 16 per TP group, seq 1024, vocab 51200",
    "DPvsDDP": "huggingface transformers docs 'Efficient training on multiple GPUs' (perf_train_gpu_many, "
    "'DP vs DDP'): GPT-2 124M, 2 x TITAN RTX 24GB, fp32, batch 4 per GPU, 200 steps: DDP over NVLink 101.9 s, with "
    "NCCL_P2P_DISABLE=1 (PCIe) 131.4 s; P2P disabled goes through host memory: NVIDIA/nccl issue #384, "
    "PCIe Gen3 x16, 2 GPUs, all-reduce busbw 3.9 GB/s",
}

# ------------------------------------------------------------------------------------------------ llm-foundry
# MPT sizes of the table: (layers, hidden, heads).
MPT_SIZES: dict[str, tuple[int, int, int]] = {
    "70b": (80, 8192, 64),
    "30b": (48, 7168, 56),
    "13b": (40, 5120, 40),
    "7b": (32, 4096, 32),
    "3b": (32, 2560, 20),
    "1b": (24, 2048, 16),
    "760m": (24, 1536, 12),
    "350m": (24, 1024, 16),
    "125m": (12, 768, 12),
}
# The table's rows: (id, MPT size, seq, GPU, GPUs, FSDP sharding (FS: FULL_SHARD, SGO: SHARD_GRAD_OP), Composer
# mixed precision (D: DEFAULT under amp_bf16, P: PURE under bf16), activation checkpointing, micro-batch,
# accumulation steps, measured tokens/s/GPU). F25 (amp_fp8) is in NOT_EXPRESSED.
_H, _A80, _A40 = "H100-80GB", "A100-80GB", "A100-40GB"
_F_ROWS: tuple[tuple[str, str, int, str, int, str, str, bool, int, int, float], ...] = (
    ("F1", "70b", 2048, _H, 512, "FS", "D", True, 8, 1, 1007),
    ("F2", "70b", 2048, _H, 128, "FS", "D", True, 8, 1, 1058),
    ("F3", "30b", 2048, _H, 512, "FS", "D", True, 8, 1, 2115),
    ("F4", "13b", 2048, _H, 512, "FS", "D", True, 16, 1, 4952),
    ("F5", "7b", 2048, _H, 512, "FS", "D", False, 6, 1, 9670),
    ("F6", "7b", 2048, _H, 128, "FS", "D", False, 6, 1, 10475),
    ("F7", "3b", 2048, _H, 512, "SGO", "D", False, 8, 1, 21664),
    ("F8", "3b", 2048, _H, 128, "SGO", "D", False, 8, 1, 23422),
    ("F9", "1b", 2048, _H, 512, "SGO", "D", False, 12, 1, 39837),
    ("F10", "70b", 2048, _H, 64, "FS", "D", True, 8, 4, 1039),
    ("F11", "70b", 2048, _H, 32, "FS", "D", True, 2, 16, 882),
    ("F12", "30b", 2048, _H, 8, "FS", "D", True, 3, 21, 2002),
    ("F13", "30b", 8192, _H, 8, "FS", "D", True, 1, 21, 1384),
    ("F14", "13b", 2048, _H, 8, "FS", "D", False, 2, 1, 4792),
    ("F15", "13b", 1024, _H, 8, "FS", "D", True, 40, 3, 5502),
    ("F16", "13b", 32768, _H, 8, "FS", "D", True, 1, 3, 1976),
    ("F17", "7b", 65536, _H, 8, "FS", "D", True, 1, 2, 1956),
    ("F18", "7b", 8192, _H, 8, "FS", "D", True, 8, 2, 6935),
    ("F19", "7b", 1024, _H, 8, "FS", "D", True, 64, 2, 10203),
    ("F20", "3b", 2048, _H, 16, "FS", "D", False, 10, 3, 24142),
    ("F21", "3b", 512, _H, 8, "FS", "D", False, 40, 6, 27965),
    ("F22", "3b", 16384, _H, 8, "FS", "D", False, 1, 6, 11152),
    ("F23", "760m", 2048, _H, 8, "FS", "D", False, 24, 2, 63147),
    ("F24", "760m", 2048, _H, 16, "FS", "D", False, 24, 1, 68551),
    ("F26", "70b", 2048, _A80, 32, "FS", "P", True, 2, 16, 373),
    ("F27", "30b", 2048, _A80, 8, "FS", "D", True, 3, 21, 916),
    ("F28", "30b", 8192, _A80, 8, "FS", "D", True, 1, 21, 574),
    ("F29", "13b", 2048, _A80, 8, "FS", "D", False, 2, 3, 2262),
    ("F30", "13b", 4096, _A80, 8, "FS", "D", True, 10, 3, 2060),
    ("F31", "13b", 32768, _A80, 8, "FS", "D", True, 1, 3, 1016),
    ("F32", "7b", 65536, _A80, 8, "FS", "D", True, 1, 2, 1013),
    ("F33", "7b", 4096, _A80, 8, "FS", "D", True, 16, 2, 3684),
    ("F34", "7b", 1024, _A80, 8, "FS", "D", True, 64, 2, 4357),
    ("F35", "3b", 2048, _A80, 8, "FS", "D", False, 10, 2, 10811),
    ("F36", "3b", 32768, _A80, 8, "FS", "D", True, 3, 6, 3029),
    ("F37", "1b", 2048, _A80, 8, "FS", "D", False, 14, 4, 20513),
    ("F38", "760m", 2048, _A80, 8, "FS", "D", False, 24, 2, 32434),
    ("F39", "760m", 512, _A80, 8, "FS", "D", False, 96, 2, 29446),
    ("F40", "350m", 2048, _A80, 8, "FS", "D", False, 32, 2, 58782),
    ("F41", "125m", 2048, _A80, 8, "FS", "D", False, 40, 2, 142830),
    ("F42", "125m", 512, _A80, 8, "FS", "D", False, 128, 2, 165681),
    ("F43", "70b", 2048, _A40, 128, "FS", "P", True, 4, 1, 376),
    ("F44", "70b", 2048, _A40, 64, "FS", "P", True, 2, 1, 276),
    ("F45", "30b", 2048, _A40, 128, "FS", "P", True, 6, 1, 865),
    ("F46", "30b", 2048, _A40, 32, "FS", "P", True, 4, 1, 857),
    ("F47", "13b", 2048, _A40, 128, "FS", "P", True, 16, 1, 1972),
    ("F48", "13b", 2048, _A40, 16, "FS", "P", True, 10, 1, 1993),
    ("F49", "13b", 2048, _A40, 8, "FS", "P", True, 4, 16, 1668),
    ("F50", "7b", 2048, _A40, 128, "FS", "P", True, 18, 1, 3623),
    ("F51", "7b", 2048, _A40, 8, "FS", "P", True, 12, 4, 3679),
    ("F52", "7b", 16384, _A40, 8, "FS", "P", True, 1, 4, 2249),
    ("F53", "3b", 2048, _A40, 128, "FS", "P", False, 6, 1, 9538),
    ("F54", "3b", 2048, _A40, 8, "FS", "P", False, 5, 8, 10065),
    ("F55", "1b", 2048, _A40, 128, "FS", "P", False, 10, 1, 18647),
    ("F56", "1b", 2048, _A40, 32, "FS", "P", False, 10, 1, 15555),
    ("F57", "1b", 2048, _A40, 8, "FS", "P", False, 8, 8, 19271),
    ("F58", "760m", 2048, _A40, 128, "FS", "P", False, 12, 1, 28940),
    ("F59", "350m", 2048, _A40, 128, "FS", "P", False, 18, 1, 51934),
    ("F60", "350m", 2048, _A40, 8, "FS", "P", False, 16, 4, 55995),
    ("F61", "125m", 2048, _A40, 128, "FS", "P", False, 26, 1, 123936),
    ("F62", "125m", 2048, _A40, 8, "FS", "P", False, 26, 3, 136334),
)
_LF_NOTE = (
    "MPT as a GPT-2 architecture of the same L/d/heads, 4x MLP, vocab 50368, learned positions (with biases, "
    "which MPT has not: bench/published_models.py mpt_config). FULL_SHARD -> fsdp2, SHARD_GRAD_OP -> "
    "fsdp2_noreshard; MP DEFAULT (amp_bf16) -> bf16, MP PURE -> pure-bf16 (bf16 gradient reduction as PURE; "
    "PURE keeps fp32 master weights, pure-bf16 does not: the optimizer step is well under 1% of these steps). "
)
_LF_NET = {
    _H: (
        "ib-ndr",
        "inter-node network not stated: DGX H100's 8 x 400 Gb/s NDR assumed (the H100 preset's typical network)",
    ),
    _A80: ("ib-hdr", "RoCE 1600 Gb/s per node = 8 x 200 Gb/s: the A100 preset's 8 x HDR NICs, the same per-NIC rate"),
    _A40: ("ib-hdr", "RoCE 1600 Gb/s per node = 8 x 200 Gb/s: the A100 preset's 8 x HDR NICs, the same per-NIC rate"),
}


def foundry_cases() -> tuple[Case, ...]:
    """llm-foundry's FSDP throughput table (F rows), compared as tokens/s/GPU (the table's own figure)."""
    out = []
    for rid, size, seq, gpu, gpus, shard, mp, ac, mb, ga, tok in _F_ROWS:
        layers, hidden, heads = MPT_SIZES[size]
        network, net_note = _LF_NET[gpu]
        out.append(
            Case(
                row=rid,
                source="LF",
                model=f"mpt-{size}-s{seq}",
                config=mpt_config(layers, hidden, heads, seq),
                seq=seq,
                gpu=gpu,
                gpus_per_node=8,
                nodes=gpus // 8,
                network=network if gpus > 8 else None,
                strategy="fsdp2" if shard == "FS" else "fsdp2_noreshard",
                precision="bf16" if mp == "D" else "pure-bf16",
                checkpointing=ac,
                micro_batch=mb,
                grad_accum=ga,
                published=tok,
                unit=TOK_S_GPU,
                compare="tokens/s/GPU: micro-batch x accumulation x data-parallel ranks x seq / predicted step / GPUs",
                note=_LF_NOTE + (net_note if gpus > 8 else "one node: NVSwitch"),
            )
        )
    return tuple(out)


# ---------------------------------------------------------------------------- the earlier step-time table
def earlier_cases() -> tuple[Case, ...]:
    """nanoGPT, Megatron-LM's 2020 weak-scaling table and transformers' DP-vs-DDP, as bench/TIME.md had them."""
    compare_step = "seconds per optimizer step: the predicted step (compute + exposed communication + optimizer)"
    out = [
        Case(
            "nanogpt-124m-8xA100",
            "nanoGPT",
            "gpt2",
            1024,
            "A100-40GB",
            8,
            1,
            None,
            "ddp",
            "bf16",
            False,
            12,
            5,
            0.562,
            S_ITER,
            compare_step,
            extra={"attention": "flash"},
            note="torch.compile fuses element-wise ops that the op-by-op model counts one by one",
        )
    ]
    for size, (h, a, layers, tp, ms) in {
        "1b": (1920, 15, 24, 1, 1.076),
        "2b": (2304, 18, 30, 2, 1.026),
        "4b": (3072, 24, 36, 4, 1.162),
        "8b": (4096, 32, 42, 8, 1.343),
    }.items():
        out.append(
            Case(
                f"megatron-{size}-tp{tp}",
                "MEG2020",
                f"megatron-{size}",
                1024,
                "A100-40GB",
                tp,
                1,
                None,
                "ddp" if tp == 1 else "tp",
                "pure-bf16",
                True,
                16,
                1,
                ms,
                S_ITER,
                compare_step,
                config=megatron_config(h, a, layers, 51200, 1024),
                fused=MEGATRON_FUSED,
                extra={"interconnect": "nvlink", "attention": "math"},
                note="GPT-2-style model as a Llama block of the same shapes (bench/published_models.py "
                "megatron_config); Megatron's fp16 with fp32 master weights as pure-bf16 (16-bit everything); math "
                "attention (baddbmm, fused softmax, bmm: the 2020 code predates flash attention)",
            )
        )
    titan = dict(attention="math")
    run = "seconds for the 200 steps: 200 x the predicted step"
    out.append(
        Case(
            "dp-vs-ddp-nvlink",
            "DPvsDDP",
            "gpt2",
            1024,
            "TITANRTX",
            2,
            1,
            None,
            "ddp",
            "fp32",
            False,
            4,
            1,
            101.9,
            S_RUN,
            run,
            samples=200,
            extra=titan | {"interconnect": "nvlink"},
            note="GPT-2's eager attention (transformers 2020)",
        )
    )
    out.append(
        Case(
            "dp-vs-ddp-pcie",
            "DPvsDDP",
            "gpt2",
            1024,
            "TITANRTX",
            2,
            1,
            None,
            "ddp",
            "fp32",
            False,
            4,
            1,
            131.4,
            S_RUN,
            run,
            samples=200,
            extra=titan | {"interconnect": "pcie", "link_bandwidth_gbps": 3.9},
            note="NCCL_P2P_DISABLE=1: NCCL through host memory, 3.9 GB/s busbw (NVIDIA/nccl #384)",
        )
    )
    return tuple(out)


def cases() -> tuple[Case, ...]:
    """Every expressed case: llm-foundry's, the other sources' (bench/published_other.py), the earlier table's."""
    return foundry_cases() + other_cases() + earlier_cases()


# The published_runs.md rows the issue asks to express (F25, amp_fp8, is excluded) and the ResNet-50 figures of
# O73/O74's notes.
REQUIRED: tuple[str, ...] = (
    *(f"F{i}" for i in range(1, 63) if i != 25),
    "O17",
    "O18",
    "O23",
    "O24",
    "O43",
    "O44",
    "O45",
    *(f"O{i}" for i in range(54, 59)),
    *(f"O{i}" for i in range(71, 78)),
)
