"""Pipeline parallel (x data parallel) with ``torch.distributed.pipelining``, on a 2-D device mesh [pp, dp]
(stages outermost, as torchtitan's ``ParallelDims`` orders them): every rank builds the whole model (the same seeded
weights as one process), keeps only its stage's modules (torchtitan's manual ``PipelineStage`` split: the
embeddings on the first stage, the final norm and LM head on the last; a Hugging Face model cannot be traced by
``pipeline()``), and one schedule (GPipe, 1F1B or interleaved 1F1B) runs every micro-batch of an optimizer step,
the loss on the last stage. The stage's replicas (the data-parallel group) average their accumulated gradients once
the pipeline's backward is done, as TP x DP's script does (no DDP wrapper: no buckets beside the accumulated
gradients). A head tied to the embedding becomes two copies, one per end of the pipeline: their gradients are
summed between the first and the last stage, so they stay equal.

Built on the shared loop (``loop.py``): a schedule step is all the micro-steps of a window at once, so ``forward``
keeps each micro-batch until the window's last, then runs the schedule over them (forward and backward), and
``backward`` has nothing left to do. Checkpoints are DCP's (each rank its stage).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

if TYPE_CHECKING:  # the script's own names (see loop.py)
    import torch.distributed as dist

    from advisor.models.families.fragments.transformer import build_model, export_weights

    from .collectives import barrier, init_torchrun, make_eval_loader
    from .common import StepLog, aggregate_mean, log
    from .constants import (
        EVAL_BATCHES,
        GRAD_ACCUM_STEPS,
        LR,
        MAX_GRAD_NORM,
        MICRO_BATCH_SIZE,
        PP_DEGREE,
        PP_SCHEDULE,
        PP_VIRTUAL_STAGES,
    )
    from .loop import Run
    from .torch_steps import checkpoint_activations


def start() -> Run:
    """This process's rank and device once the process group is up, and the mesh [pp, dp]: rank r is stage
    r // dp of the pipeline and data-parallel rank r % dp (every stage of one pipeline reads the same data)."""
    rank, local_rank, world_size, device = init_torchrun()
    if world_size % PP_DEGREE:
        raise SystemExit(f"world size {world_size} is not a multiple of the pipeline degree {PP_DEGREE}")
    dp_size = world_size // PP_DEGREE
    mesh = init_device_mesh(device.type, (PP_DEGREE, dp_size), mesh_dim_names=("pp", "dp"))
    run = Run(rank, local_rank, mesh["dp"].get_local_rank(), dp_size, device)
    run.mesh, run.pp_rank = mesh, mesh["pp"].get_local_rank()
    log(
        f"PP x DP: {PP_DEGREE} stages ({PP_SCHEDULE}, {PP_VIRTUAL_STAGES} model chunk(s) per rank), data-parallel "
        f"size {dp_size}, {GRAD_ACCUM_STEPS} micro-batches of {MICRO_BATCH_SIZE} per step and pipeline -> global "
        f"batch {MICRO_BATCH_SIZE} x {dp_size} x {GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * dp_size * GRAD_ACCUM_STEPS}"
        f"; lr {LR:g}"
    )
    return run


def stage_layers(layers: int, stages: int) -> list[range]:
    """The blocks of each pipeline stage: ``layers // stages`` each, the first ``layers % stages`` one more
    (torchtitan's ``_generate_llm_fqn_per_model_part``; advisor's estimate splits them the same way)."""
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for i in range(stages):
        n = base + (1 if i < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def prepare_model(args, run: Run) -> tuple[torch.nn.ModuleList, list]:
    """(this rank's model chunks, their parameters): the whole model built on every rank, cut into PP_DEGREE x
    PP_VIRTUAL_STAGES stages (rank r holds stages r, r + PP_DEGREE, ...: the interleaved schedules' placement), the
    other ranks' modules freed. The parameters keep the whole model's names, so the checkpoint's keys are the
    model's."""
    model = cast_weights(build_model(args.init_from))
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    total = PP_DEGREE * PP_VIRTUAL_STAGES
    if len(model.model.layers) < total:
        raise SystemExit(
            f"{len(model.model.layers)} blocks cannot fill {total} pipeline stages: lower the pipeline "
            "degree or the virtual stages (advisor --pp-degree / --pp-virtual-stages)"
        )
    ranges = stage_layers(len(model.model.layers), total)
    run.stage_ids = [run.pp_rank + k * PP_DEGREE for k in range(PP_VIRTUAL_STAGES)]
    run.num_stages, run.tied, run.hidden_size = total, tied, model.config.hidden_size
    # the model's own causal-LM loss (transformers' ForCausalLMLoss: fp32 logits, each position predicts the next
    # token, the mean over the micro-batch's tokens), computed on the last stage
    run.loss_function, run.vocab_size = model.loss_function, model.config.vocab_size
    chunks = [StageModule(model, i == 0, i == total - 1, ranges[i]).to(run.device) for i in run.stage_ids]
    del model
    gc.collect()  # the other stages' modules
    for chunk in chunks:
        checkpoint_activations(chunk)
    params = [p for chunk in chunks for p in chunk.parameters()]
    run.tied_group = tied_group(run) if tied else None
    return torch.nn.ModuleList(chunks), params


def cast_weights__fp32(model):
    """The weights stay fp32 (mixed precision autocasts per op)."""
    return model


def cast_weights__pure_bf16(model):
    """Pure bf16: weights, gradients and optimizer states all in bf16."""
    model = model.to(torch.bfloat16)
    return model


class StageModule(torch.nn.Module):
    """One pipeline stage of a Hugging Face decoder (LlamaForCausalLM and its kind): the first stage's embeddings,
    the stage's blocks under their own indices, the last stage's final norm and LM head, and the rotary table on
    every stage. Forward: token ids (first stage) or hidden states in, hidden states (or the logits) out."""

    def __init__(self, model, first: bool, last: bool, layers: range) -> None:
        super().__init__()
        inner = model.model
        self.config = model.config
        self.model = torch.nn.Module()
        self.model.embed_tokens = inner.embed_tokens if first else None
        self.model.layers = torch.nn.ModuleDict({str(i): inner.layers[i] for i in layers})
        self.model.norm = inner.norm if last else None
        self.model.rotary_emb = inner.rotary_emb
        self.lm_head = model.lm_head if last else None

    def forward(self, x):
        from transformers.masking_utils import create_causal_mask

        if self.model.embed_tokens is not None:
            x = self.model.embed_tokens(x)
        position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask = create_causal_mask(
            config=self.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=position_ids
        )
        rope = self.model.rotary_emb(x, position_ids=position_ids)
        for layer in self.model.layers.values():
            x = layer(x, attention_mask=mask, position_embeddings=rope, position_ids=position_ids)
        if self.lm_head is not None:
            x = self.lm_head(self.model.norm(x))
        return x


def tied_group(run: Run):
    """The process group of the first and the last stage of this rank's pipeline (the two copies of a tied
    embedding); every rank creates every pipeline's (new_group is collective), and gets None off the two ends."""
    dp = run.dp_size
    groups = [dist.new_group([d, (PP_DEGREE - 1) * dp + d]) for d in range(dp)]
    return groups[run.dp_rank] if run.pp_rank in (0, PP_DEGREE - 1) else None


def wrap_model(run: Run) -> None:
    """The schedule of this rank's stages (run.schedule, make_schedule) and the window of micro-batches ``forward``
    keeps for it; no wrapper around the stages (their replicas average gradients in optimizer_step)."""
    run.schedule, run.window = make_schedule(run), []


def micro_step_context(run: Run, last_micro: bool):
    """Whether this micro-step ends the window (``forward`` runs the schedule then); nothing to keep local (no DDP
    wrapper: the replicas' gradients are averaged once, in optimizer_step)."""
    run.last_micro = last_micro
    return contextlib.nullcontext()


def forward(run: Run, batch):
    """Keeps the micro-batch; on the window's last micro-step, the schedule's forward and backward of the window
    (pipeline_step). Returns what the step log adds up for this micro-step: 0 until then, then the sum of the
    window's micro-batch losses (so the step's mean loss is the one-process loop's). The schedule's micro-batch count
    is fixed: a window longer than GRAD_ACCUM_STEPS (an epoch's last micro-batches, too few for a step, carried into
    the next epoch's first window) trains its last GRAD_ACCUM_STEPS only, the carried ones logged as 0."""
    run.window.append(batch)
    if not run.last_micro:
        return torch.zeros((), dtype=torch.float64)
    window, run.window = run.window[-GRAD_ACCUM_STEPS:], []
    return torch.tensor(sum(loss.item() for loss in pipeline_step(run, window)), dtype=torch.float64)


def backward(run: Run, loss) -> None:
    """Nothing: the schedule ran every micro-batch's backward in ``forward``."""


def make_schedule(run: Run):
    """The schedule of every rank's stages over GRAD_ACCUM_STEPS micro-batches. Each micro-batch's backward runs on
    its share of the window's mean loss (loss / GRAD_ACCUM_STEPS, as the one-process loop's), so the accumulated
    gradients are the mean's (the schedule's own division, scale_grads, is off)."""

    def window_share(logits, labels):
        return run.loss_function(logits, labels, vocab_size=run.vocab_size) / GRAD_ACCUM_STEPS

    group = run.mesh["pp"].get_group()
    stages = [
        PipelineStage(chunk, i, run.num_stages, run.device, group=group) for chunk, i in zip(run.model, run.stage_ids)
    ]
    if PP_SCHEDULE == "interleaved-1f1b":
        return ScheduleInterleaved1F1B(stages, n_microbatches=GRAD_ACCUM_STEPS, loss_fn=window_share, scale_grads=False)
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[PP_SCHEDULE]
    return cls(stages[0], n_microbatches=GRAD_ACCUM_STEPS, loss_fn=window_share, scale_grads=False)


def pipeline_step(run: Run, window: list) -> list:
    """Forward and backward of the window's micro-batches through the pipeline; returns their losses (the schedule
    keeps each one's window share), sent from the last stage to every stage (each rank logs them)."""
    ids = torch.cat([b["input_ids"] for b in window]).to(run.device, non_blocking=True)
    labels = torch.cat([b["labels"] for b in window]).to(run.device, non_blocking=True)
    first, last = run.pp_rank == 0, run.pp_rank == PP_DEGREE - 1
    losses: list = []
    dtype = run.autocast_dtype
    with torch.autocast(run.device.type, dtype=dtype, enabled=dtype is not None):
        # return_outputs=False: the last stage does not keep every micro-batch's logits to merge them
        run.schedule.step(
            *([ids] if first else []),
            target=labels if last else None,
            losses=losses if last else None,
            return_outputs=False,
        )
    out = (
        torch.stack([loss.detach().float() * GRAD_ACCUM_STEPS for loss in losses]) if last else torch.zeros(len(window))
    )
    out = out.to(run.device)
    dist.broadcast(out, group=run.mesh["pp"].get_group(), group_src=PP_DEGREE - 1)
    return list(out)


def clip_grad_norm(run: Run, max_norm: float) -> torch.Tensor:
    """Clip the gradients of every stage to a total L2 norm of ``max_norm``; returns the norm before clipping. As
    torch's clip_grad_norm_ computes it for the whole model: each gradient's norm, gathered from every stage in the
    model's order, then their norm; a tied head's copy on the last stage is left out (one weight, counted once)."""
    chunks = list(run.module)
    head = chunks[-1].lm_head.weight if run.tied and chunks[-1].lm_head is not None else None
    per_chunk = [
        [torch.linalg.vector_norm(p.grad, 2.0) for p in c.parameters() if p.grad is not None and p is not head]
        for c in chunks
    ]
    group, dtype = run.mesh["pp"].get_group(), run.params[0].dtype
    counts = [None] * PP_DEGREE  # every rank's norms per chunk
    dist.all_gather_object(counts, [len(c) for c in per_chunk], group=group)
    width = max(sum(c) for c in counts)
    mine = torch.zeros(width, dtype=dtype, device=run.device)
    flat = [n for c in per_chunk for n in c]
    if flat:
        mine[: len(flat)] = torch.stack(flat)
    gathered = [torch.empty(width, dtype=dtype, device=run.device) for _ in range(PP_DEGREE)]
    dist.all_gather(gathered, mine, group=group)
    ordered = []  # the model's order: stage s is chunk s // PP_DEGREE of rank s % PP_DEGREE
    for s in range(run.num_stages):
        r, k = s % PP_DEGREE, s // PP_DEGREE
        start = sum(counts[r][:k])
        ordered.append(gathered[r][start : start + counts[r][k]])
    norm = torch.linalg.vector_norm(torch.cat(ordered), 2.0)
    torch.nn.utils.clip_grads_with_norm_(run.params, max_norm, norm)  # the parameters, whose .grad it scales
    return norm


def sync_tied_gradients(run: Run) -> None:
    """A head tied to the embedding: the first stage's embedding and the last stage's head are copies of one weight;
    the sum of their gradients is that weight's, so both step with it and stay equal."""
    if run.tied_group is None:
        return
    chunk = run.module[0] if run.pp_rank == 0 else run.module[-1]
    weight = chunk.model.embed_tokens.weight if run.pp_rank == 0 else chunk.lm_head.weight
    # a sum of the two halves of one gradient, not of replicas: nothing to divide
    dist.all_reduce(weight.grad, group=run.tied_group)  # advisor: ignore[MG012]


def average_over_replicas(run: Run) -> None:
    """Every stage's gradients averaged over its data-parallel group (all_reduce sums: divide for the mean)."""
    if run.dp_size == 1:
        return
    group = run.mesh["dp"].get_group()
    for p in run.params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(run.dp_size)


def optimizer_step(run: Run, steps: StepLog) -> None:
    """The end of a step: the gradients averaged over the replicas, the tied copies' gradients summed, the
    gradients clipped over all stages, the step, the gradients released, the LR schedule moved on and the step
    logged with the LR it used."""
    average_over_replicas(run)
    sync_tied_gradients(run)
    norm = clip_grad_norm(run, MAX_GRAD_NORM)
    lr = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    steps.end_step(lr, norm)


def held_out_loss(run: Run, dataset) -> float:
    """The mean held-out loss over every data-parallel rank: each micro-batch's hidden states passed stage to stage
    (no schedule: forward only), the loss on the last stage; the other stages add nothing to the sums."""
    group = run.mesh["pp"].get_group()
    dtype = run.autocast_dtype
    hidden = run.params[0].dtype  # the residual stream's: the weights' (autocast's residual adds stay fp32)
    total, count = 0.0, 0
    run.model.eval()
    with torch.no_grad(), torch.autocast(run.device.type, dtype=dtype, enabled=dtype is not None):
        for batch in itertools.islice(make_eval_loader(dataset, run.dp_size, run.dp_rank), EVAL_BATCHES):
            ids, labels = batch["input_ids"].to(run.device), batch["labels"].to(run.device)
            for chunk, i in zip(run.model, run.stage_ids):
                if i == 0:
                    x = ids
                else:
                    x = torch.empty(*ids.shape, run.hidden_size, dtype=hidden, device=run.device)
                    dist.recv(x, group=group, group_src=(i - 1) % PP_DEGREE)
                x = chunk(x)
                if i == run.num_stages - 1:
                    total += run.loss_function(x, labels, vocab_size=run.vocab_size).item() * len(ids)
                    count += len(ids)
                else:
                    dist.send(x.to(hidden).contiguous(), group=group, group_dst=(i + 1) % PP_DEGREE)
    run.model.train()
    return aggregate_mean(total, count, run.device)


def export(args, run: Run) -> None:
    """Rank 0 gathers every stage's weights (from data-parallel rank 0 of each) and writes the whole model, which
    loads into the plain single-GPU model; a tied head is the embedding's weight there."""
    state = {}
    for chunk in run.model:
        state.update({k: v.detach().cpu() for k, v in chunk.state_dict().items()})
    parts = [None] * dist.get_world_size() if run.rank == 0 else None
    dist.gather_object(state if run.dp_rank == 0 else {}, parts, dst=0)
    if run.rank == 0:
        full = {k: v for part in parts for k, v in part.items()}
        if run.tied:
            full.pop("lm_head.weight", None)
        with torch.device("meta"):
            model = build_model()
        model.load_state_dict(full, strict=False, assign=True)
        export_weights(model, args, full)
    barrier()


cast_weights = cast_weights__fp32
