"""One published figure as typed data (``Case``) and the units figures come in; the rows themselves are in
bench/published_cases.py and bench/published_other.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Units of a published figure. Throughputs: tokens per second per GPU, samples (sequences, images) per second of
# the whole job. Times: seconds per optimizer step, per epoch (``Case.samples`` samples), per run (``Case.samples``
# optimizer steps).
TOK_S_GPU, SAMPLES_S, SEQ_S, S_ITER, S_EPOCH, S_RUN = (
    "tok/s/GPU",
    "samples/s",
    "seq/s",
    "s/iteration",
    "s/epoch",
    "s/run",
)
THROUGHPUT_UNITS = (TOK_S_GPU, SAMPLES_S, SEQ_S)
# A source's communication overlap (``Case.overlap``): torch DDP's bucketed gradient all-reduce beside backward
# (Megatron-LM 2021's --DDP-impl torch); Megatron-core's --overlap-grad-reduce, --overlap-param-gather (with the
# distributed optimizer) and --tp-comm-overlap.
OVERLAP_DDP, OVERLAP_MEGATRON_CORE = "ddp", "megatron-core"
TRANSFORMER, CNN = "transformer", "cnn"


@dataclass(frozen=True)
class Case:
    """One published figure and the advisor inputs it was measured under.

    ``model`` is an advisor preset name, or the name of ``config`` (a Hugging Face config dict: the nearest
    architecture advisor builds, ``note`` says how near). ``seq`` is tokens per sample (a CNN's image side).
    ``micro_batch`` and ``grad_accum`` are per data-parallel rank; ``tp`` the tensor-parallel degree (None: no
    TP). ``published`` is in ``unit``; ``samples`` is the samples per epoch (``S_EPOCH``) or optimizer steps
    (``S_RUN``) the figure covers. ``compare`` says what of the prediction the figure is set against. ``fitted``:
    the row is a steady-state throughput the fit uses (False: shown, not fitted, ``compare`` says why). ``fused``:
    where the source's code fuses its element-wise work (Megatron-LM's fused kernels, torch.compile), what it fuses,
    with its source: the row is then timed with ``GpuModel.fused_elementwise`` (advisor.timing.gpu_time.fused_times);
    empty: eager PyTorch. ``overlap``: the source's own communication overlap where it differs from advisor's
    strategy rule (``OVERLAP_DDP``, ``OVERLAP_MEGATRON_CORE``; bench.published.source_overlap); empty: the strategy's.
    """

    row: str
    source: str
    model: str
    seq: int
    gpu: str
    gpus_per_node: int
    nodes: int
    network: str | None
    strategy: str
    precision: str
    checkpointing: bool
    micro_batch: int
    grad_accum: int
    published: float
    unit: str
    compare: str
    config: Mapping[str, object] | None = field(default=None, hash=False)
    tp: int | None = None
    samples: int | None = None
    fitted: bool = True
    workload: str = TRANSFORMER
    note: str = ""
    extra: Mapping[str, object] = field(default_factory=dict, hash=False)
    fused: str = ""
    overlap: str = ""

    @property
    def base_id(self) -> str:
        """The published_runs.md row id ("O43" of "O43-z1")."""
        return self.row.split("-")[0] if self.row[:1] in "FO" and self.row[1:2].isdigit() else self.row

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def plan_values(self) -> dict[str, object]:
        """The ``advisor.schema.plan_inputs`` values of this case (no global batch: the accumulation is applied
        to the strategy row, ``bench.published.step_of``, as TP x DP's batch is per data-parallel rank)."""
        values: dict[str, object] = dict(
            gpu=self.gpu,
            gpus=self.gpus_per_node,
            nodes=self.nodes,
            precision=self.precision,
            micro_batch_size=self.micro_batch,
            activation_checkpointing=self.checkpointing,
            detect_hardware=False,
        )
        if self.config is not None:
            values.update(config_dict=dict(self.config), config_source=self.model)
        else:
            values["model"] = self.model
        values["image_size" if self.workload == CNN else "seq_len"] = self.seq
        if self.network is not None:
            values["network"] = self.network
        if self.tp is not None:
            values["tp_degree"] = self.tp
        values.update(self.extra)
        return values
