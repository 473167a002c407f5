# --- Tensor parallel (inside a node) x data parallel (across TP groups) on a 2-D device mesh ---
def parallelize(model, tp_mesh) -> None:
    """Megatron-style plan per decoder layer: q/k/v and gate/up column-wise, o and down row-wise
    (one all-reduce after attention and one after the MLP). HF attention infers the local head
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

    tied = model.lm_head.weight is model.get_input_embeddings().weight
    embedding = (RowwiseParallel(input_layouts=Replicate()) if tied
                 else ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": embedding,
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False),
    })
    if tied:  # one vocab-sharded weight for both, as before sharding
        model.lm_head.weight = model.model.embed_tokens.weight
    plan = {
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def clip_grad_norm(model, max_norm: float, tp_group) -> float:
    """Clip the gradients to a total L2 norm of ``max_norm``; returns the norm before clipping. torch's
    clip_grad_norm_ cannot mix the TP-sharded (DTensor) gradients of the projections with the plain, replicated
    ones of the embeddings and norms: the squares of each rank's shards are summed over the TP group, the
    replicated ones counted once."""
    from torch.distributed.tensor import DTensor

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
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        loss = compute_loss(model, batch, device, input_dtype)
    return loss.to_local() if isinstance(loss, DTensor) else loss


def evaluate_tp(model, dataset, num_replicas: int, rank: int, device, autocast_dtype=None) -> float:
    """``evaluate`` with the vocab-parallel cross-entropy (``loss_parallel()``): the held-out loss over all ranks."""
    from torch.distributed.tensor.parallel import loss_parallel

    with loss_parallel():
        return evaluate(model, dataset, num_replicas, rank, device, autocast_dtype)


def full_state_dict(model) -> dict:
    """Every rank gathers full tensors from the TP shards (collective), so rank 0 can save a
    checkpoint that loads into the plain single-GPU model."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in model.state_dict().items()}


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    args = parse_args()
    rank, _, world_size, device = init_torchrun()  # the process group first; LOCAL_RANK picks the GPU
    if world_size % TP_DEGREE:
        raise SystemExit(f"world size {world_size} is not a multiple of the TP degree {TP_DEGREE}")
    dp_size = world_size // TP_DEGREE
    # TP inside a node (fast links), DP across TP groups: mesh[dp, tp], TP ranks adjacent.
    mesh = init_device_mesh(device.type, (dp_size, TP_DEGREE), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()
    torch.manual_seed(SEED)  # identical initial weights on every rank before sharding
    log(f"TP x DP: TP degree {TP_DEGREE}, data-parallel size {dp_size}, micro-batch {MICRO_BATCH_SIZE} per "
        f"data-parallel rank, accumulation {GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x {dp_size} x "
        f"{GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * dp_size * GRAD_ACCUM_STEPS}; lr {LR:g}")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)

    model = build_model(args.init_from)  # every rank loads it whole; parallelize() keeps only its shards
    # [pure-bf16]
    model = model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states all in bf16
    # [/pure-bf16]
    model = model.to(device)
    parallelize(model, mesh["tp"])
    # [ac]
    log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
    # [/ac]
    optimizer = make_optimizer(model.parameters(), torch.device("cpu"))  # fused kernels lack DTensor support
    schedule = lr_schedule(args.steps)  # --resume carries on the checkpoint's (resume_lr_schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, schedule) / LR)
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")  # loss scaling for fp16 only
    dataset, held_out = make_datasets(args)
    # The sampler shards by data-parallel rank: every rank of a TP group sees the same batch.
    sampler, loader = make_loader(dataset, dp_size, dp_rank)
    torch.manual_seed(SEED + dp_rank)  # per data-parallel rank; identical inside a TP group

    steps, preemption = StepLog(args.steps, device, dp_size), Preemption()
    epoch, done_micro = 0, 0
    if args.resume:  # each rank reads its own shards
        path = load_checkpoint(args.out, model, optimizer)
        epoch, done_micro = restore_training_state(path, rank, steps, schedule, scheduler, scaler)
    while not steps.done:
        sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)  # a new order every epoch; resumed: where it stopped
        for micro, batch in enumerate(loader, start=done_micro + 1):
            with torch.autocast(device.type, dtype=half, enabled=half is not None):
                loss = tp_loss(model, batch, device)
            with loss_parallel():  # the vocab-parallel cross-entropy's backward
                scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
            steps.micro_step(loss)
            if micro % GRAD_ACCUM_STEPS:
                continue  # no gradient all-reduce on non-final accumulation steps
            if dp_size > 1:
                for p in model.parameters():
                    if p.grad is None:
                        continue
                    g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    dist.all_reduce(g, group=dp_group)
                    g.div_(dp_size)  # all_reduce sums: divide for the mean
            scaler.unscale_(optimizer)  # clip the true gradients (a no-op unless fp16)
            norm = clip_grad_norm(model, MAX_GRAD_NORM, mesh["tp"].get_group())
            optimizer_step(scaler, optimizer, scheduler, steps, norm)
            steps.evaluate(args.eval_every, evaluate_tp, model, held_out, dp_size, dp_rank, device, half)
            if checkpoint_due(args, steps, preemption, device, epoch, micro):
                save_checkpoint(args, model, optimizer, training_state(steps, schedule, scheduler, scaler), rank)
                steps.restart_clock()
            if steps.done:
                break
        epoch, done_micro = epoch + 1, 0

    if steps.stopped:
        log(f"SIGTERM: stopped after step {steps.step} with a checkpoint; continue with --resume")
        teardown()
        return

    os.makedirs(args.out, exist_ok=True)
    if final_checkpoint_due(args, steps):
        save_checkpoint(args, model, optimizer, training_state(steps, schedule, scheduler, scaler), rank)
    if not args.no_save:
        state = full_state_dict(model)  # collective: every rank takes part
        if rank == 0:
            export_weights(model, args, state)
        dist.barrier()
    teardown()


if __name__ == "__main__":
    main()
