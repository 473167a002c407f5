"""One line per flag the user set that did something a reader would not see in the table: flags that cannot change
this model's answer, and ``--zero3-fetch per-parameter``'s added CPU time (``advisor.plan`` adds them to the
plan's warnings)."""

from __future__ import annotations

from strategies.zero.timing import ZERO3_PER_PARAMETER_HOST_S, fetch_passes

from .choices import Attention, Framework, FsdpGradSync, TraceMode, Zero3Fetch
from .profile import ModelProfile
from .rows import StrategyRow
from .training_options import TrainingOptions
from .units import fmt_s


def flag_notes(opts: TrainingOptions, profile: ModelProfile, rows: list[StrategyRow], mode: TraceMode) -> list[str]:
    """What the flags the user set did to this plan, in one line each: flags that cannot change this model's answer
    (said, not silently dropped), and ``--zero3-fetch per-parameter``'s added CPU time."""
    out = []
    act = profile.activations(mode)
    if opts.attention != Attention.AUTO and not act.uses_sdpa:
        out.append(
            f"--attention {opts.attention} changes nothing: {profile.spec.name} calls no scaled-dot-product attention"
        )
    elif opts.attention != Attention.AUTO and act.attention.startswith("eager"):
        out.append(
            f"--attention {opts.attention} changes nothing: {profile.spec.name} runs its own (eager) "
            "attention, which keeps the s x s scores"
        )
    tp = [r for r in rows if r.strategy.uses_tp_degree]
    if opts.tp_degree and tp and not any(r.applicable for r in tp):
        out.append(f"--tp-degree {opts.tp_degree} is not used: {tp[0].reason}")
    if opts.fsdp_grad_sync != FsdpGradSync.EVERY_MICRO_STEP:
        sync = [r for r in rows if r.strategy.uses_fsdp_grad_sync and r.applicable]
        if not sync:
            out.append(f"--fsdp-grad-sync {opts.fsdp_grad_sync} is not used: no FSDP2 row applies")
        elif all((r.grad_accum_steps or 1) == 1 for r in sync):
            out.append(
                f"--fsdp-grad-sync {opts.fsdp_grad_sync} changes nothing without gradient accumulation "
                "(give --global-batch-size)"
            )
    if opts.zero3_fetch != Zero3Fetch.COALESCED:
        z3 = [r for r in rows if r.strategy.framework == Framework.DEEPSPEED and r.strategy.shards_everything]
        if not any(r.applicable for r in z3):
            out.append(f"--zero3-fetch {opts.zero3_fetch} is not used: no ZeRO-3 row applies")
        else:
            passes = fetch_passes(opts.activation_checkpointing)
            per_step = passes * profile.stats.num_param_tensors * ZERO3_PER_PARAMETER_HOST_S
            out.append(
                f"--zero3-fetch {opts.zero3_fetch}: ZeRO-3 is timed as DeepSpeed before 0.6 ran it, one gather per "
                f"parameter tensor with a host synchronize after each ({ZERO3_PER_PARAMETER_HOST_S * 1e3:g} ms x "
                f"{profile.stats.num_param_tensors} tensors x {passes} passes = {fmt_s(per_step)} of CPU time per "
                "micro-step, in its compute); the scripts advisor writes run the DeepSpeed installed"
            )
    return out
