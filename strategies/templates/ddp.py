# --- DDP ---
# [not-text]
def use_sync_batchnorm(model, micro_batch_size: int, device_type: str) -> tuple[bool, str]:
    """SyncBatchNorm where the model has BatchNorm, the per-GPU batch is small and the device is CUDA."""
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not has_bn:
        return False, "no BatchNorm layers"
    if micro_batch_size > SYNC_BN_MAX_MICRO_BATCH:
        return False, f"per-GPU batch {micro_batch_size} is large enough for per-GPU statistics"
    if device_type != "cuda":
        return False, "SyncBatchNorm needs CUDA tensors; on CPU each rank keeps its own BatchNorm statistics"
    return True, f"per-GPU batch {micro_batch_size} is small: BatchNorm statistics synchronised across ranks"


# [/not-text]
def main() -> None:
    args = parse_args()
    rank, local_rank, world_size, device = init_torchrun()  # the process group first; LOCAL_RANK picks the GPU
    torch.manual_seed(SEED)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    log(f"DDP: world size {world_size}, micro-batch {MICRO_BATCH_SIZE}/GPU, accumulation {GRAD_ACCUM_STEPS} "
        f"-> global batch {MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = "
        f"{MICRO_BATCH_SIZE * world_size * GRAD_ACCUM_STEPS}; lr {LR:g}")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    # [pure-bf16]
    input_dtype = torch.bfloat16  # pure bf16 has no autocast to cast the inputs: float inputs are cast by hand
    # [/pure-bf16]
    # [!pure-bf16]
    input_dtype = None  # inputs as loaded (under bf16/fp16, autocast casts them)
    # [/!pure-bf16]

    # [full]
    model = build_model(args.init_from)
    # [pure-bf16]
    model = model.to(torch.bfloat16)  # pure bf16: weights, gradients and optimizer states all in bf16
    # [/pure-bf16]
    # [/full]
    # [lora16]
    model = add_lora(build_base(args, base_dtype()))  # the base frozen in its dtype, the adapters trainable
    # [/lora16]
    # [qlora]
    base_dir = args.init_from or save_test_base(args.out)
    model = add_lora(load_quantized_base(base_dir, device))  # every rank holds the quantized base
    # [/qlora]
    # [ac]
    log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
    # [/ac]
    # [not-text]
    sync_bn, why = use_sync_batchnorm(model, MICRO_BATCH_SIZE, device.type)
    log(f"SyncBatchNorm: {'on' if sync_bn else 'off'} ({why})")
    if sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # [/not-text]
    model = model.to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    gc.collect()  # DDP's first broadcast can leave a receive buffer in a reference cycle (gloo): free it now
    # [full]
    params = list(ddp.parameters())
    # [/full]
    # [lora]
    params = trainable_parameters(ddp)  # the adapters only: DDP reduces their gradients alone (frozen ones join no bucket)
    # [/lora]
    optimizer = make_optimizer(params, device)
    schedule = lr_schedule(args.steps)  # --resume carries on the checkpoint's (resume_lr_schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, schedule) / LR)
    # fp16 needs a GradScaler to keep small gradients from underflowing; bf16 does not.
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
    dataset, held_out = make_datasets(args)
    sampler, loader = make_loader(dataset, world_size, rank)
    torch.manual_seed(SEED + rank)  # per-rank randomness for augmentation and dropout

    steps, preemption = StepLog(args.steps, device, world_size), Preemption()
    epoch, done_micro = 0, 0
    if args.resume:
        path = load_checkpoint(args.out, ddp, optimizer)
        epoch, done_micro = restore_training_state(path, rank, steps, schedule, scheduler, scaler)
    while not steps.done:
        # A new order every epoch (set_epoch); a resumed run starts where its checkpoint stopped.
        sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)
        for micro, batch in enumerate(loader, start=done_micro + 1):
            last_micro = micro % GRAD_ACCUM_STEPS == 0
            # No gradient all-reduce on the accumulation steps before the last: no_sync() keeps them local.
            with (contextlib.nullcontext() if last_micro else ddp.no_sync()):
                with torch.autocast(device.type, dtype=half, enabled=half is not None):
                    loss = compute_loss(ddp, batch, device, input_dtype)
                scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
            steps.micro_step(loss)
            if not last_micro:
                continue
            # Clip the true gradients: unscale first (a no-op unless fp16), then clip, then step. The gradients
            # are already averaged over the ranks, so every rank computes the same norm.
            scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            optimizer_step(scaler, optimizer, scheduler, steps, norm)
            steps.evaluate(args.eval_every, evaluate, ddp.module, held_out, world_size, rank, device, half, input_dtype)
            if checkpoint_due(args, steps, preemption, device, epoch, micro):
                save_checkpoint(args, ddp, optimizer, training_state(steps, schedule, scheduler, scaler), rank)
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
        save_checkpoint(args, ddp, optimizer, training_state(steps, schedule, scheduler, scaler), rank)
    if not args.no_save:
        # The plain module's weights (ddp.module: no "module." prefix in the names), written by rank 0 only.
        if rank == 0:
            # [full]
            export_weights(ddp.module, args)
            # [/full]
            # [lora]
            save_adapter(ddp.module, args.out)  # the base is unchanged (--init-from's), so only the adapters
            # [/lora]
            # [lora16]
            if args.export_merged:
                export_merged(ddp.module.state_dict(), args.out)
            # [/lora16]
        dist.barrier()
    teardown()


if __name__ == "__main__":
    main()
