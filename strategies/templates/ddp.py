# ---------------------------------------------------------------------------------------------
# DDP
# ---------------------------------------------------------------------------------------------
def use_sync_batchnorm(model, micro_batch_size: int, device_type: str) -> tuple[bool, str]:
    """SyncBatchNorm when the model has BatchNorm, the per-GPU batch is small (<= 32, field notes
    pitfall 8) and the device is CUDA (SyncBatchNorm refuses CPU tensors)."""
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if not has_bn:
        return False, "no BatchNorm layers"
    if micro_batch_size > SYNC_BN_MAX_MICRO_BATCH:
        return False, f"per-GPU batch {micro_batch_size} is large enough for per-GPU statistics"
    if device_type != "cuda":
        return False, "SyncBatchNorm needs CUDA tensors; on CPU each rank keeps its own BatchNorm statistics"
    return True, f"per-GPU batch {micro_batch_size} is small: BatchNorm statistics synchronised across ranks"


def main() -> None:
    args = parse_args()
    rank, local_rank, world_size, device = init_torchrun()  # pitfalls 1 and 2
    torch.manual_seed(SEED)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    log(f"DDP: world size {world_size}, micro-batch {MICRO_BATCH_SIZE}/GPU, accumulation {GRAD_ACCUM_STEPS} "
        f"-> global batch {MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = "
        f"{MICRO_BATCH_SIZE * world_size * GRAD_ACCUM_STEPS}; lr {LR:g} (linear scaling)")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(PRECISION)
    comm = {"allreduce_calls": 0}

    # [qlora]
    base_dir = args.init_from or save_test_base(args.out)  # before the meter: the test base's save is not training
    # [/qlora]
    meter = MemoryMeter(device)
    with meter:
        # [full]
        model = build_model()
        if PRECISION == "pure-bf16":
            model = model.to(torch.bfloat16)
        # [/full]
        # [lora16]
        model = add_lora(build_base(args, base_dtype()))  # the base frozen in its dtype, the adapters trainable
        # [/lora16]
        # [qlora]
        model = add_lora(load_quantized_base(base_dir, device))  # every rank holds the quantized base
        # [/qlora]
        if ACTIVATION_CHECKPOINTING:
            log(f"activation checkpointing on {enable_activation_checkpointing(model)} blocks")
        sync_bn, why = use_sync_batchnorm(model, MICRO_BATCH_SIZE, device.type)
        log(f"SyncBatchNorm: {'on' if sync_bn else 'off'} ({why})")
        if sync_bn:
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(device)
        ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None, gradient_as_bucket_view=True)
        # DDP's initial parameter broadcast can leave a params-sized receive buffer in a reference
        # cycle on ranks != 0 (measured with gloo); free it now rather than at a random later GC.
        gc.collect()

        def counting_allreduce(state, bucket):  # counts all-reduces to show no_sync() at work
            comm["allreduce_calls"] += 1
            return allreduce_hook(dist.group.WORLD, bucket)

        ddp.register_comm_hook(None, counting_allreduce)
        # [full]
        optimizer = make_optimizer(ddp.parameters(), device)
        # [/full]
        # [lora]
        # The adapters only: DDP reduces their gradients alone (frozen parameters join no bucket).
        trainable = trainable_parameters(ddp)
        optimizer = make_optimizer(trainable, device)
        # [/lora]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s) / LR)
        # Pitfall 15: fp16 needs a GradScaler; bf16 does not.
        scaler = torch.amp.GradScaler(device.type, enabled=PRECISION == "fp16")
        dataset = load_real_dataset(args.data) if args.data else SyntheticDataset(NUM_SAMPLES)
        sampler, loader = make_loader(dataset, world_size, rank)
        torch.manual_seed(SEED + rank)  # pitfall 11: per-rank randomness for augmentation/dropout

        steps, seen, calls_per_micro_step = StepLog(args.steps, device, meter, args.timing_steps), {}, []
        epoch = 0
        while not steps.done:
            sampler.set_epoch(epoch)  # pitfall 4: a new order every epoch
            seen[epoch] = []
            for micro, batch in enumerate(loader, start=1):
                seen[epoch] += batch["index"].tolist()
                last_micro = micro % GRAD_ACCUM_STEPS == 0
                # Pitfall 16: skip the gradient all-reduce on non-final accumulation steps.
                with (contextlib.nullcontext() if last_micro else ddp.no_sync()):
                    with torch.autocast(device.type, dtype=half, enabled=half is not None):
                        loss = compute_loss(ddp, batch, device)
                    scaler.scale(loss / GRAD_ACCUM_STEPS).backward()
                steps.micro_step(loss)
                calls_per_micro_step.append(comm["allreduce_calls"])
                comm["allreduce_calls"] = 0
                if not last_micro:
                    continue
                optimizer_step(scaler, optimizer, scheduler, steps)
                if steps.done:
                    break
            epoch += 1

    # [lora]
    eval_loss = lora_eval_loss(ddp.module, dataset, device, None, half)
    # [/lora]
    os.makedirs(args.out, exist_ok=True)
    if not args.no_save:
        # [full]
        # Pitfall 7: the plain module's weights (no "module." prefix), written by rank 0 only.
        if rank == 0:
            torch.save(ddp.module.state_dict(), os.path.join(args.out, "model.pt"))
            log(f"checkpoint: {os.path.join(args.out, 'model.pt')} (loads into build_model())")
        # [/full]
        # [lora]
        # Pitfall 7: the plain module's adapters (no "module." prefix), written by rank 0 only; the base is unchanged
        # (--init-from's, or the config's fresh one), so no model.pt.
        if rank == 0:
            save_adapter(ddp.module, args.out)
        # [/lora]
        # [lora16]
        if args.export_merged and rank == 0:
            export_merged(ddp.module.state_dict(), args.out)
        # [/lora16]
        dist.barrier()
    write_report(os.path.join(args.out, args.report), rank, world_size, device, meter.result(), steps.losses,
                 steps.step_times, {"allreduce_calls_per_micro_step": calls_per_micro_step, "sample_indices": seen,
                              # [lora]
                              "final_eval_loss": eval_loss, "trainable_params": sum(p.numel() for p in trainable),
                              # [/lora]
                              "sync_batchnorm": sync_bn})
    dist.destroy_process_group()  # pitfall 19


if __name__ == "__main__":
    main()
