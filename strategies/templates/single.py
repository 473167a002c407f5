# ---------------------------------------------------------------------------------------------
# One process, one device: no launcher, no process group, no wrapper
# ---------------------------------------------------------------------------------------------
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
    # Pure bf16 has no autocast to cast the inputs: image inputs are cast by hand (token ids stay integers).
    input_dtype = torch.bfloat16 if PRECISION == "pure-bf16" else None

    # [qlora]
    base_dir = args.init_from or save_test_base(args.out)  # before the meter: the test base's save is not training
    # [/qlora]
    meter = MemoryMeter(device, args.measure_memory)
    with meter:
        # [full]
        model = build_model(args.init_from)
        if PRECISION == "pure-bf16":
            model = model.to(torch.bfloat16)
        # [/full]
        # [lora16]
        model = add_lora(build_base(args, base_dtype()))  # the base frozen in its dtype, the adapters trainable
        # [/lora16]
        # [qlora]
        model = add_lora(load_quantized_base(base_dir, device))  # quantized as it loads, onto the device
        # [/qlora]
        if ACTIVATION_CHECKPOINTING:
            log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
        model = model.to(device)
        # [full]
        optimizer = make_optimizer(model.parameters(), device)
        # [/full]
        # [lora]
        trainable = trainable_parameters(model)  # the optimizer, clipping and its states cover the adapters only
        optimizer = make_optimizer(trainable, device)
        # [/lora]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, args.steps) / LR)
        # Pitfall 15: fp16 needs a GradScaler; bf16 does not.
        scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
        dataset, held_out = make_datasets(args)
        sampler, loader = make_loader(dataset, 1, 0)
        steps, seen, grad_norms = StepLog(args.steps, device, meter, args.timing_steps), {}, []
        preemption = Preemption()
        epoch, done_micro = 0, 0
        if args.resume:
            path = load_checkpoint(args.out, model, optimizer)
            epoch, done_micro = restore_training_state(path, 0, steps, scheduler, scaler)
        while not steps.done:
            sampler.set_epoch(epoch, skip=done_micro * MICRO_BATCH_SIZE)  # a new order every epoch
            seen[epoch] = []
            for micro, batch in enumerate(loader, start=done_micro + 1):
                seen[epoch] += batch["index"].tolist()
                with torch.autocast(device.type, dtype=half, enabled=half is not None):
                    loss = compute_loss(model, batch, device, input_dtype)
                scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
                steps.micro_step(loss)
                if micro % GRAD_ACCUM_STEPS:
                    continue  # accumulate: the gradients add up until the last micro-step of the window
                # Clip the true gradients: unscale first (a no-op unless fp16), then clip, then step.
                scaler.unscale_(optimizer)
                # [full]
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)))
                # [/full]
                # [lora]
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(trainable, MAX_GRAD_NORM)))
                # [/lora]
                optimizer_step(scaler, optimizer, scheduler, steps)
                steps.evaluate(args.eval_every, evaluate, model, held_out, 1, 0, device, half, input_dtype)
                if checkpoint_due(args, steps, preemption, device, epoch, micro):
                    save_checkpoint(args, model, optimizer, training_state(steps, scheduler, scaler), 0)
                    steps.restart_clock()
                if steps.done:
                    break
            epoch, done_micro = epoch + 1, 0

    if steps.stopped:
        log(f"SIGTERM: stopped after step {steps.step} with a checkpoint; continue with --resume")
        return

    # [lora]
    eval_loss = lora_eval_loss(model, dataset, device, input_dtype, half)
    # [/lora]
    os.makedirs(args.out, exist_ok=True)
    if final_checkpoint_due(args, steps):
        save_checkpoint(args, model, optimizer, training_state(steps, scheduler, scaler), 0)
    if not args.no_save:
        # [full]
        # The plain module's weights: loads into build_model() as it is.
        torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
        log(f"checkpoint: {os.path.join(args.out, 'model.pt')} (loads into build_model())")
        # [/full]
        # [lora]
        # The adapters only: the base is unchanged (--init-from's, or the config's fresh one), so no model.pt.
        save_adapter(model, args.out)
        # [/lora]
        # [lora16]
        if args.export_merged:
            export_merged(model.state_dict(), args.out)
        # [/lora16]
    write_report(os.path.join(args.out, args.report), 0, 1, device, meter.result(), steps,
                 # [full]
                 {"sample_indices": seen, "grad_norms": grad_norms})
                 # [/full]
                 # [lora]
                 {"sample_indices": seen, "grad_norms": grad_norms, "final_eval_loss": eval_loss,
                  "trainable_params": sum(p.numel() for p in trainable)})
                 # [/lora]


if __name__ == "__main__":
    main()
