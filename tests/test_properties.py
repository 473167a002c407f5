"""Property-based tests (hypothesis, in-process, bounded examples): random CLI arguments and random
JSON configs never produce a traceback, exit 0 or 2, and successful JSON output is consistent."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.cli import main

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))

tiny_configs = st.fixed_dictionaries(
    {
        "model_type": st.sampled_from(["llama", "mistral", "qwen2"]),
        "hidden_size": st.sampled_from([32, 64, 96]),
        "intermediate_size": st.sampled_from([64, 128]),
        "num_hidden_layers": st.integers(1, 3),
        "num_attention_heads": st.just(4),
        "num_key_value_heads": st.sampled_from([1, 2, 4]),
        "vocab_size": st.integers(16, 512),
        "max_position_embeddings": st.just(256),
    }
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
hostile_configs = st.one_of(
    json_values,
    st.dictionaries(
        st.sampled_from(
            [
                "model_type",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "vocab_size",
                "intermediate_size",
                "auto_map",
                "n_layer",
            ]
        ),
        json_values,
        max_size=6,
    ),
    tiny_configs.flatmap(
        lambda c: st.fixed_dictionaries(
            {k: st.just(v) for k, v in c.items()} | {"num_hidden_layers": st.integers(-5, 10**7)}
        )
    ),
)

flag_values = st.one_of(st.integers(-3, 64).map(str), st.sampled_from(["", "x", "1e9", "-0", "nan", "3.5"]))
random_flags = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "--gpus",
                "--nodes",
                "--micro-batch-size",
                "--global-batch-size",
                "--seq-len",
                "--tp-degree",
                "--safety-factor",
                "--gpu-mem",
                "--precision",
                "--optimizer",
                "--gpu",
                "--network",
            ]
        ),
        flag_values,
    ),
    max_size=4,
)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert code in (0, 2), (argv, code, out.err)
    if code == 2:
        assert len(out.err.strip().splitlines()) == 1, out.err
    return code, out.out, out.err


def _check_consistent(doc: dict) -> None:
    for s in doc["strategies"]:
        if not s["applicable"]:
            assert s["reason"]
            continue
        b = s["per_gpu_bytes"]
        parts = ("params", "grads", "optimizer_states", "activations", "buffers", "other")
        assert sum(b[k] for k in parts) == b["total"]
        assert all(b[k] >= 0 for k in parts)
        assert b["device_total"] >= b["total"]
        assert s["max_micro_batch_size"] >= 0


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
@SETTINGS
@given(config=hostile_configs)
def test_random_json_configs(tmp_path_factory, capsys, config):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(config))
    code, out, _ = _run(["--config", str(path), "--seq-len", "16", "--gpus", "2", "--json"], capsys)
    if code == 0:
        _check_consistent(json.loads(out))


@SETTINGS
@given(flags=random_flags)
def test_random_cli_flags(capsys, flags):
    argv = ["resnet18", "--image-size", "32", "--json"] + [x for pair in flags for x in pair]
    code, out, _ = _run(argv, capsys)
    if code == 0:
        _check_consistent(json.loads(out))


@pytest.mark.slow  # over 10 s on 2 busy cores
@settings(SETTINGS, max_examples=6)  # each example traces a new random model (about 3 s): 6 keep CI short
@given(
    config=tiny_configs, gpus=st.integers(1, 8), micro=st.integers(1, 4), precision=st.sampled_from(["bf16", "fp32"])
)
def test_zero_states_shrink_and_activations_linear(
    tmp_path_factory, capsys, no_what_if_traces, config, gpus, micro, precision
):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(config))
    base = ["--config", str(path), "--seq-len", "32", "--precision", precision, "--json"]
    docs = {}
    for g, mb in ((gpus, micro), (2 * gpus, micro), (gpus, 2 * micro)):
        code, out, _ = _run(base + ["--gpus", str(g), "--micro-batch-size", str(mb)], capsys)
        assert code == 0
        docs[(g, mb)] = json.loads(out)
        _check_consistent(docs[(g, mb)])
    small, large = docs[(gpus, micro)], docs[(2 * gpus, micro)]
    for name in ("zero1", "zero2", "zero3"):
        a = next(s for s in small["strategies"] if s["name"] == name)
        b = next(s for s in large["strategies"] if s["name"] == name)
        assert b["model_state_bytes"] <= a["model_state_bytes"]
    m1, m2 = docs[(gpus, micro)]["model"], docs[(gpus, 2 * micro)]["model"]
    assert abs((m2["activation_bytes"] - m1["activation_bytes"]) - micro * m1["activation_bytes_per_sample"]) <= 16
