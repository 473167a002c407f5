# --- One process, one device: no launcher, no process group, no wrapper ---
def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(SEED)
    log(f"single process on {device}: micro-batch {MICRO_BATCH_SIZE}, accumulation {GRAD_ACCUM_STEPS} -> "
        f"batch {MICRO_BATCH_SIZE} x {GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * GRAD_ACCUM_STEPS}; lr {LR:g}")
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
    model = add_lora(load_quantized_base(base_dir, device))  # quantized as it loads, onto the device
    # [/qlora]
    # [ac]
    log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
    # [/ac]
    model = model.to(device)
    # [full]
    params = list(model.parameters())
    # [/full]
    # [lora]
    params = trainable_parameters(model)  # the optimizer, clipping and its states cover the adapters only
    # [/lora]
    optimizer = make_optimizer(params, device)
    schedule = lr_schedule(args.steps)  # --resume carries on the checkpoint's (resume_lr_schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, schedule) / LR)
    # fp16 needs a GradScaler to keep small gradients from underflowing; bf16 does not.
    scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
    dataset, held_out = make_datasets(args)
    sampler, loader = make_loader(dataset, 1, 0)
    steps, preemption = StepLog(args.steps, device, 1), Preemption()
    epoch, done_micro = 0, 0
    if args.resume:
        path = load_checkpoint(args.out, model, optimizer)
        epoch, done_micro = restore_training_state(path, 0, steps, schedule, scheduler, scaler)
    while not steps.done:
        sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)  # a new order every epoch
        for micro, batch in enumerate(loader, start=done_micro + 1):
            with torch.autocast(device.type, dtype=half, enabled=half is not None):
                loss = compute_loss(model, batch, device, input_dtype)
            scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
            steps.micro_step(loss)
            if micro % GRAD_ACCUM_STEPS:
                continue  # accumulate: the gradients add up until the last micro-step of the window
            # Clip the true gradients: unscale first (a no-op unless fp16), then clip, then step.
            scaler.unscale_(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
            optimizer_step(scaler, optimizer, scheduler, steps, norm)
            steps.evaluate(args.eval_every, evaluate, model, held_out, 1, 0, device, half, input_dtype)
            if checkpoint_due(args, steps, preemption, device, epoch, micro):
                save_checkpoint(args, model, optimizer, training_state(steps, schedule, scheduler, scaler), 0)
                steps.restart_clock()
            if steps.done:
                break
        epoch, done_micro = epoch + 1, 0

    if steps.stopped:
        log(f"SIGTERM: stopped after step {steps.step} with a checkpoint; continue with --resume")
        return

    os.makedirs(args.out, exist_ok=True)
    if final_checkpoint_due(args, steps):
        save_checkpoint(args, model, optimizer, training_state(steps, schedule, scheduler, scaler), 0)
    if not args.no_save:
        # [full]
        export_weights(model, args)
        # [/full]
        # [lora]
        save_adapter(model, args.out)  # the base is unchanged (--init-from's), so only the adapters
        # [/lora]
        # [lora16]
        if args.export_merged:
            export_merged(model.state_dict(), args.out)
        # [/lora16]


if __name__ == "__main__":
    main()
