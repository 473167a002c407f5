"""Parallelism as data: a ``Layout`` of integer degrees, validated in one place, and the layouts a cluster admits.

A layout is the degrees torchtitan's ``ParallelDims`` holds (pytorch/torchtitan,
torchtitan/distributed/parallel_dims.py, ``ParallelDims._validate``, commit b5bcd76 of 2026-08-21): data-parallel
replicate, data-parallel shard, tensor parallel and pipeline parallel (context and expert parallel are out here).
Their product is the world size; torchtitan asserts it with one message that prints the product formula
(``dp_replicate(2) * dp_shard(4) * cp(1) * tp(8) * pp(1) != WORLD_SIZE(32)``), and so does ``Layout.validate``.
Beyond torchtitan's check, the model's divisibility: the attention heads and the key/value heads by ``tp`` (each TP
rank holds whole heads: Megatron-LM, Shoeybi et al. 2019, section 3), and at most one block per stage below the
block count (``pp`` <= layers); blocks that do not divide evenly are split as torchtitan's
``_generate_llm_fqn_per_model_part`` (torchtitan/distributed/pipeline_parallel.py) splits them: the first
``layers % pp`` stages one block more (``stage_blocks``).

The rank order is torchtitan's mesh order (``ParallelDims.build_mesh``: pp, dp_replicate, dp_shard, tp, outermost
first): TP ranks are neighbours, so a TP group sits inside a node when ``tp`` divides the GPUs per node, and PP is
the outermost dimension, its stages across nodes (``layouts_for``: TP inside a node, PP across, DP the rest).

Which data-parallel policy (DDP, ZeRO, FSDP2, HSDP) runs on the DP degrees is not a degree: a layout says how many
replicas and shards there are, the policy how model states are sharded over them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import AdvisorError


@dataclass(frozen=True)
class Layout:
    """Integer parallel degrees of one training job: ``dp_replicate`` x ``dp_shard`` data-parallel ranks (HSDP:
    replicate across, shard inside; DDP or ZeRO: one of them 1), ``tp`` tensor-parallel ranks per group, ``pp``
    pipeline stages. Every degree >= 1 (``ValueError`` otherwise: a programming error, not a user's)."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "pp"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Layout.{name} must be an int >= 1, got {value!r}")

    @property
    def dp(self) -> int:
        """Data-parallel ranks in all: replicas x shards (the sampler's number of replicas)."""
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        """Ranks the layout uses: dp_replicate x dp_shard x tp x pp."""
        return self.dp * self.tp * self.pp

    def formula(self) -> str:
        """The product as torchtitan's assertion prints it: ``dp_replicate(1) * dp_shard(4) * tp(2) * pp(2)``."""
        return f"dp_replicate({self.dp_replicate}) * dp_shard({self.dp_shard}) * tp({self.tp}) * pp({self.pp})"

    def validate(
        self,
        world_size: int,
        heads: int | None = None,
        kv_heads: int | None = None,
        layers: int | None = None,
    ) -> Layout:
        """``self`` when it fits ``world_size`` ranks and the model (``heads`` attention heads, ``kv_heads``
        key/value heads, ``layers`` repeated blocks; None: not checked, as for a model without them), the one place
        layouts are checked (module docstring).

        Raises:
            AdvisorError: one line per rule, the first broken: the product is not the world size (the formula
            printed, as ``ParallelDims._validate`` prints it); ``tp`` does not divide the heads or the key/value
            heads; ``pp`` exceeds the blocks.
        """
        if self.world_size != world_size:
            model = self.tp * self.pp
            hint = ""
            if world_size % model:  # no data-parallel degree can make up the rest: say which pp would
                fit = [d for d in range(1, world_size + 1) if world_size % (self.tp * d) == 0]
                hint = (
                    f"; tp({self.tp}) * pp({self.pp}) = {model} does not divide {world_size} GPUs, so no data-parallel "
                    "degree fits: "
                    + (f"pp values that do with tp {self.tp}: {', '.join(map(str, fit))}" if fit else
                       f"tp {self.tp} itself does not divide {world_size}")
                )  # fmt: skip
            raise AdvisorError(
                f"invalid layout: {self.formula()} = {self.world_size} != world size {world_size} "
                f"(the degrees multiply to the number of GPUs){hint}"
            )
        if self.tp > 1 and heads is not None:
            kv = heads if kv_heads is None else kv_heads
            if heads % self.tp or kv % self.tp:
                raise AdvisorError(
                    f"invalid layout: tp({self.tp}) must divide the {heads} attention heads and the {kv} key/value "
                    f"heads ({heads} % {self.tp} = {heads % self.tp}, {kv} % {self.tp} = {kv % self.tp})"
                )
        if self.pp > 1 and layers is not None and self.pp > layers:
            raise AdvisorError(
                f"invalid layout: pp({self.pp}) exceeds the model's {layers} blocks (at least one block per stage)"
            )
        return self

    def stage_blocks(self, layers: int, virtual: int = 1) -> tuple[int, ...]:
        """Blocks per pipeline rank, first rank first. The model is cut into ``pp x virtual`` stages of
        ``layers // (pp virtual)`` blocks each, the first ``layers % (pp virtual)`` one more (torchtitan's
        ``_generate_llm_fqn_per_model_part`` with ``input_weight`` = ``output_weight`` = 0; Megatron-LM's even split
        when they divide), and rank r holds stages r, r + pp, r + 2 pp, ... (the interleaved schedules' round-robin
        placement: torchtitan's ``_get_pp_rank_to_stage_indices_mapping``, "loop" style). The embeddings sit on the
        first stage (rank 0), the final norm and LM head on the last (rank pp - 1), outside these counts.

        Raises:
            AdvisorError: more stages than blocks (``validate``'s rule, with ``virtual`` chunks per rank).
        """
        stages = self.pp * virtual
        if stages > layers:
            chunks = f" x {virtual} virtual stages" if virtual > 1 else ""
            raise AdvisorError(
                f"invalid layout: pp({self.pp}){chunks} exceeds the model's {layers} blocks (at least one block per "
                "stage)"
            )
        base, extra = divmod(layers, stages)
        per_stage = [base + (1 if i < extra else 0) for i in range(stages)]
        return tuple(sum(per_stage[r :: self.pp]) for r in range(self.pp))

    def is_uneven(self, layers: int, virtual: int = 1) -> bool:
        """Whether the blocks split unevenly over the stages (``stage_blocks``: some stage holds one more)."""
        return layers % (self.pp * virtual) != 0

    def pp_crosses_nodes(self, gpus_per_node: int) -> bool:
        """Whether some stage boundary's point-to-point transfers cross the network: in torchtitan's rank order
        (module docstring) stage i holds ranks [i S, (i + 1) S), S = world_size / pp, and a rank sends to the rank S
        above it; that rank is on another node for some boundary whenever the job spans nodes and pp > 1 (S a
        multiple of the node: every boundary; S smaller: the boundaries at node edges). The pipeline runs at its
        slowest boundary."""
        return self.pp > 1 and self.world_size > gpus_per_node

    def tp_inside_node(self, gpus_per_node: int) -> bool:
        """Whether every TP group sits inside one node (``tp`` divides the GPUs per node; TP ranks are
        neighbours)."""
        return gpus_per_node % self.tp == 0

    def label(self) -> str:
        """A short name of the degrees above 1 (``"dp 4 x tp 2 x pp 2"``; ``"dp 1"`` for one GPU)."""
        parts = []
        if self.dp_replicate > 1 and self.dp_shard > 1:
            parts.append(f"dp {self.dp_replicate}x{self.dp_shard}")
        elif self.dp > 1:
            parts.append(f"dp {self.dp}")
        parts += [f"{name} {n}" for name, n in (("tp", self.tp), ("pp", self.pp)) if n > 1]
        return " x ".join(parts) or "dp 1"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts_for(
    gpus_per_node: int,
    nodes: int,
    heads: int | None = None,
    kv_heads: int | None = None,
    layers: int | None = None,
    max_tp: int | None = None,
    max_pp: int | None = None,
) -> list[Layout]:
    """Every layout of ``gpus_per_node`` x ``nodes`` GPUs that validates for the model (``Layout.validate``): TP
    inside a node (``tp`` divides ``gpus_per_node``: Megatron-LM keeps tensor-parallel groups inside one NVSwitch
    node, Narayanan et al. 2021, section 3.2), PP across (any ``pp`` dividing the rest and at most ``layers``), DP
    the rest, as ``dp_shard`` (the policy splits it into replicas and shards). ``max_tp`` / ``max_pp`` cap the
    degrees. Ordered by (pp, tp): the least model parallelism first.

    Raises:
        ValueError: ``gpus_per_node`` or ``nodes`` below 1.
    """
    if gpus_per_node < 1 or nodes < 1:
        raise ValueError(f"a cluster needs >= 1 GPU per node and >= 1 node, got {gpus_per_node} x {nodes}")
    world = gpus_per_node * nodes
    out = []
    for pp in _divisors(world):
        if (max_pp is not None and pp > max_pp) or (layers is not None and pp > layers):
            continue
        for tp in _divisors(gpus_per_node):
            if (max_tp is not None and tp > max_tp) or (world // pp) % tp:
                continue
            layout = Layout(dp_shard=world // (pp * tp), tp=tp, pp=pp)
            try:
                out.append(layout.validate(world, heads, kv_heads, layers))
            except AdvisorError:
                continue
    return out
