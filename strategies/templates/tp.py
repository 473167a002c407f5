# ---------------------------------------------------------------------------------------------
# Tensor parallel (inside a node) x data parallel (across TP groups) on a 2-D device mesh
# ---------------------------------------------------------------------------------------------
def parallelize(model, tp_mesh) -> None:
    """Megatron-style plan per decoder layer: q/k/v and gate/up column-wise, o and down row-wise
    (one all-reduce after attention and one after the MLP). HF attention infers the local head
    count from the sharded projection (view(..., -1, head_dim))."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
    }
    for layer in model.model.layers:
        parallelize_module(layer, tp_mesh, plan)


def full_state_dict(model) -> dict:
    """Every rank gathers full tensors from the TP shards (collective), so rank 0 can save a
    checkpoint that loads into the plain single-GPU model (pitfall 7)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
            for k, v in model.state_dict().items()}


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    args = parse_args()
    rank, local_rank, world_size, device = init_torchrun()  # pitfalls 1 and 2
    if world_size % TP_DEGREE:
        raise SystemExit(f"world size {world_size} is not a multiple of the TP degree {TP_DEGREE}")
    dp_size = world_size // TP_DEGREE
    # TP inside a node (fast links), DP across TP groups: mesh[dp, tp], TP ranks adjacent.
    mesh = init_device_mesh(device.type, (dp_size, TP_DEGREE), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()
    torch.manual_seed(SEED)  # identical initial weights on every rank before sharding
    log(f"TP x DP: TP degree {TP_DEGREE}, data-parallel size {dp_size}, micro-batch {MICRO_BATCH_SIZE} per "
        f"data-parallel rank, accumulation {GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x {dp_size} x "
        f"{GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * dp_size * GRAD_ACCUM_STEPS}; lr {LR:g} (linear scaling)")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)

    meter = MemoryMeter(device)
    with meter:
        model = build_model()
        if PRECISION == "pure-bf16":
            model = model.to(torch.bfloat16)
        model = model.to(device)
        parallelize(model, mesh["tp"])
        if ACTIVATION_CHECKPOINTING:
            log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
        optimizer = make_optimizer(model.parameters(), torch.device("cpu"))  # fused kernels lack DTensor support
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s) / LR)
        scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")  # pitfall 15
        dataset = load_real_dataset(args.data) if args.data else SyntheticDataset(NUM_SAMPLES)
        # The sampler shards by data-parallel rank: every rank of a TP group sees the same batch.
        sampler, loader = make_loader(dataset, dp_size, dp_rank)
        torch.manual_seed(SEED + dp_rank)  # pitfall 11, identical inside a TP group

        steps, seen = StepLog(args.steps, device, meter, args.timing_steps), {}
        epoch = 0
        while not steps.done:
            sampler.set_epoch(epoch)  # pitfall 4
            seen[epoch] = []
            for micro, batch in enumerate(loader, start=1):
                seen[epoch] += batch["index"].tolist()
                with torch.autocast(device.type, dtype=half, enabled=half is not None):
                    loss = compute_loss(model, batch, device)
                scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
                steps.micro_step(loss)
                if micro % GRAD_ACCUM_STEPS:
                    continue  # pitfall 16: no gradient all-reduce on non-final accumulation steps
                if dp_size > 1:
                    for p in model.parameters():
                        if p.grad is None:
                            continue
                        g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                        dist.all_reduce(g, group=dp_group)
                        g.div_(dp_size)  # pitfall 6: a hand-written all-reduce divides by the world size
                optimizer_step(scaler, optimizer, scheduler, steps)
                if steps.done:
                    break
            epoch += 1

    os.makedirs(args.out, exist_ok=True)
    if not args.no_save:
        state = full_state_dict(model)  # collective: every rank takes part
        if rank == 0:
            torch.save(state, os.path.join(args.out, "model.pt"))
            log(f"checkpoint: {os.path.join(args.out, 'model.pt')} (loads into build_model())")
        dist.barrier()
    write_report(os.path.join(args.out, args.report), rank, world_size, device, meter.result(), steps.losses,
                 steps.step_times, {"tp_degree": TP_DEGREE, "dp_size": dp_size, "dp_rank": dp_rank,
                              "sample_indices": seen})
    dist.destroy_process_group()  # pitfall 19


if __name__ == "__main__":
    main()
