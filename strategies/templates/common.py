# ---------------------------------------------------------------------------------------------
# Model, data, loss, learning rate, memory measurement and the report: shared by every strategy.
# ---------------------------------------------------------------------------------------------
def log(msg: str) -> None:
    """Rank-0-only logging (field notes pitfall 12); a single process (no RANK) is rank 0."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


class SyntheticDataset(torch.utils.data.Dataset):
    """NUM_SAMPLES fixed random samples of the right shape; sample i is the same on every rank.

    To train on real data, pass --data PATH and fill in load_real_dataset() below: it must return
    a map-style Dataset yielding the same dict keys.
    """

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        return make_sample(torch.Generator().manual_seed(DATA_SEED + index), index)


def load_real_dataset(path: str):
    """Plug your dataset in here (one place): return a torch Dataset of dicts with the keys that
    SyntheticDataset yields ("input_ids"/"labels" for language models, "x"/"target" for images)."""
    raise SystemExit(f"--data {path}: edit load_real_dataset() in this script to read your data")


def lr_at(step: int) -> float:
    """Linear warmup to the scaled LR (reached at the end of warmup, not at step 0), then cosine
    decay to 10% (field notes 000 section 3.4: linear scaling rule with warmup)."""
    if step < WARMUP_STEPS:
        return LR * (step + 1) / WARMUP_STEPS
    progress = min(1.0, (step - WARMUP_STEPS) / max(1, TOTAL_STEPS - WARMUP_STEPS))
    return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(params, device):
    """The optimizer the estimate assumed. fused Adam on CUDA: no per-tensor temporaries. bitsandbytes' 8-bit,
    paged and Lion optimizers (paged ones page their states to host memory under GPU memory pressure; on a CPU
    bitsandbytes runs them unpaged) and transformers' Adafactor (factored second moments) are imported only when
    chosen. Adafactor runs at LR under this script's schedule (relative_step=False, no parameter scaling)."""
    fused = {"fused": True} if device.type == "cuda" else {}
    if OPTIMIZER in ("adam", "adamw"):
        cls = torch.optim.AdamW if OPTIMIZER == "adamw" else torch.optim.Adam
        return cls(params, lr=LR, weight_decay=WEIGHT_DECAY if OPTIMIZER == "adamw" else 0.0, **fused)
    if OPTIMIZER in ("adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion"):
        import bitsandbytes as bnb

        cls = {"adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
               "paged-adamw": bnb.optim.PagedAdamW, "lion": bnb.optim.Lion}[OPTIMIZER]
        return cls(params, lr=LR, weight_decay=WEIGHT_DECAY)
    if OPTIMIZER == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=LR, weight_decay=WEIGHT_DECAY, relative_step=False, scale_parameter=False,
                         warmup_init=False)
    if OPTIMIZER not in ("sgd", "sgd-momentum"):
        raise SystemExit(f"OPTIMIZER {OPTIMIZER!r}: make_optimizer() knows adamw, adam, sgd, sgd-momentum, "
                         "adamw-8bit, paged-adamw-8bit, paged-adamw, lion and adafactor")
    return torch.optim.SGD(params, lr=LR, momentum=0.9 if OPTIMIZER == "sgd-momentum" else 0.0)


def aggregate_mean(total: float, count: int, device) -> float:
    """Global mean from per-rank sums and counts (pitfall 10: not a mean of means)."""
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    all_reduce_sum(t)
    return (t[0] / t[1]).item() if t[1] > 0 else float("nan")


class StepLog:
    """Per-optimizer-step bookkeeping shared by every strategy: the global mean loss from per-rank
    sums and counts (pitfall 10), the step time and a rank-0 log line (pitfall 12).

    ``timing_steps`` more steps run after the ``total_steps`` measured ones, to time steps without the
    memory meter: once the last measured step ends, ``meter`` stops (on CPU the profiler it runs slows every
    step down) and the timing steps follow. ``losses`` holds the measured steps' losses, ``step_times`` every
    step's seconds (the measured steps first, then the timing steps)."""

    def __init__(self, total_steps: int, device, meter=None, timing_steps: int = 0) -> None:
        self.total_steps, self.device = total_steps, device
        self.meter, self.timing_steps = meter, max(0, timing_steps)
        self.losses, self.step_times = [], []
        self._sum, self._count, self._t0 = 0.0, 0, time.perf_counter()

    @property
    def done(self) -> bool:
        return len(self.step_times) >= self.total_steps + self.timing_steps

    def micro_step(self, loss) -> None:
        self._sum += loss.item()
        self._count += 1

    def end_step(self, lr: float) -> None:
        mean = aggregate_mean(self._sum, self._count, self.device)
        self.step_times.append(time.perf_counter() - self._t0)
        if len(self.losses) < self.total_steps:
            self.losses.append(mean)
            log(f"step {len(self.losses)}/{self.total_steps} loss {mean:.4f} lr {lr:.3g} {self.step_times[-1]:.2f}s")
            if len(self.losses) == self.total_steps and self.timing_steps and self.meter is not None:
                self.meter.stop()  # the memory figures cover the measured steps; the timing steps run unprofiled
                barrier()  # ranks finish the meter at different times: start the timing steps together
        else:
            timed = len(self.step_times) - self.total_steps
            log(f"timing step {timed}/{self.timing_steps} (memory meter off) loss {mean:.4f} "
                f"{self.step_times[-1]:.3f}s")
        self._sum, self._count, self._t0 = 0.0, 0, time.perf_counter()


def optimizer_step(scaler, optimizer, scheduler, steps: StepLog) -> None:
    """End of an accumulation window: step through the GradScaler (a pass-through unless fp16,
    pitfall 15), release the gradients, advance the LR schedule, log."""
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    steps.end_step(scheduler.get_last_lr()[0])


class MemoryMeter:
    """Peak allocated bytes over the whole run, from before the model is built.

    CUDA: torch.cuda.max_memory_allocated / max_memory_reserved. CPU: CpuPeakMeter (profiler memory
    events; max_memory_reserved has no CPU equivalent and is reported as null).
    """

    def __init__(self, device) -> None:
        self.device = device
        self.cpu = None if device.type == "cuda" else CpuPeakMeter()
        self.stopped = None  # the figures at stop(), once stopped

    def __enter__(self):
        if self.cpu is not None:
            self.cpu.__enter__()
        else:
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def stop(self) -> None:
        """End the measurement before the ``with`` block ends (the steps after it are only timed)."""
        if self.stopped is None:
            if self.cpu is not None:
                self.cpu.__exit__(None, None, None)
            self.stopped = self.result()

    def __exit__(self, *exc) -> None:
        if self.cpu is not None and self.stopped is None:
            self.cpu.__exit__(*exc)

    def result(self) -> dict:
        if self.stopped is not None:
            return dict(self.stopped)
        if self.cpu is not None:
            # raw: the profiler's own running total, before the frees it did not see were put back (CpuPeakMeter)
            return {"peak_allocated_bytes": int(self.cpu.peak_bytes), "peak_reserved_bytes": None,
                    "raw_peak_allocated_bytes": int(self.cpu.raw_peak_bytes), "unseen_frees": self.cpu.unseen_frees}
        return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device))}


def write_report(path: str, rank: int, world_size: int, device, memory: dict, losses: list, step_times: list,
                 extra: dict) -> None:
    """Gather every rank's figures; rank 0 writes one JSON report (pitfall 12)."""
    # step_times_s: one per step, the measured steps' (one per loss) first; profiled_steps: how many of them ran
    # under the CPU memory profiler (the timing steps after them never do; nothing is profiled on CUDA).
    mine = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")), **memory,
            "losses": losses, "step_times_s": step_times, "profiled_steps": 0 if device.type == "cuda" else len(losses),
            **extra}
    everyone = gather_objects(mine, world_size)
    if rank == 0:
        report = {"strategy": STRATEGY, "device": device.type, "world_size": world_size,
                  "steps": len(losses), "precision": PRECISION, "micro_batch_size": MICRO_BATCH_SIZE,
                  "gradient_accumulation_steps": GRAD_ACCUM_STEPS, "estimate": ESTIMATE, "per_rank": everyone}
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
        log(f"report written to {path}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=TOTAL_STEPS, help="optimizer steps to run")
    p.add_argument("--timing-steps", type=int, default=0, help="optimizer steps run after --steps with the memory "
                   "meter stopped, to time steps without the CPU profiler (their losses are only logged)")
    p.add_argument("--data", help="path to a real dataset (see load_real_dataset)")
    p.add_argument("--out", default=".", help="directory for the checkpoint and the report")
    p.add_argument("--report", default="report.json", help="report file name inside --out")
    p.add_argument("--no-save", action="store_true", help="skip the checkpoint")
    # [lora]
    p.add_argument("--init-from", metavar="PATH", default=None, help="the pretrained base to train adapters on (a "
                   "save_pretrained directory for transformers models, else a state_dict file such as model.pt); "
                   "without it the base is freshly initialised from the config, for smoke tests only")
    # [/lora]
    # [lora16]
    p.add_argument("--export-merged", action="store_true", help="also write the base with the trained adapters "
                   "merged in (--out/merged): rank 0 holds the whole base in host RAM to do it")
    # [/lora16]
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed
    p.add_argument("--deepspeed_config", default=None, help=argparse.SUPPRESS)
    return p.parse_args()
