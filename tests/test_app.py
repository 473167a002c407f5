"""The Streamlit page (advisor/page, run by the app.py shim) under ``streamlit.testing.v1.AppTest``: no browser,
no server.

The first run in a process imports torch/transformers (several seconds); plans are cached per input
by the page, so later runs with the same inputs are fast.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

APP = Path(__file__).resolve().parents[1] / "app.py"
TIMEOUT = 120  # seconds per run: generous, the first plan imports torch and transformers

SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
}


def transformers_param_count(config: dict[str, Any]) -> int:
    """sum(p.numel()) of the transformers causal LM built from ``config`` (on meta: no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def texts(elements) -> list[str]:
    """Element texts with the page's markdown escapes (``model\\_type``) removed."""
    return [re.sub(r"\\(.)", r"\1", str(e.value)) for e in elements]


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def strategy_table(at: AppTest):
    """The per-strategy table as shown (its Markdown cells unescaped)."""
    return at.table[0].value.map(lambda v: re.sub(r"\\(.)", r"\1", str(v)))


def chart_spec(at: AppTest) -> dict[str, Any]:
    """The Vega-Lite spec of the page's memory chart (what ``st.altair_chart`` sends to the browser)."""
    chart = next(e for e in at.main if getattr(e, "type", None) == "vega_lite_chart")
    return json.loads(chart.proto.spec)


def page_messages(at: AppTest) -> list[str]:
    """Every message and table cell the page shows (not code blocks: the launch line is a CLI command)."""
    found = [
        *texts(at.markdown),
        *texts(at.error),
        *texts(at.warning),
        *texts(at.info),
        *texts(at.success),
        *texts(at.caption),
    ]
    for table in at.table:
        found += [re.sub(r"\\(.)", r"\1", str(v)) for v in table.value.to_numpy().ravel()]
    return found


@pytest.fixture
def at() -> AppTest:
    """The page after its first run with the default inputs."""
    app = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    app.run()
    assert not app.exception, texts(app.exception)
    return app


def test_the_package_page_runs_as_streamlit_runs_it() -> None:
    """``advisor page`` serves advisor/page/app.py itself (not the repository's app.py shim): executed as a
    script, with absolute imports, it draws the same page."""
    page = AppTest.from_file(str(APP.parent / "advisor" / "page" / "app.py"), default_timeout=TIMEOUT)
    page.run()
    assert not page.exception, texts(page.exception)
    assert any(t.startswith("Recommendation: ") for t in texts(page.success)), texts(page.success)
    page.run()  # a rerun executes the script again
    assert not page.exception and int(metric(page, "Parameters").replace(",", "")) > 0


def test_default_page_renders_recommendation(at: AppTest) -> None:
    assert not at.error, texts(at.error)
    assert any(t.startswith("Recommendation: ") for t in texts(at.success)), texts(at.success)
    assert int(metric(at, "Parameters").replace(",", "")) > 0
    assert "GiB" in metric(at, "GPU memory")
    table = strategy_table(at)
    assert {"max micro-batch", "grad. accumulation steps", "fits", "device total (GiB)"} <= set(table.columns)
    assert len(table) >= 6  # DDP, ZeRO-1/2/3, two offload rows (+ TP rows, n/a for gpt2)
    # scripts: download buttons once strategies.render lands, an info line until then
    assert at.download_button or any("script generation not available" in t for t in texts(at.info))


def test_banner_counts_nodes_and_gpus_in_words(at: AppTest) -> None:
    """Issue 25: the banner said "1 GPU(s) per node x 1 node(s)"."""
    captions = texts(at.caption)
    assert any("1 GPU per node x 1 node," in c for c in captions), captions
    assert not any("(s)" in m for m in page_messages(at)), page_messages(at)


def test_pasted_config_changes_parameter_count(at: AppTest) -> None:
    before = metric(at, "Parameters")
    at.text_area(key="config_dict").input(json.dumps(SMALL_LLAMA)).run()
    assert not at.exception, texts(at.exception)
    assert not at.error, texts(at.error)
    expected = transformers_param_count(SMALL_LLAMA)
    assert metric(at, "Parameters") == f"{expected:,}" != before
    assert metric(at, "Model") == "llama"
    assert any(t.startswith("Recommendation: ") for t in texts(at.success))


def test_uploaded_config_is_used(at: AppTest) -> None:
    at.file_uploader(key="config_file").upload("config.json", json.dumps(SMALL_LLAMA).encode(), "application/json")
    at.run()
    assert not at.exception and not at.error, texts(at.error)
    assert metric(at, "Parameters") == f"{transformers_param_count(SMALL_LLAMA):,}"


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"model_type": "llama", "hidden_size": ', "malformed JSON at line 1"),
        ("[1, 2, 3]", "must be a JSON object"),
        ('{"model_type": "not-a-model", "hidden_size": 8}', "unknown model_type"),
        ('{"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 100000000}', "absurd"),
        ('{"model_type": "chatglm", "auto_map": {"AutoModel": "evil.Model"}}', "needs remote code"),
        ('{"model_type": "llama", "notes": "' + "x" * 2**20 + '"}', "over 1 MiB"),
    ],
    ids=["malformed", "not-an-object", "unknown-model-type", "absurd", "remote-code", "too-large"],
)
def test_bad_config_is_a_one_line_error(at: AppTest, text: str, message: str) -> None:
    at.text_area(key="config_dict").input(text).run()
    assert not at.exception, texts(at.exception)
    errors = texts(at.error)
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0], errors
    assert not at.success  # no recommendation from a stale plan


def test_vision_model_takes_an_image_size(at: AppTest) -> None:
    at.selectbox(key="model").select("resnet18").run()
    at.number_input(key="image_size").set_value(64).run()
    assert not at.exception and not at.error, texts(at.error)
    assert metric(at, "Model") == "resnet18"
    assert any("input [3, 64, 64]" in c for c in texts(at.caption))


def test_absurd_cluster_size_is_an_error(at: AppTest) -> None:
    at.number_input(key="gpus").set_value(1000).run()
    assert not at.exception, texts(at.exception)
    assert any("more than any node has" in e for e in texts(at.error)), texts(at.error)


def test_sessions_do_not_share_inputs(at: AppTest) -> None:
    other = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    other.run()
    at.text_area(key="config_dict").input(json.dumps(SMALL_LLAMA)).run()
    other.run()
    assert metric(at, "Model") == "llama"
    assert metric(other, "Model") == "gpt2"


def test_zoomed_chart_renders(at: AppTest) -> None:
    at.toggle(key="zoom").set_value(True).run()
    assert not at.exception and not at.error


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_the_script_strategy_follows_a_new_recommendation(at: AppTest) -> None:
    """The default plan (gpt2, one GPU) recommends single; after llama-2-7b on 8 x H100 the scripts' strategy is
    the new recommendation, not the single that no longer fits. A user's own pick stays while the answer stands."""
    assert at.selectbox(key="strategy").value == "single"
    at.selectbox(key="model").select("llama-2-7b")
    at.selectbox(key="gpu").select("H100-80GB")
    at.number_input(key="gpus").set_value(8)
    at.run()
    assert not at.exception, texts(at.exception)
    rec = re.search(r"Recommendation: .* \((\w+)\)", texts(at.success)[0]).group(1)
    assert rec != "single" and at.selectbox(key="strategy").value == rec
    other = next(o for o in at.selectbox(key="strategy").options if rec not in o)
    at.selectbox(key="strategy").select(other).run()
    at.run()  # a rerun with the same inputs keeps the pick
    assert at.selectbox(key="strategy").value != rec


def test_nothing_fits_names_the_smallest_cluster_as_found(no_what_if_traces, at: AppTest) -> None:
    """llama-2-7b on 2 x T4-16GB: the smallest cluster is given as nodes x GPUs per node that multiply to it (it
    said "16 GPUs (2 nodes of 2 GPUs)": the page's own GPUs per node, not the layout found)."""
    at.selectbox(key="model").select("llama-2-7b")
    at.selectbox(key="gpu").select("T4-16GB")
    at.number_input(key="gpus").set_value(2)
    at.run()
    assert not at.exception, texts(at.exception)
    error = next(e for e in texts(at.error) if e.startswith("Nothing fits"))
    m = re.search(r"smallest cluster that fits: (\d+) GPUs \((\d+) nodes? of (\d+) GPUs?\)", error)
    assert m, error
    assert int(m.group(1)) == int(m.group(2)) * int(m.group(3)), error


def test_model_too_large_says_nothing_fits(no_what_if_traces, at: AppTest) -> None:
    at.selectbox(key="model").select("llama-2-70b")
    at.selectbox(key="gpu").select("T4-16GB")
    at.number_input(key="gpus").set_value(1)
    at.run()
    assert not at.exception, texts(at.exception)
    errors = texts(at.error)
    assert any(e.startswith("Nothing fits") and "T4-16GB" in e for e in errors), errors
    assert not at.success
    assert any("no strategy fits" in t for t in texts(at.markdown))  # the reasons are listed
    # the offload reason asks for host RAM by the page's field, not "give --host-mem"
    assert any("host RAM unknown: set 'Host RAM per node (GiB)'" in t for t in texts(at.markdown)), texts(at.markdown)
    assert not [t for t in page_messages(at) if "--host-mem" in t]


def test_scripts_offered_for_download_when_render_works(at: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    import strategies.render

    def fake_render(plan: Any, strategy: str) -> dict[str, str]:
        return {"train.py": f"# {strategy}\n", "ds_config.json": "{}", "launch.sh": "torchrun train.py\n"}

    monkeypatch.setattr(strategies.render, "render_files", fake_render)
    monkeypatch.setattr(strategies.render, "launch_command", lambda plan, strategy: "torchrun train.py")
    at.run()
    assert not at.exception, texts(at.exception)
    assert [b.label for b in at.download_button] == [
        "Download train.py",
        "Download ds_config.json",
        "Download launch.sh",
    ]


def _fake_verify_module(busy: bool, calls: list[dict[str, Any]] | None = None) -> types.ModuleType:
    from advisor.errors import AdvisorError

    module = types.ModuleType("advisor.verify")

    class VerifyBusy(AdvisorError):
        pass

    def verify(
        inputs: Any,
        strategy: str,
        *,
        steps: int,
        timeout_s: float,
        progress: Any,
        out_dir: str | None = None,
        force: bool = False,
    ) -> Any:
        if calls is not None:
            calls.append(
                {"out_dir": out_dir, "force": force, "existed": out_dir is not None and Path(out_dir).exists()}
            )
        if busy:
            raise VerifyBusy("another verification is running on this machine: wait for it to finish")
        # The page's default: gpt2 on one GPU, where plain one-process training is recommended.
        assert inputs.source.model == "gpt2" and strategy == "single" and steps == 6
        progress("building the model")
        progress(0.5)
        progress(3, 3, "step 3/3")
        per_rank = [{"rank": 0, "measured_peak_bytes": 11 * 2**30, "estimated_peak_bytes": 10 * 2**30}]
        return types.SimpleNamespace(
            ok=True,
            message="estimate within 10% of the measured peak",
            per_rank=per_rank,
            relative_error=-0.0909,
            log_dir="/tmp/advisor-runs/x",
        )

    module.VerifyBusy, module.verify = VerifyBusy, verify
    return module


def test_verify_shows_estimate_vs_measured(at: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "advisor.verify", _fake_verify_module(busy=False))
    at.button(key="verify").click().run()
    assert not at.exception and not at.error, texts(at.error)
    assert "estimate within 10% of the measured peak" in texts(at.success)
    table = at.dataframe[-1].value
    assert list(table["measured peak (GiB)"]) == [11.0] and list(table["estimated peak (GiB)"]) == [10.0]
    assert list(table["estimate error"]) == ["-9.1%"]
    at.run()  # the result stays while the inputs are unchanged
    assert "estimate within 10% of the measured peak" in texts(at.success)


def test_verify_busy_and_missing_are_messages(at: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "advisor.verify", _fake_verify_module(busy=True))
    at.button(key="verify").click().run()
    assert not at.exception
    assert any("another verification is running" in t for t in texts(at.warning))
    monkeypatch.setitem(sys.modules, "advisor.verify", None)  # import fails: not implemented yet
    at.button(key="verify").click().run()
    assert not at.exception and not at.error
    assert any("verification is not available" in t for t in texts(at.info))


def test_messages_name_the_page_widgets_not_cli_flags(at: AppTest) -> None:
    at.number_input(key="gpus").set_value(4)
    at.number_input(key="micro_batch_size").set_value(2)
    at.number_input(key="global_batch_size").set_value(12)  # splits over 4 GPUs, not at micro-batch 2
    at.run()
    errors = texts(at.error)
    assert len(errors) == 1, errors
    assert errors[0].startswith("'Global batch size' 12 is not a multiple of micro-batch 2 x 4 GPUs"), errors
    assert "another 'Micro-batch size per GPU'" in errors[0] and "--" not in errors[0], errors


# --- issue 12 item 8: chart labels, host RAM, metrics, run folder, reasons, n/a rows ----------------------
def test_chart_with_eleven_strategies_labels_every_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vega-Lite drops overlapping axis labels by default (labelOverlap) and cuts long ones (labelLimit):
    with 11+ strategies every bar must still carry its whole title. Checked on the spec, not pixels."""
    from contextlib import ExitStack

    from strategies import REGISTRY
    from tests.fixtures.toy_strategy import ToyStrategy

    titles = [f"Toy data parallel number {i} with a deliberately long strategy title" for i in range(5)]
    with ExitStack() as stack:
        for i, title in enumerate(titles):
            stack.enter_context(REGISTRY.added(type(f"Toy{i}", (ToyStrategy,), {"name": f"toy{i}", "title": title})()))
        app = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
        app.run()
        app.selectbox(key="model").select("resnet18").run()
        app.number_input(key="gpus").set_value(2).run()
        assert not app.exception and not app.error, texts(app.error)
        spec = chart_spec(app)
    bars = spec["layer"][0]
    y, x = bars["encoding"]["y"], bars["encoding"]["x"]
    assert y["field"] == "strategy" and x["field"] == "GiB"  # horizontal bars: one row per strategy
    assert len(y["sort"]) >= 11 and set(titles) <= set(y["sort"])
    assert y["axis"]["labelOverlap"] is False  # never thinned out
    assert y["axis"]["labelLimit"] == 0  # never cut ("..."): 0 is no limit in Vega
    assert y["axis"].get("labelAngle", 0) == 0
    from advisor.page.charts import CHART_ROW_PX

    assert spec["height"] >= CHART_ROW_PX * len(y["sort"])  # a row of its own per label


def test_capacity_line_is_named_in_readable_text(at: AppTest) -> None:
    spec = chart_spec(at)
    marks = [layer["mark"] for layer in spec["layer"]]
    assert any(m["type"] == "rule" and m["color"] == "red" for m in marks)  # the line stays red
    assert not any(m["type"] == "text" for m in marks)  # no red text drawn over the bars
    assert "GPU memory 80.00 GiB" in spec["layer"][0]["encoding"]["x"]["title"]  # axis title: theme colours
    at.toggle(key="zoom").set_value(True).run()
    zoomed = chart_spec(at)
    assert "beyond this scale" in zoomed["layer"][0]["encoding"]["x"]["title"]
    assert [layer["mark"]["type"] for layer in zoomed["layer"]] == ["bar", "errorbar"]  # no capacity line


def _whisker(spec: dict[str, Any]) -> dict[str, Any]:
    return next(layer for layer in spec["layer"] if layer["mark"]["type"] == "errorbar")


def test_memory_and_time_charts_have_error_band_whiskers(at: AppTest) -> None:
    """Each bar of both charts has a Vega-Lite errorbar layer on its row, spanning the figure's error band (the
    extents the page computes from the JSON's error_band, under the bars' own axis title)."""
    specs = [json.loads(e.proto.spec) for e in at.main if getattr(e, "type", None) == "vega_lite_chart"]
    memory, time = specs[0], specs[1]
    for spec, low, high in ((memory, "low GiB", "high GiB"), (time, "low (s)", "high (s)")):
        whisker, bars = _whisker(spec), spec["layer"][0]
        assert whisker["mark"]["ticks"] is True
        assert whisker["encoding"]["x"]["field"] == low and whisker["encoding"]["x2"]["field"] == high
        assert whisker["encoding"]["y"]["field"] == "strategy"
        assert whisker["encoding"]["x"]["title"] == bars["encoding"]["x"]["title"]


def test_whisker_extents_are_the_error_band() -> None:
    from advisor.document import plan_to_dict
    from advisor.page.charts import memory_band_frame, time_band_frame
    from advisor.plan import plan
    from advisor.schema import plan_inputs
    from advisor.timing.error_band import TIME_BANDS, TimeKey
    from advisor.units import GiB

    doc = plan_to_dict(
        plan(plan_inputs(detect_hardware=False, model="gpt2", seq_len=128, gpus=2, gpu="H100-80GB", micro_batch_size=2))
    )
    times, memory = time_band_frame(doc).set_index("strategy"), memory_band_frame(doc).set_index("strategy")
    timed = [s for s in doc["strategies"] if s.get("time")]
    assert len(times) == len(timed) >= 2
    for s in timed:
        t, band = s["time"], s["time"]["error_band"]
        key = TimeKey("offload") if s["name"].endswith("_offload") else TimeKey("gpu", "hopper", "transformer")
        assert band == TIME_BANDS[key].as_dict()  # H100: Hopper's published-run band; offload rows their own
        assert times.loc[s["title"], "low (s)"] == pytest.approx(t["step_s"] * (1 + band["low"]))
        assert times.loc[s["title"], "high (s)"] == pytest.approx(t["step_s"] * (1 + band["high"]))
        b, mb = s["per_gpu_bytes"], s["memory_error_band"]
        assert memory.loc[s["title"], "low GiB"] == pytest.approx((b["device_total"] + mb["low"] * b["total"]) / GiB)
        assert memory.loc[s["title"], "low GiB"] < b["device_total"] / GiB < memory.loc[s["title"], "high GiB"]


def test_host_ram_is_a_page_field_and_messages_name_it(at: AppTest) -> None:
    from advisor.schema import fields_for

    assert "host_mem_gib" in {f.name for f in fields_for("page")}
    field = at.number_input(key="host_mem_gib")
    assert field.label == "Host RAM per node (GiB)"
    table = strategy_table(at)
    offload = table[table["name"] == "zero3_offload"].iloc[0]
    assert offload["fits"] == "?" and "set 'Host RAM per node (GiB)'" in offload["note"], offload.to_dict()
    field.set_value(512.0).run()
    assert not at.exception and not at.error, texts(at.error)
    table = strategy_table(at)
    assert table[table["name"] == "zero3_offload"].iloc[0]["fits"] == "yes"


def test_optional_numbers_are_bounded_as_the_schema_says(at: AppTest) -> None:
    """A dropout steps by 0.05 between 0 and its 0.9 limit; memory sizes cannot go below 0 (0 itself is refused by the
    schema's check, in one line)."""
    dropout = at.number_input(key="lora_dropout")
    assert (dropout.min, dropout.max, dropout.step) == (0.0, 0.9, 0.05)
    memory = at.number_input(key="gpu_mem_gib")
    assert (memory.min, memory.max, memory.step) == (0.0, 4096.0, 1.0)
    memory.set_value(0.0).run()
    assert not at.exception and len(at.error) == 1 and "above 0" in texts(at.error)[0], texts(at.error)


def test_page_text_turns_flags_with_a_widget_into_its_label() -> None:
    from advisor.page import words as page
    from advisor.schema import field_labels

    for flag, label in field_labels().items():
        assert page.page_text(f"host RAM unknown: give {flag}") == f"host RAM unknown: set '{label}'"
        assert page.page_text(f"pass {flag} for the target") == f"set '{label}' for the target"
        assert page.page_text(f"have 64 GiB, flag {flag}") == f"have 64 GiB, '{label}'"
        assert page.page_text(f"or another {flag}") == f"or another '{label}'"
    assert page.page_text("--tp-degree 3 does not divide") == "--tp-degree 3 does not divide"  # no widget: a CLI option


def test_gpus_metric_is_shown_whole(at: AppTest) -> None:
    at.selectbox(key="gpu").select("H200-141GB")
    at.number_input(key="gpus").set_value(16)
    at.run()
    assert not at.exception and not at.error, texts(at.error)
    assert metric(at, "GPUs") == "16 x H200-141GB"
    # the metrics sit in a wrapping row at their content's width, not in four fixed columns that cut them
    row = next(b for b in at.main.container if any(type(k).__name__ == "Metric" for k in b.children.values()))
    assert row.proto.flex_container.wrap and row.proto.flex_container.direction == row.proto.flex_container.HORIZONTAL
    assert not at.columns or not any(type(k).__name__ == "Metric" for c in at.columns for k in c.children.values())


def test_na_rows_show_na_and_the_whole_reason(at: AppTest) -> None:
    from advisor.plan import plan
    from advisor.schema import plan_inputs

    table = strategy_table(at)
    cells = set(table.to_numpy().ravel())
    assert not cells & {"None", "nan", "NaN", "<NA>", ""}, cells
    tp = table[table["name"] == "tp"].iloc[0]
    reason = plan(plan_inputs(model="gpt2")).row("tp").reason
    assert tp["fits"] == "n/a" and tp["note"] == f"n/a: {reason}" and len(reason) > 100  # whole, not cut
    # a static table: the cell text is not truncated by a grid's column width
    assert not at.dataframe or all("note" not in d.value.columns for d in at.dataframe)


def test_verify_writes_a_new_folder_in_the_chosen_runs_folder(
    at: AppTest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from advisor.page import runner

    default = at.text_input(key="runs_dir")
    assert default.value == str((Path.cwd() / "advisor-runs").resolve())  # the CLI's default, shown
    calls: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "advisor.verify", _fake_verify_module(busy=False, calls=calls))
    runs = tmp_path / "runs"
    default.input(str(runs)).run()
    assert any(str(runs / "gpt2-single-TIME") in c for c in texts(at.caption)), texts(at.caption)
    at.button(key="verify").click().run()
    assert not at.exception and not at.error, texts(at.error)
    assert len(calls) == 1 and calls[0]["force"] is False and not calls[0]["existed"]
    out = Path(calls[0]["out_dir"])
    assert out.parent == runs and out.name.startswith("gpt2-single-")
    # an existing run is never reused: the next one gets a suffix
    monkeypatch.setattr(runner.time, "strftime", lambda fmt: "20260101-000000")
    (runs / "gpt2-ddp-20260101-000000").mkdir(parents=True)
    (runs / "gpt2-ddp-20260101-000000-2").mkdir()
    assert runner.new_run_dir(str(runs), "gpt2", "ddp") == runs / "gpt2-ddp-20260101-000000-3"


def test_runs_folder_that_is_a_file_is_a_message(at: AppTest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "advisor.verify", _fake_verify_module(busy=False, calls=calls))
    (tmp_path / "afile").write_text("x")
    at.text_input(key="runs_dir").input(str(tmp_path / "afile")).run()
    at.button(key="verify").click().run()
    assert not at.exception, texts(at.exception)
    errors = texts(at.error)
    assert len(errors) == 1 and errors[0].startswith("Folder for verification runs") and "not a folder" in errors[0]
    assert not calls


# --- the "Check my training script" tab ---------------------------------------------------------------
CHECK_DATA = Path(__file__).parent / "data" / "check"


def test_check_tab_lists_findings_of_a_pasted_script(at: AppTest) -> None:
    from advisor.check import check_source

    bad = (CHECK_DATA / "mg002_bad.py").read_text()
    at.text_area(key="check_text").input(bad).run()
    assert not at.exception, texts(at.exception)
    frame = next(d.value for d in at.dataframe if "rule" in d.value.columns)
    findings = check_source(bad, "train.py")
    expected = [(f.line, f.rule) for f in findings]
    assert list(zip(frame["line"], frame["rule"])) == expected and expected
    assert list(frame.columns) == ["line", "rule", "severity", "message", "fix", "pitfall"]
    assert list(frame["pitfall"]) == [f.pitfall for f in findings]
    assert any(e.startswith(f"{len(expected)} finding(s) in train.py") for e in texts(at.error)), texts(at.error)
    assert any("Recommendation: " in t for t in texts(at.success))  # the plan tab still renders


def test_check_tab_clean_script_and_syntax_error(at: AppTest) -> None:
    at.text_area(key="check_text").input((CHECK_DATA / "mg002_good.py").read_text()).run()
    assert any(t.startswith("No findings") for t in texts(at.success)), texts(at.success)
    at.text_area(key="check_text").input("def broken(:\n    pass\n").run()
    assert not at.exception, texts(at.exception)
    errors = texts(at.error)
    assert len(errors) == 1 and "train.py:1: cannot parse" in errors[0], errors


def test_check_tab_uploaded_file(at: AppTest) -> None:
    at.file_uploader(key="check_file").upload(
        "my_train.py", (CHECK_DATA / "mg013_bad.py").read_bytes(), "text/x-python"
    )
    at.run()
    assert not at.exception, texts(at.exception)
    frame = next(d.value for d in at.dataframe if "rule" in d.value.columns)
    assert list(frame["rule"]) == ["MG013"]


def test_ladder_box_draws_the_ladder_chart(at: AppTest) -> None:
    """The Memory-savings ladder box: the plan's ladder[] as a Streamlit Altair chart, one bar per rung with figures
    in the ladder's order, each bar the rung's device total; none without it."""
    assert not any(s.startswith("Memory-savings ladder") for s in texts(at.subheader))
    at.checkbox(key="ladder").check().run()
    assert not at.exception and not at.error, texts(at.error)
    assert any(s.startswith("Memory-savings ladder on ") for s in texts(at.subheader)), texts(at.subheader)
    charts = [json.loads(e.proto.spec) for e in at.main if getattr(e, "type", None) == "vega_lite_chart"]
    ladder = next(c for c in charts if "rung" in json.dumps(c))
    order = ladder["layer"][0]["encoding"]["y"]["sort"]  # the bars' rungs, in the ladder's order
    from advisor.ladder import LABELS

    assert order[0] == "0. as planned" and len(order) >= 2, order
    assert all(label.split(". ", 1)[1] in {text for text, _ in LABELS.values()} for label in order), order
    assert ladder["layer"][0]["encoding"]["x"]["field"] == "device total GiB"


def test_ladder_frame_keeps_the_rungs_with_figures_in_order() -> None:
    from advisor.page.charts import ladder_frame

    rung = {"throughput": 10.0, "throughput_unit": "tokens/s", "fits": False, "first_fit": False}
    doc: Any = {
        "ladder": [
            {**rung, "label": "as planned", "device_bytes": 3 * 2**30, "peak_bytes": 2 * 2**30},
            {**rung, "label": "optimizer step in backward", "device_bytes": None, "peak_bytes": None, "fits": None},
            {**rung, "label": "chunked cross-entropy", "device_bytes": 2**30, "peak_bytes": 2**29, "fits": True,
             "first_fit": True},
        ]
    }  # fmt: skip
    frame = ladder_frame(doc)
    assert list(frame["rung"]) == ["0. as planned", "2. chunked cross-entropy"]  # the blocked rung has no bar
    assert list(frame["device total GiB"]) == [3.0, 1.0] and list(frame["peak GiB"]) == [2.0, 0.5]
    assert list(frame["fits"]) == ["does not fit", "first fit"]
    assert ladder_frame({"hardware": {}}).empty  # type: ignore[typeddict-item]
