"""The page's sidebar: what the user chose as a ``Form`` (the plan's cache key), drawn from the schema's page
fields (a widget per field, keyed by the field's name), and the pasted or uploaded config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

import streamlit as st

from advisor.errors import AdvisorError
from advisor.fields import Field
from advisor.gpu_presets import DEFAULT_GPU_PRESET
from advisor.model_presets import find_transformer_preset
from advisor.models import MAX_CONFIG_FILE_BYTES, known_model_names, parse_config_text
from advisor.plan import Plan, plan
from advisor.schema import PlanInputs, fields_for, get_field, inputs_from_values
from strategies import strategy_names

DEFAULT_MODEL = "gpt2"
DETECTED = "detected"
DEFAULT = "default"
SIDEBAR_GROUPS = {"model": "Model", "training": "Training", "cluster": "Hardware"}

FormValue = bool | int | float | str  # one widget's value (None: unset, left out of the form)


class Upload(Protocol):
    """What the page reads of an ``st.file_uploader`` file."""

    name: str

    def getvalue(self) -> bytes: ...


@dataclass(frozen=True)
class Form:
    """What the user chose, as plain JSON-able values: the cache key of the plan. ``values`` are schema
    field values by name (unset fields omitted); a pasted or uploaded config stays text until planning."""

    values: dict[str, FormValue]
    config_text: str | None = None  # pasted or uploaded config.json; wins over the catalog model when given
    config_source: str = "pasted config"

    def key(self) -> str:
        """Canonical JSON: the cache key (config text included, so a pasted config is keyed by text), with
        the registered strategies (a plan has one row per strategy)."""
        return json.dumps(
            {
                "values": self.values,
                "config_text": self.config_text,
                "config_source": self.config_source,
                "strategies": strategy_names(),
            },
            sort_keys=True,
        )

    @classmethod
    def from_key(cls, key: str) -> Form:
        """The form whose ``key()`` is ``key``."""
        doc = json.loads(key)
        return cls(values=doc["values"], config_text=doc["config_text"], config_source=doc["config_source"])

    def to_inputs(self) -> PlanInputs:
        """The ``PlanInputs`` the CLI would build (``advisor.schema.inputs_from_values``). Config text is
        parsed as JSON only.

        Raises:
            AdvisorError: malformed JSON, JSON that is not an object, or a value the schema refuses.
        """
        values: dict[str, object] = dict(self.values)
        if self.config_text is not None:
            config = parse_config_text(self.config_text, self.config_source)
            if not isinstance(config, dict):  # resolve_model calls .get() before it checks the type
                raise AdvisorError(
                    f"{self.config_source}: a config must be a JSON object ({{...}}), got {type(config).__name__}"
                )
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


def _optional_number(f: Field, help: str | None = None) -> int | float | None:
    """A number input that may be left empty (None: advisor's default, shown as the placeholder)."""
    low, placeholder, text = f.opt.low, f.opt.none or "", help or f.opt.help
    if f.kind == "int":
        count = st.number_input(
            f.label,
            min_value=1 if low is None else int(low),
            value=None,
            step=1,
            key=f.name,
            placeholder=placeholder,
            help=text,
        )
        return None if count is None else int(count)
    # Every float the page asks for is 0 or more (a low of 0.0 is exclusive: the schema's check says so in one line);
    # a fraction (a dropout, at most 1) in 0.05 steps.
    high = f.opt.high
    value = st.number_input(
        f.label,
        min_value=0.0 if low is None else float(low),
        max_value=None if high is None else float(high),
        value=None,
        step=0.05 if high is not None and high <= 1 else 1.0,
        key=f.name,
        placeholder=placeholder,
        help=text,
    )
    return None if value is None else float(value)


def _widget(f: Field) -> FormValue | None:
    """The widget of one schema field, keyed by the field's name: a selectbox for choices (with the
    default first when the field may be empty), a checkbox for switches, a number input otherwise."""
    if f.kind == "bool":
        return st.checkbox(f.label, key=f.name, value=bool(f.default), help=f.opt.help)
    if f.opt.choices:
        options = tuple(f.opt.choices)
        if f.optional:
            options = (DEFAULT, *options)
        chosen = st.selectbox(
            f.label,
            options,
            key=f.name,
            help=f.opt.help,
            format_func=lambda v: f"default ({f.opt.none})" if v == DEFAULT else str(v),
        )
        return None if chosen == DEFAULT else chosen
    if f.kind == "str":  # free text (LoRA target module names): empty means the default
        text = st.text_input(f.label, key=f.name, placeholder=f.opt.none or "", help=f.opt.help)
        return text.strip() or None
    if f.optional:
        return _optional_number(f)
    default, low = f.default, f.opt.low
    if f.kind == "int":
        assert isinstance(default, int), f"schema field {f.name} is an integer"
        return st.number_input(
            f.label, min_value=None if low is None else int(low), value=default, step=1, key=f.name, help=f.opt.help
        )
    assert isinstance(default, (int, float)), f"schema field {f.name} is a number"
    # A float's step is a float (Streamlit refuses mixed types): small ones (a dropout) in 0.05 steps.
    return st.number_input(
        f.label,
        min_value=0.0 if low is None else low,
        value=default,
        step=0.05 if float(default) < 1 else 1.0,
        key=f.name,
        help=f.opt.help,
    )


def _config_text() -> tuple[str | None, str]:
    """Uploaded file, else pasted text, else None. Returns (text, source name for messages)."""
    st.caption(
        "A pasted or uploaded Hugging Face config.json replaces the catalog model (an upload wins over "
        "pasted text). It is read as JSON only; no code runs and nothing is downloaded."
    )
    pasted = st.text_area(
        get_field("config_dict").label,
        key="config_dict",
        height=150,
        placeholder='{"model_type": "llama", "hidden_size": 4096, ...}',
    )
    upload = st.file_uploader("or upload a config.json", type=["json"], key="config_file")
    text, name = upload_or_paste(upload, pasted, MAX_CONFIG_FILE_BYTES, "the model's config.json, not weights")
    return text, name or "pasted config"


def upload_or_paste(upload: Upload | None, pasted: str | None, limit: int, what: str) -> tuple[str | None, str | None]:
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
    values: dict[str, FormValue | None] = {}
    text, source = None, "pasted config"
    with st.sidebar:
        for group, title in SIDEBAR_GROUPS.items():
            st.header(title)
            for f in (f for f in fields_for("page") if f.group == group):
                if f.name == "model":
                    names = model_names()
                    values["model"] = st.selectbox(
                        f.label,
                        names,
                        index=names.index(DEFAULT_MODEL),
                        key="model",
                        help="transformer presets (Hugging Face configs) and torchvision classifiers",
                    )
                elif f.name == "config_dict":
                    text, source = _config_text()
                elif f.name in ("seq_len", "image_size"):
                    model = values["model"]  # the catalog's selectbox above: a name
                    assert isinstance(model, str), "the model field comes first"
                    transformer = text is not None or find_transformer_preset(model) is not None
                    if transformer == (f.name == "seq_len"):
                        values[f.name] = _optional_number(f)
                elif f.name == "gpu":
                    assert isinstance(f.opt.choices, tuple), "the GPU presets"
                    gpu = st.selectbox(
                        f.label,
                        (DETECTED, *f.opt.choices),
                        key="gpu",
                        help=f.opt.help,
                        format_func=lambda g: f"detected GPUs (else {DEFAULT_GPU_PRESET})" if g == DETECTED else g,
                    )
                    values["gpu"] = None if gpu == DETECTED else gpu
                else:
                    values[f.name] = _widget(f)
    return Form(values={k: v for k, v in values.items() if v is not None}, config_text=text, config_source=source)
