"""Corpus case (flat field values) -> Plan, through the public API of the code under test."""

from __future__ import annotations

from advisor.hardware import HOST_DETECTED, Hardware
from advisor.plan import plan
from advisor.schema import inputs_from_values

from .corpus import CPU_HOST_GIB


def plan_for(case: dict):
    device = case.pop("device", "cuda")
    world = case.pop("cpu_world", None)
    inputs, _ = inputs_from_values(dict(case, detect_hardware=False))
    if device == "cpu":
        host = CPU_HOST_GIB * 2**30
        hw = Hardware(
            gpu_name="CPU",
            gpu_memory_bytes=host // world,
            gpus_per_node=world,
            num_nodes=1,
            interconnect="nvlink",
            network=None,
            bf16_tflops=0.0,
            link_gbps=0.0,
            host_mem_bytes=host,
            sources={"gpu_name": "this machine's CPU (gloo)"},
            host_mem_state=HOST_DETECTED,
            # explicit, so the golden plans do not depend on this machine's CPU (oneDNN scratch)
            cpu_conv_scratch_threads=0,
        )
        return plan(inputs, device="cpu", hardware=hw)
    return plan(inputs)
