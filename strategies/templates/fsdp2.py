# --- FSDP2 (torch.distributed.fsdp.fully_shard): parameters, gradients and optimizer states sharded ---
@contextlib.contextmanager
def parameters_on_meta():
    """While active, every parameter a module registers is moved to the meta device at once (no memory, and
    the constructor's init runs on nothing), while buffers are computed for real (the idea of accelerate's
    init_empty_weights(include_buffers=False))."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def build_on_meta():
    """The model on the meta device (no rank ever holds it whole), and the true values of its buffers.

    Returns (model, buffers): ``buffers`` lists (module, name, value) for every buffer of the meta model.
    Why a second build: to_empty() below leaves every buffer uninitialised too, and init functions do not
    cover every buffer (a causal mask, position ids, a model's own table). The model's own constructor,
    run a second time with only the parameters on meta, computes them exactly as a normal build does.
    Buffers are small; parameters are not, and they get their values from rank 0's build (init_parameters).
    """
    with torch.device("meta"):
        model = build_model()
    torch.manual_seed(SEED)  # a buffer drawn at random gets the value a normal build with SEED gives it
    with parameters_on_meta():
        reference = build_model()
    buffers = [(module, name, ref_module._buffers[name])
               for module, ref_module in zip(model.modules(), reference.modules())
               for name, buf in module._buffers.items() if buf is not None]
    del reference
    return model, buffers


def init_parameters(model, args) -> None:
    """Write every parameter after to_empty() (which leaves each rank's shards as uninitialised memory) with the
    weights every other strategy's script starts from.

    Rank 0 builds the model whole in host memory exactly as the DDP and single-GPU scripts do (SEED, then
    build_model(): the model's own init, or --init-from's weights) and broadcasts it tensor by tensor into every
    rank's shards (set_model_state_dict, broadcast_from_rank0). Why not each rank initialising its own shards:
    DTensor's random ops draw other numbers than a plain build (on CUDA an offset-based generator of its own; on
    CPU none, each rank would draw the same numbers), so the same SEED would start FSDP2 from other weights than
    DDP. The cost: rank 0 holds one whole fp32 copy in host RAM while it broadcasts (the plan's load figure).
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    names = list(get_model_state_dict(model))  # every rank: its shards' names, no copy
    state, missing = {}, [None]
    if dist.get_rank() == 0:
        torch.manual_seed(SEED)  # the seed the other scripts build with: the same init draws
        # [full]
        whole = build_model(args.init_from)
        # [pure-bf16]
        whole = whole.to(torch.bfloat16)
        # [/pure-bf16]
        # [/full]
        # [lora]
        whole = add_lora(build_base(args, base_dtype()))  # the base, then peft's adapters (lora_B zero)
        # [/lora]
        state = whole.state_dict()
        del whole
        missing = [[name for name in names if name not in state]]
        state = {name: state[name] for name in names if name in state}
    dist.broadcast_object_list(missing)  # every rank stops, or none: a rank left in the broadcast would wait
    if missing[0]:
        raise SystemExit(f"the model built whole has no {', '.join(missing[0][:3])}, which the sharded one has")
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True,
                                                                strict=False))
    if args.init_from:
        log(f"pretrained weights loaded from {args.init_from} into every rank's shards")


def restore_buffers(buffers, device) -> None:
    """Put the true buffer values (build_on_meta) in place of to_empty()'s garbage, cast to the model's
    buffer dtype (pure bf16 casts them, as .to(torch.bfloat16) does) and on the compute device (with CPU
    offload to_empty() put them in host memory; FSDP2 offloads parameters only)."""
    for module, name, value in buffers:
        if value.is_meta:
            raise SystemExit(f"buffer {name} of {type(module).__name__} is computed from parameters in its "
                             "constructor; build_on_meta() cannot recompute it: initialise it in the script")
        module._buffers[name] = value.to(device=device, dtype=module._buffers[name].dtype)


def mixed_precision_policy():
    """bf16 / fp16: blocks compute on 16-bit gathered parameters, gradients reduced in fp32, sharded
    parameters and optimizer states stay fp32 (no autocast). fp32, and pure bf16 (the module is bf16
    already): no casting at all, the default policy."""
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    if half is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)


def build_sharded_model(mesh, device, args):
    """Build on meta, shard, then materialise only this rank's shards and write them (init_parameters).

    Returns the model: one FSDP2 unit per repeated block, and the root.
    """
    model, buffers = build_on_meta()
    # [full]
    # [pure-bf16]
    model = model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states all in bf16
    # [/pure-bf16]
    # [/full]
    # [lora]
    # LoRA, still on meta: the base's parameters in its dtype (buffers stay as built, as from_pretrained leaves them),
    # then peft's adapters. fully_shard below shards the frozen base too (each rank holds 1/N of it).
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(base_dtype())
    model = add_lora(model)
    # [/lora]
    # [ac]
    # before sharding: fully_shard then wraps the checkpointed blocks
    log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
    # [/ac]
    shard_args = {"mesh": mesh, "mp_policy": mixed_precision_policy()}
    # [offload]
    shard_args["offload_policy"] = CPUOffloadPolicy()  # the shards live in pinned host memory; the CPU steps them
    # [/offload]
    # One unit per repeated block: its parameters are gathered just before it runs and freed after,
    # in forward (and, resharding, gathered again in backward).
    blocks = repeated_blocks(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=RESHARD_AFTER_FORWARD, **shard_args)
    # The root unit takes everything else (embeddings, head, final norm). It keeps torch's default for
    # the root: its parameters stay gathered from forward to backward, which needs them first.
    fully_shard(model, **shard_args)
    # Only now is memory allocated: each rank's shards, nothing else.
    # [offload]
    model.to_empty(device=torch.device("cpu"))
    # [/offload]
    # [!offload]
    model.to_empty(device=device)
    # [/!offload]
    init_parameters(model, args)
    restore_buffers(buffers, device)
    return model


def evaluate_sharded(model, dataset, num_replicas: int, rank: int, device, input_dtype) -> float:
    """evaluate() (no autocast: the policy casts), then every unit resharded: without gradients nothing reshards
    the root (nor, unresharded, the blocks)."""
    loss = evaluate(model, dataset, num_replicas, rank, device, None, input_dtype)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return loss


def main() -> None:
    args = parse_args()
    rank, _, world_size, device = init_torchrun()  # the process group first; LOCAL_RANK picks the GPU
    # [hsdp]
    if world_size % REPLICATE_DEGREE:
        raise SystemExit(f"world size {world_size} is not a multiple of the replicate degree {REPLICATE_DEGREE}")
    # HSDP: replicate across nodes (dim 0), shard inside a node (dim 1): the gathers stay on fast links.
    mesh = init_device_mesh(device.type, (REPLICATE_DEGREE, world_size // REPLICATE_DEGREE),
                            mesh_dim_names=("replicate", "shard"))
    # [/hsdp]
    # [!hsdp]
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    # [/!hsdp]
    log(f"FSDP2: world size {world_size} (mesh {tuple(mesh.shape)}), reshard after forward {RESHARD_AFTER_FORWARD}, "
        f"micro-batch {MICRO_BATCH_SIZE}/GPU, accumulation {GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x "
        f"{world_size} x {GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * world_size * GRAD_ACCUM_STEPS}; lr {LR:g}")

    model = build_sharded_model(mesh, device, args)
    # The optimizer sees the sharded parameters: its states are shards too (offload: a CPU step).
    # [full]
    params = list(model.parameters())
    # [/full]
    # [lora]
    params = trainable_parameters(model)  # the adapters' shards: the optimizer and clipping see only them
    # [/lora]
    # [offload]
    optimizer = make_optimizer(params, torch.device("cpu"))
    # [/offload]
    # [!offload]
    optimizer = make_optimizer(params, device)
    # [/!offload]
    schedule = lr_schedule(args.steps)  # --resume carries on the checkpoint's (resume_lr_schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, schedule) / LR)
    # fp16 needs a GradScaler. torch.amp's works on DTensor gradients: DTensor's unscale takes the max of
    # found_inf over the mesh, so every rank skips the same steps.
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
    dataset, held_out = make_datasets(args)
    sampler, loader = make_loader(dataset, world_size, rank)  # every rank is a data-parallel rank
    torch.manual_seed(SEED + rank)  # per-rank randomness for augmentation and dropout
    # [pure-bf16]
    input_dtype = torch.bfloat16  # pure bf16: no policy casts the inputs, so float inputs are cast by hand
    # [/pure-bf16]
    # [!pure-bf16]
    input_dtype = None  # the mixed-precision policy casts the inputs
    # [/!pure-bf16]

    steps, preemption = StepLog(args.steps, device, world_size), Preemption()
    epoch, done_micro = 0, 0
    if args.resume:  # each rank reads its own shards
        path = load_checkpoint(args.out, model, optimizer)
        epoch, done_micro = restore_training_state(path, rank, steps, schedule, scheduler, scaler)
    while not steps.done:
        # A new order every epoch (set_epoch); a resumed run starts where its checkpoint stopped.
        sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)
        for micro, batch in enumerate(loader, start=done_micro + 1):
            last_micro = micro % GRAD_ACCUM_STEPS == 0
            # [sync-last]
            # Syncing only on the last micro-step skips the reduce-scatters before it, but every rank keeps its
            # unsharded gradients until then (syncing every micro-step would accumulate shards).
            model.set_requires_gradient_sync(last_micro)
            # [/sync-last]
            loss = compute_loss(model, batch, device, input_dtype)  # no autocast: the policy casts
            scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
            steps.micro_step(loss)
            if not last_micro:
                continue
            # Clip the true gradients: unscale first (a no-op unless fp16). The norm comes back as a DTensor
            # reduced over every rank's shards: full_tensor() is the global norm.
            scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            optimizer_step(scaler, optimizer, scheduler, steps, norm)
            steps.evaluate(args.eval_every, evaluate_sharded, model, held_out, world_size, rank, device,
                           input_dtype)
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
    if final_checkpoint_due(args, steps):  # resumable: every rank writes its own shards (DCP), in parallel
        save_checkpoint(args, model, optimizer, training_state(steps, schedule, scheduler, scaler), rank)
    if not args.no_save:
        # [full]
        # Portable: the full weights, gathered by every rank (a collective) into rank 0's CPU memory; rank 0
        # alone writes them, loadable into the plain model (no wrapper prefix in the names).
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            export_weights(model, args, full)
        del full
        # [/full]
        # [lora]
        # The checkpoint above holds the adapters' shards and their optimizer states only (the frozen base is
        # --init-from's, unchanged), so it is cheap. No full weights either.
        # Portable: the adapters whole, gathered by every rank (a collective) into rank 0's CPU memory; rank 0 writes
        # them in peft's format (names of the plain model).
        adapter = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                       ignore_frozen_params=True))
        if rank == 0:
            save_adapter(model, args.out, adapter)
        # [/lora]
        # [lora16]
        if args.export_merged:  # the whole model gathered into rank 0's host memory (a collective)
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:
                export_merged(full, args.out)
            del full
        # [/lora16]
        dist.barrier()
    teardown()


if __name__ == "__main__":
    main()
