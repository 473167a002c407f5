"""Corpus case (flat field values) -> Plan, through the public API of the code under test."""

from __future__ import annotations

from dataclasses import fields

from advisor.hardware import Hardware
from advisor.options import TrainingOptions
from advisor.plan import PlanInputs, plan

from .corpus import CPU_HOST_GIB


def plan_for(case: dict):
    device = case.pop("device", "cuda")
    world = case.pop("cpu_world", None)
    names = {f.name for f in fields(TrainingOptions)}
    training = TrainingOptions(**{k: case.pop(k) for k in list(case) if k in names})
    inputs = PlanInputs(training=training, detect_hardware=False, **case)
    if device == "cpu":
        host = CPU_HOST_GIB * 2**30
        hw = Hardware(gpu_name="CPU", gpu_memory_bytes=host // world, gpus_per_node=world, num_nodes=1,
                      interconnect="nvlink", network=None, bf16_tflops=0.0, link_gbps=0.0, host_mem_bytes=host,
                      sources={"gpu_name": "this machine's CPU (gloo)"})
        return plan(inputs, device="cpu", hardware=hw)
    return plan(inputs)
