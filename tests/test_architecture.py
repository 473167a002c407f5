"""The shape of the house (issue 11): layers import downward only, with no cycle (imports inside
functions count); no code outside strategies/ decides behaviour by a strategy's name; a strategy
defined in one module and registered with one line reaches the plan, the CLI and the page; the CLI
flags and the page's widgets are exactly the schema's fields for that face."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from advisor import schema, training_options

ROOT = Path(__file__).resolve().parents[1]

# Layers, bottom first. A module may import its own layer and the ones below; check and doctor stand
# beside plan and may import only the bottom layer (and themselves).
LAYERS: list[tuple[str, ...]] = [
    (
        "advisor",
        "advisor.choices",
        "advisor.errors",
        "advisor.units",
        "advisor.gpu_presets",
        "advisor.model_presets",
        "advisor.schema",
        "advisor.training_options",
        "advisor.training_rules",
        "advisor.fields",
        "advisor.free_text",
        "advisor.faces",
        "advisor.locks",
        "advisor.cache",
        "advisor.cache_face",
        "advisor.processes",
        "advisor.once_cache",
    ),
    (
        "advisor.models",
        "advisor.hardware",
        "advisor.checkpointing",
        "advisor.measure",
        "advisor.trace",
        "advisor.memory",
        "advisor.profile",
        "advisor.context",
    ),
    ("strategies",),
    (
        "advisor.rows",
        "advisor.candidates",
        "advisor.layout_search",
        "advisor.lora_text",
        "advisor.explain",
        "advisor.recommend",
        "advisor.invariants",
        "advisor.variants",
        "advisor.ladder_state",
        "advisor.ladder",
        "advisor.applied_options",
        "advisor.flag_notes",
    ),
    ("advisor.plan",),
    ("advisor.document",),
    ("advisor.verify", "advisor.verify_setup", "advisor.run_report"),
    (
        "advisor.cli",
        "advisor.calibrate_face",
        "advisor.__main__",
        "advisor.text_table",
        "advisor.text_report",
        "advisor.page",
        "app",
        "bench",
    ),
]
BESIDE = ("advisor.check", "advisor.doctor")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    # advisor/ with its packages (advisor/page: the Streamlit page) and the repository's app.py shim.
    files = [
        ROOT / "app.py",
        *(ROOT / "advisor").rglob("*.py"),
        *(ROOT / "strategies").rglob("*.py"),
        *(ROOT / "bench").glob("*.py"),
    ]
    # Fragments, templates and the probe are text pasted into (or run beside) generated scripts, not modules of
    # this program.
    text = ("fragments", "templates", "probe")
    return {_module_name(p): p for p in files if not any(t in p.relative_to(ROOT).parts for t in text)}


def _imports(name: str, path: Path) -> set[str]:
    """Every module this one imports, at any depth of its syntax tree (functions included)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # "from . import x" imports module x
    return found


def _own(target: str, modules: dict[str, Path]) -> str | None:
    """The longest module of this program that ``target`` names (None: a third-party module)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def _layer(name: str) -> int | str:
    if any(name == b or name.startswith(b + ".") for b in BESIDE):
        return "beside"
    best = None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]


def _graph() -> dict[str, set[str]]:
    modules = _sources()
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for t in _imports(name, path) if (m := _own(t, modules)) and m != name}
    return graph


def test_layers_import_downward_only():
    bad = []
    for name, targets in _graph().items():
        mine = _layer(name)
        for t in targets:
            theirs = _layer(t)
            if mine == "beside":
                ok = theirs == 0 or any(t == b or t.startswith(b + ".") for b in BESIDE if name.startswith(b))
            else:
                ok = theirs != "beside" and theirs <= mine or (theirs == "beside" and mine == len(LAYERS) - 1)
            if not ok:
                bad.append(f"{name} (layer {mine}) imports {t} (layer {theirs})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _graph()
    # Package __init__ modules that re-export their own submodules are edges down into the package, not cycles.
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w.startswith(v + "."):
                continue  # a package importing its own submodule
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    assert not cycles, cycles


def test_the_page_package_is_scanned_in_the_faces_layer():
    modules = _sources()
    page = {name for name in modules if name.startswith("advisor.page.")}
    assert {"advisor.page.app", "advisor.page.form", "advisor.page.launch"} <= page
    assert {_layer(name) for name in page | {"app", "advisor.cli"}} == {len(LAYERS) - 1}


def test_the_import_scan_sees_imports_inside_functions():
    imports = _imports("advisor.cli", ROOT / "advisor" / "cli.py")
    assert "advisor.plan" in imports and "advisor.verify" in imports  # both are imported inside functions


def _strategy_words() -> set[str]:
    from strategies import strategy_names

    names = set(strategy_names())
    parts = {p for n in names for p in (n.split("_")[0], "_" + n.split("_", 1)[1] if "_" in n else "")}
    return names | {p for p in parts if p} | {n.rstrip("0123456789") for n in names}


def _name_comparisons(path: Path, words: set[str]) -> list[str]:
    offenders = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                consts += side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
        ):
            for arg in node.args:
                consts += arg.elts if isinstance(arg, ast.Tuple) else [arg]
        hits = [c.value for c in consts if isinstance(c, ast.Constant) and c.value in words]
        if hits:
            offenders.append(f"{path.name}:{node.lineno}: {hits}")
    return offenders


def test_no_strategy_name_is_compared_outside_strategies():
    """Behaviour by name (``name == "zero3"``, ``startswith("zero")``, ``in ("tp", "tp_dp")``) belongs to
    the strategy's own attributes. advisor/check reads users' scripts (their variables are often called
    ``ddp``), so it is not scanned."""
    words = _strategy_words()
    offenders = [
        o
        for name, path in _sources().items()
        if not name.startswith(("strategies", "advisor.check"))
        for o in _name_comparisons(path, words)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_name_scan_catches_a_name_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        'if s.name.startswith("zero"):\n    pass\nif s.name in ("tp", "tp_dp"):\n    pass\n'
        'ok = s.name == "zero3_offload"\nfine = s.offload\n'
    )
    assert len(_name_comparisons(bad, _strategy_words())) == 3


def _choice_values() -> set[str]:
    """Every value of the closed sets in ``advisor.choices`` (precisions, optimizers, devices, trace modes,
    launchers, attention kernels, dtypes, quantizations, frameworks, FSDP2 gradient syncs)."""
    from advisor.choices import CHOICES

    return {member.value for choice in CHOICES for member in choice}


def test_no_choice_value_is_compared_outside_choices():
    """A precision, optimizer, device, launcher (or any other ``advisor.choices`` value) is compared as its enum
    member (``precision == Precision.FP32``, ``device != Device.CPU``) or asked through a property
    (``optimizer.is_paged``), never as a string literal: the sets live in one module. torch's own device strings
    (``t.device.type == "cpu"``) count too (``Device.CPU == "cpu"``), so the scan stays strict. advisor/check reads
    users' scripts (their strings are not these values) and bench is no part of the program: neither is scanned."""
    words = _choice_values()
    skip = ("advisor.choices", "advisor.check", "bench")
    offenders = [
        o
        for name, path in _sources().items()
        if not any(name == s or name.startswith(s + ".") for s in skip)
        for o in _name_comparisons(path, words)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_value_scan_catches_a_value_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        'if opts.precision == "pure-bf16":\n    pass\nif opt not in ("adam", "adamw"):\n    pass\n'
        'on_cpu = t.device.type != "cpu"\nds = launcher.name.endswith("deepspeed")\n'
        'ok = opts.precision == Precision.PURE_BF16\nlabel = "bf16"\nfine = opts.optimizer.is_paged\n'
    )
    assert len(_name_comparisons(bad, _choice_values())) == 4


def test_schema_choices_become_enum_members():
    """The faces pass plain strings; the schema holds the members (``TrainingOptions.__post_init__``), and a
    value outside the set stays as it came, for ``validate`` to refuse by its flag."""
    from dataclasses import replace

    from advisor.choices import Attention, Dtype, Optimizer, Precision, Quant
    from advisor.errors import AdvisorError

    t = schema.plan_inputs(
        model="gpt2",
        precision="pure-bf16",
        optimizer="paged-adamw",
        attention="math",
        lora_rank=8,
        lora_dtype="bf16",
        quantize="nf4",
    ).training
    assert (t.precision, t.optimizer, t.attention, t.lora_dtype, t.quantize) == (
        Precision.PURE_BF16,
        Optimizer.PAGED_ADAMW,
        Attention.MATH,
        Dtype.BF16,
        Quant.NF4,
    )
    assert type(t.precision) is Precision and type(replace(t, precision="fp16").precision) is Precision
    assert (
        type(schema.TrainingOptions().optimizer) is Optimizer
        and schema.echo(schema.plan_inputs(model="gpt2"))["training"]["optimizer"] == "adamw"
    )
    assert schema.TrainingOptions(precision="int4").precision == "int4"
    with pytest.raises(AdvisorError, match="got 'int4'"):
        schema.plan_inputs(model="gpt2", precision="int4")
    choices = (*training_options.PRECISIONS, *training_options.OPTIMIZERS, *training_options.ATTENTION_CHOICES)
    assert all(type(c) is str for c in choices)


# ------------------------------------------------------------------------- a toy strategy, end to end
def test_a_strategy_in_one_module_reaches_plan_cli_and_page(capsys):
    from streamlit.testing.v1 import AppTest

    from advisor.cli import build_parser, main
    from advisor.plan import plan
    from strategies import REGISTRY
    from tests.fixtures.toy_strategy import ToyStrategy

    with REGISTRY.added(ToyStrategy()):
        p = plan(schema.plan_inputs(model="resnet18", image_size=32, gpus=2, gpu="A100-80GB", detect_hardware=False))
        toy = p.row("toy")
        assert toy.applicable and toy.memory.peak.total == p.row("ddp").memory.peak.total
        assert "toy" in build_parser().format_help()
        assert main(["resnet18", "--image-size", "32", "--gpus", "2", "--gpu", "A100-80GB", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [s["name"] for s in doc["strategies"]][-1] == "toy"
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
        at.run()
        at.selectbox(key="model").select("resnet18").run()
        assert "toy" in at.selectbox(key="strategy").options[-1]
        assert not at.exception
    assert "toy" not in build_parser().format_help()  # unregistered again


# ---------------------------------------------------------------------- faces derived from the schema
def test_cli_flags_are_exactly_the_schema_cli_fields():
    from advisor.cli import build_parser

    parser = build_parser()
    flags = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help", "--version"}
    positionals = {a.dest for a in parser._actions if not a.option_strings}
    cli = schema.fields_for("cli")
    short = {f.opt.short for f in cli if f.opt.short}  # second spellings (--pp for --pp-degree, --tp for --tp-degree)
    assert short == {"--pp", "--tp"}
    assert flags == {f.opt.flag for f in cli if not f.opt.positional} | short
    assert positionals == {f.name for f in cli if f.opt.positional} == {"model"}


def test_help_lists_the_registries_choices():
    from advisor.cli import build_parser
    from advisor.gpu_presets import GPU_PRESETS, NETWORKS
    from strategies import strategy_names

    text = " ".join(build_parser().format_help().split())
    for name in [
        *(p.name for p in GPU_PRESETS.values()),
        *NETWORKS,
        *strategy_names(),
        *training_options.PRECISIONS,
        *training_options.OPTIMIZERS,
        *training_options.ATTENTION_CHOICES,
    ]:
        assert name in text, name


def test_page_widgets_are_exactly_the_schema_page_fields():
    from streamlit.testing.v1 import AppTest

    from advisor.page.app import CONTROLS

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.run()
    at.selectbox(key="model").select("resnet18").run()  # the vision fields
    vision = _widget_keys(at)
    at.selectbox(key="model").select("gpt2").run()  # the transformer fields
    keys = (vision | _widget_keys(at)) - set(CONTROLS)
    assert not at.exception
    assert keys == {f.name for f in schema.fields_for("page")}


def _widget_keys(at) -> set[str]:
    kinds = ("selectbox", "number_input", "checkbox", "text_area", "toggle", "button", "text_input", "file_uploader")
    return {w.key for kind in kinds for w in getattr(at, kind) if w.key and not w.key.startswith("$$")}


def test_every_schema_field_is_documented_and_typed():
    for f in schema.all_fields():
        assert f.opt.help, f.name
        assert f.kind in ("bool", "int", "float", "str", "shape", "dict"), f.name
        assert set(f.opt.faces) <= set(schema.FACES), f.name
        if "page" in f.opt.faces:
            assert f.opt.label, f"{f.name} is on the page without a label"
        if "cli" in f.opt.faces and not f.opt.positional:
            assert f.opt.flag and f.opt.flag.startswith("--"), f.name


@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": "gpt2", "gpus": 0}, "--gpus must be between 1 and 64"),
        ({"model": "gpt2", "nodes": 10**6}, "--nodes 1000000 is absurd"),
        ({"model": "gpt2", "precision": "int4"}, "--precision must be one of bf16, fp16, fp32, pure-bf16"),
        ({"model": "gpt2", "network": "carrier-pigeon"}, "--network must be one of ib-ndr"),
        ({"model": "gpt2", "safety_factor": 3.0}, "--safety-factor must be between 1.0 and 2.0"),
        ({"model": "gpt2", "host_mem_gib": -1.0}, "--host-mem must be above 0 and at most"),
        ({"model": "gpt2", "micro_batch_size": 2.5}, "--micro-batch-size must be an integer"),
        ({"model": "gpt2", "base_lr": 0.1}, "--base-lr and --base-batch-size go together"),
        ({"model": "resnet50", "input_shape": (3, 32, 32)}, "--input-shape applies to --model-factory"),
    ],
)
def test_one_validation_place_names_the_flag(values, message):
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError) as err:
        schema.inputs_from_values(values)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_inputs_are_echoed_in_the_json(capsys):
    from advisor.cli import main

    assert (
        main(["resnet18", "--image-size", "32", "--gpus", "2", "--gpu", "L4-24GB", "--host-mem", "64", "--json"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 2
    assert doc["inputs"]["model"]["model"] == "resnet18" and doc["inputs"]["model"]["image_size"] == 32
    assert doc["inputs"]["cluster"] | {"gpus": 2, "gpu": "L4-24GB", "host_mem_gib": 64.0} == doc["inputs"]["cluster"]
    assert doc["hardware"]["host_mem_state"] == "given"
