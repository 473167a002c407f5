"""The memory options the user passes (--selective-checkpointing, --activation-offload, --optimizer-in-backward,
--chunked-cross-entropy) applied to every strategy row of the plan, memory and step time, by the ladder's own rules:
each row's figures are ``advisor.ladder_state.evaluate_state`` of the options' state on that row's strategy (the
ladder calls the same function for its rungs). A row that cannot take an option is left out with the option's flag
and why, in one line.

What the rows still leave as they were: the largest micro-batch (searched without the options), the host RAM that
activation offload pins (said in the row's memory notes, not in its host-RAM verdict).
"""

from __future__ import annotations

from dataclasses import replace

from .cache import DiskCache, NullCache
from .context import StrategyContext
from .errors import AdvisorError
from .ladder_state import Env, Figures, State, evaluate_state, user_state
from .memory_options import optimizer_in_backward_blocker
from .rows import StrategyRow, fit_note, fit_verdict
from .training_options import TrainingOptions
from .units import fmt_gib


def _flags(opts: TrainingOptions) -> list[tuple[str, State]]:
    """(flag as the user wrote it, the state of that option alone), for each option passed."""
    st = user_state(opts)
    out = []
    if st.ac:
        every = f" --checkpoint-every {st.every}" if st.ac == "layer" else ""
        out.append(
            (f"--selective-checkpointing {opts.selective_checkpointing}{every}", State(ac=st.ac, every=st.every))
        )
    if st.activation_offload:
        out.append(("--activation-offload", State(activation_offload=True)))
    if st.optimizer_in_backward:
        out.append(("--optimizer-in-backward", State(optimizer_in_backward=True)))
    if st.chunked_ce:
        out.append((f"--chunked-cross-entropy {st.ce_chunks}", State(chunked_ce=True, ce_chunks=st.ce_chunks)))
    return out


def refuse_accumulation(opts: TrainingOptions, rows: list[StrategyRow]) -> None:
    """--optimizer-in-backward when every applicable row accumulates: one line for the plan.

    Raises:
        AdvisorError: --optimizer-in-backward with gradient accumulation on every row.
    """
    if opts.optimizer_in_backward:
        steps = [r.grad_accum_steps or 1 for r in rows if r.applicable]
        if steps and min(steps) > 1:
            raise AdvisorError(
                "--optimizer-in-backward: " + (optimizer_in_backward_blocker(None, min(steps), False) or "")
            )


def apply_options(
    ctx: StrategyContext, rows: list[StrategyRow], cache: DiskCache | NullCache, scratch_threads: int
) -> list[StrategyRow]:
    """``rows`` with the user's memory options applied (module docstring); ``rows`` themselves when none is passed.
    A row that cannot take one becomes not applicable, its reason ``<flag>: <why>``."""
    st = user_state(ctx.options)
    if st == State():
        return rows
    flags = _flags(ctx.options)
    out = []
    for r in rows:
        if not r.applicable or r.memory is None:
            out.append(r)
            continue
        env = Env(ctx, r.strategy, cache, scratch_threads)
        fig = evaluate_state(env, st)
        if isinstance(fig, str):
            out.append(StrategyRow(r.name, r.title, False, r.strategy, reason=_blocked(env, flags, fig)))
            continue
        out.append(_applied(ctx, r, fig, flags))
    return out


def _blocked(env: Env, flags: list[tuple[str, State]], why: str) -> str:
    """``<flag>: <why>`` for the first option that the strategy cannot take alone (else the options together)."""
    for flag, alone in flags:
        one = evaluate_state(env, alone)
        if isinstance(one, str):
            return f"{flag}: {one}"
    return f"{' '.join(f for f, _ in flags)}: {why}"


def _applied(ctx: StrategyContext, r: StrategyRow, fig: Figures, flags: list[tuple[str, State]]) -> StrategyRow:
    """Row ``r`` with ``fig``'s memory and step time, its fit redone, its memory notes saying what was applied."""
    assert fig.memory is not None, "evaluate_state gives the row's memory with its figures"
    notes = [f"{' '.join(f for f, _ in flags)} applied (advisor.memory_options, as the ladder)"]
    notes += [text for _, text in fig.notes]
    if fig.host:
        notes.append(f"activation offload pins {fmt_gib(fig.host)} of host memory per GPU (not in the host-RAM fit)")
    memory = replace(fig.memory, notes=fig.memory.notes + tuple(notes))
    row = replace(r, memory=memory, time=fig.time)
    row.fits, row.short_of = fit_verdict(memory, ctx.hardware, r.load_host_bytes_per_node)
    row.fit_note = fit_note(row, ctx.hardware, ctx)
    return row


def unscripted_flags(opts: TrainingOptions) -> list[str]:
    """The flags passed (as written) that the rows apply but the generated scripts do not emit yet: all but
    --selective-checkpointing, --chunked-cross-entropy and --optimizer-in-backward, which the scripts write
    (``checkpoint_activations``'s op and layer variants, strategies/templates/torch_steps.py; the model fragment's
    chunked ``compute_loss``; templates/common.py's ``OptimizerInBackward``), the renderer refusing in one line the
    strategies (``Strategy.unscripted_options``), models, precisions and optimizers they do not take."""
    return [f for f, st in _flags(opts) if not (st.ac or st.chunked_ce or st.optimizer_in_backward)]


def unscripted_error(opts: TrainingOptions) -> str | None:
    """The one line --emit / --verify stop with when a flag passed is not in the generated scripts (None: all are):
    the script would not match the plan it is measured against."""
    flags = unscripted_flags(opts)
    if not flags:
        return None
    it = "it" if len(flags) == 1 else "them"
    return (
        f"{', '.join(flags)}: the generated scripts do not apply {it} yet, so the script would not match the plan; "
        f"drop {it} to --emit or --verify (without --emit the plan sizes {it})"
    )


def script_note(opts: TrainingOptions) -> list[str]:
    """The options the rows apply but the generated scripts do not emit yet: said once (none passed: nothing)."""
    flags = unscripted_flags(opts)
    if not flags:
        return []
    return [f"{', '.join(flags)}: applied to the strategy rows' memory and step time; the generated scripts do not "
            "emit them yet"]  # fmt: skip
