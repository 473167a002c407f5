"""FSDP2 (torch.distributed.fsdp.fully_shard): parameters, gradients and optimizer states sharded over a device mesh
(HSDP: replicated across nodes, sharded inside one). The loop's strategy functions (``loop.py``): the mesh, the model
built on the meta device and sharded before any rank holds it whole, the gradient sync, the clipping of sharded
gradients, the sharded evaluation and the gathered export.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

if TYPE_CHECKING:  # the script's own names (see loop.py)
    import torch.distributed as dist

    from advisor.checkpointing import repeated_blocks
    from advisor.models.families.fragments.transformer import build_base, build_model, export_weights

    from .adapters import add_lora, base_dtype, export_merged, save_adapter, trainable_parameters
    from .collectives import barrier, init_torchrun
    from .common import StepLog, evaluate, log
    from .constants import (
        GRAD_ACCUM_STEPS,
        LR,
        MAX_GRAD_NORM,
        MICRO_BATCH_SIZE,
        PRECISION,
        REPLICATE_DEGREE,
        RESHARD_AFTER_FORWARD,
        SEED,
    )
    from .loop import Run
    from .torch_steps import checkpoint_activations, step_with


def start__fsdp() -> Run:
    """This process's rank and device once the process group is up, and the 1-D mesh every rank shards over."""
    rank, local_rank, world_size, device = init_torchrun()
    run = Run(rank, local_rank, rank, world_size, device)  # every rank is a data-parallel rank
    run.mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    log_layout(run)
    return run


def start__hsdp() -> Run:
    """This process's rank and device once the process group is up, and HSDP's 2-D mesh: replicate across nodes
    (dim 0), shard inside a node (dim 1), so the gathers stay on fast links."""
    rank, local_rank, world_size, device = init_torchrun()
    if world_size % REPLICATE_DEGREE:
        raise SystemExit(f"world size {world_size} is not a multiple of the replicate degree {REPLICATE_DEGREE}")
    run = Run(rank, local_rank, rank, world_size, device)  # every rank is a data-parallel rank
    run.mesh = init_device_mesh(device.type, (REPLICATE_DEGREE, world_size // REPLICATE_DEGREE),
                                mesh_dim_names=("replicate", "shard"))
    log_layout(run)
    return run


def log_layout(run: Run) -> None:
    world_size = run.dp_size
    log(f"FSDP2: world size {world_size} (mesh {tuple(run.mesh.shape)}), reshard after forward "
        f"{RESHARD_AFTER_FORWARD}, micro-batch {MICRO_BATCH_SIZE}/GPU, accumulation {GRAD_ACCUM_STEPS} -> global batch "
        f"{MICRO_BATCH_SIZE} x {world_size} x {GRAD_ACCUM_STEPS} = {MICRO_BATCH_SIZE * world_size * GRAD_ACCUM_STEPS}; "
        f"lr {LR:g}")


def precision_dtypes__policy() -> tuple[None, None]:
    """(autocast dtype, input dtype): neither; the mixed-precision policy casts (mixed_precision_policy)."""
    return None, None


def prepare_model__full(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(the sharded model, its parameters): the optimizer sees the shards, so its states are shards too."""
    model = build_sharded_model(run.mesh, run.device, args)
    run.optimizer_device = shard_placement(run.device)[1]
    return model, list(model.parameters())


def prepare_model__lora(args, run: Run) -> tuple[torch.nn.Module, list]:
    """(the sharded model, the adapters' shards): the optimizer and clipping see only them."""
    model = build_sharded_model(run.mesh, run.device, args)
    run.optimizer_device = shard_placement(run.device)[1]
    params = trainable_parameters(model)
    return model, params


def build_sharded_model(mesh, device, args):
    """Build on meta, shard, then materialise only this rank's shards and write them (init_parameters).

    Returns the model: one FSDP2 unit per repeated block, and the root.
    """
    model, buffers = build_on_meta()
    model = adapt_on_meta(model)
    checkpoint_activations(model)  # before sharding: fully_shard then wraps the checkpointed blocks
    shard_args, where = shard_placement(device)
    shard_args["mesh"], shard_args["mp_policy"] = mesh, mixed_precision_policy()
    # One unit per repeated block: its parameters are gathered just before it runs and freed after,
    # in forward (and, resharding, gathered again in backward).
    blocks = repeated_blocks(model)
    for block in blocks:
        fully_shard(block, reshard_after_forward=RESHARD_AFTER_FORWARD, **shard_args)
    # The root unit takes everything else (embeddings, head, final norm). It keeps torch's default for
    # the root: its parameters stay gathered from forward to backward, which needs them first.
    fully_shard(model, **shard_args)
    model.to_empty(device=where)  # only now is memory allocated: each rank's shards, nothing else
    init_parameters(model, args)
    restore_buffers(buffers, device)
    return model


def shard_placement__device(device) -> tuple[dict, torch.device]:
    """(fully_shard's extra arguments, where the shards and the optimizer step live): on the compute device."""
    return {}, device


def shard_placement__offload(device) -> tuple[dict, torch.device]:
    """(fully_shard's extra arguments, where the shards and the optimizer step live): the shards in pinned host
    memory, stepped by the CPU (CPUOffloadPolicy); each block's are copied to the device to compute."""
    return {"offload_policy": CPUOffloadPolicy()}, torch.device("cpu")  # offload: the optimizer steps in host memory


def adapt_on_meta__full(model):
    """Full fine-tuning: every parameter trains, as built."""
    return model


def adapt_on_meta__pure_bf16(model):
    """Pure bf16: weights, gradients and optimizer states all in bf16."""
    return model.to(torch.bfloat16)


def adapt_on_meta__lora(model):
    """LoRA, still on meta: the base's parameters in its dtype (buffers stay as built, as from_pretrained leaves
    them), then peft's adapters. fully_shard shards the frozen base too (each rank holds 1/N of it)."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(base_dtype())
    return add_lora(model)


def build_whole__full(args):
    """Rank 0's whole model for init_parameters: SEED's init or --init-from's weights."""
    return build_model(args.init_from)


def build_whole__pure_bf16(args):
    """Rank 0's whole model for init_parameters, in bf16."""
    return build_model(args.init_from).to(torch.bfloat16)


def build_whole__lora(args):
    """Rank 0's whole model for init_parameters: the base, then peft's adapters (lora_B zero)."""
    return add_lora(build_base(args, base_dtype()))


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
        whole = build_whole(args)
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


def wrap_model(run: Run) -> None:
    """Nothing wraps the model: fully_shard made its blocks FSDP2 units as it was built (prepare_model)."""


def micro_step_context__every(run: Run, last_micro: bool):
    """Every micro-step reduce-scatters its gradients into the shards (FSDP2's default)."""
    return contextlib.nullcontext()


def micro_step_context__sync_last(run: Run, last_micro: bool):
    """Syncing only on the last micro-step skips the reduce-scatters before it, but every rank keeps its unsharded
    gradients until then (syncing every micro-step would accumulate shards)."""
    run.model.set_requires_gradient_sync(last_micro)
    return contextlib.nullcontext()


def optimizer_step(run: Run, steps: StepLog) -> None:
    """Clip the true gradients (unscale first: a no-op unless fp16; torch.amp's GradScaler works on DTensor gradients,
    taking the max of found_inf over the mesh, so every rank skips the same steps). The norm comes back as a DTensor
    reduced over every rank's shards: full_tensor() is the global norm. Then step, release the gradients, move the LR
    schedule on and log the step with the LR it used."""
    run.scaler.unscale_(run.optimizer)
    norm = torch.nn.utils.clip_grad_norm_(run.params, MAX_GRAD_NORM)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    step_with(run, steps, norm)


def held_out_loss(run: Run, dataset) -> float:
    """evaluate() (no autocast: the policy casts), then every unit resharded: without gradients nothing reshards
    the root (nor, unresharded, the blocks)."""
    loss = evaluate(run.model, dataset, run.dp_size, run.dp_rank, run.device, None, run.input_dtype)
    for module in run.model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    return loss


def export__full(args, run: Run) -> None:
    """Portable: the full weights, gathered by every rank (a collective) into rank 0's CPU memory; rank 0 alone
    writes them, loadable into the plain model (no wrapper prefix in the names)."""
    full = get_model_state_dict(run.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if run.rank == 0:
        export_weights(run.model, args, full)
    del full
    barrier()


def export__lora(args, run: Run) -> None:
    """Portable: the adapters whole, gathered by every rank (a collective) into rank 0's CPU memory; rank 0 writes
    them in peft's format (names of the plain model). The base is --init-from's, unchanged: no full weights."""
    adapter = get_model_state_dict(run.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                       ignore_frozen_params=True))
    if run.rank == 0:
        save_adapter(run.model, args.out, adapter)
    barrier()


def export__lora_merged(args, run: Run) -> None:
    """The adapters as export__lora writes them; with --export-merged also the whole model, gathered into rank 0's
    host memory (a collective), with the adapters merged in."""
    adapter = get_model_state_dict(run.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                       ignore_frozen_params=True))
    if run.rank == 0:
        save_adapter(run.model, args.out, adapter)
    if args.export_merged:
        full = get_model_state_dict(run.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if run.rank == 0:
            export_merged(full, args.out)
        del full
    barrier()


start = start__fsdp
precision_dtypes = precision_dtypes__policy
prepare_model = prepare_model__full
shard_placement = shard_placement__device
adapt_on_meta = adapt_on_meta__full
build_whole = build_whole__full
micro_step_context = micro_step_context__every
export = export__full
