"""The Streamlit page (app.py) under ``streamlit.testing.v1.AppTest``: no browser, no server.

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
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512,
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


@pytest.fixture
def at() -> AppTest:
    """The page after its first run with the default inputs."""
    app = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    app.run()
    assert not app.exception, texts(app.exception)
    return app


def test_default_page_renders_recommendation(at: AppTest) -> None:
    assert not at.error, texts(at.error)
    assert any(t.startswith("Recommendation: ") for t in texts(at.success)), texts(at.success)
    assert int(metric(at, "Parameters").replace(",", "")) > 0
    assert "GiB" in metric(at, "GPU memory")
    table = at.dataframe[0].value
    assert {"max micro-batch", "grad. accumulation steps", "fits", "device total (GiB)"} <= set(table.columns)
    assert len(table) >= 6  # DDP, ZeRO-1/2/3, two offload rows (+ TP rows, n/a for gpt2)
    # scripts: download buttons once strategies.render lands, an info line until then
    assert at.download_button or any("script generation not available" in t for t in texts(at.info))


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


@pytest.mark.parametrize("text, message", [
    ('{"model_type": "llama", "hidden_size": ', "malformed JSON at line 1"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"model_type": "not-a-model", "hidden_size": 8}', "unknown model_type"),
    ('{"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 100000000}', "absurd"),
    ('{"model_type": "llama", "auto_map": {"AutoModel": "evil.Model"}}', "remote code"),
    ('{"model_type": "llama", "notes": "' + "x" * 2**20 + '"}', "over 1 MiB"),
], ids=["malformed", "not-an-object", "unknown-model-type", "absurd", "remote-code", "too-large"])
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


def test_model_too_large_says_nothing_fits(at: AppTest) -> None:
    at.selectbox(key="model").select("llama-2-70b")
    at.selectbox(key="gpu").select("T4-16GB")
    at.number_input(key="gpus").set_value(1)
    at.run()
    assert not at.exception, texts(at.exception)
    errors = texts(at.error)
    assert any(e.startswith("Nothing fits") and "T4-16GB" in e for e in errors), errors
    assert not at.success
    assert any("no strategy fits" in t for t in texts(at.markdown))  # the reasons are listed


def test_scripts_offered_for_download_when_render_works(at: AppTest, monkeypatch: pytest.MonkeyPatch) -> None:
    import strategies.render

    def fake_render(plan: Any, strategy: str) -> dict[str, str]:
        return {"train.py": f"# {strategy}\n", "ds_config.json": "{}", "launch.sh": "torchrun train.py\n"}

    monkeypatch.setattr(strategies.render, "render_files", fake_render)
    monkeypatch.setattr(strategies.render, "launch_command", lambda plan, strategy: "torchrun train.py")
    at.run()
    assert not at.exception, texts(at.exception)
    assert [b.label for b in at.download_button] == [
        "Download train.py", "Download ds_config.json", "Download launch.sh"]


def _fake_verify_module(busy: bool) -> types.ModuleType:
    from advisor.errors import AdvisorError

    module = types.ModuleType("advisor.verify")

    class VerifyBusy(AdvisorError):
        pass

    def verify(inputs: Any, strategy: str, *, steps: int, timeout_s: float, progress: Any) -> Any:
        if busy:
            raise VerifyBusy("another verification is running on this machine: wait for it to finish")
        assert inputs.source.model == "gpt2" and strategy == "ddp" and steps == 6
        progress("building the model")
        progress(0.5)
        progress(3, 3, "step 3/3")
        per_rank = [{"rank": 0, "measured_peak_bytes": 11 * 2**30, "estimated_peak_bytes": 10 * 2**30}]
        return types.SimpleNamespace(ok=True, message="estimate within 10% of the measured peak",
                                     per_rank=per_rank, relative_error=-0.0909, log_dir="/tmp/advisor-runs/x")

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
    at.number_input(key="global_batch_size").set_value(7)
    at.run()
    errors = texts(at.error)
    assert len(errors) == 1, errors
    assert errors[0].startswith("'Global batch size' 7 is not a multiple of micro-batch 1 x 4 GPUs"), errors
    assert "another 'Micro-batch size per GPU'" in errors[0] and "--" not in errors[0], errors


# --- the "Check my training script" tab ---------------------------------------------------------------
CHECK_DATA = Path(__file__).parent / "data" / "check"


def test_check_tab_lists_findings_of_a_pasted_script(at: AppTest) -> None:
    from advisor.check import check_source

    bad = (CHECK_DATA / "mg002_bad.py").read_text()
    at.text_area(key="check_text").input(bad).run()
    assert not at.exception, texts(at.exception)
    frame = next(d.value for d in at.dataframe if "rule" in d.value.columns)
    expected = [(f.line, f.rule) for f in check_source(bad, "train.py")]
    assert list(zip(frame["line"], frame["rule"])) == expected and expected
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
    at.file_uploader(key="check_file").upload("my_train.py", (CHECK_DATA / "mg013_bad.py").read_bytes(), "text/x-python")
    at.run()
    assert not at.exception, texts(at.exception)
    frame = next(d.value for d in at.dataframe if "rule" in d.value.columns)
    assert list(frame["rule"]) == ["MG013"]
