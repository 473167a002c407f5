"""The memory options beyond full checkpointing (advisor.memory_options, advisor.chunked_ce, advisor.selective_ac):
bytes measured with torch's own hooks against the hand arithmetic, the saved tensors of torch's selective
checkpoint run against the stated policy, and the optimizer-in-backward refusals."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.chunked_ce import chunked_cross_entropy
from advisor.errors import AdvisorError
from advisor.measure import CpuPeakMeter
from advisor.memory_options import (
    BlockDims,
    ce_plain_bytes,
    chunked_ce_bytes,
    optimizer_in_backward_blocker,
    sac_op_saved_bytes_per_block,
)
from advisor.schema import plan_inputs, validate
from advisor.selective_ac import layer_policy_blocks, op_context_fn
from strategies.base import Strategy
from strategies.ddp import DDP
from strategies.fsdp2 import FSDP2
from strategies.single import Single
from strategies.zero import Zero

CONFIGS = Path(__file__).parent / "data" / "configs"


class _Peak(TorchDispatchMode):
    """The peak, after any op, of the bytes of the storages ops created that are still alive (weak references to
    the storages: a storage's reference dies with it)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[weakref.ref, int]] = []
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):  # a view or in-place: no new storage
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    s = t.untyped_storage()
                    self.made.append((weakref.ref(s), s.nbytes()))
        self.peak = max(self.peak, sum(n for ref, n in self.made if ref() is not None))
        return out


def _keep(saved: list[torch.Tensor]):  # noqa: ANN202
    """A pack hook that records every tensor saved for backward."""

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    return pack


def test_chunked_ce_saved_bytes_and_loss() -> None:
    torch.manual_seed(0)
    rows, vocab, chunks = 256, 2000, 8
    per = rows // chunks
    # Per-chunk logits, as an output head applied chunk by chunk gives them; each chunk's gradient is consumed at once
    # (the head's backward; here a post-accumulate hook drops it), so backward holds one chunk's at a time.
    parts = [torch.randn(per, vocab, dtype=torch.bfloat16, requires_grad=True) for _ in range(chunks)]
    errors: list[float] = []  # each chunk's gradient against plain cross-entropy's (computed before backward)
    expected: dict[int, torch.Tensor] = {}

    def consume(t: torch.Tensor) -> None:
        assert t.grad is not None
        if expected[id(t)].dim():
            errors.append(float((t.grad.float() - expected[id(t)]).abs().max()))
        t.grad = None

    for p in parts:
        p.register_post_accumulate_grad_hook(consume)
    labels = torch.randint(0, vocab, (rows,))
    labels[5] = -100
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(_keep(saved), lambda t: t):
        loss = chunked_cross_entropy(parts, labels, chunks)
    # Hand arithmetic: the 16-bit logits (rows x vocab x 2), the int64 labels and fp32 logsumexp per row, and the
    # int64 valid-row count once per chunk; no fp32 chunk kept.
    assert sum(t.numel() * t.element_size() for t in saved) == rows * vocab * 2 + rows * (8 + 4) + chunks * 8
    assert not any(t.dtype == torch.float32 and t.numel() > per for t in saved)
    whole = torch.cat([p.detach() for p in parts]).requires_grad_()
    ref = F.cross_entropy(whole.float(), labels)
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    ref.backward()
    assert whole.grad is not None
    expected.update({id(p): g.float() for p, g in zip(parts, whole.grad.split(per))})
    loss.backward()
    assert len(errors) == chunks and max(errors) < 1e-3
    # Backward runs every chunk's loss node before any head (autograd's ready queue takes the latest node first), so
    # the 16-bit gradients of all chunks exist together, each with one fp32 chunk (which becomes its gradient in
    # place) beside it while it is cast: 2 bytes per logit + one chunk's 4 (in a model each chunk's saved logits are
    # freed as its gradient appears; here they are the test's leaves, made before the measured pass).
    expected.clear()
    for p in parts:
        expected[id(p)] = torch.zeros(())  # no comparison inside the measured pass: only the drop
    mode = _Peak()
    again = chunked_cross_entropy(parts, labels, chunks)
    with mode:
        again.backward()
    chunk = per * vocab
    assert rows * vocab * 2 + chunk * 4 <= mode.peak <= rows * vocab * 2 + chunk * 4 + rows * 16
    # The whole-tensor form (one gradient tensor, what the generated scripts use: the head applied once) gives the
    # same loss.
    one = chunked_cross_entropy(whole.detach().view(2, rows // 2, vocab), labels.view(2, -1), chunks)
    assert abs(one.item() - ref.item()) <= 1e-6 * abs(ref.item())
    # 16-bit logits here (a second profiled measurement in one process reads an earlier one's frees as its own); the
    # fp32 rule is measured by the generated scripts' runs (tests/test_selective_scripts.py, within 0.2%)
    _whole_logits_temporaries(rows, vocab, chunks, torch.bfloat16)


def _whole_logits_temporaries(rows: int, vocab: int, chunks: int, dtype: torch.dtype) -> None:
    """The whole-tensor form's temporaries, measured with the allocator's own events (torch.logsumexp's exp(x - max)
    is allocated inside its kernel, which a dispatch mode does not see), over fresh logits made before: in forward
    each chunk's fp32 copy beside that temporary (fp32 logits need no copy: .float() returns them); in backward the
    whole gradient and one chunk's fp32 copy. The rule (chunked_ce_bytes) is the logits, 12 bytes per row and the
    larger of the two."""
    gc.collect()  # an earlier call's graph, freed now and not inside the measurement (a free it did not see made)
    size = torch.finfo(dtype).bits // 8
    copy, chunk = (4 if size == 2 else 0), rows // chunks * vocab
    logits = torch.randn(rows, vocab, dtype=dtype).requires_grad_()
    labels = torch.randint(0, vocab, (rows,))
    with CpuPeakMeter() as meter:
        loss = chunked_cross_entropy(logits, labels, chunks)
    forward = chunk * (4 + copy)
    assert forward <= meter.peak_bytes <= forward + rows * 64, (dtype, meter.peak_bytes)
    with CpuPeakMeter() as meter:
        loss.backward()
    backward = rows * vocab * size + chunk * copy
    assert backward <= meter.peak_bytes <= backward + rows * 64, (dtype, meter.peak_bytes)
    assert chunked_ce_bytes(rows, vocab, size, chunks) == rows * (vocab * size + 12) + max(forward, backward)


def test_chunked_ce_rule_against_plain() -> None:
    # Llama 3.2 3B at 2 x 4096 tokens, 128256 vocab, 16-bit logits: the plain loss holds 12 bytes per logit at the
    # start of backward; chunked in 8: the logits and their gradient, 2 + 2 bytes per logit, one fp32 chunk and 12 per
    # row. The head's bf16 weight gradient (3072 wide, pure bf16 as torchtune trains) beside the logits' gradient is
    # less; an fp32 one (autocast's fp32 weights) too, at this many tokens.
    rows, vocab, hidden = 8192, 128256, 3072
    assert ce_plain_bytes(rows, vocab) == rows * vocab * 12
    chunked = rows * vocab * 4 + 1024 * vocab * 4 + rows * 12
    assert chunked_ce_bytes(rows, vocab, 2, 8) == chunked
    assert chunked_ce_bytes(rows, vocab, 2, 8, hidden, 2) == chunked == chunked_ce_bytes(rows, vocab, 2, 8, hidden, 4)
    # at 256 tokens the fp32 weight gradient is the larger moment
    head = vocab * hidden * 4 + 256 * hidden * 2
    assert chunked_ce_bytes(256, vocab, 2, 8, hidden, 4) == 256 * (vocab * 2 + 12) + head
    saving = ce_plain_bytes(rows, vocab) - chunked
    assert 7.3 < saving / 2**30 < 7.4  # torchtune's table: -8.1 GiB (after compile)


class _Block(torch.nn.Module):
    """A tiny Llama-like block: q, k, v, o projections around fused attention, then a gated MLP (7 matmuls)."""

    def __init__(self, h: int = 32, i: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(h, h, bias=False) for _ in range(4))
        self.gate, self.up = torch.nn.Linear(h, i, bias=False), torch.nn.Linear(h, i, bias=False)
        self.down = torch.nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        split = lambda t: t.view(b, s, self.heads, h // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def test_selective_checkpointing_saves_the_stated_ops() -> None:
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(2, 16, 32, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(_keep(saved), lambda t: t):
        out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, context_fn=op_context_fn)
    # Non-reentrant checkpointing saves only the block's input through the outer hooks; the policy's own cache
    # holds the MUST_SAVE outputs. Count them from the policy's view: run the forward under the policy and collect
    # the outputs it chose to save.
    assert [tuple(t.shape) for t in saved] == [(2, 16, 32)]
    chosen: list[tuple[str, tuple[int, ...]]] = []
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from advisor.selective_ac import op_policy

    policy = op_policy()

    def spy(ctx, func, *args, **kwargs):  # noqa: ANN001, ANN202
        verdict = policy(ctx, func, *args, **kwargs)
        if verdict == CheckpointPolicy.MUST_SAVE and not ctx.is_recompute:
            chosen.append((str(func), ()))
        return verdict

    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        out2 = torch.utils.checkpoint.checkpoint(
            block, x, use_reentrant=False, context_fn=lambda: create_selective_checkpoint_contexts(spy)
        )
    names = [n for n, _ in chosen]
    # q (1st mm), v (3rd), gate (5th), down (7th) and the CPU fused attention: the stated policy.
    assert names.count("aten.mm.default") == 4
    assert names.count("aten._scaled_dot_product_flash_attention_for_cpu.default") == 1
    assert len(names) == 5
    (out.sum() + out2.sum()).backward()
    ref = x.grad.clone()  # type: ignore[union-attr]
    x.grad = None
    (2 * block(x).sum()).backward()
    assert torch.allclose(ref, x.grad, atol=1e-5)  # type: ignore[arg-type]
    # The rule's per-block bytes for these dims (fp32 activations): q + v + gate + down + attention output + lse.
    d = BlockDims(hidden=32, intermediate=64, heads=4, kv_heads=4)
    assert sac_op_saved_bytes_per_block(32, d, 4) == 32 * (4 * (32 + 32 + 64 + 32 + 32) + 4 * 4)


def test_layer_policy_blocks() -> None:
    assert layer_policy_blocks(6, 2) == [1, 3, 5]  # torchtitan: _layer_sac_count % ac_freq == 0, counted from 1
    assert layer_policy_blocks(5, 1) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("strategy", "ga", "clip", "word"),
    [(Single(), 2, False, "accumulation"), (Single(), 1, True, "clipping"), (DDP(), 1, False, "DDP")],
)
def test_optimizer_in_backward_refusals(strategy: Strategy, ga: int, clip: bool, word: str) -> None:
    reason = optimizer_in_backward_blocker(strategy.optimizer_in_backward_blocker, ga, clip)
    assert reason is not None and word in reason and "\n" not in reason
    assert optimizer_in_backward_blocker(Single().optimizer_in_backward_blocker, 1, False) is None
    assert optimizer_in_backward_blocker(FSDP2().optimizer_in_backward_blocker, 1, False) is None
    assert "DeepSpeed" in (optimizer_in_backward_blocker(Zero(3).optimizer_in_backward_blocker, 1, False) or "")


def test_checkpointing_flags_refused_together() -> None:
    with pytest.raises(AdvisorError, match="give one of them"):
        validate(plan_inputs(model="gpt2", activation_checkpointing=True, selective_checkpointing="op"))
    with pytest.raises(AdvisorError, match="--checkpoint-every goes with"):
        validate(plan_inputs(model="gpt2", checkpoint_every=3))


def test_plan_refuses_optimizer_in_backward_with_accumulation_and_says_what_the_scripts_skip() -> None:
    from advisor.plan import plan

    base = dict(model="gpt2", seq_len=128, gpus=1, gpu="A100-80GB", micro_batch_size=2, detect_hardware=False)
    with pytest.raises(AdvisorError, match=r"^--optimizer-in-backward: 4 accumulation steps need the summed gradient"):
        plan(plan_inputs(**base, global_batch_size=8, optimizer_in_backward=True))
    p = plan(plan_inputs(**base, activation_offload=True))
    assert not any("memory-savings ladder" in w for w in p.warnings)  # the rows apply it now
    assert any(w.startswith("--activation-offload: applied to the strategy rows") for w in p.warnings)
    # chunked cross-entropy is in the scripts: no such note
    p = plan(plan_inputs(**base, chunked_cross_entropy=8))
    assert not any("the generated scripts do not" in w for w in p.warnings)


def test_chunked_loss_scripts_only_causal_lms_without_a_router_loss() -> None:
    """The script shifts the labels as a causal LM's loss does and computes the cross-entropy alone: only a causal LM
    whose loss adds no router term takes it; each refusal is one line naming why."""
    from advisor.models.configs import load_config_file, spec_from_hf_config
    from advisor.models.families.transformer import chunked_loss_blocker

    def spec(name: str, **extra: object):  # noqa: ANN202
        config = dict(load_config_file(str(CONFIGS / name)), **extra)  # type: ignore[arg-type]
        return spec_from_hf_config(config, name, name, 128)

    # Gemma 2 soft-caps its logits inside forward: the chunked loss takes them as the model returns them
    for name in ("llama-3.1-8b.json", "gpt2.json", "gemma-2-9b-it.json", "mixtral-8x7b-v0.1.json"):
        assert chunked_loss_blocker(spec(name)) is None, name
    assert chunked_loss_blocker(spec("bert-base-uncased.json")) == (
        "BertForMaskedLM is not a causal language model; the script shifts the labels as a causal LM's loss does"
    )
    assert "not a causal language model" in (chunked_loss_blocker(spec("t5-small.json")) or "")
    routed = spec("mixtral-8x7b-v0.1.json", output_router_logits=True)
    assert "load-balancing loss" in (chunked_loss_blocker(routed) or "")


def test_verify_refuses_an_option_the_scripts_do_not_write() -> None:
    """verify() itself (the page's and bench's way in, not only the CLI's) stops before planning: the script would
    run without the option and be measured against a plan with it."""
    from advisor.verify import verify

    with pytest.raises(AdvisorError, match=r"^--activation-offload: the generated scripts do not apply it yet"):
        verify(plan_inputs(model="gpt2", gpus=1, detect_hardware=False, activation_offload=True), "single")


def test_a_pipeline_plan_emits_the_options_into_its_other_rows_scripts(tmp_path: Path) -> None:
    """--pp adds the pipeline row; the plan's other rows still take the options their scripts write (a new user's
    find: the flag refused chunked cross-entropy and selective checkpointing for DDP too)."""
    from advisor.cli import main

    small = str(CONFIGS.parent / "small_llama.json")
    argv = ["--config", small, "--seq-len", "32", "--micro-batch-size", "2", "--precision", "fp32", "--gpus", "4"]
    argv += ["--pp", "2", "--chunked-cross-entropy", "4", "--selective-checkpointing", "op", "--strategy", "ddp"]
    assert main([*argv, "--emit", str(tmp_path / "ddp")]) == 0
    script = (tmp_path / "ddp" / "train.py").read_text()
    assert "ChunkedCrossEntropy.apply(" in script and "op_context_fn" in script
