"""advisor's measurement probe: runs a generated train.py unchanged and writes the report --verify, bench and
the tests read, so that nothing of the measurement lives in the script a user keeps.

    python _advisor_probe.py [--measured-steps N] train.py [train.py's options]

(launched in place of train.py: ``torchrun ... _advisor_probe.py --measured-steps 6 train.py --steps 11 --out out``;
the deepspeed launcher's ``--local_rank=N``, put right after the program, is handed on to train.py.)

It loads train.py as a module (its ``main()`` is not run on import), wraps some of the script's own functions and
a few torch / DeepSpeed entry points, calls ``main()``, and records per rank:

- the peak allocated memory from the start of the run: CUDA ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved``; CPU ``advisor.measure.CpuPeakMeter`` (profiler memory events). The meter stops after
  ``--measured-steps`` optimizer steps (the CPU profiler slows every step down; the steps after it are timed
  only). QLoRA's stand-in base, written by ``save_test_base`` when no --init-from is given, is left out: the meter
  starts again after it.
- the losses, step times and held-out losses from the script's ``StepLog``;
- DDP: all-reduce calls per micro-step (a counting comm hook on every DistributedDataParallel); FSDP2:
  reduce-scatters per micro-step (a post-accumulate-grad hook on one parameter per unit) and the sharding;
  ZeRO: the stage and, at stage 3, each rank's partition; TP: the mesh coordinates;
- the sample indices every rank drew per epoch (from the script's ``ResumableSampler``), whether SyncBatchNorm was
  used, and the trained model's loss on the first micro-batch (``final_eval_loss``, compared with the exported
  weights by the tests).

The report (``--out``/report.json, the format ``advisor.run_report.read_report`` reads) is gathered to rank 0 when the
script destroys its process group (one process: when ``main()`` returns).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import sys
import weakref

import torch

from advisor.measure import CpuPeakMeter

CPU_METER = CpuPeakMeter  # bench.diagnose swaps in its recording meter


class Probe:
    """The figures of one rank; ``install(train)`` wraps the script module's functions."""

    def __init__(self, measured_steps: int | None) -> None:
        self.measured_steps = measured_steps
        self.cuda = torch.cuda.is_available()
        self.cpu_meter = None
        self.memory: dict | None = None  # the figures once the meter stopped
        self.args = None  # train.py's parsed options
        self.steps = None  # the script's StepLog
        self.comm_calls = 0
        self.per_micro_step: list[int] = []
        self.comm_key: str | None = None  # "allreduce_calls_per_micro_step" or "reduce_scatters_per_micro_step"
        self.indices: dict[int, list[int]] = {}
        self.epoch = 0
        self.extra: dict = {}
        self.trained = None  # (model, device, input dtype, autocast dtype or None) of the last training forward
        self.dataset = None
        self.reported = False
        self.plain_compute_loss = None  # the script's compute_loss, unwrapped
        self.train = None  # the script's module

    # --- memory -----------------------------------------------------------------------------------------------
    def start_meter(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self.cpu_meter = CPU_METER()
            self.cpu_meter.__enter__()

    def restart_meter(self) -> None:
        """Forget what was measured so far (QLoRA's stand-in base was written)."""
        if self.cpu_meter is not None:
            self.cpu_meter.__exit__(None, None, None)
        self.start_meter()

    def stop_meter(self) -> None:
        if self.memory is not None:
            return
        if self.cuda:
            self.memory = {
                "peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
                "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()),
            }
            return
        self.cpu_meter.__exit__(None, None, None)
        m = self.cpu_meter
        # raw: the profiler's own running total, before the frees it did not see were put back (CpuPeakMeter)
        self.memory = {
            "peak_allocated_bytes": int(m.peak_bytes),
            "peak_reserved_bytes": None,
            "raw_peak_allocated_bytes": int(m.raw_peak_bytes),
            "unseen_frees": m.unseen_frees,
        }

    # --- wrapping -----------------------------------------------------------------------------------------------
    def install(self, train) -> None:
        probe = self

        def wrap(owner, name, make):
            original = getattr(owner, name, None)
            if original is not None:
                setattr(owner, name, make(original))

        wrap(train, "parse_args", lambda f: lambda *a, **k: setattr(probe, "args", f(*a, **k)) or probe.args)

        def step_log_init(f):
            def init(self, *a, **k):
                f(self, *a, **k)
                probe.steps = self

            return init

        def end_step(f):
            def end(self, *a, **k):
                f(self, *a, **k)
                if probe.measured_steps is not None and len(self.step_times) == probe.measured_steps:
                    probe.stop_meter()  # the memory figures cover the measured steps; the rest are timed only
                    if torch.distributed.is_initialized():
                        torch.distributed.barrier()  # ranks stop the meter at different times: go on together
                    if int(os.environ.get("RANK", "0")) == 0:
                        print(
                            f"advisor probe: memory meter stopped after step {probe.measured_steps}; the steps "
                            "after it are timed only",
                            flush=True,
                        )
                    self.restart_clock()  # the meter's export is not the next step's time

            return end

        def micro_step(f):
            def micro(self, *a, **k):
                f(self, *a, **k)
                probe.per_micro_step.append(probe.comm_calls)
                probe.comm_calls = 0

            return micro

        wrap(train.StepLog, "__init__", step_log_init)
        wrap(train.StepLog, "end_step", end_step)
        wrap(train.StepLog, "micro_step", micro_step)

        def set_epoch(f):
            def set_(self, epoch, *a, **k):
                probe.epoch = epoch
                probe.indices.setdefault(epoch, [])
                return f(self, epoch, *a, **k)

            return set_

        def sampler_iter(f):
            def it(self):
                seen = probe.indices.setdefault(probe.epoch, [])
                for i in f(self):
                    seen.append(int(i))
                    yield i

            return it

        wrap(train.ResumableSampler, "set_epoch", set_epoch)
        wrap(train.ResumableSampler, "__iter__", sampler_iter)

        def compute_loss(f):
            def loss(model, batch, device, *a):
                if torch.is_grad_enabled():  # a training forward (evaluation runs without gradients)
                    auto = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
                    probe.trained = (weakref.ref(model), device, a, auto)
                return f(model, batch, device, *a)

            return loss

        self.plain_compute_loss = getattr(train, "compute_loss", None)  # a pipeline script has its own loss
        wrap(train, "compute_loss", compute_loss)
        wrap(train, "make_datasets", lambda f: lambda *a: probe.keep_datasets(f(*a)))
        wrap(train, "final_checkpoint_due", lambda f: lambda *a: probe.training_ended(train) or f(*a))
        wrap(train, "save_test_base", lambda f: lambda *a: probe.restarted(f(*a)))
        wrap(train, "build_sharded_model", lambda f: lambda *a: probe.fsdp2_built(train, f(*a)))
        self._install_libraries(train)
        self.train = train

    def _install_libraries(self, train) -> None:
        probe = self
        from torch.nn.parallel import DistributedDataParallel

        ddp_init = DistributedDataParallel.__init__

        def counted_ddp(self, *a, **k):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            ddp_init(self, *a, **k)
            probe.comm_key = "allreduce_calls_per_micro_step"

            def counting_allreduce(state, bucket):  # counts all-reduces (no_sync() skips them)
                probe.comm_calls += 1
                return allreduce_hook(state, bucket)

            self.register_comm_hook(self.process_group, counting_allreduce)

        DistributedDataParallel.__init__ = counted_ddp
        if train.STRATEGY == "ddp":
            probe.extra["sync_batchnorm"] = False
            convert = torch.nn.SyncBatchNorm.convert_sync_batchnorm

            def converting(module, *a, **k):
                probe.extra["sync_batchnorm"] = True
                return convert(module, *a, **k)

            torch.nn.SyncBatchNorm.convert_sync_batchnorm = converting
        if train.STRATEGY.startswith("zero"):
            import deepspeed

            initialize = deepspeed.initialize

            def initialized(*a, **k):
                out = initialize(*a, **k)
                probe.zero_built(train, out[0])
                return out

            deepspeed.initialize = initialized
        destroy = torch.distributed.destroy_process_group

        def destroying(*a, **k):
            if not a and not k.get("group"):  # the default group: the end of the run
                probe.write_report()
            return destroy(*a, **k)

        torch.distributed.destroy_process_group = destroying

    # --- the strategies' own figures ---------------------------------------------------------------------------
    def keep_datasets(self, datasets):
        self.dataset = datasets[0]
        return datasets

    def restarted(self, value):
        self.restart_meter()
        return value

    def fsdp2_built(self, train, model):
        from torch.distributed.fsdp import FSDPModule

        blocks = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]

        def counted(_param) -> None:
            self.comm_calls += 1

        # FSDP2 runs a sharded parameter's post-accumulate-grad hooks right after its unit's reduce-scatter has
        # written the sharded gradient, and only then: one hook on one parameter per unit counts the unit.
        in_blocks = {id(p) for block in blocks for p in block.parameters()}
        root_own = [p for p in model.parameters() if id(p) not in in_blocks]
        for params in [root_own] + [list(block.parameters()) for block in blocks]:
            first = next((p for p in params if p.requires_grad), None)
            if first is not None:
                first.register_post_accumulate_grad_hook(counted)
        self.comm_key = "reduce_scatters_per_micro_step"
        mesh = next(model.parameters()).device_mesh
        self.extra.update(
            {
                "fsdp_units": len(blocks) + 1,
                "local_param_numel": sum(p.to_local().numel() for p in model.parameters()),
                "full_param_numel": sum(p.numel() for p in model.parameters()),
                "reshard_after_forward": train.RESHARD_AFTER_FORWARD,
                "cpu_offload": hasattr(train, "CPUOffloadPolicy"),
                "mesh_shape": list(mesh.shape),
                "mesh_dim_names": list(mesh.mesh_dim_names),
                "grad_sync": "every-micro-step",
            }
        )
        set_sync = model.set_requires_gradient_sync

        def setting_sync(requires_gradient_sync: bool, *a, **k):  # turned off: the script syncs on the last only
            if not requires_gradient_sync:
                self.extra["grad_sync"] = "last-micro-step"
            return set_sync(requires_gradient_sync, *a, **k)

        model.set_requires_gradient_sync = setting_sync
        return model

    def zero_built(self, train, engine) -> None:
        stage = engine.zero_optimization_stage()
        self.extra.update({"zero_stage": stage, "offload": bool(engine.zero_offload_optimizer())})
        if stage == 3:  # this rank's partitions (ds_tensor) against the full parameters (ds_numel)
            params = list(engine.module.parameters())
            self.extra.update(
                {
                    "local_param_numel": sum(p.ds_tensor.numel() for p in params),
                    "full_param_numel": sum(p.ds_numel for p in params),
                }
            )

    def training_ended(self, train) -> None:
        """Before the final checkpoint: the meter stops, and the trained model's loss on the first micro-batch."""
        self.stop_meter()
        if self.trained is None or self.dataset is None or self.reported:
            return
        ref, device, args, auto = self.trained
        model = ref()
        if model is None:
            return
        from torch.nn.parallel import DistributedDataParallel

        module = model.module if isinstance(model, DistributedDataParallel) else model
        batch = torch.utils.data.default_collate([self.dataset[i] for i in range(train.MICRO_BATCH_SIZE)])
        module.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=auto, enabled=auto is not None):
            # TP's logits are vocab-sharded: its script's tp_loss runs the cross-entropy under loss_parallel()
            loss = getattr(train, "tp_loss", self.plain_compute_loss)(module, batch, device, *args)
        module.train()
        from torch.distributed.fsdp import FSDPModule

        for m in module.modules():  # FSDP2: without gradients nothing reshards the root (nor, unresharded, blocks)
            if isinstance(m, FSDPModule):
                m.reshard()
        self.extra["final_eval_loss"] = loss.item()
        trainable = [p for p in module.parameters() if p.requires_grad]
        if len(trainable) < len(list(module.parameters())):  # adapters: what trains
            self.extra["trainable_params"] = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in trainable)

    # --- the report ---------------------------------------------------------------------------------------------
    def write_report(self) -> None:
        if self.reported or self.steps is None:
            return
        self.reported = True
        self.stop_meter()
        train, steps = self.train, self.steps
        distributed = torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if distributed else 0
        world = torch.distributed.get_world_size() if distributed else 1
        measured = len(steps.losses) if self.measured_steps is None else min(self.measured_steps, len(steps.losses))
        mine = {
            "rank": rank,
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            **self.memory,
            "losses": steps.losses[:measured],
            "step_times_s": steps.step_times,
            "profiled_steps": 0 if self.cuda else measured,
            "grad_norms": steps.grad_norms,
            "sample_indices": self.indices,
            **self.extra,
        }
        if self.comm_key:
            mine[self.comm_key] = self.per_micro_step
        if hasattr(train, "TP_DEGREE"):  # tp, tp_dp: the mesh is (data parallel, tensor parallel), TP ranks adjacent
            mine.update(
                {"tp_degree": train.TP_DEGREE, "dp_size": world // train.TP_DEGREE, "dp_rank": rank // train.TP_DEGREE}
            )
        everyone = [None] * world
        if distributed:
            torch.distributed.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        if rank == 0:
            report = {
                "strategy": train.STRATEGY,
                "device": "cuda" if self.cuda else "cpu",
                "world_size": world,
                "steps": measured,
                "precision": train.PRECISION,
                "micro_batch_size": train.MICRO_BATCH_SIZE,
                "gradient_accumulation_steps": train.GRAD_ACCUM_STEPS,
                "eval_losses": steps.eval_losses,
                "per_rank": everyone,
            }
            out = self.args.out if self.args is not None else "."
            os.makedirs(out, exist_ok=True)
            path = os.path.join(out, "report.json")
            with open(path, "w") as f:
                json.dump(report, f, indent=2)
            print(f"advisor probe: report written to {path}", flush=True)


def split_argv(argv: list[str]) -> tuple[int | None, str, list[str]]:
    """(--measured-steps, the script, the script's own argv) from the probe's argv (without the program name)."""
    measured, passed, i = None, [], 0
    while i < len(argv) and not argv[i].endswith(".py"):
        if argv[i] == "--measured-steps":
            measured, i = int(argv[i + 1]), i + 2
            continue
        passed.append(argv[i])  # the deepspeed launcher's --local_rank=N
        i += 1
    if i == len(argv):
        raise SystemExit("usage: _advisor_probe.py [--measured-steps N] train.py [options]")
    return measured, argv[i], [argv[i], *passed, *argv[i + 1 :]]


def import_model_library(train: object) -> None:
    """Import what the script's ``build_model`` imports when main() calls it: the transformers model class
    (``HF_MODEL_CLASS``: transformers loads its module on first access) or torchvision (``MODEL_NAME``), and peft for
    a LoRA script (``LORA_RANK``), so that ``main`` runs as it would, only without the import."""
    cls = getattr(train, "HF_MODEL_CLASS", None)
    if cls:
        getattr(importlib.import_module("transformers"), cls)
    elif getattr(train, "MODEL_NAME", None):
        importlib.import_module("torchvision")
    if getattr(train, "LORA_RANK", None):
        importlib.import_module("peft")


def main(argv: list[str] | None = None) -> None:
    measured, script, script_argv = split_argv(list(sys.argv[1:] if argv is None else argv))
    path = os.path.abspath(script)
    sys.path[0] = os.path.dirname(path)  # as if train.py were run itself
    sys.argv = script_argv
    spec = importlib.util.spec_from_file_location("advisor_train", path)
    train = importlib.util.module_from_spec(spec)
    sys.modules["advisor_train"] = train
    # The script's imports and the model library it imports inside main() run with the cyclic garbage collector off:
    # importing torch, torch.distributed.checkpoint and a transformers model class makes hundreds of thousands of
    # objects, and the collector's passes over them took a quarter of the import time (measured here: 5.4 s -> 4.4 s
    # of CPU; a 2-rank verification 14.6 s -> 11.2 s of CPU, 9.2 s -> 7.2 s wall, with the freeze below). Imports
    # allocate no tensors worth counting, so the meter, which starts after them, reads the same run.
    gc.disable()
    try:
        spec.loader.exec_module(train)
        import_model_library(train)
        probe = Probe(measured)
        probe.install(train)
        probe.start_meter()
    finally:
        gc.enable()
    # Everything imported so far lives until the process ends: frozen, the collector's full passes during training
    # (DDP's wrap calls gc.collect()) no longer walk it.
    gc.freeze()
    train.main()
    probe.write_report()  # one process (no process group), or a script that never destroyed its group
    # main() returned: everything is saved and reported. Leave without the interpreter's shutdown, where gloo's and
    # the CPU profiler's threads sometimes end a rank with "terminate called without an active exception"
    # (SIGABRT) after the work is done, which would turn a measured run into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
