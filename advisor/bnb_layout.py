"""Byte layout of bitsandbytes-quantized weights and of optimizer states, in pure arithmetic.

Every size is a Python ``int`` number of bytes (``state_bytes_per_element`` returns bytes per
parameter element as a ``float``). This module deliberately imports neither torch nor
bitsandbytes: it is imported by code that must stay light. The formulas were read from, and are
tested against (``tests/test_bnb_layout.py``), bitsandbytes 0.50.2, torch 2.14.1 and
transformers 5.24; the comments cite the source file and function each one comes from.

What is counted
---------------
*Quantized weights* (``quantized_weight_bytes``): the packed data plus every tensor of the
weight's ``QuantState`` (and of its nested ``state2``). bitsandbytes allocates each of those per
weight: the 4-bit code table is created afresh by ``functional.get_4bit_type`` on every
``quantize_4bit`` call, and the nested 8-bit code is copied per weight
(``code.to(A.device, copy=True)`` in ``functional.quantize_blockwise``), so nothing is shared
between weights and nothing is added once per model.

*Optimizer state* (``optimizer_state_bytes``): the device-resident tensors in ``opt.state[p]``
after the first ``step()``, counting a tensor object shared between parameters once:

- bitsandbytes' ``qmap1``/``qmap2`` are the same two tensors for every parameter of one optimizer
  (``Optimizer8bit.name2qmap``, assigned in ``Optimizer2State.init_state``): added once per
  optimizer, and only when at least one tensor takes the 8-bit path (otherwise they stay the
  host-side tensors ``fill_qmap`` made in ``Optimizer8bit.__init__`` and never enter the state).
- bitsandbytes' ``state["step"]`` and transformers Adafactor's ``state["step"]`` are Python ints:
  not tensors, nothing counted.
- torch.optim Adam/AdamW's ``state["step"]`` is a 0-dim fp32 tensor that torch deliberately keeps
  on the *CPU* when neither ``fused`` nor ``capturable`` is set (torch/optim/adam.py
  ``Adam._init_group``, "special device hosting for step"): host memory, not counted.
- Adafactor's ``state["RMS"]`` is a 0-dim tensor on the parameter's device (``Adafactor._rms`` of
  the parameter): counted (4 bytes for fp16/bf16/fp32 parameters).

Sizes are logical (``numel * itemsize``); the CUDA caching allocator rounds every block up to
512 bytes, which this module does not model.
"""

import math
from dataclasses import dataclass
from typing import Sequence  # noqa: UP035 -- the brief keeps this module to math, dataclasses, typing

from .choices import Optimizer, Quant, values  # the names as enums; advisor.choices imports only enum

__all__ = [
    "BNB_OPTIMIZERS",
    "OPTIMIZER_CHOICES",
    "PAGED",
    "QUANT_CHOICES",
    "QuantWeightLayout",
    "optimizer_source",
    "optimizer_state_bytes",
    "quant_storage_numel",
    "quant_weight_layout",
    "quantized_weight_bytes",
    "state_bytes_per_element",
]

QUANT_CHOICES: tuple[str, ...] = values(Quant)

# adamw, adam, sgd-momentum, sgd, adamw-8bit, paged-adamw-8bit, paged-adamw, adafactor, lion
OPTIMIZER_CHOICES: tuple[str, ...] = values(Optimizer)

#: Optimizers whose state bitsandbytes may page (``Optimizer.is_paged``).
PAGED: frozenset[Optimizer] = frozenset(o for o in Optimizer if o.is_paged)

#: Optimizers that need bitsandbytes installed.
BNB_OPTIMIZERS: frozenset[str] = frozenset({"adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion"})

_OPTIMIZER_SOURCE: dict[str, str] = {
    "adamw": "torch.optim.AdamW",
    "adam": "torch.optim.Adam",
    "sgd-momentum": "torch.optim.SGD",
    "sgd": "torch.optim.SGD",
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
    "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
    "paged-adamw": "bitsandbytes.optim.PagedAdamW",
    "adafactor": "transformers.optimization.Adafactor",
    "lion": "bitsandbytes.optim.Lion",
}

# bitsandbytes/functional.py quantize_4bit: valid 4-bit block sizes.
_4BIT_BLOCKSIZES: tuple[int, ...] = (32, 64, 128, 256, 512, 1024, 2048, 4096)
# bitsandbytes/functional.py quantize_4bit: compress_statistics quantizes absmax with
# quantize_blockwise(..., blocksize=256).
_NESTED_BLOCKSIZE = 256
# bitsandbytes/functional.py get_4bit_type: 16 fp32 values (``assert data.numel() == 16``).
_4BIT_CODE_BYTES = 16 * 4
# bitsandbytes/functional.py create_dynamic_map: 256 fp32 values (``assert len(data) == 2**total_bits``).
_DYNAMIC_MAP_BYTES = 256 * 4
_FP32 = 4

# bitsandbytes/optim/optimizer.py Optimizer2State.__init__ / Optimizer1State.__init__:
# min_8bit_size=4096 default; init_state: 8-bit only when ``p.numel() >= min_8bit_size``.
_MIN_8BIT_SIZE = 4096
# bitsandbytes/optim/optimizer.py Optimizer2State.init_state: ``blocksize = 256`` for absmax1/absmax2.
_OPTIM_8BIT_BLOCKSIZE = 256


@dataclass(frozen=True)
class QuantWeightLayout:
    """Byte breakdown of one quantized weight (all fields in bytes)."""

    data: int
    """Packed/quantized weight data (``Params4bit.data`` uint8, or ``Int8Params.data`` int8)."""
    absmax: int
    """Per-block absmax (4-bit: fp32, or uint8 with double quant) or per-row ``SCB`` (int8, fp32)."""
    code: int
    """4-bit code table (16 fp32), per weight; 0 for int8."""
    nested: int
    """Double-quant extras: offset (0-dim fp32) + nested fp32 absmax + nested 256-entry fp32 code."""

    @property
    def total(self) -> int:
        """Sum of all parts, in bytes."""
        return self.data + self.absmax + self.code + self.nested


def _numel(shape: Sequence[int]) -> int:
    """Number of elements of ``shape``; ValueError for a non-positive or non-int dimension."""
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            raise ValueError(f"shape {tuple(shape)!r} must hold positive int dimensions")
    return math.prod(shape)


def _ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints, as bitsandbytes writes it: ``-(a // -b)``."""
    return -(a // -b)


def quant_weight_layout(
    shape: tuple[int, ...], quant: str, double_quant: bool = False, blocksize: int = 64
) -> QuantWeightLayout:
    """Byte breakdown of one weight of ``shape`` once bitsandbytes has quantized it on the device.

    See :func:`quantized_weight_bytes` for the arguments and formulas.
    """
    if quant not in QUANT_CHOICES:
        raise ValueError(f"unknown quant {quant!r}; choose one of {', '.join(QUANT_CHOICES)}")
    if len(shape) == 0:
        raise ValueError("shape must have at least one dimension")
    n = _numel(shape)

    if quant == Quant.INT8:
        # bitsandbytes/nn/modules.py Int8Params._quantize -> functional.int8_vectorwise_quant
        # (backends/default/ops.py "int8_vectorwise_quant"; _ops.py fake: out_row int8 A.shape,
        # row_stats fp32 of A.numel() // A.shape[-1]). data = CB (int8, same tensor), SCB = row_stats.
        # threshold=0.0 at quantization time: no outlier-column tensor is kept.
        rows = n // shape[-1]
        return QuantWeightLayout(data=n, absmax=rows * _FP32, code=0, nested=0)

    if blocksize not in _4BIT_BLOCKSIZES:
        raise ValueError(f"invalid 4-bit blocksize {blocksize}; choose one of {_4BIT_BLOCKSIZES}")
    # bitsandbytes/_ops.py fake "quantize_4bit" (and backends/default/ops.py quantize_4bit):
    # blocks = -(n // -blocksize); absmax fp32 (blocks,); out uint8 ((n + 1) // 2, 1)
    # with the default quant_storage=torch.uint8 (Params4bit.__new__).
    blocks = _ceil_div(n, blocksize)
    data = (n + 1) // 2
    # bitsandbytes/functional.py quantize_4bit: code = get_4bit_type(quant_type, device=A.device),
    # a fresh 16-entry fp32 tensor per call -> per weight.
    code = _4BIT_CODE_BYTES
    if not double_quant:
        return QuantWeightLayout(data=data, absmax=blocks * _FP32, code=code, nested=0)
    # bitsandbytes/functional.py quantize_4bit with compress_statistics=True:
    #   offset = _absmax.mean()                     -> 0-dim fp32
    #   qabsmax, state2 = quantize_blockwise(_absmax - offset, blocksize=256)
    # functional.quantize_blockwise: qabsmax uint8 (blocks,), state2.absmax fp32
    # (ceil(blocks / 256),) (_ops.py fake "quantize_blockwise"), state2.code =
    # code.to(A.device, copy=True) -> a per-weight copy of the 256-entry fp32 dynamic map.
    nested = _FP32 + _ceil_div(blocks, _NESTED_BLOCKSIZE) * _FP32 + _DYNAMIC_MAP_BYTES
    return QuantWeightLayout(data=data, absmax=blocks, code=code, nested=nested)


def quantized_weight_bytes(shape: tuple[int, ...], quant: str, double_quant: bool = False, blocksize: int = 64) -> int:
    """Bytes one quantized ``Linear`` weight holds on the device, quant state included.

    ``shape`` is the weight's shape, ``(out_features, in_features)`` for a ``Linear``; n = numel.

    - ``"nf4"`` / ``"fp4"`` (``bnb.nn.Params4bit``, bitsandbytes/functional.py ``quantize_4bit``),
      blocks = ceil(n / blocksize):
      ``ceil(n/2)`` packed uint8 + ``4*blocks`` fp32 absmax + 64 (16-entry fp32 code);
      with ``double_quant`` (``compress_statistics=True``): ``ceil(n/2)`` + ``blocks`` (uint8
      absmax) + 64 (code) + 4 (fp32 offset) + ``4*ceil(blocks/256)`` (nested fp32 absmax) +
      1024 (nested 256-entry fp32 code).
    - ``"int8"`` (``bnb.nn.Int8Params`` in ``Linear8bitLt(has_fp16_weights=False)``,
      bitsandbytes/nn/modules.py ``Int8Params._quantize``): ``n`` int8 + ``4 * n // shape[-1]``
      (fp32 ``SCB``, one per row = out_features). ``double_quant`` and ``blocksize`` are ignored.

    All code tables are per-weight tensors (see the module docstring), so the sum over a model's
    weights is the model's total. Returns bytes (int). Raises ValueError for an unknown
    ``quant``, an invalid 4-bit ``blocksize`` or a bad shape.
    """
    return quant_weight_layout(shape, quant, double_quant, blocksize).total


def quant_storage_numel(shape: tuple[int, ...], storage_bytes: int) -> int:
    """Elements of a 4-bit weight's packed data when ``bnb_4bit_quant_storage`` is a dtype of ``storage_bytes``
    bytes (``Params4bit(quant_storage=...)``; 1 = the default uint8): two 4-bit codes per byte, packed into
    elements of that dtype. bitsandbytes/_ops.py fake "quantize_4bit": ``out = torch.empty(((n + 1) //
    (quant_storage.itemsize * 2), 1), dtype=quant_storage)`` (backends/default/ops.py views the packed uint8 bytes
    as ``quant_storage``). The bytes are this x ``storage_bytes``: ``ceil(n / 2)`` for even n whatever the dtype;
    the absmax and code of the quant state do not change. A float storage dtype is what lets DeepSpeed ZeRO-3 and
    FSDP treat the packed weight as one more floating parameter to partition (peft's docs, "Use PEFT QLoRA and
    DeepSpeed with ZeRO3")."""
    _check_elem_bytes(storage_bytes)
    return (_numel(shape) + 1) // (storage_bytes * 2)


def _check_optimizer(optimizer: str) -> None:
    """ValueError for a name not in OPTIMIZER_CHOICES."""
    if optimizer not in OPTIMIZER_CHOICES:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {', '.join(OPTIMIZER_CHOICES)}")


def _check_elem_bytes(elem_bytes: int) -> None:
    """ValueError for a non-positive or non-int ``elem_bytes``."""
    if not isinstance(elem_bytes, int) or isinstance(elem_bytes, bool) or elem_bytes <= 0:
        raise ValueError(f"elem_bytes must be a positive int, got {elem_bytes!r}")


def _adafactor_state_elem_bytes(elem_bytes: int) -> int:
    """Bytes per element of Adafactor's state for a parameter of ``elem_bytes`` bytes/element.

    transformers/optimization.py ``Adafactor.step``: ``if grad.dtype in {float16, bfloat16}:
    grad = grad.float()``, then every state tensor is made ``.to(grad)``; ``RMS`` is
    ``_rms(p_data_fp32)``, also fp32 for fp16/bf16 parameters. So 2-byte dtypes -> fp32 (4),
    otherwise the parameter's own dtype.
    """
    return _FP32 if elem_bytes == 2 else elem_bytes


def optimizer_state_bytes(optimizer: str, shapes: Sequence[tuple[int, ...]], elem_bytes: int) -> int:
    """Bytes of one optimizer's per-parameter state after the first ``step()``.

    ``shapes``: the trainable parameters of this optimizer (every one is assumed to get a grad);
    ``elem_bytes``: bytes per element of their dtype (2 for bf16/fp16, 4 for fp32). n = numel.

    - ``"adamw"``, ``"adam"`` (torch/optim/adam.py ``Adam._init_group``): ``exp_avg`` +
      ``exp_avg_sq`` ``zeros_like(p)``: ``2 * n * elem_bytes`` (the 0-dim ``step`` is host-side).
    - ``"sgd-momentum"`` (torch/optim/sgd.py ``SGD.step``, ``momentum_buffer`` = clone of the
      grad): ``n * elem_bytes``; ``"sgd"`` (momentum 0): no state, 0.
    - ``"adamw-8bit"``, ``"paged-adamw-8bit"`` (bitsandbytes/optim/optimizer.py
      ``Optimizer2State.init_state``, ``min_8bit_size=4096``): n >= 4096: ``state1``/``state2``
      uint8 + ``absmax1``/``absmax2`` fp32 per 256 block: ``2*n + 8*ceil(n/256)``; n < 4096:
      fp32 ``state1``/``state2``: ``8*n``; plus the shared ``qmap1``/``qmap2`` (2 x 256 fp32 =
      2048) once per optimizer if any n >= 4096.
    - ``"paged-adamw"`` (``Optimizer2State.init_state`` with optim_bits=32,
      ``get_state_buffer(p, dtype=torch.float32)``): always fp32: ``8 * n``.
    - ``"lion"`` (``Optimizer1State.init_state``, optim_bits=32): one fp32 ``state1``: ``4 * n``.
    - ``"adafactor"`` (transformers/optimization.py ``Adafactor.step``, defaults: beta1=None so no
      ``exp_avg``): len(shape) >= 2: ``exp_avg_sq_row`` (shape[:-1]) + ``exp_avg_sq_col``
      (shape[:-2] + shape[-1:]); else ``exp_avg_sq`` (shape); plus the 0-dim ``RMS``; all in
      fp32 for fp16/bf16/fp32 params (param dtype otherwise):
      ``s * (prod(shape[:-1]) + prod(shape[:-2]) * shape[-1] + 1)`` or ``s * (n + 1)``.

    Returns bytes (int). Raises ValueError for an unknown optimizer, a bad ``elem_bytes`` or a
    bad shape. A scalar parameter is shape ``()`` (n = 1).
    """
    _check_optimizer(optimizer)
    _check_elem_bytes(elem_bytes)
    numels = [_numel(s) for s in shapes]
    total_n = sum(numels)

    if optimizer in (Optimizer.ADAMW, Optimizer.ADAM):
        return 2 * total_n * elem_bytes
    if optimizer == Optimizer.SGD_MOMENTUM:
        return total_n * elem_bytes
    if optimizer == Optimizer.SGD:
        return 0
    if optimizer in (Optimizer.ADAMW_8BIT, Optimizer.PAGED_ADAMW_8BIT):
        total = 0
        any_8bit = False
        for n in numels:
            if n >= _MIN_8BIT_SIZE:
                any_8bit = True
                total += 2 * n + 2 * _ceil_div(n, _OPTIM_8BIT_BLOCKSIZE) * _FP32
            else:
                total += 2 * n * _FP32
        if any_8bit:
            # Optimizer2State.init_state: state["qmap1"] = self.name2qmap["dynamic"],
            # state["qmap2"] = self.name2qmap["udynamic"]: one pair per optimizer instance.
            total += 2 * _DYNAMIC_MAP_BYTES
        return total
    if optimizer == Optimizer.PAGED_ADAMW:
        return 2 * total_n * _FP32
    if optimizer == Optimizer.LION:
        return total_n * _FP32
    # adafactor
    s = _adafactor_state_elem_bytes(elem_bytes)
    total = 0
    for shape, n in zip(shapes, numels):
        if len(shape) >= 2:  # Adafactor._get_options: factored = len(param_shape) >= 2
            row = math.prod(shape[:-1])
            col = math.prod(shape[:-2]) * shape[-1]
            total += (row + col) * s
        else:
            total += n * s
        total += s  # state["RMS"]: 0-dim tensor on the parameter's device
    return total


def state_bytes_per_element(optimizer: str, elem_bytes: int) -> float:
    """Bytes of optimizer state per parameter element of a *large* tensor (bytes/element).

    For a time model's bytes-touched figure; per-tensor and per-optimizer constants are dropped:
    adamw/adam ``2*elem_bytes``; sgd-momentum ``elem_bytes``; sgd 0; adamw-8bit /
    paged-adamw-8bit ``2 + 8/256`` (two uint8 states + two fp32 absmax per 256 elements);
    paged-adamw 8 (fp32 x 2); lion 4 (fp32); adafactor 0 (factored second moment: (rows + cols)
    elements per 2-D tensor, vanishing per element). Raises ValueError for an unknown optimizer.
    """
    _check_optimizer(optimizer)
    _check_elem_bytes(elem_bytes)
    per_element: dict[str, float] = {
        "adamw": 2.0 * elem_bytes,
        "adam": 2.0 * elem_bytes,
        "sgd-momentum": float(elem_bytes),
        "sgd": 0.0,
        "adamw-8bit": 2.0 + 2.0 * _FP32 / _OPTIM_8BIT_BLOCKSIZE,
        "paged-adamw-8bit": 2.0 + 2.0 * _FP32 / _OPTIM_8BIT_BLOCKSIZE,
        "paged-adamw": 2.0 * _FP32,
        "adafactor": 0.0,
        "lion": float(_FP32),
    }
    return per_element[optimizer]


def optimizer_source(optimizer: str) -> str:
    """Dotted path of the library class behind a CLI optimizer name, e.g.
    ``"bitsandbytes.optim.AdamW8bit"`` ("sgd" and "sgd-momentum" are both ``torch.optim.SGD``,
    with momentum 0 and > 0). Raises ValueError for an unknown optimizer."""
    _check_optimizer(optimizer)
    return _OPTIMIZER_SOURCE[optimizer]
