"""The ladder: memory savings one on top of the other, least slowdown per GiB saved first, each with its peak per
GPU, step time and throughput, and where the job first fits; then LoRA and QLoRA (fine-tuning a transformer) and
more GPUs.

One strategy carries the ladder: the recommended one; else on one GPU plain training; else the applicable row
without offload that shards everything (FSDP2, ZeRO-3) and needs the least memory. Each rung is a state of the
options (``advisor.ladder_state``): full activation checkpointing, 8-bit AdamW, LoRA and QLoRA through the traces
and rows themselves; chunked cross-entropy, the selective op policy, activation offload and the optimizer step in
backward by the rules of ``advisor.memory_options`` applied to the row's peak.

The order is greedy: from the current state, the candidate with the least added seconds per GiB saved comes next;
a candidate that saves nothing here goes last and says so; one that the strategy cannot compose with says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .cache import DiskCache, NullCache
from .candidates import TIE
from .choices import Optimizer
from .context import StrategyContext
from .hardware import HOST_UNKNOWN
from .ladder_state import Env, Figures, State, evaluate_state, throughput, user_state
from .memory_options import DEFAULT_CE_CHUNKS
from .models import RECIPE_LORA_RANK, recipe_flags
from .rows import Recommendation, StrategyRow
from .units import fmt_gib

# Candidates in the order they are offered before the greedy sort (ties keep it).
CANDIDATES = ("chunked_ce", "sac_op", "ac_full", "optimizer_in_backward", "activation_offload", "adamw_8bit")
LABELS = {
    "base": ("as planned", ""),
    "chunked_ce": ("chunked cross-entropy", f"--chunked-cross-entropy {DEFAULT_CE_CHUNKS}"),
    "sac_op": ("selective checkpointing (op policy)", "--selective-checkpointing op"),
    "ac_full": ("activation checkpointing (full)", "--activation-checkpointing"),
    "optimizer_in_backward": ("optimizer step in backward", "--optimizer-in-backward"),
    "activation_offload": ("activation offload to CPU", "--activation-offload"),
    "adamw_8bit": ("8-bit AdamW", "--optimizer adamw-8bit"),
    "lora": (f"LoRA (rank {RECIPE_LORA_RANK}, all linear layers)", recipe_flags()),
    "qlora": ("QLoRA (nf4)", recipe_flags(quantize=True)),
    "more_gpus": ("more GPUs", ""),
}
# Rungs whose option replaces an earlier rung's (State.plus): full checkpointing the op policy, QLoRA LoRA.
SUPERSEDES = {"ac_full": ("sac_op",), "qlora": ("lora",)}


@dataclass(frozen=True)
class Rung:
    """One rung: the options so far plus ``key``'s (``LABELS``). Bytes per GPU; ``step_s`` one optimizer step at the
    row's global batch; ``throughput`` tokens/s of the job (a language model) or samples/s. ``saved_bytes`` and
    ``slowdown`` are against the rung before. ``blocker``: why the strategy cannot take it (then no figures);
    ``note``: what the figure assumes or what else it needs."""

    key: str
    label: str
    flags: str
    peak_bytes: int | None = None
    device_bytes: int | None = None
    step_s: float | None = None
    throughput: float | None = None
    unit: str = "tokens/s"
    fits: bool = False
    saved_bytes: int = 0
    slowdown: float = 0.0
    first_fit: bool = False
    blocker: str | None = None
    note: str = ""
    host_bytes: int = 0
    short_of: str | None = None  # why it does not fit: "GPU memory", "host RAM", "host RAM unknown" (rows' words)
    built_on: bool = True  # False: the rungs after it are sized without its option (``_Steps.add``)


@dataclass(frozen=True)
class Ladder:
    """The ladder of one strategy (``strategy``: its name); ``first_fit``: the key of the first rung that fits."""

    strategy: str
    title: str
    rungs: tuple[Rung, ...]
    # The first fitting rung's options less the earlier ones the fit does not need (``_fewest``): one Rung whose
    # ``flags`` give them together; None when every option up to the first fit is needed, or nothing fits.
    fewest: Rung | None = None

    @property
    def first_fit(self) -> Rung | None:
        return next((r for r in self.rungs if r.first_fit), None)


def build_ladder(
    ctx: StrategyContext,
    rows: Sequence[StrategyRow],
    cache: DiskCache | NullCache,
    scratch_threads: int,
    recommended: str | None,
    cluster: Recommendation | None = None,
    order: Sequence[str] | None = None,
) -> Ladder | None:
    """The ladder for the plan (module docstring); None when no row can carry it (none applies with memory).
    ``cluster``: the recommendation whose smallest cluster (``min_gpus``, ``min_nodes``, ``min_cluster_flags``)
    is the last rung. ``order``: take these rungs (``CANDIDATES`` keys) in this order instead of the greedy one (the
    benchmark re-predicts a published table in its own order)."""
    carriers = [r for r in rows if r.applicable and r.memory is not None and not r.strategy.offload]
    if not carriers:
        return None
    # The recommended row; else plain training on one GPU; else the row that shards everything without offload
    # (what more GPUs would scale: the nothing-fits answer's own), least memory first; else the least memory.
    alone = "single" if ctx.hardware.num_gpus == 1 else None
    sharded = [r for r in carriers if r.strategy.shards_everything]
    pick = (
        next((r for r in carriers if r.name == recommended), None)
        or next((r for r in carriers if r.name == alone), None)
        or min(sharded or carriers, key=lambda r: r.memory.device_total if r.memory else 0)
    )
    env = Env(ctx, pick.strategy, cache, scratch_threads)
    start = user_state(ctx.options)  # the options the user passed are the ladder's base, not its rungs
    first = evaluate_state(env, start)
    if isinstance(first, str):
        return None
    steps = _Steps(env, pick.global_batch_size, first, start, pick.load_host_bytes_per_node)
    if order is not None:
        for k in order:
            fig = evaluate_state(env, steps.state.plus(k))
            steps.add(k, fig)
    else:
        steps.greedy([k for k in CANDIDATES if _offered(env, k, start)])
    spec = ctx.profile.spec
    if spec.adapter is None and spec.is_transformer:
        state = steps.state
        for k in ("lora", "qlora"):
            steps.add(k, evaluate_state(env, state.plus(k)), advance=False)
    label, _ = LABELS["more_gpus"]
    if cluster is not None and cluster.min_gpus:
        # --gpus counts the GPUs of one node: a cluster of several nodes is --gpus per node x --nodes; with the
        # options that cluster was found with (a new user ran the flags alone, and nothing fitted).
        nodes = cluster.min_nodes or 1
        flags = " ".join(
            f
            for f in (
                f"--gpus {cluster.min_gpus // nodes}",
                f"--nodes {nodes}" * (nodes > 1),
                cluster.min_cluster_flags,
            )
            if f
        )
        steps.out.append(Rung("more_gpus", label, flags, fits=True, note="the recommendation's smallest cluster"))
    else:
        why = (
            "not searched: the job fits as planned"
            if recommended is not None
            else "not searched: a rung above fits"
            if any(r.fits for r in steps.out)
            else "not searched: the answer's other fixes come first, or more GPUs do not help (the reasons above)"
        )
        steps.out.append(Rung("more_gpus", label, "", blocker=why))
    return Ladder(pick.name, pick.title, tuple(steps.out), _fewest(steps, start))


def _fewest(steps: _Steps, start: State) -> Rung | None:
    """The options of the first rung that fits with every earlier rung dropped that it still fits without (tried
    the latest taken first): the ladder stacks the cheapest savings first, so a free one (8-bit AdamW, chunked
    cross-entropy) can sit above the one that makes the job fit, and 8-bit AdamW changes the numerics. None when
    none can be dropped."""
    rungs = steps.out
    fit = next((r for r in rungs if r.first_fit), None)
    if fit is None or fit is rungs[0]:
        return None
    kept = [r for r in rungs[1 : rungs.index(fit)] if r.blocker is None and r.built_on]
    figures = None
    for r in reversed(kept):
        trial = [k for k in kept if k is not r]
        state = start
        for k in (*trial, fit):
            state = state.plus(k.key)
        fig = evaluate_state(steps.env, state)
        if isinstance(fig, Figures) and fig.device <= steps.gpu:
            kept, figures = trial, fig
    if figures is None:
        return None
    thr, unit = throughput(steps.env, steps.batch, figures.step_s)
    label = " and ".join(r.label for r in (*kept, fit))
    flags = cumulative_flags((*kept, fit))
    return Rung(fit.key, label, flags, figures.peak, figures.device, figures.step_s, thr, unit, fits=True)


class _Steps:
    """The rungs so far: the state reached, its figures, and the table."""

    def __init__(self, env: Env, batch: int | None, first: Figures, start: State, load_bytes: int = 0) -> None:
        self.env, self.batch, self.gpu = env, batch, env.ctx.hardware.gpu_memory_bytes
        self.load_bytes = load_bytes  # host RAM per node while the script builds the model (the row's)
        self.state, self.cur = start, first
        self.out: list[Rung] = []
        self.fitted = False
        self._rung("base", first, None)

    def _rung(self, key: str, fig: Figures, prev: Figures | None) -> None:
        label, flags = LABELS[key]
        thr, unit = throughput(self.env, self.batch, fig.step_s)
        host = self._host_short(fig)
        # said once: a shortage every rung shares (building the model) stands under the first rung only
        host_short = host[1] if host and (prev is None or self._host_short(prev) != host) else None
        fits = fig.device <= self.gpu and host is None
        short_of = None if fits else "GPU memory" if fig.device > self.gpu else host[0] if host else None
        saved = prev.peak - fig.peak if prev else 0
        slow = (fig.step_s / prev.step_s - 1) if prev and prev.step_s and fig.step_s else 0.0
        # a peak while the model loads (QLoRA under ZeRO-3: the whole quantized base on every rank before it is
        # partitioned) is no rung's saving to undo: say where it is (a new user read QLoRA above LoRA as a mistake)
        phase = fig.memory.peak.phase if fig.memory is not None else ""
        loading = f"the peak is {phase}" if phase.startswith("loading") else ""
        note = "; ".join(n for n in (fig.note(key), loading, host_short) if n)
        self.out.append(
            Rung(
                key, label, flags, fig.peak, fig.device, fig.step_s, thr, unit, fits, saved, slow,
                first_fit=fits and not self.fitted, note=note, host_bytes=fig.host, short_of=short_of,
            )
        )  # fmt: skip
        self.fitted = self.fitted or fits

    def _host_short(self, fig: Figures) -> tuple[str, str] | None:
        """(what is short, why) where a state does not surely fit the node's RAM (None: it does, or needs none), by
        ``rows.fit_verdict``'s rule: the pinned activations of every GPU of the node (``Figures.host``) beside what
        the row offloads, and, when the RAM is known, the larger of that and what building the model takes."""
        hw = self.env.ctx.hardware
        states = fig.memory.host_bytes_per_node if fig.memory is not None else 0
        need = fig.host * hw.gpus_per_node + states
        if hw.host_mem_state == HOST_UNKNOWN or hw.host_mem_bytes is None:
            if not need:
                return None
            return "host RAM unknown", (
                f"fits only if the host RAM allows: needs {fmt_gib(need)} of host RAM per node (unknown here)"
            )
        if max(need, self.load_bytes) > hw.host_mem_bytes:
            have = fmt_gib(hw.host_mem_bytes)
            if need >= self.load_bytes:
                return "host RAM", f"does not fit in host RAM: needs {fmt_gib(need)} per node, the node has {have}"
            return "host RAM", (
                f"does not fit in host RAM: building the model takes {fmt_gib(self.load_bytes)} per node, the node "
                f"has {have}"
            )
        return None

    def add(self, key: str, fig: Figures | str, advance: bool = True) -> None:
        """One rung on top of the current state (``advance``: it becomes the state the next rung adds to)."""
        label, flags = LABELS[key]
        if isinstance(fig, str):
            self.out.append(Rung(key, label, flags, blocker=fig))
            return
        self._rung(key, fig, self.cur)
        # A rung that the node's RAM does not surely hold, where the state before it did, is not built on: the
        # rungs after it (LoRA, QLoRA) are sized without it (a new user's LoRA read NO for offload's pinned memory),
        # and it says so (another read the next rung's peak above it, with a saving, as a mistake).
        if not advance:
            return
        if self._host_short(fig) and not self._host_short(self.cur):
            before = next(r.label for r in reversed(self.out[:-1]) if r.blocker is None)
            last = self.out[-1]
            self.out[-1] = replace(
                last, note=f"{last.note}; not built on: the rungs below add to {before}", built_on=False
            )
            return
        self.state, self.cur = self.state.plus(key), fig

    def greedy(self, left: list[str]) -> None:
        """Add ``left`` least added seconds per GiB saved first; those that cannot compose say why, those that
        save nothing at the peak reached go last and say so."""
        while left:
            scored = [(k, evaluate_state(self.env, self.state.plus(k))) for k in left]
            for k, f in scored:
                if isinstance(f, str):
                    self.add(k, f)
                    left.remove(k)
            cur = self.cur
            useful = [(k, f) for k, f in scored if isinstance(f, Figures) and cur.peak - f.peak >= 2**20]
            if not useful:
                for k, f in scored:
                    if isinstance(f, Figures):
                        label, flags = LABELS[k]
                        self.out.append(Rung(k, label, flags, blocker="saves nothing at this peak", note=f.note(k)))
                return

            def cost(item: tuple[str, Figures]) -> float:
                dt = (item[1].step_s or 0.0) - (cur.step_s or 0.0)
                return dt / ((cur.peak - item[1].peak) / 2**30)

            k, fig = min(useful, key=cost)
            self.add(k, fig)
            left.remove(k)
            if k == "ac_full" and "sac_op" in left:  # full checkpointing supersedes the op policy
                left.remove("sac_op")


def _offered(env: Env, key: str, start: State) -> bool:
    opts = env.ctx.options
    if key == "adamw_8bit":
        return opts.optimizer == Optimizer.ADAMW
    if key == "sac_op":
        return not opts.activation_checkpointing and not start.ac
    if key == "ac_full":
        return not opts.activation_checkpointing
    return start.plus(key) != start  # an option the user passed is in the base already


def ladder_doc(ladder: Ladder) -> list[dict[str, object]]:
    """The ladder as JSON rows (``ladder[]``)."""
    return [
        {
            "rung": r.key,
            "label": r.label,
            "flags": r.flags,
            "strategy": ladder.strategy,
            "peak_bytes": r.peak_bytes,
            "device_bytes": r.device_bytes,
            "step_s": r.step_s,
            "throughput": r.throughput,
            "throughput_unit": r.unit,
            "fits": r.fits if r.blocker is None and r.short_of != "host RAM unknown" else None,
            "first_fit": r.first_fit,
            "saved_bytes": r.saved_bytes,
            "slowdown": r.slowdown,
            "host_bytes": r.host_bytes,
            "blocker": r.blocker,
            "note": r.note,
        }
        for r in ladder.rungs
    ]


def cumulative_flags(rungs: Sequence[Rung]) -> str:
    """The flags that give the options of ``rungs`` together (those taken: no blocker), as one command line: a rung
    that replaces an earlier one (``SUPERSEDES``) drops that one's flags, so the line is one the CLI accepts
    (--selective-checkpointing and --activation-checkpointing are two policies, refused together)."""
    return " ".join(r.flags for r in _taken(rungs))


def _taken(rungs: Sequence[Rung]) -> list[Rung]:
    """The rungs of ``rungs`` whose options are on together: no blocker, not replaced by a later one."""
    taken = [r for r in rungs if r.blocker is None and r.flags and r.built_on]
    dropped = {old for r in taken for old in SUPERSEDES.get(r.key, ())}
    return [r for r in taken if r.key not in dropped]


def ladder_for_plan(
    ctx: StrategyContext,
    rows: Sequence[StrategyRow],
    cache: DiskCache | NullCache,
    scratch_threads: int,
    rec: Recommendation,
) -> Ladder | None:
    """The plan's ladder (with --ladder, or when nothing fits: None otherwise) and its line in ``rec``'s reasons
    (changed in place). Where an offload row is recommended, the ladder of the rows without offload is built all the
    same: a memory saving (not LoRA or QLoRA, which train otherwise) that fits and trains faster than the offload row
    beyond the tie band is named in the reasons (a new user's --host-mem hid a single-GPU fit at twice the speed)."""
    best = next((r for r in rows if r.name == rec.strategy), None)
    offloads = best is not None and best.strategy.offload and best.time is not None
    if not (ctx.options.ladder or rec.strategy is None or offloads):
        return None
    ladder = build_ladder(ctx, rows, cache, scratch_threads, rec.strategy, rec)
    if ladder is None:
        return None
    if rec.strategy is None:
        rec.reasons.insert(1, ladder_reason(ladder, ctx))
    elif offloads and best is not None and best.time is not None:
        fit = ladder.fewest or ladder.first_fit
        if fit is not None and fit.key in ("lora", "qlora"):  # another way to fine-tune, not a saving of this one
            fit = None
        own, unit = throughput(
            Env(ctx, best.strategy, cache, scratch_threads), best.global_batch_size, best.time.step_s
        )
        if fit is not None and fit.throughput and own and unit == fit.unit and fit.throughput > own * (1 + TIE):
            label, flags = (fit.label, fit.flags) if fit is ladder.fewest else _options_up_to(ladder, fit)
            rec.reasons.append(
                f"faster without offload, with other options: {ladder.title} fits with {label} ({flags}): "
                f"{_gib(fit)} per GPU{_rate(fit)}, {fit.throughput / own:.2f}x the throughput of {best.title} "
                f"({own:,.0f} {unit}); --ladder shows each option's memory and speed"
            )
    return ladder if ctx.options.ladder or rec.strategy is None else None


def ladder_reason(ladder: Ladder, ctx: StrategyContext) -> str:
    """The nothing-fits answer's line on the ladder: the cheapest rung that fits (the options up to it), before
    more GPUs, or that none does."""
    fit = ladder.first_fit
    if fit is None:
        return (
            f"no rung of the memory-savings ladder fits {ladder.title} on {ctx.hardware.num_gpus} x "
            f"{ctx.hardware.gpu_name} (see the ladder)"
        )
    labels, taken = _options_up_to(ladder, fit)
    few = ladder.fewest
    if few is not None:
        return (
            f"fewest changes before more GPUs: {ladder.title} fits with {few.label} ({few.flags}): "
            f"{_gib(few)} per GPU{_rate(few)}; the ladder below stacks the savings that cost the least speed first "
            f"and fits at {fit.label} ({taken}: {_gib(fit)}{_rate(fit)})"
        )
    if fit is ladder.rungs[0]:  # the ladder's row fits as planned: it is one the recommender may not take
        return (
            f"{ladder.title} fits as planned ({_gib(fit)} per GPU{_rate(fit)}) but is sized "
            "and timed only: no script runs it here (its row says why)"
        )
    return (
        f"cheapest fix before more GPUs: {ladder.title} fits with {labels} ({taken}): "
        f"{_gib(fit)} per GPU{_rate(fit)} (the ladder below)"
    )


def _options_up_to(ladder: Ladder, fit: Rung) -> tuple[str, str]:
    """(labels joined with "and", flags) of the options taken up to and including ``fit`` (``_taken``); ``fit``'s
    own label where none is taken."""
    taken = _taken(ladder.rungs[1 : ladder.rungs.index(fit) + 1])
    return " and ".join(r.label for r in taken) or fit.label, cumulative_flags(taken)


def _gib(rung: Rung) -> str:
    """The rung's device total per GPU, '12.34 GiB' (0 where it was not sized)."""
    return f"{(rung.device_bytes or 0) / 2**30:.2f} GiB"


def _rate(rung: Rung) -> str:
    """', 1,234 tokens/s' (the rung's throughput), or nothing where it was not timed."""
    return f", {rung.throughput:,.0f} {rung.unit}" if rung.throughput else ""
