"""What a verification runs on this machine: its hardware (``run_hardware``: the GPUs present, or at most
``MAX_CPU_RANKS`` CPU ranks of ``CPU_RANK_THREADS`` threads each), its plan (``verify_plan``: the target's row
re-planned for that hardware, fp32 on CPU unless the precision was explicit) and, on CPU, this machine's
calibration for the predicted step time (``calibrated``). ``advisor.verify`` launches and measures what they choose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from strategies import get_strategy, runnable_names, strategy_names

from .choices import Device, Precision
from .errors import AdvisorError
from .hardware import HOST_DETECTED, Hardware, host_memory_bytes
from .models import family_of
from .plan import Plan, plan
from .schema import PlanInputs

__all__ = ["CPU_RANK_THREADS", "MAX_CPU_RANKS", "calibrated", "run_hardware", "verify_plan"]

MAX_CPU_RANKS = 4
CPU_RANK_THREADS = 1  # intra-op threads of each CPU rank (OMP_NUM_THREADS), as the calibration measures them


def run_hardware(requested: int, device: Device, notes: list[str]) -> Hardware:
    """The hardware a verification really runs on, with capping noted."""
    if device == Device.CUDA:
        import torch

        have = torch.cuda.device_count()
        world = min(requested, have)
        if world < requested:
            notes.append(f"{requested} GPUs requested, {have} present: verifying at world size {world}")
        props = torch.cuda.get_device_properties(0)
        return Hardware(
            gpu_name=props.name,
            gpu_memory_bytes=int(props.total_memory),
            gpus_per_node=world,
            num_nodes=1,
            interconnect="nvlink",
            network=None,
            bf16_tflops=0.0,
            link_gbps=0.0,
            host_mem_bytes=host_memory_bytes(),
            sources={"gpu_name": "detected"},
            host_mem_state=HOST_DETECTED,
        )
    world = min(requested, MAX_CPU_RANKS)
    if world < requested:
        notes.append(f"{requested} ranks requested; CPU runs are capped at {MAX_CPU_RANKS}: verifying at {world}")
    host = host_memory_bytes()
    # oneDNN's weight-gradient scratch of convolutions whose kernel is taller than their input (3x3 on a
    # 2x2 map: resnet's layer4 at 64 px): on CPUs without AVX-512 its x64:gemm:jit kernel books
    # threads x (4 x weight bytes + im2col columns) from the c10 allocator for the op's duration
    # (oneDNN src/cpu/gemm_convolution_utils.cpp, init_conf: book<float>(key_conv_wei_reduction,
    # nthr * weights_d.size()), size() already in bytes). Measured on AMD EPYC (AVX2), torch 2.14.1 /
    # oneDNN 3.12: 37,822,720 B for one 512->512 3x3 convolution on a 2x2 map at 1 thread (75,645,184 B at 2);
    # a resnet18 step at 64 px, batch 8, 2 threads: real backward peak 120,465,064 B, the trace 58,058,216 B
    # without it. The value is the threads each rank runs with: verify() launches every rank with
    # OMP_NUM_THREADS=1. 0 with AVX-512/AMX, without mkldnn, or on other ISAs
    # (``advisor.trace.onednn_gemm_bwd_weights_machine``).
    from .trace import onednn_gemm_bwd_weights_machine

    scratch_threads = 1 if onednn_gemm_bwd_weights_machine() else 0
    return Hardware(
        gpu_name="CPU",
        gpu_memory_bytes=host // max(1, world),
        gpus_per_node=world,
        num_nodes=1,
        interconnect="nvlink",
        network=None,
        bf16_tflops=0.0,
        link_gbps=0.0,
        host_mem_bytes=host,
        sources={"gpu_name": "this machine's CPU (gloo)"},
        host_mem_state=HOST_DETECTED,
        cpu_conv_scratch_threads=scratch_threads,
    )


def verify_plan(
    inputs: PlanInputs,
    strategy: str | None,
    device: Device,
    precision_explicit: bool = False,
    use_cache: bool = True,
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[str, Plan, Hardware, list[str]]:
    """The plan a verification on ``device`` runs: the target plan's row ``strategy`` (default: the recommended
    one) re-planned for this machine (``run_hardware``, the strategy's ``verify_cluster``, fp32 on CPU unless the
    precision was explicit, and on CPU this machine's calibration, ``calibrated``). Returns (the strategy's name,
    the plan, its hardware, notes for the user). Used by ``verify`` and by bench's re-prediction of step times (no run).

    Raises:
        AdvisorError: nothing fits and no strategy was named; an unknown strategy; the row does not apply here.
    """
    target = plan(inputs)
    name = strategy or target.recommendation.strategy
    if name is None:
        raise AdvisorError(
            "nothing fits the target hardware, so there is no recommended strategy to verify: "
            "pass --strategy NAME to verify one anyway"
        )
    notes: list[str] = []
    opts = target.options
    if device == Device.CPU and opts.precision != Precision.FP32 and not precision_explicit:
        notes.append(
            f"CPU run: fp32 instead of {opts.precision} (CPUs without native bf16 emulate it, many times slower; "
            f"pass --precision {opts.precision} to verify in it)"
        )
        opts = replace(opts, precision=Precision.FP32)
    if (
        device == Device.CPU
        and inputs.training.micro_batch_size is None
        and opts.micro_batch_size != (family_default := family_of(target.spec).default_micro_batch)
    ):
        # The target GPU's throughput choice (hundreds of samples for a small model) would take minutes per step and
        # gigabytes on CPU ranks: the family's default instead.
        notes.append(
            f"CPU run: micro-batch {family_default} (the default for the model) instead of the "
            f"{opts.micro_batch_size} chosen for throughput on {target.hardware.gpu_name}; pass "
            "--micro-batch-size to set it"
        )
        opts = replace(opts, micro_batch_size=family_default)
    if name not in runnable_names():
        raise AdvisorError(f"--strategy must be one of {', '.join(strategy_names())}, got {name!r}")
    hw = run_hardware(target.hardware.num_gpus, device, notes)
    hw, opts = get_strategy(name).verify_cluster(hw, opts, target.row(name))
    hw = calibrated(hw, device, use_cache, say, notes)
    run_plan = plan(replace(inputs, training=opts), device=device, hardware=hw)
    if not run_plan.row(name).applicable:
        raise AdvisorError(f"cannot verify {name}: {run_plan.row(name).reason}")
    if hw.calibration is not None and (convs := timed_convolutions(run_plan, name, use_cache, say, notes)):
        # Planned again with them (the traces come from the cache): only the step time changes.
        hw = replace(hw, calibration=replace(hw.calibration, conv_s=convs))
        run_plan = plan(replace(inputs, training=opts), device=device, hardware=hw)
    return name, run_plan, hw, notes


def timed_convolutions(
    run_plan: Plan, name: str, use_cache: bool, say: Callable[[str], None], notes: list[str]
) -> tuple[tuple[tuple[int, ...], float], ...]:
    """Row ``name``'s convolutions measured on this CPU at the run's micro-batch (``advisor.timing.cpu_conv``): each
    call of its traced step (the row's trace mode), from the cache or timed now. Empty for a model without
    convolutions, or, with a note, when timing them failed (they are then timed at the calibration's rate)."""
    from .cache import open_cache
    from .timing.cpu_conv import conv_calls, measured_conv_s
    from .trace import BASE_B

    mode = run_plan.row(name).strategy.trace_mode(run_plan.options.precision)
    steps = run_plan.profile.activations(mode)
    phases = [(getattr(t1, ph), getattr(t2, ph)) for _, t1, t2 in steps.depths for ph in ("fwd_ops", "bwd_ops")]
    calls = conv_calls(phases, run_plan.context().micro_batch_size, BASE_B)
    if not calls:
        return ()
    try:
        table, contended = measured_conv_s(calls, CPU_RANK_THREADS, open_cache(use_cache), say)
    except RuntimeError as err:
        notes.append(f"the convolutions are timed at the calibration's one rate: {err}")
        return ()
    if contended:
        notes.append(
            "other processes kept the CPUs busy while the model's convolutions were timed: the predicted step time "
            "is rough (they are timed again next time)"
        )
    return table


def calibrated(hw: Hardware, device: Device, use_cache: bool, say: Callable[[str], None], notes: list[str]) -> Hardware:
    """``hw`` with this machine's CPU calibration (``advisor.timing.calibrate``) for a CPU run, so the plan's
    step times predict this machine's ranks (``CPU_RANK_THREADS`` threads each). A GPU run comes back unchanged:
    ``plan()`` times it with this machine's stored GPU calibration (``advisor calibrate``) where there is one, and
    a note says how to make one where there is none. A failed calibration leaves the run untimed, with a note."""
    if device != Device.CPU:
        from .cache import open_cache
        from .timing.gpu_calibrate import calibration_for

        if use_cache and calibration_for(hw.gpu_name, hw.gpu_memory_bytes, open_cache()) is None:
            notes.append(
                f"no calibration of this {hw.gpu_name} is stored: the predicted step time uses the GPU preset's "
                "constants (run 'advisor calibrate' once for a prediction from this machine's measured rates)"
            )
        return hw
    from .cache import open_cache
    from .timing.calibrate import cached_calibration, cpu_calibration

    cache = open_cache(use_cache)
    if cached_calibration(hw.gpus_per_node, CPU_RANK_THREADS, cache) is None:
        say(
            f"calibrating this machine's CPU for the step-time prediction ({hw.gpus_per_node} rank(s), about 10 s; "
            "cached)"
        )
    try:
        cal = cpu_calibration(hw.gpus_per_node, CPU_RANK_THREADS, cache=cache)
    except RuntimeError as err:
        notes.append(f"no predicted step time: {err}")
        return hw
    if cal.contended:
        notes.append(
            "other processes kept the CPUs busy during the CPU calibration: the predicted step time is "
            "rough (it is measured again in 10 minutes)"
        )
    return replace(hw, calibration=cal)
