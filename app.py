"""Streamlit page for advisor: per-GPU memory by component for every strategy, the recommendation,
generated scripts and a verification run on this machine.

Run it from the repository root::

    .venv/bin/streamlit run app.py

A thin face over ``advisor.plan.plan`` (the function the CLI calls): this file only reads widgets
into ``PlanInputs``, caches the plan per input and draws the result. Sizes are bytes internally and
shown in GiB (2**30 bytes).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from advisor.document import plan_to_dict
from advisor.errors import AdvisorError
from advisor.faces import quiet_library_logs
from advisor.fields import Field
from advisor.gpu_presets import DEFAULT_GPU_PRESET
from advisor.model_presets import find_transformer_preset
from advisor.models import MAX_CONFIG_FILE_BYTES, known_model_names, parse_config_text
from advisor.plan import Plan, plan
from advisor.schema import PlanInputs, field_labels, fields_for, get_field, inputs_from_values
from advisor.units import GiB, counted, fmt_count
from strategies import strategy_names

log = logging.getLogger("advisor.app")

DEFAULT_MODEL = "gpt2"
DETECTED = "detected"
DEFAULT = "default"
# The chart's components, bottom to top: Breakdown fields (plan_to_dict keys) -> legend labels, then
# what nvidia-smi shows beyond the peak allocated.
BREAKDOWN = {"params": "params", "grads": "grads", "optimizer_states": "optimizer states",
             "activations": "activations", "buffers": "buffers", "other": "other"}
OVERHEAD = "device overhead"
COMPONENTS = (*BREAKDOWN.values(), OVERHEAD)
NO_SCRIPTS = "script generation not available"
DEFAULT_RUNS_DIR = "advisor-runs"  # what the CLI's --verify uses without --emit (advisor.verify), from the cwd
_DONE_OF_TOTAL = re.compile(r"\b(\d+)\s*/\s*(\d+)\b")


# Widgets on the page that are not schema inputs (the schema's page fields are keyed by their names).
CONTROLS = ("config_file", "zoom", "verify", "check_text", "check_file")
SIDEBAR_GROUPS = {"model": "Model", "training": "Training", "cluster": "Hardware"}


@dataclass(frozen=True)
class Form:
    """What the user chose, as plain JSON-able values: the cache key of the plan. ``values`` are schema
    field values by name (unset fields omitted); a pasted or uploaded config stays text until planning."""

    values: dict[str, Any]
    config_text: str | None = None  # pasted or uploaded config.json; wins over the catalog model when given
    config_source: str = "pasted config"

    def key(self) -> str:
        """Canonical JSON: the cache key (config text included, so a pasted config is keyed by text), with
        the registered strategies (a plan has one row per strategy)."""
        return json.dumps({"values": self.values, "config_text": self.config_text,
                           "config_source": self.config_source, "strategies": strategy_names()}, sort_keys=True)

    @classmethod
    def from_key(cls, key: str) -> Form:
        doc = json.loads(key)
        return cls(values=doc["values"], config_text=doc["config_text"], config_source=doc["config_source"])

    def to_inputs(self) -> PlanInputs:
        """The ``PlanInputs`` the CLI would build (``advisor.schema.inputs_from_values``). Config text is
        parsed as JSON only.

        Raises:
            AdvisorError: malformed JSON, JSON that is not an object, or a value the schema refuses.
        """
        values = dict(self.values)
        if self.config_text is not None:
            config = parse_config_text(self.config_text, self.config_source)
            if not isinstance(config, dict):  # resolve_model calls .get() before it checks the type
                raise AdvisorError(f"{self.config_source}: a config must be a JSON object ({{...}}), "
                                   f"got {type(config).__name__}")
            values.pop("model", None)
            values.update(config_dict=config, config_source=self.config_source)
        return inputs_from_values(values)[0]


@st.cache_resource(show_spinner=False)
def model_names() -> list[str]:
    """The catalog (imports torchvision once per server)."""
    return known_model_names()


@st.cache_resource(max_entries=64, show_spinner="Tracing the model and sizing every strategy...")
def cached_plan(form_key: str) -> Plan:
    """``plan()`` once per distinct input (shared read-only across sessions; errors are not cached)."""
    return plan(Form.from_key(form_key).to_inputs())


def md(text: str) -> str:
    """Escape text for Streamlit markdown (messages contain ``_``, ``*``, ``$``, brackets)."""
    return "".join("\\" + c if c in "\\`*_[]<>$|~#" else c for c in text)


# The core's messages name CLI flags; on this page the same choice is a widget (the schema gives both).
# Flags without a widget here (--tp-degree, --attention, ...) stay as they are: they are CLI options.
# --emit: on this page verification writes its run into a new folder of the runs folder.
FLAG_WIDGETS = field_labels() | {"--config": "the config.json box", "--emit": get_field("runs_dir").opt.label}
# "pass --host-mem" / "give --host-mem" -> "set 'Host RAM per node (GiB)'"; "flag --host-mem" -> the label.
_FLAG = re.compile(r"(?:\b(pass|give|add|flag) )?(--[a-z][a-z0-9-]*)")


def _widget_words(m: re.Match) -> str:
    verb, flag = m.group(1), m.group(2)
    if flag not in FLAG_WIDGETS:
        return m.group(0)
    label = f"'{FLAG_WIDGETS[flag]}'"
    return label if verb == "flag" else f"set {label}" if verb else label


def page_text(text: str) -> str:
    """A core message in this page's words: CLI flags that have a widget here become the widget's label
    (in quotes); "pass/give/add --flag" becomes "set 'label'". Not escaped (see ``say``)."""
    return _FLAG.sub(_widget_words, text)


def say(text: str) -> str:
    """``page_text``, markdown-escaped: for st.markdown, st.error and the like."""
    return md(page_text(text))


def one_line(err: BaseException) -> str:
    """An unexpected exception as one line: its type and the first line of its message."""
    text = str(err).strip()
    return f"{err.__class__.__name__}: {text.splitlines()[0][:300]}" if text else err.__class__.__name__


def gib(n_bytes: int | None) -> float | None:
    """Bytes -> GiB (2**30) for display, or None."""
    return None if n_bytes is None else round(n_bytes / GiB, 3)


# ------------------------------------------------------------------------------------------ inputs
def _optional_number(f: Field, help: str | None = None) -> int | float | None:
    """A number input that may be left empty (None: advisor's default, shown as the placeholder)."""
    integer = f.kind == "int"
    low = f.opt.low if f.opt.low is not None and (integer or f.opt.low > 0) else (1 if integer else None)
    value = st.number_input(f.opt.label, min_value=low, value=None, step=1 if integer else 1.0, key=f.name,
                            placeholder=f.opt.none or "", help=help or f.opt.help)
    return None if value is None else (int(value) if integer else float(value))


def _widget(f: Field) -> Any:
    """The widget of one schema field, keyed by the field's name: a selectbox for choices (with the
    default first when the field may be empty), a checkbox for switches, a number input otherwise."""
    if f.kind == "bool":
        return st.checkbox(f.opt.label, key=f.name, value=bool(f.default), help=f.opt.help)
    if f.opt.choices:
        options = tuple(f.opt.choices)
        if f.optional:
            options = (DEFAULT, *options)
        chosen = st.selectbox(f.opt.label, options, key=f.name, help=f.opt.help,
                              format_func=lambda v: f"default ({f.opt.none})" if v == DEFAULT else str(v))
        return None if chosen == DEFAULT else chosen
    if f.kind == "str":  # free text (LoRA target module names): empty means the default
        text = st.text_input(f.opt.label, key=f.name, placeholder=f.opt.none or "", help=f.opt.help)
        return text.strip() or None
    if f.optional:
        return _optional_number(f)
    # A float's step is a float (Streamlit refuses mixed types): small ones (a dropout) in 0.05 steps.
    step = 1 if f.kind == "int" else (0.05 if float(f.default) < 1 else 1.0)
    low = f.opt.low if f.opt.low is not None else (0.0 if f.kind == "float" else None)
    return st.number_input(f.opt.label, min_value=low, value=f.default, step=step, key=f.name, help=f.opt.help)


def _config_text() -> tuple[str | None, str]:
    """Uploaded file, else pasted text, else None. Returns (text, source name for messages)."""
    st.caption("A pasted or uploaded Hugging Face config.json replaces the catalog model (an upload wins over "
               "pasted text). It is read as JSON only; no code runs and nothing is downloaded.")
    pasted = st.text_area(get_field("config_dict").opt.label, key="config_dict", height=150,
                          placeholder='{"model_type": "llama", "hidden_size": 4096, ...}')
    upload = st.file_uploader("or upload a config.json", type=["json"], key="config_file")
    text, name = _upload_or_paste(upload, pasted, MAX_CONFIG_FILE_BYTES, "the model's config.json, not weights")
    return text, name or "pasted config"


def _upload_or_paste(upload: Any, pasted: str | None, limit: int, what: str) -> tuple[str | None, str | None]:
    """The uploaded file's text (it wins), else the pasted text, else None; with the upload's name.

    Raises:
        AdvisorError: over ``limit`` bytes or not UTF-8 (``what`` says what to give instead).
    """
    if upload is not None:
        data = upload.getvalue()
        if len(data) > limit:
            raise AdvisorError(f"{upload.name} is over {limit // 2**20} MiB: upload {what}")
        try:
            return data.decode("utf-8"), upload.name
        except UnicodeDecodeError:
            raise AdvisorError(f"{upload.name} is not UTF-8 text: upload {what}")
    if pasted and pasted.strip():
        if len(pasted.encode("utf-8")) > limit:
            raise AdvisorError(f"the pasted text is over {limit // 2**20} MiB: paste {what}")
        return pasted, None
    return None, None


def read_form() -> Form:
    """Draw the sidebar: the schema's page fields of the model, training and cluster groups, in order.

    Raises:
        AdvisorError: an unreadable upload.
    """
    values: dict[str, Any] = {}
    text, source = None, "pasted config"
    with st.sidebar:
        for group, title in SIDEBAR_GROUPS.items():
            st.header(title)
            for f in (f for f in fields_for("page") if f.group == group):
                if f.name == "model":
                    names = model_names()
                    values["model"] = st.selectbox(f.opt.label, names, index=names.index(DEFAULT_MODEL), key="model",
                                                   help="transformer presets (Hugging Face configs) and torchvision "
                                                        "classifiers")
                elif f.name == "config_dict":
                    text, source = _config_text()
                elif f.name in ("seq_len", "image_size"):
                    transformer = text is not None or find_transformer_preset(values["model"]) is not None
                    if transformer == (f.name == "seq_len"):
                        values[f.name] = _optional_number(f)
                elif f.name == "gpu":
                    gpu = st.selectbox(f.opt.label, (DETECTED, *f.opt.choices), key="gpu", help=f.opt.help,
                                       format_func=lambda g: f"detected GPUs (else {DEFAULT_GPU_PRESET})"
                                       if g == DETECTED else g)
                    values["gpu"] = None if gpu == DETECTED else gpu
                else:
                    values[f.name] = _widget(f)
    return Form(values={k: v for k, v in values.items() if v is not None}, config_text=text,
                config_source=source)


# ----------------------------------------------------------------------------------------- outputs
def show_summary(p: Plan, doc: dict[str, Any]) -> None:
    """Parameter count and the hardware, prominently; the rest of the inputs as a caption."""
    model, hw, tr = doc["model"], doc["hardware"], doc["training"]
    # A wrapping row of content-wide metrics, not fixed columns: a long value ("16 x H100-80GB", a long
    # model name) takes the width it needs and moves to the next line instead of being cut with "...".
    with st.container(horizontal=True, wrap=True, gap="large"):
        st.metric("Parameters", f"{model['num_params']:,}", width="content",
                  help=f"{fmt_count(model['num_params'])}; trainable {model['num_trainable_params']:,}")
        if model["num_trainable_params"] != model["num_params"]:  # LoRA or a frozen backbone
            st.metric("Trainable", f"{model['num_trainable_params']:,}", width="content",
                      help=f"{fmt_count(model['num_trainable_params'])} of {fmt_count(model['num_params'])}")
        st.metric("Model", model["name"], width="content")
        st.metric("GPUs", f"{hw['num_gpus']} x {hw['gpu_name']}", width="content")
        st.metric("GPU memory", f"{gib(hw['gpu_memory_bytes']):.2f} GiB", width="content",
                  help="usable per GPU, GiB = 2**30 bytes")
    shape = f"seq-len {model['seq_len']}" if p.spec.is_transformer else f"input {model['input_shape']}"
    st.caption(md(f"{model['source']}; {shape}; {tr['precision']}, {tr['optimizer']}, micro-batch "
                  f"{tr['micro_batch_size']}/GPU, activation checkpointing "
                  f"{'on' if tr['activation_checkpointing'] else 'off'}, attention {model['attention']}; "
                  f"{counted(hw['gpus_per_node'], 'GPU')} per node x {counted(hw['num_nodes'], 'node')}, {hw['interconnect']}"
                  + (f", network {hw['network']}" if hw["network"] else "")))


def show_recommendation(p: Plan) -> None:
    """The chosen strategy (or an explicit "nothing fits"), its reasons and every warning."""
    rec = p.recommendation
    if rec.strategy:
        st.success(md(f"Recommendation: {p.row(rec.strategy).title} ({rec.strategy})"))
    else:
        hw = p.hardware
        need = (f" The smallest cluster that fits: {counted(rec.min_gpus, 'GPU')} ({counted(rec.min_nodes, 'node')} of "
                f"{counted(hw.gpus_per_node, 'GPU')}) with full sharding (see the reasons)." if rec.min_gpus else "")
        st.error(md(f"Nothing fits: no strategy fits {p.spec.name} on {hw.num_gpus} x {hw.gpu_name} "
                    f"({hw.gpu_memory_bytes / GiB:.2f} GiB each).{need}"))
    st.markdown("\n".join(f"- {say(r)}" for r in rec.reasons))
    warnings = p.warnings + rec.warnings
    if warnings:
        st.warning("\n".join(f"- {say(w)}" for w in warnings))


def memory_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """Long-form per-GPU GiB by component for every applicable strategy (device overhead = device
    total - peak allocated)."""
    rows = []
    for s in doc["strategies"]:
        if not s["applicable"]:
            continue
        b = s["per_gpu_bytes"]
        parts = {label: b[key] for key, label in BREAKDOWN.items()} | {OVERHEAD: b["device_total"] - b["total"]}
        for order, (component, n) in enumerate(parts.items()):
            rows.append({"strategy": s["title"], "component": component, "order": order, "GiB": n / GiB,
                         "device total GiB": b["device_total"] / GiB})
    return pd.DataFrame(rows)


CHART_ROW_PX = 32  # height per strategy: each bar has a row of its own and its whole title as the label
CHART_AXES_PX = 70  # the axis and its title below the bars


def memory_chart(frame: pd.DataFrame, capacity_bytes: int, strategy_order: list[str],
                 zoom: bool = False) -> alt.Chart | alt.LayerChart:
    """Horizontal stacked bars, one row per strategy labelled with its whole title (however many
    strategies: no label is dropped, turned or cut), and a red dashed rule at the GPU's usable memory,
    named with its value in the axis title (theme-coloured text, readable on light and dark pages).
    ``zoom``: scale the axis to the longest bar (the capacity line is left out when it lies beyond)."""
    cap = capacity_bytes / GiB
    top = float(frame["device total GiB"].max()) * 1.05
    zoomed = zoom and 0 < top < cap
    title = (f"per-GPU memory (GiB); red dashed line: GPU memory {cap:.2f} GiB" if not zoomed else
             f"per-GPU memory (GiB); GPU memory {cap:.2f} GiB is beyond this scale")
    bars = alt.Chart(frame).mark_bar().encode(
        y=alt.Y("strategy:N", sort=strategy_order, title=None,
                axis=alt.Axis(labelLimit=0, labelOverlap=False, labelAngle=0, labelPadding=6)),
        x=alt.X("sum(GiB):Q", stack="zero", title=title,
                scale=alt.Scale(domain=[0, top]) if zoomed else alt.Scale()),
        color=alt.Color("component:N", sort=list(COMPONENTS), title="component"),
        order=alt.Order("order:Q"),
        tooltip=["strategy:N", "component:N", alt.Tooltip("GiB:Q", format=".2f"),
                 alt.Tooltip("device total GiB:Q", format=".2f")],
    ).properties(height=CHART_ROW_PX * len(strategy_order) + CHART_AXES_PX)
    if zoomed:
        return bars
    line = pd.DataFrame({"GiB": [cap]})
    rule = alt.Chart(line).mark_rule(color="red", strokeDash=[6, 4], size=2).encode(
        x="GiB:Q", tooltip=[alt.Tooltip("GiB:Q", format=".2f", title="GPU memory (GiB)")])
    return alt.layer(bars, rule)


TIME_PARTS = (("compute_s", "compute"), ("exposed_comm_s", "communication not hidden"), ("optimizer_s", "optimizer"))


def time_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """Long-form seconds per optimizer step by part for every timed strategy (issue 13)."""
    rows = []
    for s in doc["strategies"]:
        t = s.get("time")
        if not s["applicable"] or not t:
            continue
        for order, (key, label) in enumerate(TIME_PARTS):
            rows.append({"strategy": s["title"], "part": label, "order": order, "seconds": t[key],
                         "step (s)": t["step_s"]})
    return pd.DataFrame(rows)


def time_chart(frame: pd.DataFrame, strategy_order: list[str]) -> alt.Chart:
    """Horizontal stacked bars of one optimizer step's seconds per strategy, in the memory chart's rows."""
    return alt.Chart(frame).mark_bar().encode(
        y=alt.Y("strategy:N", sort=strategy_order, title=None,
                axis=alt.Axis(labelLimit=0, labelOverlap=False, labelAngle=0, labelPadding=6)),
        x=alt.X("sum(seconds):Q", stack="zero", title="seconds per optimizer step (data loading not modelled)"),
        color=alt.Color("part:N", sort=[label for _, label in TIME_PARTS], title="part"),
        order=alt.Order("order:Q"),
        tooltip=["strategy:N", "part:N", alt.Tooltip("seconds:Q", format=".4f"),
                 alt.Tooltip("step (s):Q", format=".4f")],
    ).properties(height=CHART_ROW_PX * len(strategy_order) + CHART_AXES_PX)


NONE_CELL = "—"  # a cell with nothing to show (not Markdown syntax, unlike "-")
TABLE_COLUMNS = ("strategy", "name", "fits", "device total (GiB)", "peak allocated (GiB)", "max micro-batch",
                 "grad. accumulation steps", "global batch", "host RAM / node (GiB)", "note")


def _fits_text(s: dict[str, Any]) -> str:
    """yes / no / ? (the verdict waits for host RAM nobody gave)."""
    return "?" if s["fits"] is None else "yes" if s["fits"] else "no"


def _note(s: dict[str, Any]) -> str:
    """Where the peak is and what is short, in the page's words (``page_text``)."""
    short = s["short_of"]
    what = ("host RAM per node unknown: give --host-mem" if short == "host RAM unknown" else
            f"short of {short}" if short else None)
    return page_text(f"peak in the {s['peak_phase']}" + (f"; {what}" if what else ""))


def strategy_table(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per strategy, as the text shown (a static table: nothing is cut or shown as "None"): fits,
    GiB, max micro-batch, accumulation steps, host RAM; "n/a" and the whole reason when n/a."""
    rows = []
    for s in doc["strategies"]:
        row = dict.fromkeys(TABLE_COLUMNS, NONE_CELL) | {"strategy": s["title"], "name": s["name"]}
        if not s["applicable"]:
            rows.append(row | {"fits": "n/a", "note": "n/a: " + page_text(s["reason"] or "does not apply")})
            continue
        b, host = s["per_gpu_bytes"], s["host_bytes_per_node"]
        rows.append(row | {"fits": _fits_text(s), "device total (GiB)": f"{b['device_total'] / GiB:.2f}",
                           "peak allocated (GiB)": f"{b['total'] / GiB:.2f}",
                           "max micro-batch": str(s["max_micro_batch_size"]),
                           "grad. accumulation steps": str(s["gradient_accumulation_steps"]),
                           "global batch": str(s["global_batch_size"]),
                           "host RAM / node (GiB)": f"{host / GiB:.2f}" if host else NONE_CELL, "note": _note(s)})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def show_memory(doc: dict[str, Any]) -> None:
    """The stacked chart with the capacity line, then the table."""
    st.subheader("Per-GPU memory by strategy (GiB)")
    frame = memory_frame(doc)
    if frame.empty:
        st.info("no strategy applies to this model and hardware")
    else:
        order = [s["title"] for s in doc["strategies"] if s["applicable"]]
        zoom = st.toggle("Scale to the bars", key="zoom",
                         help="zoom in on small bars; the GPU memory line is hidden when it lies above them")
        times = time_frame(doc)
        left, right = st.columns(2) if not times.empty else (st.container(), None)
        with left:
            st.altair_chart(memory_chart(frame, doc["hardware"]["gpu_memory_bytes"], order, zoom), width="stretch")
            st.caption("Bars: peak allocated by component plus device overhead (CUDA context, NCCL buffers, "
                       "allocator fragmentation), about what nvidia-smi shows. Red line: the GPU's usable memory.")
        if right is not None:
            with right:
                timed = [t for t in order if t in set(times["strategy"])]
                st.altair_chart(time_chart(times, timed), width="stretch")
                st.caption("One optimizer step at the global batch: compute (forward + backward of every "
                           "micro-step), communication that compute does not hide, the optimizer step. Data loading "
                           "is not modelled.")
    # st.table, not st.dataframe: a static table wraps long reasons instead of cutting them off. Its cells
    # are Markdown, so the text is escaped.
    st.table(strategy_table(doc).map(md), hide_index=True)


# --------------------------------------------------------------------------------- scripts, verify
def choose_strategy(p: Plan) -> str | None:
    """The strategy for scripts and verification; the recommendation by default."""
    names = [r.name for r in p.rows if r.applicable]
    if not names:
        return None
    titles = {r.name: r.title for r in p.rows}
    rec = p.recommendation.strategy
    return st.selectbox(get_field("strategy").opt.label, names, key="strategy",
                        index=names.index(rec) if rec in names else 0,
                        format_func=lambda n: f"{titles[n]} ({n})" + (" - recommended" if n == rec else ""))


def _mime(file_name: str) -> str:
    """Content type for a generated file's download."""
    return {"py": "text/x-python", "json": "application/json", "sh": "text/x-shellscript"}.get(
        file_name.rsplit(".", 1)[-1], "text/plain")


def show_downloads(p: Plan, strategy: str) -> None:
    """Download buttons for ``strategies.render.render_files``; an info line while it is missing."""
    try:
        from strategies.render import launch_command, render_files

        files = render_files(p, strategy)
        launch = launch_command(p, strategy)
    except (NotImplementedError, ImportError):
        st.info(f"{NO_SCRIPTS} yet for {strategy}")
        return
    except AdvisorError as err:
        st.info(md(f"{NO_SCRIPTS}: {err}"))
        return
    except Exception as err:  # another module's bug must not break the page
        log.exception("render_files failed")
        st.info(md(f"{NO_SCRIPTS}: {one_line(err)}"))
        return
    cols = st.columns(max(1, len(files)))
    for col, (name, text) in zip(cols, files.items()):
        col.download_button(f"Download {name}", text, file_name=name, mime=_mime(name), on_click="ignore",
                            key=f"dl-{strategy}-{name}")
    if launch:
        st.code(launch, language="bash")


class Progress:
    """Shows ``verify``'s progress reports inside an ``st.status``: strings become the status text; a
    fraction in [0, 1], a ``(done, total)`` pair of numbers or "N/M" in the text moves the bar. Accepts
    any call shape.
    Called from the script thread only (see ``follow_verify``)."""

    def __init__(self, status: Any) -> None:
        self._bar = status.progress(0.0)
        self._text = status.empty()
        self._elapsed = status.empty()
        self._start = time.monotonic()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        values = list(args) + list(kwargs.values())
        texts = [str(v) for v in values if not isinstance(v, (int, float)) or isinstance(v, bool)]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        fraction = None
        if len(numbers) >= 2 and numbers[1]:
            fraction = numbers[0] / numbers[1]
        elif len(numbers) == 1 and 0 <= numbers[0] <= 1:
            fraction = float(numbers[0])
        elif texts and (m := _DONE_OF_TOTAL.search(" ".join(texts))) and int(m.group(2)):
            fraction = int(m.group(1)) / int(m.group(2))  # "step 3/6 loss 2.1"
        if fraction is not None:
            self._bar.progress(min(max(fraction, 0.0), 1.0))
        elif numbers:
            texts += [str(n) for n in numbers]
        if texts:
            self._text.text(" ".join(texts))

    def tick(self) -> None:
        self._elapsed.caption(f"{time.monotonic() - self._start:.0f} s")


@dataclass
class VerifyJob:
    """A verification running in a worker thread. Kept in ``st.session_state``: a rerun of the page
    (any widget change) resumes following it instead of losing it, and sessions never share one."""

    run_key: str
    strategy: str
    steps: int
    future: Future
    messages: queue.SimpleQueue


def new_run_dir(folder: str, model: str, strategy: str) -> Path:
    """A folder for one verification run that does not exist yet: ``folder/MODEL-STRATEGY-TIME``, with
    ``-2``, ``-3``... when that is taken (an existing run is never written into).

    Raises:
        AdvisorError: ``folder`` exists and is not a folder.
    """
    label = get_field("runs_dir").opt.label
    try:
        base = runs_base(folder)
        if base.exists() and not base.is_dir():
            raise AdvisorError(f"{label} {base}: exists and is not a folder: choose another")
        stem = f"{run_stem(model, strategy)}-{time.strftime('%Y%m%d-%H%M%S')}"
        run, n = base / stem, 2
        while run.exists():
            run, n = base / f"{stem}-{n}", n + 1
    except (OSError, ValueError) as err:  # a path the OS refuses (a NUL byte, too long, no permission)
        raise AdvisorError(f"{label} {folder[:200]!r}: not a usable folder ({err}): choose another")
    return run


def runs_base(folder: str) -> Path:
    """The runs folder as an absolute path (empty: the default, from the server's working directory)."""
    return Path(folder.strip() or DEFAULT_RUNS_DIR).expanduser().resolve()


def run_stem(model: str, strategy: str) -> str:
    """MODEL-STRATEGY as a run folder's name starts (advisor.verify names its runs the same way)."""
    return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', model)}-{strategy}"


def start_verify(inputs: PlanInputs, strategy: str, steps: int, timeout_s: int, run_key: str,
                 run_dir: Path) -> VerifyJob | None:
    """Import ``advisor.verify`` (optional: it may not exist yet) and start ``verify`` in a worker
    thread, writing into ``run_dir`` (a new folder: never ``force``); its progress reports are queued for
    the script thread. None after showing why not."""
    try:
        verify = importlib.import_module("advisor.verify").verify
    except (ImportError, AttributeError) as err:
        st.info(md(f"verification is not available yet ({err})"))
        return None
    messages: queue.SimpleQueue = queue.SimpleQueue()
    future: Future = Future()

    def work() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(verify(inputs, strategy, steps=steps, timeout_s=timeout_s, out_dir=str(run_dir),
                                     force=False, progress=lambda *a, **k: messages.put((a, k))))
        except BaseException as err:  # handed to the script thread, which shows it
            future.set_exception(err)

    threading.Thread(target=work, name=f"advisor-verify-{strategy}", daemon=True).start()
    return VerifyJob(run_key, strategy, steps, future, messages)


def follow_verify(job: VerifyJob) -> dict[str, Any] | None:
    """Show the job's progress until it ends; return its result as plain data, or None after
    showing the error. Polls from the script thread (Streamlit calls from the worker would be lost)."""
    with st.status(f"Verifying {job.strategy} on this machine ({job.steps} steps)...", expanded=True) as status:
        progress = Progress(status)
        while True:
            done = job.future.done()
            while not job.messages.empty():
                args, kwargs = job.messages.get()
                progress(*args, **kwargs)
            if done:
                break
            progress.tick()  # a Streamlit call, so a rerun request can end this wait (the job goes on)
            time.sleep(0.3)
        err = job.future.exception()
        if isinstance(err, AdvisorError):
            busy = type(err).__name__ == "VerifyBusy"
            status.update(label="another verification is running" if busy else "verification failed", state="error")
            (st.warning if busy else st.error)(say(str(err)))
            return None
        if err is not None:
            log.error("verify failed", exc_info=err)
            status.update(label="verification failed", state="error")
            st.error(md(f"verification failed: {one_line(err)}"))
            return None
        result = job.future.result()
        ok = bool(getattr(result, "ok", False))
        status.update(label="verification finished", state="complete" if ok else "error")
    return {"ok": ok, "message": str(getattr(result, "message", "")),
            "per_rank": list(getattr(result, "per_rank", []) or []),
            "relative_error": getattr(result, "relative_error", None),
            "log_dir": str(getattr(result, "log_dir", "") or "")}


def show_verify_result(result: dict[str, Any]) -> None:
    """Verdict, estimate vs measured peak per rank, relative error and where the logs are."""
    (st.success if result["ok"] else st.error)(say(result["message"] or ("verified" if result["ok"] else "failed")))
    rows = []
    for r in result["per_rank"]:
        measured, estimated = r.get("measured_peak_bytes"), r.get("estimated_peak_bytes")
        err = (estimated - measured) / measured if estimated is not None and measured else None
        rows.append({"rank": r.get("rank"), "estimated peak (GiB)": gib(estimated),
                     "measured peak (GiB)": gib(measured),
                     "estimate error": None if err is None else f"{err:+.1%}"})
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    if result["relative_error"] is not None:
        st.metric("Relative error of the estimate", f"{result['relative_error']:+.1%}",
                  help="(estimate - measured) / measured peak allocated, as advisor.verify reports it")
    if result["log_dir"]:
        st.caption(md(f"logs: {result['log_dir']}"))


def show_verify(form: Form, strategy: str, model: str) -> None:
    """The "verify on this machine" button and where the run goes; the last result stays while the
    inputs are unchanged."""
    st.subheader("Verify on this machine")
    st.caption("Runs the chosen strategy's training for a few steps on this machine's devices and compares "
               "the measured peak memory per rank with the estimate.")
    c1, c2 = st.columns(2)
    sf, tf = get_field("steps"), get_field("timeout")
    steps = int(c1.number_input(sf.opt.label, min_value=int(sf.opt.low), max_value=int(sf.opt.high), value=6,
                                key="steps", help=sf.opt.help))
    timeout_s = int(c2.number_input(tf.opt.label, min_value=1, max_value=int(tf.opt.high), value=600, key="timeout",
                                    help=tf.opt.help))
    rf = get_field("runs_dir")
    folder = st.text_input(rf.opt.label, value=str(Path(DEFAULT_RUNS_DIR).resolve()), key="runs_dir", help=rf.opt.help)
    try:
        where = str(runs_base(folder) / f"{run_stem(model, strategy)}-TIME")
    except (OSError, ValueError):
        where = f"{folder[:200]}/..."
    st.caption(md(f"a run goes into a new folder {where} (train.py, launch.sh, run.log, the report); existing "
                  "runs are never overwritten"))
    run_key = f"{form.key()}|{strategy}"
    job: VerifyJob | None = st.session_state.get("verify_job")
    if st.button("Verify on this machine", key="verify"):
        if job is not None:
            st.warning("a verification started from this page is still running: its progress is below")
        else:
            st.session_state.pop("verify_result", None)
            try:
                run_dir = new_run_dir(folder, model, strategy)
            except AdvisorError as err:
                st.error(say(str(err)))
                return
            job = start_verify(form.to_inputs(), strategy, steps, timeout_s, run_key, run_dir)
            if job is not None:
                st.session_state["verify_job"] = job
    if job is not None:
        if job.run_key != run_key:
            st.caption(md(f"following the verification of {job.strategy} started with other inputs"))
        result = follow_verify(job)
        del st.session_state["verify_job"]
        if result is not None:
            st.session_state["verify_result"] = (job.run_key, result)
    saved = st.session_state.get("verify_result")
    if saved and saved[0] == run_key:
        show_verify_result(saved[1])


# ------------------------------------------------------------------------------------ check a script
MAX_SCRIPT_BYTES = 1 << 20


def _script_text() -> tuple[str | None, str]:
    """Uploaded .py file, else pasted text, else None. Returns (text, file name for the findings)."""
    pasted = st.text_area("Paste your training script", key="check_text", height=260,
                          placeholder="import torch.distributed as dist\n...")
    upload = st.file_uploader("or upload a .py file", type=["py"], key="check_file")
    text, name = _upload_or_paste(upload, pasted, MAX_SCRIPT_BYTES, "the training script itself (Python source)")
    return text, name or "train.py"


def findings_frame(findings: list) -> pd.DataFrame:
    """One row per finding: line, rule, severity, message, fix, field note."""
    return pd.DataFrame([{"line": f.line, "rule": f.rule, "severity": f.severity, "message": f.message,
                          "fix": f.fix, "field notes": f.field_note} for f in findings],
                        columns=["line", "rule", "severity", "message", "fix", "field notes"])


def show_check() -> None:
    """The 'Check my script' tab: the single-to-multi-GPU pitfalls in a pasted or uploaded script
    (``advisor.check``: the file is parsed as a syntax tree, never run)."""
    from advisor.check import FAILING, RULES, check_source

    st.caption(f"Finds the pitfalls of moving a one-GPU script to many ({len(RULES)} rules from the field "
               "notes: samplers, ranks, DDP order, checkpoints, accumulation...). The script is parsed, never "
               "run. Same as `python -m advisor check train.py`.")  # static text: markdown on purpose
    try:
        text, name = _script_text()
        if text is None:
            return
        findings = check_source(text, name)
    except AdvisorError as err:
        st.error(say(str(err)))
        return
    if not findings:
        st.success(f"No findings: none of the {len(RULES)} rules fired on {name}")
        return
    failing = sum(f.severity in FAILING for f in findings)
    (st.error if failing else st.info)(md(f"{len(findings)} finding(s) in {name}: {failing} error(s)/warning(s), "
                                          f"{len(findings) - failing} info"))
    st.dataframe(findings_frame(findings), hide_index=True, width="stretch")
    for rule_id in dict.fromkeys(f.rule for f in findings):
        with st.expander(f"{rule_id}: {RULES[rule_id].title}"):
            st.text(RULES[rule_id].doc)


# -------------------------------------------------------------------------------------------- page
def main() -> None:
    """The page: inputs in the sidebar; summary, recommendation, memory, scripts and verification in
    the first tab; the script checker in the second."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never contact a model hub (set at the entry point)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    quiet_library_logs()  # bitsandbytes' optional-kernel warning (advisor.faces)
    st.set_page_config(page_title="advisor: GPU memory for training", layout="wide")
    st.title("How much GPU memory will training need?")
    plan_tab, check_tab = st.tabs(["Memory and strategy", "Check my training script"])
    with check_tab:
        show_check()
    with plan_tab:
        show_plan()


def show_plan() -> None:
    """Plan from the sidebar's inputs: summary, recommendation, memory, scripts and verification."""
    try:
        form = read_form()
        p = cached_plan(form.key())
        doc = plan_to_dict(p)
    except AdvisorError as err:
        st.error(say(str(err)))
        return
    except Exception as err:  # a bug elsewhere: one line here, the traceback in the server log
        log.exception("planning failed")
        st.error(md(f"internal error while planning: {one_line(err)}"))
        return
    show_summary(p, doc)
    show_recommendation(p)
    show_memory(doc)
    st.subheader("Training scripts")
    strategy = choose_strategy(p)
    if strategy is None:
        st.info("no strategy applies: nothing to generate or verify")
        return
    show_downloads(p, strategy)
    show_verify(form, strategy, p.spec.name)


if __name__ == "__main__":  # `streamlit run` executes the page as __main__
    main()
