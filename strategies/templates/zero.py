# --- DeepSpeed ZeRO (stage, offload, buckets and precision are in ds_config.json) ---
# [lora]
def adapter_state_dict(module) -> dict:
    """Every rank: the trainable parameters (the adapters) by name, as whole CPU copies."""
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    # [zero3]
    import deepspeed

    # ZeRO-3 partitions them: gathered for the copy (read-only: modifier_rank None).
    with deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None):
        return {name: p.detach().cpu().clone() for name, p in named}
    # [/zero3]
    # [!zero3]
    return {name: p.detach().cpu().clone() for name, p in named}
    # [/!zero3]


# [/lora]
def save_checkpoint(args, engine, state: dict, rank: int) -> None:
    """DeepSpeed's own checkpoint: every rank writes its partition of the optimizer states (and, under ZeRO-3, of
    the weights), with the LR schedule; plus every rank's training state; then commit_checkpoint."""
    tag = f"step-{state['step']}"
    # [full]
    engine.save_checkpoint(os.path.join(args.out, "checkpoints"), tag=tag, save_latest=False)
    # [/full]
    # [lora]
    # The frozen base is --init-from's, unchanged: only the adapters and their optimizer states are written.
    engine.save_checkpoint(os.path.join(args.out, "checkpoints"), tag=tag, save_latest=False,
                           exclude_frozen_parameters=True)
    # [/lora]
    save_training_state(checkpoint_dir(args.out, state["step"]), rank, state)
    commit_checkpoint(args, state["step"], rank)


def load_checkpoint(out: str, engine) -> str:
    """--resume: the latest checkpoint into the engine (weights, optimizer states, LR schedule); returns its path."""
    path = latest_checkpoint(out)
    try:
        # [full]
        engine.load_checkpoint(os.path.dirname(path), tag=os.path.basename(path))
        # [/full]
        # [lora]
        engine.load_checkpoint(os.path.dirname(path), tag=os.path.basename(path), load_module_strict=False)
        # [/lora]
    except (OSError, RuntimeError, KeyError, ValueError) as err:
        raise unreadable(path, err) from None
    return path


def main() -> None:
    import deepspeed

    args = parse_args()
    with open(args.deepspeed_config or DS_CONFIG_FILE) as f:
        ds_config = json.load(f)
    cuda = torch.cuda.is_available()
    # The deepspeed launcher (or torchrun) sets RANK/LOCAL_RANK/WORLD_SIZE; LOCAL_RANK picks the GPU.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(local_rank)
    # The process group exists before the engine wraps the model; a collective waiting longer than the timeout fails.
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo",
                               timeout=datetime.timedelta(minutes=COLLECTIVE_TIMEOUT_MINUTES))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    # The batch sizes and the clipping norm follow this script's constants and the world size it runs on (ds_config's
    # figures are what advisor planned); precision, buckets and offload stay ds_config's.
    ds_config.update(train_micro_batch_size_per_gpu=MICRO_BATCH_SIZE, gradient_accumulation_steps=GRAD_ACCUM_STEPS,
                     train_batch_size=MICRO_BATCH_SIZE * GRAD_ACCUM_STEPS * world_size, gradient_clipping=MAX_GRAD_NORM)
    log(f"ZeRO-{ds_config['zero_optimization']['stage']}: world size {world_size}, micro-batch {MICRO_BATCH_SIZE}/GPU, "
        f"accumulation {GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = "
        f"{ds_config['train_batch_size']}; lr {LR:g}")
    # [qlora]
    # QLoRA: bitsandbytes quantizes the base as from_pretrained loads it (build_base), so without --init-from a freshly
    # initialised base is saved first and loaded from there; a quantized base is never built under zero.Init.
    args.init_from = args.init_from or save_test_base(args.out)
    # [/qlora]
    # [zero-init]
    # ZeRO-3 partitions the parameters as they are created (deepspeed.zero.Init), so no rank ever holds the full
    # model. --init-from loads through transformers' DeepSpeed integration instead: while an HfDeepSpeedConfig is
    # alive, from_pretrained builds the model under zero.Init itself and copies the checkpoint into the partitions.
    import transformers
    from transformers.integrations import HfDeepSpeedConfig

    # The model's class is imported first: zero.Init replaces torch.Tensor's constructor while it is active, and
    # transformers' modeling code imported under it fails (torch._dynamo's polyfills check that constructor).
    getattr(transformers, HF_MODEL_CLASS)
    hf_ds_config = HfDeepSpeedConfig(ds_config) if args.init_from else None
    init = contextlib.nullcontext() if args.init_from else deepspeed.zero.Init(config_dict_or_path=ds_config)
    # [full]
    with init:
        model = build_model(args.init_from)
    # [/full]
    # [lora]
    # LoRA: the base frozen, partitioned like any parameter. zero.Init builds in the dtype of ds_config's bf16/fp16
    # mode; from_pretrained loads in the base's dtype.
    with init:
        model = build_base(args, base_dtype() if args.init_from else None)
    # [/lora]
    # [/zero-init]
    # [!zero-init]
    # [full]
    # Built whole on every rank; deepspeed.initialize partitions what this stage partitions.
    # [zero3]
    # (Not under zero.Init: this model re-initialises its weights after creation, which partitioned weights cannot
    # take; it is small enough to build whole.)
    # [/zero3]
    model = build_model(args.init_from)
    # [/full]
    # [lora]
    model = build_base(args, base_dtype())  # the frozen base in its dtype, whole on every rank
    # [/lora]
    # [/!zero-init]
    # [full]
    params = list(model.parameters())
    # [/full]
    # [lora]
    # Outside zero.Init: peft initialises the adapters (lora_B to zero) on whole tensors; deepspeed.initialize then
    # partitions them too.
    model = add_lora(model)
    params = trainable_parameters(model)  # the optimizer (DeepSpeed's fp32 master copies too) sees the adapters
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    if LORA_DTYPE == "auto" and half is not None:
        # DeepSpeed's bf16/fp16 modes hold the module in 16 bits (the fp32 master copies live in its optimizer),
        # but cast nothing of a model zero.Init built: the adapters peft made in fp32 are cast here.
        for p in params:
            p.data = p.data.to(half)
    # [/lora]
    # [ac]
    log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
    # [/ac]
    # [offload]
    optimizer = make_optimizer(params, torch.device("cpu"))  # offload: the optimizer steps in host memory
    # [/offload]
    # [!offload]
    optimizer = make_optimizer(params, device)
    # [/!offload]
    schedule = lr_schedule(args.steps)  # --resume carries on the checkpoint's (resume_lr_schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, schedule) / LR)
    # DeepSpeed owns mixed precision (bf16/fp16 + loss scaling in ds_config), gradient
    # accumulation boundaries (no_sync is implicit), the gradient reduction and clipping.
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=params,
                                                           lr_scheduler=scheduler, config=ds_config)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    dataset, held_out = make_datasets(args)
    sampler, loader = make_loader(dataset, world_size, rank)
    torch.manual_seed(SEED + rank)  # per-rank randomness for augmentation and dropout

    steps, preemption = StepLog(args.steps, device, world_size), Preemption()
    epoch, done_micro = 0, 0
    if args.resume:  # the LR scheduler's state is in DeepSpeed's checkpoint
        path = load_checkpoint(args.out, engine)
        epoch, done_micro = restore_training_state(path, rank, steps, schedule, scheduler)
    while not steps.done:
        sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)  # a new order every epoch; resumed: where it stopped
        for micro, batch in enumerate(loader, start=done_micro + 1):
            loss = compute_loss(engine, batch, engine.device, dtype)
            engine.backward(loss)
            lr = scheduler.get_last_lr()[0]  # the rate this step uses (logged), before engine.step() moves it on
            engine.step()  # steps the optimizer (and the LR schedule) only at accumulation boundaries
            steps.micro_step(loss)
            if micro % GRAD_ACCUM_STEPS:  # not yet an accumulation boundary
                continue
            steps.end_step(lr, engine.get_global_grad_norm())
            steps.evaluate(args.eval_every, evaluate, engine, held_out, world_size, rank, engine.device,
                           None, dtype)
            if checkpoint_due(args, steps, preemption, engine.device, epoch, micro):
                save_checkpoint(args, engine, training_state(steps, schedule), rank)
                steps.restart_clock()
            if steps.done:
                break
        epoch, done_micro = epoch + 1, 0

    if steps.stopped:
        log(f"SIGTERM: stopped after step {steps.step} with a checkpoint; continue with --resume")
    else:
        os.makedirs(args.out, exist_ok=True)
        if final_checkpoint_due(args, steps):
            save_checkpoint(args, engine, training_state(steps, schedule), rank)
        if not args.no_save:
            # [full]
            # The full weights, in DeepSpeed's 16-bit module dtype under bf16/fp16 (ZeRO-3 gathers them module by
            # module: stage3_gather_16bit_weights_on_model_save; every rank takes part), written by rank 0 with the
            # names of the plain model.
            # [zero3]
            full = engine._zero3_consolidated_16bit_state_dict()
            # [/zero3]
            # [!zero3]
            full = engine.module.state_dict()
            # [/!zero3]
            if rank == 0:
                export_weights(engine.module, args, full)
            del full
            # [/full]
            # [lora]
            # The adapters only (the base is unchanged): under ZeRO-3 every rank takes part in gathering the
            # trainable parameters whole, the frozen base stays partitioned; rank 0 writes them (names of the plain
            # module, engine.module).
            adapter = adapter_state_dict(engine.module)
            if rank == 0:
                save_adapter(engine.module, args.out, adapter)
            # [/lora]
            # [lora16]
            if args.export_merged:
                # The whole model in rank 0's host memory: ZeRO-3 gathers it module by module (every rank takes part).
                # [zero3]
                full = engine._zero3_consolidated_16bit_state_dict()
                # [/zero3]
                # [!zero3]
                full = engine.module.state_dict()
                # [/!zero3]
                if rank == 0:
                    export_merged(full, args.out)
            # [/lora16]
    # Clean teardown, so no rank dies on its way out after the work is done. Wait for every rank, let DeepSpeed
    # remove its hooks and buffers while the process group still works, drop our references to the engine, then
    # destroy the group once through DeepSpeed, which also drops the references to its groups that it keeps. Left
    # to the interpreter's exit, all this is freed in no set order while the other rank's connections close.
    dist.barrier()
    engine.destroy()
    del engine, optimizer, scheduler, model, params
    # [zero-init]
    del hf_ds_config
    # [/zero-init]
    gc.collect()
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
