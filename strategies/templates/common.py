from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import shutil
import signal
import time
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the script's own names (see loop.py)
    from advisor.models.families.fragments.transformer import DATA_HELP, INIT_FROM_HELP, compute_loss, load_real_dataset, make_sample

    from .collectives import all_reduce_sum, barrier, make_eval_loader
    from .constants import (
        DATA_SEED,
        EVAL_BATCHES,
        EVAL_EVERY,
        EVAL_SAMPLES,
        INIT_FROM,
        KEEP_CHECKPOINTS,
        LR,
        MICRO_BATCH_SIZE,
        MODEL_FLOPS_PER_SAMPLE,
        NUM_SAMPLES,
        OPTIMIZER,
        PEAK_FLOPS_PER_GPU,
        SAVE_EVERY,
        SEQ_LEN,
        TOTAL_STEPS,
        WARMUP_STEPS,
        WEIGHT_DECAY,
    )


# --- Data, evaluation, learning rate, optimizer, step log and checkpoints: shared by every strategy ---
def log(msg: str) -> None:
    """Rank 0 only: one line per step, not one per rank."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


class SyntheticDataset(torch.utils.data.Dataset):
    """Fixed random samples (a smoke test without --data): sample i is the same on every rank; ``offset`` keeps the
    held-out ones apart."""

    def __init__(self, num_samples: int, offset: int = 0) -> None:
        self.num_samples, self.offset = num_samples, offset

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict:
        return make_sample(torch.Generator().manual_seed(DATA_SEED + self.offset + index))


class ResumableSampler(torch.utils.data.Sampler):
    """A sampler whose epoch can start part-way: set_epoch(epoch, skip) passes over the first ``skip`` indices of
    that epoch's order without loading them (a resumed run continues where its checkpoint stopped)."""

    def __init__(self, sampler) -> None:
        self.sampler, self.skip = sampler, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        self.sampler.set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


def make_datasets(args):
    """(training set, held-out set): --data's, else synthetic samples."""
    if not args.data:
        return SyntheticDataset(NUM_SAMPLES), SyntheticDataset(EVAL_SAMPLES, offset=NUM_SAMPLES)
    if not os.path.exists(args.data):
        raise SystemExit(f"--data {args.data}: no such file or directory")
    return load_real_dataset(args)


def evaluate(model, dataset, num_replicas: int, rank: int, device, autocast_dtype=None, input_dtype=None) -> float:
    """Mean held-out loss over at most EVAL_BATCHES micro-batches per data-parallel rank. Loss sums and sample counts
    are added over the ranks (a mean over all samples, not a mean of per-rank means)."""
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        for batch in itertools.islice(make_eval_loader(dataset, num_replicas, rank), EVAL_BATCHES):
            n = len(next(iter(batch.values())))  # samples in this micro-batch
            total += compute_loss(model, batch, device, input_dtype).item() * n
            count += n
    model.train()
    return aggregate_mean(total, count, device)


def lr_schedule(total_steps: int) -> dict:
    """A fresh run's LR schedule (lr_at): warmup over at most a tenth of ``total_steps``, then a cosine from LR, at
    the end of the warmup, down to the floor at the last step."""
    warmup = min(WARMUP_STEPS, max(1, total_steps // 10))
    return {"warmup": warmup, "start": warmup, "start_factor": 1.0, "total": total_steps}


def lr_at(step: int, schedule: dict) -> float:
    """The LR of optimizer step ``step`` (0-based): linear warmup to LR (reached at the end of warmup, not at step 0:
    Goyal et al. 2017), then a cosine from start_factor x LR at step ``start`` down to the floor, 10% of LR, at the
    last step (``total`` - 1)."""
    if step < schedule["warmup"]:
        return LR * (step + 1) / schedule["warmup"]
    start, top = schedule["start"], schedule["start_factor"]
    progress = min(1.0, (step - start) / max(1, schedule["total"] - 1 - start))
    return LR * (0.1 + (top - 0.1) * 0.5 * (1 + math.cos(math.pi * progress)))


def resume_lr_schedule(schedule: dict, saved, step: int, next_lr: float) -> None:
    """--resume at optimizer step ``step``: ``schedule`` (this run's, for its --steps; changed in place) carries on
    the checkpoint's, ``saved``. With the same --steps it is the same; with another, the cosine starts again at
    ``step``, from the LR the old run would have used next, down to the floor at the new --steps (a cosine over the
    new total from the start would send the LR back up). A checkpoint written before schedules were saved has none
    (``saved`` None): its LR scheduler's last LR, ``next_lr``, is the one the old run would have used next."""
    if saved is not None and saved["total"] == schedule["total"]:
        schedule.update(saved)
        return
    if saved is None:
        if step < schedule["warmup"]:
            return  # the warmup goes on
        start, factor = step, next_lr / LR
    else:
        start = max(step, saved["warmup"])  # stopped during the warmup: it ends as planned, then the cosine
        factor, schedule["warmup"] = lr_at(start, saved) / LR, saved["warmup"]
    schedule.update(start=start, start_factor=factor)


def make_optimizer__adam(params, device):
    """The optimizer the estimate assumed (OPTIMIZER: Adam or AdamW) over ``params``."""
    if OPTIMIZER not in ("adam", "adamw"):
        raise SystemExit(f"OPTIMIZER {OPTIMIZER!r}: this script holds Adam's code: emit it again with --optimizer")
    fused = {"fused": True} if device.type == "cuda" else {}  # one kernel for all parameters on CUDA
    cls = torch.optim.AdamW if OPTIMIZER == "adamw" else torch.optim.Adam
    return cls(params, lr=LR, weight_decay=WEIGHT_DECAY if OPTIMIZER == "adamw" else 0.0, **fused)


def make_optimizer__adam_in_backward(params, device):
    """The optimizer step in backward (torchtune's optimizer_in_bwd): one Adam or AdamW (OPTIMIZER) per parameter,
    each stepped in that parameter's post-accumulate-grad hook as soon as backward has its gradient, which is then
    freed (OptimizerInBackward): one parameter's gradient alive at a time instead of all of them."""
    if OPTIMIZER not in ("adam", "adamw"):
        raise SystemExit(f"OPTIMIZER {OPTIMIZER!r}: this script holds Adam's code: emit it again with --optimizer")
    fused = {"fused": True} if device.type == "cuda" else {}  # one kernel per parameter's step on CUDA
    cls = torch.optim.AdamW if OPTIMIZER == "adamw" else torch.optim.Adam
    decay = WEIGHT_DECAY if OPTIMIZER == "adamw" else 0.0
    return OptimizerInBackward(params, lambda one: cls(one, lr=LR, weight_decay=decay, **fused))


class OptimizerInBackward(torch.optim.Optimizer):
    """One optimizer per parameter (``make([p])``), stepped by the parameter's post-accumulate-grad hook, which then
    frees the gradient. This object is what the LR schedule and the checkpoints see: its one param group carries the
    LR, copied to each parameter's optimizer before its step; its state dict holds theirs. Its own step does nothing
    (the parameters stepped in backward): no gradient is left for clipping, so none is done."""

    def __init__(self, params, make) -> None:
        params = list(params)
        super().__init__(params, {"lr": LR})
        self.each = [make([p]) for p in params]
        for p, one in zip(params, self.each, strict=True):
            p.register_post_accumulate_grad_hook(lambda _p, one=one: self.step_one(one))

    def step_one(self, one) -> None:
        one.param_groups[0]["lr"] = self.param_groups[0]["lr"]
        one.step()
        one.zero_grad(set_to_none=True)

    def step(self, closure=None) -> None:
        """Nothing left to step (backward did); called so the LR schedule counts the step."""

    def state_dict(self) -> dict:
        return {"lr": self.param_groups[0]["lr"], "each": [one.state_dict() for one in self.each]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.param_groups[0]["lr"] = state_dict["lr"]
        for one, saved in zip(self.each, state_dict["each"], strict=True):
            one.load_state_dict(saved)


def make_optimizer__sgd(params, device):
    """The optimizer the estimate assumed (OPTIMIZER: SGD, with or without momentum) over ``params``."""
    if OPTIMIZER not in ("sgd", "sgd-momentum"):
        raise SystemExit(f"OPTIMIZER {OPTIMIZER!r}: this script holds SGD's code: emit it again with --optimizer")
    return torch.optim.SGD(params, lr=LR, momentum=0.9 if OPTIMIZER == "sgd-momentum" else 0.0)


def bnb_optimizer_class():
    """bitsandbytes' optimizer class for OPTIMIZER: its 8-bit, paged and Lion optimizers; the paged ones move their
    states to host memory under GPU memory pressure (on a CPU bitsandbytes runs them unpaged)."""
    import bitsandbytes as bnb

    classes = {"adamw-8bit": bnb.optim.AdamW8bit, "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
               "paged-adamw": bnb.optim.PagedAdamW, "lion": bnb.optim.Lion}
    if OPTIMIZER not in classes:
        raise SystemExit(f"OPTIMIZER {OPTIMIZER!r}: this script holds bitsandbytes' optimizers: emit it again with "
                         "--optimizer")
    return classes[OPTIMIZER]


def make_optimizer__bnb(params, device):
    """The optimizer the estimate assumed (OPTIMIZER: one of bitsandbytes') over ``params``."""
    return bnb_optimizer_class()(params, lr=LR, weight_decay=WEIGHT_DECAY)


def make_optimizer__bnb_in_backward(params, device):
    """The optimizer step in backward (torchtune's optimizer_in_bwd, which takes any optimizer class) with one of
    bitsandbytes' optimizers (OPTIMIZER) per parameter, each stepped in that parameter's post-accumulate-grad hook
    (OptimizerInBackward): one parameter's gradient alive at a time. bitsandbytes steps each tensor of a group on its
    own (its 8-bit states are quantized per tensor), so one optimizer per parameter steps as one over all of them."""
    cls = bnb_optimizer_class()
    return OptimizerInBackward(params, lambda one: cls(one, lr=LR, weight_decay=WEIGHT_DECAY))


def make_optimizer__adafactor(params, device):
    """The optimizer the estimate assumed (OPTIMIZER: transformers' Adafactor) over ``params``."""
    if OPTIMIZER != "adafactor":
        raise SystemExit(f"OPTIMIZER {OPTIMIZER!r}: this script holds Adafactor's code: emit it again with --optimizer")
    from transformers.optimization import Adafactor

    # transformers' Adafactor (factored second moments) at LR under this script's schedule
    return Adafactor(params, lr=LR, weight_decay=WEIGHT_DECAY, relative_step=False, scale_parameter=False,
                     warmup_init=False)


def aggregate_mean(total: float, count: int, device) -> float:
    """Global mean from per-rank sums and counts."""
    t = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
    all_reduce_sum(t)
    return (t[0] / t[1]).item() if t[1] > 0 else float("nan")


class StepLog:
    """Per-optimizer-step bookkeeping: the global mean loss, step time, throughput and a rank-0 log line; ``losses``,
    ``step_times``, ``grad_norms`` and ``eval_losses`` keep this run's figures."""

    def __init__(self, total_steps: int, device, dp_size: int) -> None:
        self.total_steps, self.device, self.dp_size = total_steps, device, dp_size
        self.losses, self.step_times, self.grad_norms, self.eval_losses = [], [], [], []
        self.start = 0  # optimizer steps done before this run (a resumed one starts after its checkpoint's)
        self.stopped = False  # SIGTERM: the run ends at this step boundary (checkpoint_due)
        self.at, self.saved_step = (0, 0), None  # (epoch, micro-batch) of the last step; the step last checkpointed
        self._sum, self._count, self._t0 = 0.0, 0, time.perf_counter()

    @property
    def step(self) -> int:  # optimizer steps done, counting those before a resume
        return self.start + len(self.step_times)

    @property
    def done(self) -> bool:
        return self.stopped or self.step >= self.total_steps

    def restart_clock(self) -> None:  # leave an evaluation or a checkpoint out of the next step's time
        self._t0 = time.perf_counter()

    def evaluate(self, every: int, run, *args) -> None:
        """``run(*args)`` (the held-out loss) after every ``every`` steps and after the last (``every`` 0: never)."""
        if every <= 0 or (self.step % every and not self.done):
            return
        self.eval_losses.append([self.step, run(*args)])
        log(f"eval after step {self.step}: held-out loss {self.eval_losses[-1][1]:.4f}")
        self.restart_clock()

    def micro_step(self, loss) -> None:
        self._sum += loss.item()
        self._count += 1

    def end_step(self, lr: float, grad_norm=None) -> None:
        """Log the step: mean loss over every rank, the LR it used, the gradient norm before clipping, seconds,
        throughput of all data-parallel ranks and, on CUDA, the MFU and this rank's peak allocated memory."""
        samples = MICRO_BATCH_SIZE * self._count * self.dp_size
        mean = aggregate_mean(self._sum, self._count, self.device)
        seconds = time.perf_counter() - self._t0
        self.losses.append(mean)
        self.step_times.append(seconds)
        line = f"step {self.step}/{self.total_steps} loss {mean:.4f} lr {lr:.3g}"
        if grad_norm is not None:
            self.grad_norms.append(float(grad_norm))
            line += f" grad norm {self.grad_norms[-1]:.3g}"
        line += f" {seconds:.2f}s {throughput(samples, seconds)}"
        if self.device.type == "cuda":
            line += f"{mfu(samples, seconds)} peak {torch.cuda.max_memory_allocated(self.device) / 2**30:.2f} GiB"
        log(line)
        self._sum, self._count, self._t0 = 0.0, 0, time.perf_counter()


def throughput__tokens(samples: int, seconds: float) -> str:
    return f"{samples * SEQ_LEN / seconds:,.0f} tokens/s"


def throughput__samples(samples: int, seconds: float) -> str:
    return f"{samples / seconds:,.1f} samples/s"


def mfu__known(samples: int, seconds: float) -> str:
    """MFU: model FLOPs per second over the dense peak of every GPU of the run (PaLM paper, appendix B)."""
    gpus = int(os.environ.get("WORLD_SIZE", "1"))
    return f" MFU {MODEL_FLOPS_PER_SAMPLE * samples / seconds / (PEAK_FLOPS_PER_GPU * gpus):.1%}"


def mfu__unknown(samples: int, seconds: float) -> str:
    """No MFU: the planned GPU's peak FLOP/s is not known (set PEAK_FLOPS_PER_GPU and MODEL_FLOPS_PER_SAMPLE)."""
    return ""


class Preemption:
    """SIGTERM (SLURM's --signal before the time limit, a preemption) only raises a flag; the ranks agree on it at a
    step boundary (a one-number all-reduce), so every rank saves the same step, then the script exits 0."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, lambda signum, frame: setattr(self, "requested", True))

    def agreed(self, device) -> bool:
        flag = torch.tensor([float(self.requested)], device=device)
        all_reduce_sum(flag)
        return bool(flag.item() > 0)


def checkpoint_due(args, steps, preemption, device, epoch: int, micro: int) -> bool:
    """At a step boundary ``micro`` micro-batches into ``epoch``: every --save-every steps, and on SIGTERM (which
    also ends the run). The last step's checkpoint comes after training (final_checkpoint_due)."""
    steps.at = (epoch, micro)
    steps.stopped = preemption.agreed(device) or steps.stopped  # a collective: every rank calls it
    due = steps.stopped or (args.save_every > 0 and steps.step % args.save_every == 0 and not steps.done)
    if due:
        steps.saved_step = steps.step
    return due


def final_checkpoint_due(args, steps) -> bool:
    return not args.no_save and steps.saved_step != steps.step


def checkpoint_dir(out: str, step: int) -> str:
    return os.path.join(out, "checkpoints", f"step-{step}")


def latest_checkpoint(out: str) -> str:
    """--resume: the checkpoint named by --out/checkpoints/latest."""
    root = os.path.join(out, "checkpoints")
    try:
        with open(os.path.join(root, "latest")) as f:
            path = os.path.join(root, f.read().strip())
    except FileNotFoundError:
        raise SystemExit(f"--resume: no checkpoint in {root}: checkpoints are written every --save-every steps "
                         "and on SIGTERM") from None
    if not os.path.isdir(path):
        raise SystemExit(f"--resume: {root}/latest names {os.path.basename(path)}, which is missing: point 'latest' "
                         "at a step-N directory that exists")
    return path


def unreadable(path: str, err: Exception) -> SystemExit:
    first = (str(err).splitlines() or [""])[0][:200]
    return SystemExit(f"--resume: {path} is unreadable or belongs to another model ({type(err).__name__}: {first})")


def commit_checkpoint(args, step: int, rank: int) -> None:
    """Once every rank has written step-N, rank 0 points 'latest' at it (renamed over it: a crash never leaves it
    half-written) and removes all but the newest --keep-checkpoints, never the one just written."""
    barrier()
    if rank == 0:
        root = os.path.join(args.out, "checkpoints")
        with open(os.path.join(root, "latest.tmp"), "w") as f:
            f.write(f"step-{step}")
        os.replace(os.path.join(root, "latest.tmp"), os.path.join(root, "latest"))
        done = sorted(int(d.removeprefix("step-")) for d in os.listdir(root) if re.fullmatch(r"step-\d+", d))
        for old in done[:-args.keep_checkpoints]:
            if old != step:  # an earlier run into this --out may have left later steps
                shutil.rmtree(os.path.join(root, f"step-{old}"))
        log(f"checkpoint: {checkpoint_dir(args.out, step)} (continue with --resume)")
    barrier()


def training_state(steps, schedule: dict, scheduler=None, scaler=None) -> dict:
    """What a resumed run needs besides the model and the optimizer: the step, the position in the epoch, the LR
    schedule (lr_at's and the scheduler's), the fp16 loss scale and this rank's random number generators."""
    epoch, micro = steps.at
    return {"step": steps.step, "epoch": epoch, "micro": micro, "lr_schedule": dict(schedule),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None, "cpu_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def save_training_state(path: str, rank: int, state: dict) -> None:
    torch.save(state, os.path.join(path, f"training-state-rank{rank}.pt"))


def restore_training_state(path: str, rank: int, steps, schedule: dict, scheduler, scaler=None) -> tuple[int, int]:
    """This rank's training state from checkpoint ``path`` (the LR scheduler's too, unless DeepSpeed's checkpoint
    holds it); returns (epoch, micro-batches of it already done)."""
    try:
        state = torch.load(os.path.join(path, f"training-state-rank{rank}.pt"), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as err:
        raise unreadable(path, err) from None
    if state["step"] >= steps.total_steps:
        raise SystemExit(f"--resume: {path} is at step {state['step']} and --steps is {steps.total_steps}: raise "
                         "--steps to train further")
    if state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    resume_lr_schedule(schedule, state.get("lr_schedule"), state["step"], scheduler.get_last_lr()[0])
    if scaler is not None:
        scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda_rng"])
    steps.start = state["step"]
    log(f"resumed from {path}: step {state['step']}, epoch {state['epoch']}, micro-batch {state['micro']}")
    return state["epoch"], state["micro"]


# The options (flags, add_argument's keywords): every script's, then the data's, the export's and the launcher's.
OPTIONS = (
    (("--steps",), {"type": int, "default": TOTAL_STEPS, "help": "optimizer steps to run"}),
    (("--init-from",), {"metavar": "PATH", "default": INIT_FROM, "help": INIT_FROM_HELP}),
    (("--save-every",), {"type": int, "default": SAVE_EVERY, "help": "write a resumable checkpoint every N optimizer "
                         "steps into --out/checkpoints (0: only on SIGTERM and after the last step)"}),
    (("--keep-checkpoints",), {"type": int, "default": KEEP_CHECKPOINTS, "help": "newest checkpoints kept"}),
    (("--resume",), {"action": "store_true", "help": "continue from the latest checkpoint in --out/checkpoints: model, "
                     "optimizer, LR schedule, step, position in the epoch and every rank's random state"}),
    (("--eval-every",), {"type": int, "default": EVAL_EVERY, "help": "evaluate on the held-out set every N optimizer "
                         "steps and after the last (0: never)"}),
)
DATA_OPTIONS__files = ((("--data",), {"metavar": "PATH", "default": None, "help": DATA_HELP}),)
DATA_OPTIONS__text = (
    (("--data",), {"metavar": "PATH", "default": None, "help": DATA_HELP}),
    (("--tokenizer",), {"metavar": "DIR", "default": None, "help": "the tokenizer for --data (a save_pretrained "
                        "directory or hub id); None: --init-from's"}),
)
EXPORT_OPTIONS__plain = (
    (("--out",), {"default": ".", "help": "directory for the checkpoints and the trained weights"}),
    (("--no-save",), {"action": "store_true", "help": "skip the checkpoint after the last step and the exported "
                      "weights (periodic checkpoints are still written)"}),
)
EXPORT_OPTIONS__merged = (
    (("--out",), {"default": ".", "help": "directory for the checkpoints and the trained weights"}),
    (("--no-save",), {"action": "store_true", "help": "skip the checkpoint after the last step and the exported "
                      "weights (periodic checkpoints are still written)"}),
    (("--export-merged",), {"action": "store_true", "help": "also write the base with the trained adapters merged in "
                            "(--out/merged): rank 0 holds the whole base in host RAM to do it"}),
)
LAUNCHER_OPTIONS__torchrun = ((("--check-args",), {"action": "store_true", "help": argparse.SUPPRESS}),)
LAUNCHER_OPTIONS__deepspeed = (  # the deepspeed launcher passes --local_rank and, from launch.sh, --deepspeed_config
    (("--check-args",), {"action": "store_true", "help": argparse.SUPPRESS}),
    (("--local_rank", "--local-rank"), {"type": int, "default": None, "help": argparse.SUPPRESS}),
    (("--deepspeed_config",), {"default": None, "help": argparse.SUPPRESS}),
)


class OptionParser(argparse.ArgumentParser):
    """argparse's parser, with a bad option's error on one line (the usage is --help's) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args():
    """The options, checked. launch.sh and slurm.sbatch run the script once with --check-args before the launcher
    starts a process per GPU (each would print the same error): it exits 0 when the options are good, 2 with one
    line when one is bad, 3 after printing --help."""
    p = OptionParser(description=__doc__.splitlines()[0], add_help=False,
                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-h", "--help", action="store_true", default=argparse.SUPPRESS, help="show this help and exit")
    for flags, options in (*OPTIONS, *DATA_OPTIONS, *EXPORT_OPTIONS, *LAUNCHER_OPTIONS):
        p.add_argument(*flags, **options)
    args = p.parse_args()
    if "help" in args:
        p.print_help()
        raise SystemExit(3 if args.check_args else 0)
    # One-line errors instead of tracebacks: counts out of range, local paths that do not exist (a hub id such as
    # org/name is not one).
    for flag, value, low in (("--steps", args.steps, 1), ("--eval-every", args.eval_every, 0),
                             ("--save-every", args.save_every, 0), ("--keep-checkpoints", args.keep_checkpoints, 1)):
        if value < low:
            p.error(f"{flag} must be {low} or more, got {value}")
    for flag, value in (("--init-from", args.init_from), ("--tokenizer", getattr(args, "tokenizer", None))):
        local = value and (value.startswith((".", "/", "~")) or value.count("/") > 1
                           or value.endswith((".pt", ".pth", ".bin", ".safetensors")))
        if local and not os.path.exists(os.path.expanduser(value)):
            p.error(f"{flag} {value}: no such file or directory")
    if args.data is not None and not os.path.exists(os.path.expanduser(args.data)):
        p.error(f"--data {args.data}: no such file or directory")
    if args.data is not None and "tokenizer" in args and not (args.tokenizer or args.init_from):
        p.error("--data needs a tokenizer: pass --tokenizer DIR (or --init-from DIR, which has one)")
    # --out must take files: the nearest folder that exists (the rest is created) takes a test file (root passes
    # os.access on read-only file systems such as /proc, so the file is written, then removed).
    out = os.path.abspath(os.path.expanduser(args.out))
    while not os.path.exists(out):
        out = os.path.dirname(out)
    probe = os.path.join(out, f".write-check-{os.getpid()}")
    try:
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as err:
        p.error(f"--out {args.out}: {out} cannot take files ({err.strerror}): pass a writable directory")
    if args.resume:
        try:
            latest_checkpoint(args.out)
        except SystemExit as err:  # no checkpoint to resume from: one line now, not one per rank later
            p.error(str(err))
    elif os.path.exists(os.path.join(args.out, "checkpoints", "latest")):
        # Starting over there would point 'latest' at the new run and replace the exported weights.
        p.error(f"--out {args.out} holds an earlier run's checkpoints: pass --resume to continue it, or a new --out")
    if args.check_args:
        raise SystemExit(0)
    return args


DATA_OPTIONS = DATA_OPTIONS__text
EXPORT_OPTIONS = EXPORT_OPTIONS__plain
LAUNCHER_OPTIONS = LAUNCHER_OPTIONS__torchrun
mfu = mfu__unknown
throughput = throughput__tokens
