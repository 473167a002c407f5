"""The one input schema: every choice a user can make, typed, with its default, bounds, help text and
the faces that show it, validated in one place (``validate``).

Faces are derived from it: the CLI's argparse parser (``advisor.cli.build_parser`` iterates
``fields_for("cli")``), the Streamlit form (``app.py`` draws ``fields_for("page")``), bench's case runner
(``inputs_from_values``) and the JSON echo of the inputs (``echo``). Choices come from the registries
(GPU presets, networks, precisions, optimizers; the strategy names from ``strategies``, resolved by the
faces because strategies sit above this layer), never typed twice.

Groups (torchtitan-style typed config dataclasses): ``ModelSource`` (what to train), ``TrainingOptions``
(how: defined in ``advisor.training_options``, with its choices and the rules among its fields), ``ClusterSpec``
(on what), ``RunOptions`` (scripts, verification and output: CLI/page only, never part of a plan).
``PlanInputs`` holds the first three plus the plan-level switches.

What one field is and how one value is checked against it (``Opt``, ``Field``, the type read from the
annotation) is ``advisor.fields``; the free-text inputs (``--lora-targets``, ``--init-from``,
``--input-shape``) are parsed in ``advisor.free_text``. Numeric bounds (``low``/``high``) are inclusive,
except a ``low`` of 0.0, which is exclusive: the value must be above 0. A choice from a closed set is typed
with its ``StrEnum`` (``advisor.choices``): the string a face passes becomes the member as the group is built
(``TrainingOptions.__post_init__``), and the choices the faces list stay plain strings.

Nothing here imports torch or any other layer of advisor but the bottom data modules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .choices import Device, values
from .errors import AdvisorError
from .fields import FACES, STRATEGY_CHOICES, Field, check_value, group_fields
from .fields import option as _f  # short: the dataclass bodies below call it once per field
from .gpu_presets import GPU_PRESETS, INTERCONNECTS, NETWORKS
from .training_options import TrainingOptions
from .training_rules import validate_training

DEVICES = values(Device)  # the plain strings (advisor.choices.values); the training choices: advisor.training_options


@dataclass(frozen=True)
class ModelSource:
    """What to train. Exactly one source: a name, a config file, a pasted config or a factory."""

    model: str | None = _f(
        None,
        positional=True,
        label="Catalog model",
        faces=("cli", "page", "bench"),
        help="torchvision name (resnet50, vit_b_16, ...), transformer preset (gpt2, llama-2-7b, "
        "...) or Hugging Face repo id alias; see --list-models",
    )
    config_path: str | None = _f(
        None,
        flag="--config",
        metavar="PATH",
        faces=("cli", "bench"),
        help="a Hugging Face config.json (parsed as JSON only)",
    )
    config_dict: dict[str, object] | None = _f(
        None,
        label="Paste a config.json",
        faces=("page",),
        help="a pasted or uploaded Hugging Face config.json (parsed as JSON only)",
    )
    config_source: str | None = _f(None, faces=(), help="where config_dict came from (an upload's name)")
    model_factory: str | None = _f(
        None, flag="--model-factory", metavar="MOD:FN", help="import MOD and call FN() -> nn.Module (your code)"
    )
    input_shape: tuple[int, ...] | None = _f(
        None,
        flag="--input-shape",
        metavar="C,H,W",
        help="per-sample input shape of a --model-factory model "
        "(default 3,224,224; float inputs, loss = mean square of the output)",
    )
    seq_len: int | None = _f(
        None,
        flag="--seq-len",
        label="Sequence length",
        faces=("cli", "page", "bench"),
        low=1,
        none="auto",
        help="tokens per sample (default min(model max, 2048))",
    )
    image_size: int | None = _f(
        None,
        flag="--image-size",
        label="Image size (px)",
        faces=("cli", "page", "bench"),
        low=1,
        none="224",
        help="image side in pixels (default 224)",
    )


@dataclass(frozen=True)
class ClusterSpec:
    """On what: ``gpus`` x ``nodes`` GPUs of one kind. Unset fields are detected, else from the preset."""

    gpu: str | None = _f(
        None,
        flag="--gpu",
        label="GPU",
        faces=("cli", "page", "bench"),
        metavar="PRESET",
        choices=tuple(p.name for p in GPU_PRESETS.values()),
        strict=False,
        none="detected, else A100-80GB",
        help="GPU preset (case-insensitive)",
    )
    gpu_mem_gib: float | None = _f(
        None,
        flag="--gpu-mem",
        label="Usable GPU memory (GiB)",
        faces=("cli", "page"),
        metavar="GIB",
        low=0.0,
        high=4096,
        none="the GPU's",
        help="usable GPU memory, GiB (nvidia-smi MiB/1024)",
    )
    gpus: int | None = _f(
        None,
        flag="--gpus",
        label="GPUs per node",
        faces=("cli", "page", "bench"),
        low=1,
        high=64,
        high_message="--gpus is GPUs per node; {value} is more than any node has: use --nodes for more",
        none="detected, else 1",
        help="GPUs per node",
    )
    nodes: int = _f(
        1,
        flag="--nodes",
        label="Nodes",
        faces=("cli", "page", "bench"),
        low=1,
        high=100_000,
        high_message="--nodes {value} is absurd: check the value",
        help="number of nodes (default 1)",
    )
    interconnect: str | None = _f(
        None,
        flag="--interconnect",
        label="Interconnect (inside a node)",
        faces=("cli", "page", "bench"),
        choices=INTERCONNECTS,
        none="the GPU's",
        help="link between GPUs in a node",
    )
    network: str | None = _f(
        None,
        flag="--network",
        label="Network (between nodes)",
        faces=("cli", "page"),
        choices=tuple(NETWORKS),
        none="100gbe when nodes > 1",
        help="link between nodes",
    )
    link_bandwidth_gbps: float | None = _f(
        None,
        flag="--link-bandwidth",
        faces=("cli", "bench"),
        metavar="GBPS",
        low=0.0,
        high=10**5,
        none="the preset's measured figure",
        help="all-reduce bus bandwidth between the GPUs of one node, GB/s (nccl-tests busbw)",
    )
    network_bandwidth_gbps: float | None = _f(
        None,
        flag="--network-bandwidth",
        faces=("cli", "bench"),
        metavar="GBPS",
        low=0.0,
        high=10**5,
        none="NICs per node x the network's per-NIC figure",
        help="bandwidth from one node to the others, GB/s one direction",
    )
    host_mem_gib: float | None = _f(
        None,
        flag="--host-mem",
        label="Host RAM per node (GiB)",
        faces=("cli", "page"),
        metavar="GIB",
        low=0.0,
        high=2**20,
        none="auto",
        help="host RAM per node, GiB (for CPU offload; default: this machine's when "
        "planning for its own GPUs, else unknown)",
    )
    detect_hardware: bool = _f(True, faces=(), help="detect this machine's GPUs when no preset is given")


@dataclass(frozen=True)
class RunOptions:
    """Scripts, verification and output. Read by the faces; never part of a plan."""

    strategy: str | None = _f(
        None,
        flag="--strategy",
        label="Strategy for the scripts and the verification run",
        faces=("cli", "page", "bench"),
        choices=STRATEGY_CHOICES,
        none="the recommended one",
        help="strategy for --emit/--verify",
    )
    emit: str | None = _f(
        None,
        flag="--emit",
        metavar="DIR",
        help="write train.py (and its data.py), launch.sh, slurm.sbatch (and ds_config.json) into DIR (with "
        "--verify: the run's directory; default advisor-runs/MODEL-STRATEGY-TIME)",
    )
    force: bool = _f(False, flag="--force", help="let --emit overwrite its own files in a non-empty DIR")
    runs_dir: str | None = _f(
        None,
        label="Folder for verification runs",
        faces=("page",),
        none="advisor-runs",
        help="each verification writes a new folder MODEL-STRATEGY-TIME inside this one and "
        "never reuses an existing run's (the CLI's --emit DIR names the run's folder "
        "itself); a relative path is from the server's working directory",
    )
    verify: bool = _f(False, flag="--verify", help="run the script here and compare measured peaks")
    steps: int | None = _f(
        None,
        flag="--steps",
        label="Steps",
        faces=("cli", "page", "bench"),
        low=1,
        high=10_000,
        none="6",
        help="optimizer steps for --verify (default 6)",
    )
    timeout: float | None = _f(
        None,
        flag="--timeout",
        label="Timeout (s)",
        faces=("cli", "page"),
        low=0.0,
        high=7 * 86400,
        none="600",
        high_message="--timeout is in seconds, at most a week (604800), got {value:g}",
        help="seconds before --verify gives up (default 600, at most a week)",
    )
    json: bool = _f(False, flag="--json", help="print one JSON document (schema in README)")
    compare: bool = _f(False, flag="--compare", help="also show DeepSpeed's own model-state estimates")
    no_cache: bool = _f(
        False, flag="--no-cache", help="neither read nor write the trace cache (advisor cache info shows where it is)"
    )
    list_models: bool = _f(False, flag="--list-models", help="list the known model names and exit")


GROUPS: dict[str, type] = {"model": ModelSource, "training": TrainingOptions, "cluster": ClusterSpec, "run": RunOptions}
GROUP_TITLES = {
    "model": "model source",
    "training": "training",
    "cluster": "hardware (default: detected GPUs, else the A100-80GB preset)",
    "run": "scripts, verification and output",
}


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan depends on (``plan(PlanInputs) -> Plan``)."""

    source: ModelSource = field(default_factory=ModelSource)
    training: TrainingOptions = field(default_factory=TrainingOptions)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    compare: bool = False  # RunOptions.compare: DeepSpeed's estimators beside ours
    use_cache: bool = True  # not RunOptions.no_cache


def all_fields() -> Iterator[Field]:
    """Every field of every group, in declaration order."""
    for group, cls in GROUPS.items():
        yield from group_fields(group, cls)


def fields_for(face: str) -> list[Field]:
    """The fields ``face`` ("cli", "page" or "bench") shows."""
    if face not in FACES:
        raise ValueError(f"unknown face {face!r}")
    return [f for f in all_fields() if face in f.opt.faces]


def get_field(name: str) -> Field:
    for f in all_fields():
        if f.name == name:
            return f
    raise KeyError(name)


def field_labels() -> dict[str, str]:
    """CLI flag -> page label, for the fields both faces show (the page says the label where the core's
    messages name the flag)."""
    return {
        f.opt.flag: f.opt.label
        for f in all_fields()
        if f.opt.flag and f.opt.label and {"cli", "page"} <= set(f.opt.faces)
    }


# ----------------------------------------------------------------------------------------- validation
def validate_group(
    group: ModelSource | TrainingOptions | ClusterSpec | RunOptions, strategy_names: tuple[str, ...] = ()
) -> None:
    """Check every field of one group instance (``ModelSource``, ``TrainingOptions``, ...).

    Raises:
        AdvisorError: the first bad value, in one line naming the flag and the accepted range.
    """
    name = next(g for g, cls in GROUPS.items() if isinstance(group, cls))
    for f in (f for f in all_fields() if f.group == name):
        check_value(f, getattr(group, f.name), strategy_names)


def validate(inputs: PlanInputs) -> None:
    """The one validation place for a plan's inputs: every field's type, bounds and choices, then the
    rules that name several fields. Rules that need the resolved model or hardware (``--seq-len`` against
    learned positions, ``--tp-degree`` against the GPUs per node, the global batch against micro-batch x
    GPUs) are checked where those are resolved, in ``advisor.plan``.

    Raises:
        AdvisorError: one line saying what is wrong and what to do.
    """
    for group in (inputs.source, inputs.training, inputs.cluster):
        validate_group(group)
    validate_training(inputs.training)
    s = inputs.source
    if s.input_shape is not None:
        if not s.model_factory:
            raise AdvisorError("--input-shape applies to --model-factory models only")
        if not s.input_shape or len(s.input_shape) > 5 or any(not 1 <= d <= 65536 for d in s.input_shape):
            raise AdvisorError(f"--input-shape needs 1-5 dimensions between 1 and 65536, got {s.input_shape}")
        if s.image_size is not None:  # the shape already sets the image's size: one of them would be dropped
            raise AdvisorError("--input-shape sets the whole input, --image-size too: give one of them")


def validate_run(run: RunOptions, strategy_names: tuple[str, ...]) -> None:
    """The run/output options: each field, then the flags that only make sense together.

    Raises:
        AdvisorError: one line, as ``validate``.
    """
    validate_group(run, strategy_names)
    if run.strategy and not (run.emit or run.verify):
        raise AdvisorError("--strategy chooses what --emit/--verify produce: add --emit DIR or --verify")
    if run.force and not run.emit:
        raise AdvisorError("--force only applies to --emit DIR")
    if run.emit is not None and not run.emit.strip():
        raise AdvisorError("--emit needs a directory path")
    for name in ("steps", "timeout"):
        if getattr(run, name) is not None and not run.verify:
            raise AdvisorError(f"--{name} applies to --verify only: add --verify or drop --{name}")


# ------------------------------------------------------------------------------- building and echo
def split_values(values: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """Flat ``{field name: value}`` -> ``{group: {field name: value}}`` (unset names keep defaults).

    Raises:
        KeyError: a name that is no schema field.
    """
    by_name = {f.name: f.group for f in all_fields()}
    out: dict[str, dict[str, object]] = {g: {} for g in GROUPS}
    for name, value in values.items():
        out[by_name[name]][name] = value
    return out


_Group = TypeVar("_Group")  # one of GROUPS' classes


def _group(cls: type[_Group], values: Mapping[str, object]) -> _Group:
    """``cls(**values)``: one group from the values a face gave, of whatever types they are (``validate`` checks
    them).

    Raises:
        TypeError: a name that is no field of ``cls``.
    """
    return cls(**values)


def inputs_from_values(values: Mapping[str, object]) -> tuple[PlanInputs, RunOptions]:
    """What every face does with what the user gave: flat field values -> typed, validated inputs.

    Raises:
        AdvisorError: as ``validate``.
        KeyError: a name that is no schema field (a face's bug, not the user's).
    """
    g = split_values(values)
    run = _group(RunOptions, g["run"])
    inputs = PlanInputs(
        source=_group(ModelSource, g["model"]),
        training=_group(TrainingOptions, g["training"]),
        cluster=_group(ClusterSpec, g["cluster"]),
        compare=run.compare,
        use_cache=not run.no_cache,
    )
    validate(inputs)
    return inputs, run


def plan_inputs(**values: object) -> PlanInputs:
    """``PlanInputs`` from field values by name, validated: ``plan_inputs(model="gpt2", gpus=2, seq_len=256)``.

    Raises:
        AdvisorError: as ``validate``.
    """
    return inputs_from_values(values)[0]


def echo(inputs: PlanInputs) -> dict[str, object]:
    """The inputs as JSON: ``{group: {field: value}}`` for every field a face can set (a pasted config is
    echoed as its source name, not its text)."""
    out: dict[str, object] = {}
    for name, group in (("model", inputs.source), ("training", inputs.training), ("cluster", inputs.cluster)):
        values: dict[str, object] = {}
        out[name] = values
        for f in (f for f in all_fields() if f.group == name and f.opt.faces):
            value = getattr(group, f.name)
            if f.name == "config_dict":
                value = None if value is None else (inputs.source.config_source or "pasted config")
            values[f.name] = list(value) if isinstance(value, tuple) else value
    out["use_cache"] = inputs.use_cache
    return out
