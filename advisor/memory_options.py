"""The memory options beyond full activation checkpointing, as arithmetic: what each keeps, saves and costs.

Each rule is in bytes (ints) or seconds and names its source. ``advisor.ladder_state.evaluate_state`` applies them
to a strategy row's traced peak (``advisor.memory.Breakdown``) and step time, for the ladder's rungs
(``advisor.ladder``) and for the plan's rows when the user passes the options (``advisor.applied_options``); the
generated scripts write selective checkpointing (``checkpoint_activations``'s op and layer variants,
strategies/templates/torch_steps.py, with ``advisor.selective_ac``'s policy copied in) and chunked cross-entropy (the
transformer fragment's ``compute_loss`` chunked variant, with ``advisor.chunked_ce``'s ``ChunkedCrossEntropy``) and, in
the single-GPU script, the optimizer step in backward (templates/common.py's ``OptimizerInBackward``); not yet
activation offload.

- Chunked cross-entropy (``advisor.chunked_ce``): ``ce_plain_bytes`` / ``chunked_ce_bytes``.
- Selective activation checkpointing (``advisor.selective_ac``): ``sac_op_saved_bytes_per_block`` and
  ``sac_op_recompute_flops_per_block`` for the op policy; ``layer_policy_share`` for every-k-th block.
- Activation offloading to CPU: ``offload_transfer_s``.
- The optimizer step in backward: ``optimizer_in_backward_blocker`` and ``optimizer_in_backward_grad_bytes``.

Nothing here imports torch or any layer above the bottom data modules.
"""

from __future__ import annotations

from dataclasses import dataclass

# torchtune's CEWithChunkedOutputLoss default (torchtune/modules/loss/ce_chunked_output_loss.py, num_output_chunks=8).
DEFAULT_CE_CHUNKS = 8
# torchtune's OffloadActivations(min_offload_size=1024): saved tensors under 1 KiB stay on the GPU
# (torchtune/training/_activation_offloading.py); negligible next to a block's activations, not counted.
OFFLOAD_MIN_BYTES = 1024


def ce_plain_bytes(rows: int, vocab: int) -> int:
    """Bytes of the loss's logits at the start of backward with ``F.cross_entropy(logits.float(), ...)``
    (transformers' ``ForCausalLMLoss`` upcasts the logits, then log-softmax + NLL): the fp32 log-softmax
    ``aten._log_softmax`` saves for backward, then ``nll_loss_backward``'s fp32 gradient of it and
    ``_log_softmax_backward_data``'s fp32 gradient of the logits: ``rows x vocab x 12``. The logits themselves are
    not saved (the upcast's backward needs no input; torchtune's recipes ``del logits`` before backward). The trace of
    Llama 3.2 3B at 2 x 4096 tokens holds exactly this at its backward peak: 4 bytes per logit in its activations, the
    two fp32 gradients (8 x 8192 x 128256 bytes) as temporaries."""
    return rows * vocab * 12


def chunked_ce_bytes(
    rows: int, vocab: int, logit_bytes: int, chunks: int, hidden: int = 0, head_grad_elem: int = 0
) -> int:
    """Bytes of the loss with ``advisor.chunked_ce.ChunkedCrossEntropy`` over the whole logits (the output head applied
    once, as the generated scripts do) at its peak: the logits (``logit_bytes`` each, saved for backward; then their
    gradient, one tensor of the same dtype), per row the fp32 logsumexp and int64 label (12 bytes), and the largest of
    three moments' temporaries:

    - the last chunk's forward: ``torch.logsumexp``'s fp32 ``exp(x - max)`` of the chunk (allocated inside the kernel,
      aten/src/ATen/native/ReduceOps.cpp ``logsumexp_out_impl``) beside the chunk's fp32 copy, which 16-bit logits
      need and fp32 logits do not (``.float()`` returns them): ``rows / chunks x vocab x (4 + 4 or 0)``;
    - the loss node's backward: the whole gradient (``torch.empty_like(logits)``) beside the saved logits, and one
      chunk's fp32 copy (16-bit logits): ``rows x vocab x logit_bytes + rows / chunks x vocab x (4 or 0)``;
    - just after it, the head matmul's backward: the head's weight gradient (``vocab x hidden x head_grad_elem``, the
      trainable weights' dtype; 0 for a frozen head) and the input gradient (``rows x hidden x logit_bytes``) beside
      the logits' gradient.

    The output head applied per chunk (torchtune's ``num_output_chunks``, ``ChunkCrossEntropy``) keeps less of the
    logits' gradient but holds one weight gradient per chunk at once (measured: a 32000 x 512 head in 8 chunks, 0.09
    GiB above one), so the scripts apply the head once. Measured with saved-tensor hooks and the allocator's events in
    tests/test_memory_options.py, and in generated scripts' runs (tests/test_selective_scripts.py)."""
    per_chunk = -(-rows // max(1, chunks))
    copy = 4 if logit_bytes < 4 else 0
    forward = per_chunk * vocab * (4 + copy)
    loss_backward = rows * vocab * logit_bytes + per_chunk * vocab * copy
    head = vocab * hidden * head_grad_elem + rows * hidden * logit_bytes
    return rows * (vocab * logit_bytes + 12) + max(forward, loss_backward, head)


def ce_saving(
    rows: int, vocab: int, logit_bytes: int, chunks: int = DEFAULT_CE_CHUNKS, hidden: int = 0, head_grad_elem: int = 0
) -> int:
    """Bytes chunked cross-entropy saves at the backward peak (``ce_plain_bytes`` - ``chunked_ce_bytes``, >= 0)."""
    chunked = chunked_ce_bytes(rows, vocab, logit_bytes, chunks, hidden, head_grad_elem)
    return max(0, ce_plain_bytes(rows, vocab) - chunked)


def ce_saved_activation_bytes(rows: int, vocab: int, logit_bytes: int, chunked: bool) -> int:
    """What the loss keeps for backward (outside the model's blocks, so not offloaded with them): the fp32
    log-softmax (plain), or the 16-bit logits and per row the fp32 logsumexp and int64 label (chunked)."""
    return rows * (vocab * logit_bytes + 12) if chunked else rows * vocab * 4


@dataclass(frozen=True)
class BlockDims:
    """One decoder block's widths (a Hugging Face config's ``hidden_size``, ``intermediate_size``,
    ``num_attention_heads``, ``num_key_value_heads``): what the op policy's saved outputs are sized from."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int

    @property
    def kv(self) -> int:
        return self.hidden // self.heads * self.kv_heads


def block_dims(cfg: dict[str, object]) -> BlockDims | None:
    """``BlockDims`` of a Llama-style config (gated MLP: ``intermediate_size``), None for any other."""
    try:
        h, i, n = (int(str(cfg[k])) for k in ("hidden_size", "intermediate_size", "num_attention_heads"))
    except (KeyError, TypeError, ValueError):
        return None
    kv = cfg.get("num_key_value_heads") or n
    return BlockDims(h, i, n, int(str(kv)))


def sac_op_saved_bytes_per_block(tokens: int, d: BlockDims, elem: int) -> int:
    """What the op policy (``advisor.selective_ac``) saves in one Llama block beyond full checkpointing's block
    input: of the seven matmuls in forward order (q, k, v, o, gate, up, down projections) the 1st, 3rd, 5th and
    7th outputs (q: hidden, v: kv width, gate: intermediate, down: hidden) and the fused attention's output (hidden)
    and fp32 logsumexp (one per head), for ``tokens`` tokens in ``elem``-byte activations."""
    return tokens * (elem * (3 * d.hidden + d.kv + d.intermediate) + 4 * d.heads)


def sac_op_recompute_flops_per_block(tokens: int, d: BlockDims) -> int:
    """Forward FLOPs the op policy recomputes in one Llama block: the 2nd, 4th and 6th matmuls (k, o and up
    projections, 2 FLOPs per multiply-add); attention and the saved matmuls are not rerun."""
    return 2 * tokens * d.hidden * (d.kv + d.hidden + d.intermediate)


def layer_policy_share(blocks: int, every: int) -> float:
    """Share of the blocks the layer policy checkpoints (every ``every``-th: ``blocks // every`` of ``blocks``);
    its saving and its recompute are that share of full checkpointing's."""
    return (blocks // every) / blocks if blocks and every >= 1 else 0.0


def offload_transfer_s(offloaded: int, gbps: float, fwd_s: float, bwd_s: float) -> tuple[float, float]:
    """(transfer seconds, exposed seconds) of activation offloading: every offloaded byte goes to pinned host
    memory in forward and back in backward at ``gbps`` GB/s (``advisor.timing.comm.pcie_host_gbps``), on a side
    stream (torchtune ``OffloadActivations(use_streams=True)``), so each direction hides under its phase's compute
    and only what outlasts it (``transfer - phase``) is exposed."""
    one_way = offloaded / (gbps * 1e9) if gbps > 0 else 0.0
    return 2 * one_way, max(0.0, one_way - fwd_s) + max(0.0, one_way - bwd_s)


def optimizer_in_backward_blocker(strategy_blocker: str | None, grad_accum_steps: int, clipping: bool) -> str | None:
    """Why the optimizer step cannot run in backward here (None: it can), one line each: torchtune's
    ``optimizer_in_bwd`` steps each parameter in ``register_post_accumulate_grad_hook`` and refuses accumulation and
    clipping (torchtune/recipes/full_finetune_single_device.py); ``strategy_blocker``: the strategy's own reason
    (``Strategy.optimizer_in_backward_blocker``: under DDP the hook fires before the bucket's all-reduce)."""
    if grad_accum_steps > 1:
        return (
            f"{grad_accum_steps} accumulation steps need the summed gradient, but each parameter steps as soon as "
            "its gradient is ready (torchtune refuses gradient_accumulation_steps > 1)"
        )
    if clipping:
        return (
            "global-norm clipping needs every gradient before any step, and each parameter steps in its own hook "
            "(torchtune refuses clip_grad_norm with optimizer_in_bwd)"
        )
    return strategy_blocker


def optimizer_in_backward_grad_bytes(largest_grad: int, tied_grad: int) -> int:
    """Gradient bytes held at any moment with the optimizer step in backward: one parameter's (the largest,
    between its hook and ``grad = None``) plus a tied weight's, which accumulates from its first use in backward
    (the LM head) to its last (the input embedding) and is held through the whole backward."""
    return largest_grad + tied_grad
