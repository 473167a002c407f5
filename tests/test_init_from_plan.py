"""``--init-from`` (advisor's own input: the generated script will load pretrained weights from a path or hub id):
the schema field, its validation, and the host RAM per node while the script loads them
(``Strategy.load_host_bytes_per_node``), by hand for a small Llama and resnet18 on 2 GPUs.

Per node, g = 2 GPUs, P parameters, B buffer bytes, L the largest module's own parameters, N = 2 shards:

* fresh build: ddp g x (4P + B); zero3 (zero.Init) g x 4L; fsdp2 g x (ceil(4P / N) + B) + rank 0's whole build
  4P + B, broadcast into the shards (every strategy starts from the same weights, issue 25); single 4P + B;
* --init-from, transformers (from_pretrained fills the meta-built model: 1 copy): ddp the same; zero3 the larger of
  the build and rank 0's whole checkpoint 4P + B (``_load_pretrained_model``: map_location "cpu" on rank 0, "meta"
  on the others); fsdp2 the shards + rank 0's copy 4P + B (``set_model_state_dict(broadcast_from_rank0=True)``);
* --init-from, vision (a torch.load'ed state_dict beside the model: 2 copies): ddp g x 2 x (4P + B), zero3 (no
  zero.Init for torchvision) the same, fsdp2 the shards + 2 x (4P + B).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.cli import build_parser, main
from advisor.document import plan_to_dict
from advisor.errors import AdvisorError
from advisor.free_text import INIT_FROM_MAX_CHARS
from advisor.plan import plan
from advisor.schema import echo, get_field, plan_inputs

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "tests" / "data" / "small_llama.json"
G = 2  # GPUs per node (one node)

# The plans, not the cache: no what-if traces (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("no_what_if_traces")


def _small(**extra):
    return plan(plan_inputs(config_path=str(SMALL), seq_len=32, gpus=G, detect_hardware=False, **extra))


@pytest.fixture(scope="module")
def llama():
    """(fresh, --init-from) plans of the small Llama; the second with 0.008 GiB (8.2 MiB) of host RAM, which no
    row's loading fits (for the messages)."""
    return _small(), _small(init_from="org/small-llama", host_mem_gib=0.008)


@pytest.fixture(scope="module")
def resnet():
    return plan(
        plan_inputs(
            model="resnet18", image_size=64, micro_batch_size=1, gpus=G, detect_hardware=False, init_from="resnet18.pt"
        )
    )


def _meta_llama():
    import torch
    import transformers

    cfg = dict(json.loads(SMALL.read_text()))
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
def test_small_llama_counts_by_hand(llama):
    stats = llama[0].profile.stats
    hidden, inter, layers, kv, vocab = 256, 512, 2, 4 * 32, 2048
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden  # q,o + k,v + mlp + 2 norms
    by_hand = 2 * vocab * hidden + layers * per_layer + hidden  # embeddings, LM head (untied), blocks, final norm
    model = _meta_llama()
    assert stats.num_params == by_hand == sum(p.numel() for p in model.parameters()) == 2_229_504
    assert stats.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())
    assert stats.largest_module_params == vocab * hidden  # the embedding (and the LM head): a ZeRO-3 gather unit
    assert llama[1].profile.stats == stats  # --init-from changes nothing of the model itself


def test_llama_host_ram_while_loading(llama):
    fresh, init = llama
    stats = fresh.profile.stats
    p, b, largest = stats.num_params, stats.buffer_bytes, stats.largest_module_params
    copy = 4 * p + b  # one fp32 copy with the buffers: 8,918,144 bytes
    shards = G * (-(-4 * p // G) + b)
    expected_fresh = {
        "single": copy,
        "ddp": G * copy,
        "zero1": G * copy,
        "zero2": G * copy,
        "tp": G * copy,
        "zero3": G * 4 * largest,
        "fsdp2": shards + copy,
        "fsdp2_noreshard": shards + copy,
        "fsdp2_offload": shards + copy,
    }
    # --init-from moves only ZeRO-3's figure: FSDP2's rank 0 holds one whole copy either way
    expected_init = dict(expected_fresh, zero3=max(G * 4 * largest, copy), zero3_offload=max(G * 4 * largest, copy))
    for name, want in expected_fresh.items():
        assert fresh.row(name).load_host_bytes_per_node == want, name
    for name, want in expected_init.items():
        assert init.row(name).load_host_bytes_per_node == want, name
    # The figures themselves, as computed by hand once.
    assert fresh.row("ddp").load_host_bytes_per_node == init.row("ddp").load_host_bytes_per_node == 17_836_288
    assert fresh.row("zero3").load_host_bytes_per_node == 4_194_304
    assert init.row("zero3").load_host_bytes_per_node == 8_918_144
    assert fresh.row("fsdp2").load_host_bytes_per_node == 17_836_416
    assert init.row("fsdp2").load_host_bytes_per_node == 17_836_416


def test_vision_state_dict_is_two_copies(resnet):
    import torch
    import torchvision

    stats = resnet.profile.stats
    with torch.device("meta"):
        model = torchvision.models.resnet18()
    assert stats.num_params == sum(p.numel() for p in model.parameters()) == 11_689_512
    assert stats.buffer_bytes == sum(b.numel() * b.element_size() for b in model.buffers())
    copy = 4 * stats.num_params + stats.buffer_bytes
    shards = G * (-(-4 * stats.num_params // G) + stats.buffer_bytes)
    assert resnet.row("ddp").load_host_bytes_per_node == G * 2 * copy
    assert resnet.row("single").load_host_bytes_per_node == 2 * copy
    assert resnet.row("zero3").load_host_bytes_per_node == G * 2 * copy  # torchvision: no zero.Init, every rank loads
    assert resnet.row("fsdp2").load_host_bytes_per_node == shards + 2 * copy


def test_lora_keeps_its_rule_and_fsdp2_adds_the_base():
    """LoRA: the base loads in its held dtype (bf16 here) with or without --init-from; FSDP2's rank 0 adds the base."""
    p = _small(init_from="org/small-llama", lora_rank=8, precision="bf16")
    stats = p.profile.stats
    frozen, b = 2 * stats.num_frozen, stats.buffer_bytes
    assert stats.num_trainable > 0 and stats.num_frozen == 2_229_504
    assert p.row("ddp").load_host_bytes_per_node == G * (frozen + 4 * stats.num_trainable + b)
    shards = G * (-(-4 * stats.num_params // G) + b)
    assert p.row("fsdp2").load_host_bytes_per_node == shards + frozen + b
    assert p.row("zero3").load_host_bytes_per_node == max(G * 4 * stats.largest_module_params, frozen + b)


def test_messages_say_it_is_for_loading_the_pretrained_weights(llama, capsys):
    fresh, init = llama
    ddp, fsdp2, zero3 = init.row("ddp"), init.row("fsdp2"), init.row("zero3")
    for r in (ddp, fsdp2, zero3):
        assert r.fits is False and r.short_of == "host RAM", r.name
        assert "while the script loads the pretrained weights (--init-from)" in r.fit_note, r.fit_note
    assert "FSDP2, where rank 0 alone loads them" in ddp.fit_note
    assert "rank 0 holds a whole copy of the pretrained model" in fsdp2.fit_note
    assert "rank 0 reads the whole checkpoint" in zero3.fit_note
    from advisor.text_report import render_text

    text = render_text(init)
    assert "host RAM per node while the script loads the pretrained weights from --init-from" in text
    assert "RAM! ddp" in text and "while the script builds the model" not in text
    plain = render_text(fresh)
    assert "host RAM per node while the script builds the model" in plain and "--init-from" not in plain


def test_the_field_and_its_faces(llama):
    f = get_field("init_from")
    assert f.group == "training" and f.type == str | None and f.kind == "str" and f.optional
    assert f.opt.flag == "--init-from"
    assert {"cli", "page", "bench"} <= set(f.opt.faces) and f.opt.label
    assert "--init-from" in build_parser().format_help()
    fresh, init = llama
    assert echo(init.inputs)["training"]["init_from"] == "org/small-llama"
    assert plan_to_dict(fresh)["inputs"]["training"]["init_from"] is None
    for ok in ("meta-llama/Llama-2-7b-hf", "/data/my models/ckpt-100", "./model.pt", "Größe/модель", "x" * 512):
        assert plan_inputs(model="gpt2", init_from=ok).training.init_from == ok


@pytest.mark.parametrize(
    "value, expected",
    [
        ("a\nb", "on one line"),
        ("a\rb", "control characters"),
        ("a\tb", "control characters"),
        ("a\x00b", "control characters"),
        ("a\u202eb", "control characters"),  # a bidirectional override
        ("a\u2028b", "on one line"),
        ('dir"/x', "quotes"),
        ("it's", "quotes"),
        ("C:\\models\\x", "backslashes"),
        ("", "needs a path or hub id"),
        ("   ", "needs a path or hub id"),
        ("x" * (INIT_FROM_MAX_CHARS + 1), "more than 512"),
    ],
)
def test_bad_values_one_line_exit_2(value, expected, capsys):
    with pytest.raises(AdvisorError) as err:
        plan_inputs(model="gpt2", init_from=value)
    assert "\n" not in str(err.value) and "--init-from" in str(err.value)
    assert main(["gpt2", "--init-from", value]) == 2
    out = capsys.readouterr().err.strip()
    assert len(out.splitlines()) == 1 and out.startswith("advisor: error: --init-from"), out
    assert expected in out and "Traceback" not in out


def test_not_text_is_refused():
    with pytest.raises(AdvisorError, match="--init-from must be text"):
        plan_inputs(model="gpt2", init_from=7)


def test_subprocess_newline_exits_2_with_one_line():
    """``.venv/bin/python -m advisor gpt2 --init-from $'a\\nb'``."""
    r = subprocess.run(
        [sys.executable, "-m", "advisor", "gpt2", "--init-from", "a\nb"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--init-from" in r.stderr and "one line" in r.stderr


def test_a_relative_path_that_exists_is_written_absolute(tmp_path, monkeypatch):
    """`--init-from ./my-tiny` was written as INIT_FROM = './my-tiny', read from wherever the script is launched
    (a new user's find): a relative path that exists here is written absolute; one that does not exist here (the
    cluster's) and a hub id are written as given."""
    from strategies.render import job_from_plan

    (tmp_path / "my-tiny").mkdir()
    monkeypatch.chdir(tmp_path)
    assert job_from_plan(_small(init_from="./my-tiny"), "ddp").init_from == str(tmp_path / "my-tiny")
    assert job_from_plan(_small(init_from="./not-here"), "ddp").init_from == "./not-here"
    assert job_from_plan(_small(init_from="org/small-llama"), "ddp").init_from == "org/small-llama"


def test_fresh_weights_at_a_fine_tuning_rate_is_said_where_it_is_so():
    """A verification of fresh weights at advisor's fine-tuning rate (2e-05) says its loss moves little (a new user
    read a flat loss as a failed run); not with --init-from, nor with a rate of the user's (--base-lr)."""
    from strategies.render import fresh_weights_at_a_fine_tuning_rate, job_from_plan

    assert fresh_weights_at_a_fine_tuning_rate(job_from_plan(_small(), "ddp"))
    assert not fresh_weights_at_a_fine_tuning_rate(job_from_plan(_small(init_from="org/small-llama"), "ddp"))
    assert not fresh_weights_at_a_fine_tuning_rate(job_from_plan(_small(base_lr=2e-3, base_batch_size=8), "ddp"))
