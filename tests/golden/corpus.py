"""The golden-plan corpus: fixed planning questions whose ``--json`` plans were saved before the
schema/strategies refactor (issue 11) and must stay identical afterwards, except for the fields that
refactor adds or renames (see ``tests/test_golden.py``).

Each case is a flat dict of input-field values (the schema's field names) plus ``device``: "cuda"
plans for the cluster; "cpu" is the estimate a CPU verification run compares against, on a fixed
CPU "cluster" (``cpu_world`` ranks sharing ``CPU_HOST_GIB`` of RAM, as ``advisor.verify`` builds it).
Host RAM is always given, so no figure depends on this machine.

    .venv/bin/python -m tests.golden.corpus     # rewrite tests/golden/plans.json (only when told to)
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GOLDEN = HERE / "plans.json"
TINY = str(ROOT / "tests" / "data" / "tiny_llama.json")
SMALL = str(ROOT / "tests" / "data" / "small_llama.json")
LLAMA_SMALL = str(ROOT / "bench" / "llama_small.json")
CPU_HOST_GIB = 24

CASES: dict[str, dict] = {
    # torchvision
    "resnet50-4xA100": dict(model="resnet50", gpus=4, gpu="A100-80GB", host_mem_gib=512),
    "resnet18-64px-2x4090-sgd": dict(
        model="resnet18", image_size=64, gpus=2, gpu="RTX4090", optimizer="sgd-momentum", host_mem_gib=128
    ),
    "vit_b_16-8xH100-ac": dict(
        model="vit_b_16", gpus=8, gpu="H100-80GB", activation_checkpointing=True, host_mem_gib=1024
    ),
    "convnext_tiny-2xA100-fp32-mb64": dict(
        model="convnext_tiny", gpus=2, gpu="A100-40GB", precision="fp32", micro_batch_size=64, host_mem_gib=256
    ),
    # transformer presets
    "gpt2-s256-2xA100": dict(model="gpt2", seq_len=256, gpus=2, gpu="A100-80GB", host_mem_gib=512),
    "gpt2-s1024-8xA100-ga": dict(
        model="gpt2", gpus=8, gpu="A100-40GB", micro_batch_size=4, global_batch_size=64, host_mem_gib=512
    ),
    "bert-base-s128-4xV100-fp16": dict(
        model="bert-base", seq_len=128, gpus=4, gpu="V100-32GB", precision="fp16", host_mem_gib=256
    ),
    "t5-base-2xA10G": dict(model="t5-base", seq_len=512, gpus=2, gpu="A10G-24GB", host_mem_gib=128),
    "llama-2-7b-8xA100-ac": dict(
        model="llama-2-7b", gpus=8, gpu="A100-80GB", activation_checkpointing=True, host_mem_gib=1024
    ),
    "llama-2-7b-2x8-ib": dict(
        model="llama-2-7b", gpus=8, nodes=2, network="ib-hdr", gpu="H100-80GB", host_mem_gib=2048
    ),
    "llama-2-70b-8xA100": dict(model="llama-2-70b", gpus=8, gpu="A100-80GB", host_mem_gib=1024),
    "llama-2-13b-4x4090-purebf16": dict(
        model="llama-2-13b", seq_len=1024, gpus=4, gpu="RTX4090", precision="pure-bf16", host_mem_gib=256
    ),
    "mistral-7b-8xH100-tp4": dict(
        model="mistral-7b",
        seq_len=4096,
        gpus=8,
        gpu="H100-80GB",
        tp_degree=4,
        activation_checkpointing=True,
        host_mem_gib=2048,
    ),
    "qwen2.5-7b-1xH200": dict(model="qwen2.5-7b", gpus=1, gpu="H200-141GB", host_mem_gib=512),
    "opt-1.3b-4xA10G-sgd": dict(model="opt-1.3b", gpus=4, gpu="A10G-24GB", optimizer="sgd", host_mem_gib=192),
    "tinyllama-2xV100-lr": dict(
        model="tinyllama-1.1b", gpus=2, gpu="V100-32GB", base_lr=3e-4, base_batch_size=8, host_mem_gib=256
    ),
    # config files
    "tiny_llama-2xA100": dict(config_path=TINY, gpus=2, gpu="A100-80GB", host_mem_gib=64),
    "llama_small-4xH200-offload-host": dict(
        config_path=LLAMA_SMALL, gpus=4, gpu="H200-141GB", host_mem_gib=1, micro_batch_size=8
    ),
    "small_llama-3xL4-gpumem": dict(
        config_path=SMALL, seq_len=64, gpus=3, gpu="L4-24GB", gpu_mem_gib=10, host_mem_gib=64
    ),
    # CPU verification estimates
    "cpu-gpt2-s256-w2": dict(
        model="gpt2", seq_len=256, precision="fp32", micro_batch_size=2, device="cpu", cpu_world=2
    ),
    "cpu-llama_small-s256-w2": dict(
        config_path=LLAMA_SMALL, seq_len=256, precision="fp32", micro_batch_size=4, device="cpu", cpu_world=2
    ),
    "cpu-llama_small-s128-w2-bf16": dict(
        config_path=LLAMA_SMALL, seq_len=128, precision="bf16", micro_batch_size=4, device="cpu", cpu_world=2
    ),
    "cpu-resnet18-64px-w1": dict(
        model="resnet18",
        image_size=64,
        precision="fp32",
        micro_batch_size=8,
        optimizer="sgd-momentum",
        device="cpu",
        cpu_world=1,
    ),
    "cpu-bert-base-s128-w2-ac": dict(
        model="bert-base",
        seq_len=128,
        precision="fp32",
        micro_batch_size=4,
        activation_checkpointing=True,
        device="cpu",
        cpu_world=2,
    ),
    "cpu-small_llama-s32-w2-ga": dict(
        config_path=SMALL,
        seq_len=32,
        precision="fp32",
        micro_batch_size=2,
        global_batch_size=8,
        device="cpu",
        cpu_world=2,
    ),
}


def plan_case(case: dict):
    """The plan document (``plan_to_dict``) for one corpus case."""
    from advisor.document import plan_to_dict

    from .build import plan_for

    return plan_to_dict(plan_for(dict(case)))


def main() -> None:
    docs = {name: plan_case(case) for name, case in CASES.items()}
    GOLDEN.write_text(json.dumps(docs, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(docs)} plans to {GOLDEN}")


if __name__ == "__main__":
    main()
