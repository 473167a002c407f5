"""The states of the memory-savings ladder (``advisor.ladder``) and their figures: which options are on (``State``),
what the plan's strategy row gives for them (``Env``: the profiles and rows, one trace per profile) and the peak,
device total and step time with ``advisor.memory_options``' rules applied to the row's peak (``evaluate_state``):

- two moments bound the peak: the row's own peak (at the start of backward for a language model, where activations
  and the loss's logits are largest) and the end of backward (``StrategyMemory.model_state_bytes``: weights,
  every gradient, optimizer states); the options lower the first (activations, logits, gradients held) or the
  second (gradients held with the optimizer step in backward);
- step time: the row's (``StrategyRow.time``), plus the op policy's share of full checkpointing's recompute and
  activation offload's PCIe time that outlasts its phase (forward taken as a third of the compute, backward as two:
  backward runs two matmuls per forward matmul, Narayanan et al. 2021, section 5.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from .cache import DiskCache, NullCache
from .choices import Optimizer, SelectiveCheckpointing, TraceMode
from .context import StrategyContext
from .errors import AdvisorError
from .memory import Breakdown, StrategyMemory, optimizer_step_temp_bytes, trace_mode, weight_bytes
from .memory_options import (
    DEFAULT_CE_CHUNKS,
    block_dims,
    ce_saved_activation_bytes,
    chunked_ce_bytes,
    layer_policy_share,
    offload_transfer_s,
    optimizer_in_backward_blocker,
    optimizer_in_backward_grad_bytes,
    sac_op_recompute_flops_per_block,
    sac_op_saved_bytes_per_block,
)
from .models import AdapterSpec, recipe_adapter
from .models.limits import HIDDEN_KEYS, as_int, config_get
from .profile import ModelProfile, build_profile
from .rows import StrategyRow, evaluate_row
from .training_options import TrainingOptions

if TYPE_CHECKING:
    from strategies.base import Strategy

    from .timing.step import StepTime


@dataclass(frozen=True)
class State:
    """Which options are on: the ladder's rungs so far (``plus`` adds one by its ``advisor.ladder.LABELS`` key)."""

    chunked_ce: bool = False
    ac: str = ""  # "", "op", "layer", "full"
    optimizer_in_backward: bool = False
    activation_offload: bool = False
    adamw_8bit: bool = False
    adapter: str = ""  # "", "lora", "qlora"
    ce_chunks: int = DEFAULT_CE_CHUNKS  # chunked cross-entropy's row chunks (--chunked-cross-entropy CHUNKS)
    every: int = 2  # the layer policy's k: every k-th block checkpointed (--checkpoint-every)

    def plus(self, key: str) -> State:
        if key == "sac_op":
            return replace(self, ac="op")
        if key == "ac_full":
            return replace(self, ac="full")
        if key in ("lora", "qlora"):
            return replace(self, adapter=key)
        return replace(
            self,
            chunked_ce=self.chunked_ce or key == "chunked_ce",
            optimizer_in_backward=self.optimizer_in_backward or key == "optimizer_in_backward",
            activation_offload=self.activation_offload or key == "activation_offload",
            adamw_8bit=self.adamw_8bit or key == "adamw_8bit",
        )


def user_state(opts: TrainingOptions) -> State:
    """The ladder state of the options the user passed (``State()``: none of them)."""
    policy = opts.selective_checkpointing
    ac = {SelectiveCheckpointing.OP: "op", SelectiveCheckpointing.LAYER: "layer"}[policy] if policy else ""
    return State(
        chunked_ce=opts.chunked_cross_entropy is not None,
        ac=ac,
        optimizer_in_backward=opts.optimizer_in_backward,
        activation_offload=opts.activation_offload,
        ce_chunks=opts.chunked_cross_entropy or DEFAULT_CE_CHUNKS,
        every=opts.layer_every,
    )


@dataclass(frozen=True)
class Figures:
    """A state's figures on the strategy: peak allocated and device total per GPU (bytes), one optimizer step
    (seconds; None: not timed), what each option's figure assumes, and the pinned host bytes offload takes."""

    peak: int
    device: int
    step_s: float | None
    notes: tuple[tuple[str, str], ...] = ()  # (option key, what its figure assumes)
    host: int = 0
    # The same figures as the strategy row's memory and step time (``advisor.applied_options`` puts them on the
    # plan's rows): the breakdown at the peak sums to ``peak``; the time's parts are the row's with the options'.
    memory: StrategyMemory | None = field(default=None, compare=False)
    time: StepTime | None = field(default=None, compare=False)

    def note(self, key: str) -> str:
        return next((text for k, text in self.notes if k == key), "")


class Env:
    """What every state is evaluated from: the plan's context, its strategy and the profiles by (checkpointing,
    adapter), built once each (``advisor.profile.build_profile``, disk-cached traces)."""

    def __init__(
        self, ctx: StrategyContext, strategy: Strategy, cache: DiskCache | NullCache, scratch_threads: int
    ) -> None:
        self.ctx, self.strategy, self.cache, self.scratch = ctx, strategy, cache, scratch_threads
        self.profiles: dict[tuple[bool, str], ModelProfile] = {}
        self.rows: dict[tuple[bool, str, bool], StrategyRow] = {}
        spec = ctx.profile.spec
        self.tokens = spec.seq_len if spec.seq_len and spec.family not in ("vision", "custom") else None
        cfg = spec.config or {}
        self.vocab = int(str(cfg.get("vocab_size") or 0)) if spec.is_transformer else 0
        self.hidden = as_int(config_get(cfg, HIDDEN_KEYS, 0) or 0) if spec.is_transformer else 0  # d_model
        self.blocks = int(str(cfg.get("num_hidden_layers") or 0)) if spec.is_transformer else 0
        self.dims = block_dims(cfg) if spec.is_transformer else None
        self.tied = bool(cfg.get("tie_word_embeddings", False)) and self.vocab > 0

    def adapter(self, kind: str) -> AdapterSpec | None:
        if not kind:
            return self.ctx.profile.spec.adapter
        precision = self.ctx.options.precision
        assert precision is not None, "the plan resolves the precision"
        return recipe_adapter(precision.compute_dtype, quantize=kind == "qlora")  # the offered adapters

    def profile(self, checkpointing: bool, kind: str) -> ModelProfile:
        key = (checkpointing, kind)
        if key not in self.profiles:
            base = self.ctx.profile
            if key == (base.checkpointing, ""):
                self.profiles[key] = base
            else:
                spec = replace(base.spec, adapter=self.adapter(kind))
                self.profiles[key] = build_profile(
                    spec, base.attention, checkpointing, cache=self.cache, cpu_conv_scratch_threads=self.scratch
                )
        return self.profiles[key]

    def row(self, checkpointing: bool, kind: str, eight_bit: bool) -> tuple[StrategyContext, StrategyRow]:
        opts = replace(self.ctx.options, activation_checkpointing=checkpointing)
        if eight_bit:
            opts = replace(opts, optimizer=Optimizer.ADAMW_8BIT)
        ctx = StrategyContext(self.profile(checkpointing, kind), self.ctx.hardware, opts, self.ctx.device)
        key = (checkpointing, kind, eight_bit)
        if key not in self.rows:
            self.rows[key] = evaluate_row(self.strategy, ctx, False)
        return ctx, self.rows[key]

    @property
    def rows_per_step(self) -> int:
        """Loss rows (tokens) in one micro-step on this GPU."""
        return (self.tokens or 0) * self.ctx.micro_batch_size


def _logit_bytes(ctx: StrategyContext) -> int:
    return 4 if trace_mode(ctx.options.precision, casts_weights=False) == TraceMode.FP32 else 2


def evaluate_state(env: Env, st: State) -> Figures | str:
    """The figures of state ``st`` on ``env``'s strategy, or the one line saying why it cannot be had."""
    base_ac = env.ctx.options.activation_checkpointing
    full = st.ac == "full" or st.adapter == "qlora" or (base_ac and st.ac not in ("op", "layer"))
    try:
        ctx, row = env.row(full, st.adapter, st.adamw_8bit)
    except AdvisorError as err:
        return str(err)
    if not row.applicable or row.memory is None:
        return row.reason or f"{row.title} does not apply"
    mem, notes = row.memory, []  # (key, note)
    peak = mem.peak
    act, other, grads = peak.activations, peak.other, peak.grads
    step_s = row.time.step_s if row.time is not None else None
    time = row.time
    lb = _logit_bytes(ctx)
    rows = env.rows_per_step
    floor: Breakdown | None = None  # a moment without activations the options leave as it is (the optimizer step)
    if st.ac == "op" and not full:
        if env.dims is None or not env.blocks:
            return "the op policy's saved outputs are sized for Llama-style blocks (q/k/v/o and a gated MLP) only"
        plain_ctx, plain_row = env.row(False, st.adapter, st.adamw_8bit)
        _, ac_row = env.row(True, st.adapter, st.adamw_8bit)
        if ac_row.memory is None or plain_row.memory is None:
            return "no row with full checkpointing to start the op policy from"
        saved = env.blocks * sac_op_saved_bytes_per_block(rows, env.dims, lb)
        ap, pp_ = ac_row.memory.peak, plain_row.memory.peak
        mem = ac_row.memory
        if _holds_activations(ap) or not _holds_activations(pp_):
            # full checkpointing's peak is a moment of forward or backward: its activations plus the saved outputs
            peak = ap
            act, other, grads = min(pp_.activations, ap.activations + saved), ap.other, ap.grads
        else:
            # full checkpointing peaks at the optimizer step (no activations then: the policy leaves it as it is);
            # the policy's backward moment is the plain row's with full checkpointing's activations plus the saved
            floor = ap
            peak = pp_
            act = min(pp_.activations, _checkpointed_activations(env, ctx, st.adapter) + saved)
            other, grads = pp_.other, pp_.grads
        if ac_row.time is not None and plain_row.time is not None:
            recompute = ac_row.time.flops - ac_row.time.model_flops
            share = (
                min(1.0, env.blocks * sac_op_recompute_flops_per_block(rows, env.dims) * ac_row.time.micro_steps
                    / recompute)
                if recompute > 0
                else 0.0
            )  # fmt: skip
            step_s = plain_row.time.step_s + share * (ac_row.time.step_s - plain_row.time.step_s)
            time = _between(plain_row.time, ac_row.time, share)
        notes.append(("sac_op", "full checkpointing's peak plus the saved matmul and attention outputs"))
    if st.ac == "layer" and not full:
        _, ac_row = env.row(True, st.adapter, st.adamw_8bit)
        if ac_row.memory is None:
            return "no row with full checkpointing to start the layer policy from"
        blocks = _blocks(env, ctx, st.adapter)
        share = layer_policy_share(blocks, st.every)
        if not share:
            return f"every {st.every}-th block of {blocks} checkpoints none: no repeated blocks to checkpoint"
        # memory_options.layer_policy_share: the saving and the recompute are that share of full checkpointing's;
        # the recomputed block's temporaries are full checkpointing's.
        ap = ac_row.memory.peak
        if _holds_activations(ap):
            act, other = act - int(share * max(0, act - ap.activations)), max(other, ap.other)
        else:  # full checkpointing peaks at the optimizer step, which the policy leaves as it is
            floor = ap
            act -= int(share * max(0, act - _checkpointed_activations(env, ctx, st.adapter)))
        if ac_row.time is not None and row.time is not None:
            step_s = row.time.step_s + share * (ac_row.time.step_s - row.time.step_s)
            time = _between(row.time, ac_row.time, share)
        notes.append(
            ("sac_layer", f"{blocks // st.every} of {blocks} blocks checkpointed: that share of full checkpointing's "
             "saving and recompute")
        )  # fmt: skip
    if st.chunked_ce:
        if not env.vocab or not rows:
            return "chunked cross-entropy needs a language model's vocabulary-wide loss"
        # The plain loss's 12 bytes per logit at the backward peak (memory_options.ce_plain_bytes): 4 kept for
        # backward (activations), 8 of gradients (temporaries); chunked: the saved logits and per-row logsumexp and
        # label (activations), then their gradient and one chunk's fp32 copy (temporaries). A peak at another moment
        # (inside the blocks' backward, the optimizer step: its temporaries are not the loss's) is left as it is:
        # the loss holds nothing then (FSDP2's row of a 7B model at 2 x 4096 tokens rose by 0.12 GiB without this).
        logits = rows * env.vocab
        if other >= 8 * logits:
            kept = ce_saved_activation_bytes(rows, env.vocab, lb, chunked=True)
            act = max(0, act - ce_saved_activation_bytes(rows, env.vocab, lb, chunked=False)) + kept
            # the output head's weight gradient appears beside the logits' gradient (frozen under LoRA: none)
            head_elem = (
                weight_bytes(ctx.profile.stats, None, env.strategy.trace_mode(ctx.options.precision)).trainable_elem
                if ctx.profile.spec.adapter is None
                else 0
            )
            other = (
                other - 8 * logits + chunked_ce_bytes(rows, env.vocab, lb, st.ce_chunks, env.hidden, head_elem) - kept
            )
    if st.activation_offload:
        blocks = max(1, _blocks(env, ctx, st.adapter))
        loss_kept = ce_saved_activation_bytes(rows, env.vocab, lb, st.chunked_ce) if env.vocab and rows else 0
        inside = max(0, act - loss_kept)
        # torchtune's OffloadActivations brings each tensor back just before its backward, the next one prefetched:
        # about two blocks' saved tensors are on the GPU at the backward peak.
        offloaded = inside - min(inside, 2 * inside // blocks)
        act -= offloaded
        if row.time is not None and step_s is not None:
            t = row.time.compute_s / max(1, row.time.micro_steps)
            gbps = _host_gbps(env)
            moved, exposed = offload_transfer_s(offloaded, gbps, t / 3, 2 * t / 3)
            step_s += exposed * row.time.micro_steps
            if time is not None:  # the PCIe copies as communication beside compute, what outlasts it exposed
                steps = row.time.micro_steps
                time = replace(
                    time,
                    comm_s=time.comm_s + moved * steps,
                    exposed_comm_s=time.exposed_comm_s + exposed * steps,
                )
            notes.append(
                (
                    "activation_offload",
                    f"{offloaded / 2**30:.2f} GiB to pinned host memory and back per micro-step, "
                    f"{moved * 1e3:.0f} ms over PCIe at {gbps:g} GB/s"
                    + (", hidden under compute" if exposed == 0 else f", {exposed * 1e3:.0f} ms exposed"),
                )
            )
    end = mem.model_state_bytes
    if st.optimizer_in_backward:
        ga = row.grad_accum_steps or 1
        blocker = optimizer_in_backward_blocker(env.strategy.optimizer_in_backward_blocker, ga, clipping=False)
        if blocker:
            return blocker
        elem = weight_bytes(ctx.profile.stats, ctx.profile.spec.adapter, env.strategy.trace_mode(ctx.options.precision))
        shards = row.dp_size if env.strategy.hook_grads_sharded else 1
        sizes = sorted((_numel(s) for s in ctx.profile.stats.trainable_shapes), reverse=True)
        tied = env.vocab * env.hidden if env.tied else 0
        largest = next((n for n in sizes if n != tied), 0) if tied else (sizes[0] if sizes else 0)
        tied = tied if ctx.profile.spec.adapter is None else 0
        held = optimizer_in_backward_grad_bytes(largest * elem.trainable_elem, tied * elem.trainable_elem) // shards
        all_grads = ctx.profile.stats.num_trainable * elem.trainable_elem // shards
        end = end - all_grads + held
        grads = min(grads, held)
        # The largest parameter (the output head, the first gradient backward makes) steps in backward, beside the
        # activations forward kept (those of a backward peak, or all of them where the row peaks at its optimizer
        # step), with its step's temporaries (memory.optimizer_step_temp_bytes: CPU Adam's two, none for CUDA's fused
        # Adam) instead of the loss's: measured in a generated script's run (tests/test_selective_scripts.py).
        temp = optimizer_step_temp_bytes(ctx.options.optimizer, ctx.device, largest // shards, elem.trainable_elem)
        alive = (
            act
            if _holds_activations(peak)
            else ctx.profile.activations(_ctx_mode(ctx)).at(ctx.micro_batch_size).activations
        )
        if alive + held + temp > act + grads + other:
            act, grads, other = alive, held, temp
            peak = replace(peak, phase="backward (the largest parameter's step in its gradient's hook)")
        notes.append(("optimizer_in_backward", "no global-norm clipping (each parameter steps in its own hook)"))
    moment = replace(peak, activations=act, other=other, grads=grads)
    if floor is not None and floor.total > moment.total:
        moment = floor
    total = max(moment.total, end)
    device = total + mem.overhead.total
    host = 0
    if st.activation_offload:
        host = offloaded
    bd = _peak_breakdown(moment, end)
    memory = replace(mem, peak=bd, model_state_bytes=end)
    return Figures(total, device, step_s, tuple(notes), host, memory, time)


def _holds_activations(moment: Breakdown) -> bool:
    """A moment of forward or backward (the strategies' phase names start so), which the activation policies change;
    the optimizer step and the end of backward hold no activations."""
    return moment.phase.startswith(("forward", "backward"))


def _checkpointed_activations(env: Env, ctx: StrategyContext, adapter: str) -> int:
    """Activations full checkpointing keeps at this micro-batch (the checkpointed trace's saved tensors at the end of
    forward: each block's input, and what lies outside the blocks)."""
    return env.profile(True, adapter).activations(_ctx_mode(ctx)).at(ctx.micro_batch_size).activations


def _peak_breakdown(moment: Breakdown, end: int) -> Breakdown:
    """The larger of two moments (``evaluate_state``): the row's peak with the options applied (``moment``), or the
    end of backward, holding ``end`` bytes of weights, gradients and optimizer states (its parts: the moment's
    weights and optimizer states, the gradients the rest)."""
    if end <= moment.total:
        return moment
    params = min(moment.params, end)
    opt = min(moment.optimizer_states, end - params)
    parts = moment.params_parts if params == moment.params else ()
    return Breakdown(params=params, grads=end - params - opt, optimizer_states=opt, phase="end of backward",
                     params_parts=parts)  # fmt: skip


def _between(a: StepTime, b: StepTime, share: float) -> StepTime:
    """Step ``a`` moved ``share`` (0..1) of the way to step ``b`` in every timed part (a policy that checkpoints that
    share of what ``b`` checkpoints and ``a`` does not: ``memory_options.layer_policy_share``)."""
    return replace(
        a,
        compute_s=a.compute_s + share * (b.compute_s - a.compute_s),
        comm_s=a.comm_s + share * (b.comm_s - a.comm_s),
        exposed_comm_s=a.exposed_comm_s + share * (b.exposed_comm_s - a.exposed_comm_s),
        optimizer_s=a.optimizer_s + share * (b.optimizer_s - a.optimizer_s),
        host_s=a.host_s + share * (b.host_s - a.host_s),
        flops=a.flops + round(share * (b.flops - a.flops)),
    )


def _blocks(env: Env, ctx: StrategyContext, adapter: str) -> int:
    """The model's repeated blocks: a Llama-style config's ``num_hidden_layers``, else the blocks the checkpointed
    trace finds (a plain trace checkpoints none; GPT-2 names its count ``n_layer``, a CNN has none in its config)."""
    return env.blocks or env.profile(True, adapter).activations(_ctx_mode(ctx)).checkpointed_blocks


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _host_gbps(env: Env) -> float:
    """Pinned host<->device bandwidth of the GPU's PCIe generation (``advisor.timing.comm.pcie_host_gbps``)."""
    from strategies.base import timing_of

    from .timing.comm import pcie_host_gbps

    t = timing_of(env.ctx)
    return pcie_host_gbps(t.preset.pcie_gen) if t is not None else pcie_host_gbps(4)


def _ctx_mode(ctx: StrategyContext) -> TraceMode:
    return trace_mode(ctx.options.precision, casts_weights=False)


def throughput(env: Env, row_batch: int | None, step_s: float | None) -> tuple[float | None, str]:
    """(tokens/s of the job for a language model, else samples/s; its unit) at ``row_batch`` samples per step."""
    if step_s is None or not step_s or not row_batch:
        return None, "tokens/s" if env.tokens else "samples/s"
    if env.tokens:
        return row_batch * env.tokens / step_s, "tokens/s"
    return row_batch / step_s, "samples/s"
