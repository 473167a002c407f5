"""Tensor parallel inside a node x data parallel across the TP groups, on a 2-D device mesh [dp, tp]. The loop's
strategy functions (``loop.py``): the mesh (the data-parallel rank decides the data), the model sharded by
parallelize(), the vocab-parallel loss, the gradient all-reduce across the TP groups with the clipping of sharded
gradients, and the export of the gathered weights.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

if TYPE_CHECKING:  # the script's own names (see loop.py)
    import torch.distributed as dist

    from advisor.models.families.fragments.transformer import build_model, compute_loss, export_weights

    from .collectives import barrier, init_torchrun
    from .common import StepLog, evaluate, log
    from .constants import GRAD_ACCUM_STEPS, LR, MAX_GRAD_NORM, MICRO_BATCH_SIZE, TP_DEGREE
    from .loop import Run
    from .torch_steps import checkpoint_activations, step_with


def start() -> Run:
    """This process's rank and device once the process group is up, and the mesh: TP inside a node (fast links),
    DP across TP groups (mesh[dp, tp], TP ranks adjacent). Every rank of a TP group reads the same data, so the
    data-parallel rank and size are the mesh's dp dimension's."""
    rank, local_rank, world_size, device = init_torchrun()
    if world_size % TP_DEGREE:
        raise SystemExit(f"world size {world_size} is not a multiple of the TP degree {TP_DEGREE}")
    dp_size = world_size // TP_DEGREE
    mesh = init_device_mesh(device.type, (dp_size, TP_DEGREE), mesh_dim_names=("dp", "tp"))
    run = Run(rank, local_rank, mesh["dp"].get_local_rank(), dp_size, device)
    run.mesh, run.optimizer_device = mesh, torch.device("cpu")  # fused optimizer kernels lack DTensor support
    log(f"TP x DP: TP degree {TP_DEGREE}, data-parallel size {dp_size}, micro-batch {MICRO_BATCH_SIZE} per "
        f"data-parallel rank, accumulation {GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x {dp_size} x "
        f"{GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * dp_size * GRAD_ACCUM_STEPS}; lr {LR:g}")
    return run


def prepare_model__full(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(the TP-sharded model, its parameters): every rank loads it whole; parallelize() keeps only its shards."""
    model = build_model(args.init_from).to(run.device)
    parallelize(model, run.mesh["tp"])
    checkpoint_activations(model)
    return model, list(model.parameters())


def prepare_model__pure_bf16(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(the TP-sharded model, its parameters), weights, gradients and optimizer states all in bf16."""
    model = build_model(args.init_from)
    model = model.to(torch.bfloat16).to(run.device)
    parallelize(model, run.mesh["tp"])
    checkpoint_activations(model)
    return model, list(model.parameters())


def parallelize(model, tp_mesh) -> None:
    """transformers' own tensor-parallel plan for the decoder blocks (the config class's ``base_model_tp_plan``:
    q/k/v and the MLP's first projections column-wise, the attention output and the MLP's last projection row-wise;
    one all-reduce after attention and one after the MLP, Megatron-LM's layout). HF attention infers the local head
    count from the sharded projection (view(..., -1, head_dim)).

    The vocabulary is sharded too (Megatron-LM's vocab-parallel embedding and cross-entropy; torchtitan's Llama
    plan): the LM head column-wise with its logits left sharded on the vocab dim, for the cross-entropy under
    ``loss_parallel()``; the input embedding on its hidden dim (its gradient stays sharded), or, tied to the head,
    on its vocab dim with the head's weight pointed back at it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head.weight is embed.weight
    parallelize_module(embed, tp_mesh, RowwiseParallel(input_layouts=Replicate()) if tied
                       else ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
    if tied:  # one vocab-sharded weight for both, as before sharding
        head.weight = embed.weight
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    # e.g. "layers.*.self_attn.q_proj": "colwise", matched under the base model (torch matches "*" with fnmatch)
    plan = {pattern: styles[style]() for pattern, style in model.config.base_model_tp_plan.items()}
    parallelize_module(model.base_model, tp_mesh, plan)


def clip_grad_norm(model, max_norm: float, tp_group) -> float:
    """Clip the gradients to a total L2 norm of ``max_norm``; returns the norm before clipping. torch's
    clip_grad_norm_ cannot mix the TP-sharded (DTensor) gradients of the projections with the plain, replicated
    ones of the embeddings and norms: the squares of each rank's shards are summed over the TP group, the
    replicated ones counted once."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    sharded = [g.to_local() for g in grads if isinstance(g, DTensor) and any(pl.is_shard() for pl in g.placements)]
    whole = [g.to_local() if isinstance(g, DTensor) else g for g in grads
             if not (isinstance(g, DTensor) and any(pl.is_shard() for pl in g.placements))]
    squares = torch.zeros(2, dtype=torch.float32, device=grads[0].device if grads else "cpu")
    for i, part in enumerate((sharded, whole)):
        for g in part:
            squares[i] += g.float().pow(2).sum()
    shard_squares = squares[:1].clone()
    dist.all_reduce(shard_squares, group=tp_group)
    norm = float((shard_squares[0] + squares[1]).sqrt())
    scale = max_norm / (norm + 1e-6)
    if scale < 1.0:
        for g in sharded + whole:
            g.mul_(scale)
    return norm


def tp_loss(model, batch, device, input_dtype=None):
    """``compute_loss`` on the vocab-sharded logits: the vocab-parallel cross-entropy (``loss_parallel()``), its
    replicated result as a plain tensor. Its backward must run under ``loss_parallel()`` too."""
    with loss_parallel():
        loss = compute_loss(model, batch, device, input_dtype)
    return loss.to_local() if isinstance(loss, DTensor) else loss


def full_state_dict(model) -> dict:
    """Every rank gathers full tensors from the TP shards (collective), so rank 0 can save a
    checkpoint that loads into the plain single-GPU model."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in model.state_dict().items()}


def wrap_model(run: Run) -> None:
    """Nothing wraps the model: parallelize() sharded its layers in place (prepare_model)."""


def micro_step_context(run: Run, last_micro: bool):
    """Nothing to hold back: the data-parallel all-reduce runs once per step, in optimizer_step."""
    return contextlib.nullcontext()


def forward(run: Run, batch):
    """This micro-step's loss on the vocab-sharded logits (tp_loss), under autocast where mixed precision uses it."""
    dtype = run.autocast_dtype
    with torch.autocast(run.device.type, dtype=dtype, enabled=dtype is not None):
        return tp_loss(run.model, batch, run.device)


def backward(run: Run, loss) -> None:
    """The vocab-parallel cross-entropy's backward runs under ``loss_parallel()`` too."""
    with loss_parallel():
        run.scaler.scale(loss / GRAD_ACCUM_STEPS).backward()


def optimizer_step(run: Run, steps: StepLog) -> None:
    """Average the gradients over the data-parallel groups (all_reduce sums: divide for the mean), clip the true
    gradients (unscale first: a no-op unless fp16) over the TP shards, step, release the gradients, move the LR
    schedule on and log the step with the LR it used."""
    if run.dp_size > 1:
        for p in run.model.parameters():
            if p.grad is None:
                continue
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=run.mesh["dp"].get_group())
            g.div_(run.dp_size)
    run.scaler.unscale_(run.optimizer)
    norm = clip_grad_norm(run.model, MAX_GRAD_NORM, run.mesh["tp"].get_group())
    step_with(run, steps, norm)


def held_out_loss(run: Run, dataset) -> float:
    """``evaluate`` with the vocab-parallel cross-entropy (``loss_parallel()``): the held-out loss over all ranks."""
    with loss_parallel():
        return evaluate(run.model, dataset, run.dp_size, run.dp_rank, run.device, run.autocast_dtype)


def export(args, run: Run) -> None:
    """Every rank gathers the full tensors from the TP shards (a collective); rank 0 writes weights that load into
    the plain single-GPU model."""
    state = full_state_dict(run.model)
    if run.rank == 0:
        export_weights(run.model, args, state)
    barrier()


prepare_model = prepare_model__full
