# ---------------------------------------------------------------------------------------------
# DeepSpeed ZeRO (stage, offload, buckets and precision are in ds_config.json)
# ---------------------------------------------------------------------------------------------
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
    # Pitfall 1: the process group exists before the engine wraps the model.
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED)
    stage = ds_config["zero_optimization"]["stage"]
    log(f"ZeRO-{stage}: world size {world_size}, micro-batch {MICRO_BATCH_SIZE}/GPU, accumulation "
        f"{GRAD_ACCUM_STEPS} -> global batch {MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = "
        f"{ds_config['train_batch_size']}; lr {LR:g} (linear scaling)")
    meter = MemoryMeter(device)
    with meter:
        # ZERO_INIT: ZeRO-3 partitions the parameters as they are created, so no rank ever holds the full
        # model. torchvision models re-initialise weights after creation, which partitioned weights
        # cannot take; they are small enough to build whole and partition in deepspeed.initialize.
        init = deepspeed.zero.Init(config_dict_or_path=ds_config) if ZERO_INIT else contextlib.nullcontext()
        with init:
            model = build_model()
        if ACTIVATION_CHECKPOINTING:
            log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
        optimizer = make_optimizer(model.parameters(), torch.device("cpu") if OFFLOAD else device)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s) / LR)
        # DeepSpeed owns mixed precision (bf16/fp16 + loss scaling in ds_config), gradient
        # accumulation boundaries (no_sync is implicit) and the gradient reduction.
        engine, optimizer, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer,
                                                               lr_scheduler=scheduler, config=ds_config)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
        dataset = load_real_dataset(args.data) if args.data else SyntheticDataset(NUM_SAMPLES)
        sampler, loader = make_loader(dataset, world_size, rank)
        torch.manual_seed(SEED + rank)  # pitfall 11

        steps = StepLog(args.steps, device, meter, args.timing_steps)
        epoch = 0
        while not steps.done:
            sampler.set_epoch(epoch)  # pitfall 4
            for micro, batch in enumerate(loader, start=1):
                loss = compute_loss(engine, batch, engine.device, dtype)
                engine.backward(loss)
                engine.step()  # steps the optimizer only at accumulation boundaries
                steps.micro_step(loss)
                if micro % GRAD_ACCUM_STEPS:  # not yet an accumulation boundary
                    continue
                steps.end_step(scheduler.get_last_lr()[0])
                if steps.done:
                    break
            epoch += 1

    os.makedirs(args.out, exist_ok=True)
    if not args.no_save:
        # Full 16-bit weights gathered from all ranks (ZeRO-3: stage3_gather_16bit_weights_on_model_save),
        # saved by rank 0 as a plain state_dict without a "module." prefix (pitfall 7).
        engine.save_16bit_model(args.out, "model.pt")
        log(f"checkpoint: {os.path.join(args.out, 'model.pt')} (loads into build_model())")
        dist.barrier()
    write_report(os.path.join(args.out, args.report), rank, world_size, device, meter.result(), steps.losses,
                 steps.step_times, {"zero_stage": stage, "offload": OFFLOAD})
    # Clean teardown, so no rank dies on its way out after the work is done. Wait for every rank (rank 0
    # has just written the report), let DeepSpeed remove its hooks and buffers while the process group
    # still works, drop our references to the engine, then destroy the group once (pitfall 19) through
    # DeepSpeed, which also drops the references to its groups that it keeps. Left to the interpreter's
    # exit, all this is freed in no set order while the other rank's connections close.
    dist.barrier()
    engine.destroy()
    del engine, optimizer, scheduler, model
    gc.collect()
    deepspeed.comm.destroy_process_group()  # pitfall 19


if __name__ == "__main__":
    main()
