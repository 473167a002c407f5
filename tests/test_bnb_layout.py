"""advisor.bnb_layout against the real bitsandbytes / torch / transformers objects (all on CPU).

bitsandbytes quantizes Params4bit and Int8Params on CPU (``.to("cpu")`` of a not yet quantized
parameter runs ``_quantize``), and its optimizers step on CPU (paged ones fall back to ordinary
buffers there, with the same sizes), so every formula is checked against real tensors here.
"""

import subprocess
import sys
import warnings

import pytest

from advisor import bnb_layout as bl
from advisor.bnb_layout import (
    BNB_OPTIMIZERS,
    OPTIMIZER_CHOICES,
    PAGED,
    QUANT_CHOICES,
    optimizer_source,
    optimizer_state_bytes,
    quantized_weight_bytes,
    state_bytes_per_element,
)

torch = pytest.importorskip("torch")

# numel 21000: not a multiple of 64 (partial last block); 61440: a multiple of 64 but not of
# 64*256 (partial nested block); 131072 and 4096000: exact multiples of 64*256.
SHAPES_4BIT = [(300, 70), (96, 640), (512, 256), (1000, 4096)]
OPT_SHAPES = [(64, 128), (4096, 2), (100,), (8, 8, 8)]


def _storage_bytes(tensors, seen: set[int]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (dedupe by storage data pointer)."""
    total = 0
    for t in tensors:
        st = t.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        total += st.nbytes()
    return total


def _quant_state_tensors(qs) -> list:
    """Every tensor reachable from a bitsandbytes QuantState, nested state2 included."""
    import bitsandbytes as bnb

    out = []
    for v in vars(qs).values():
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, bnb.functional.QuantState):
            out.extend(_quant_state_tensors(v))
    return out


# ---------------------------------------------------------------------------------- weights


@pytest.mark.parametrize("qt", ["nf4", "fp4"])
@pytest.mark.parametrize("dq", [False, True])
def test_4bit_weight_bytes_match_bitsandbytes(qt: str, dq: bool) -> None:
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    codes = []
    for out_f, in_f in SHAPES_4BIT:
        lin = bnb.nn.Linear4bit(
            in_f, out_f, bias=False, compute_dtype=torch.bfloat16, quant_type=qt, compress_statistics=dq
        )
        w = torch.randn(out_f, in_f, dtype=torch.bfloat16)
        lin.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=qt, compress_statistics=dq)
        lin = lin.to("cpu")
        weight = lin.weight
        assert weight.bnb_quantized and weight.dtype == torch.uint8
        qs = weight.quant_state
        assert qs.nested is dq
        seen: set[int] = set()
        real = _storage_bytes([weight.data, *_quant_state_tensors(qs)], seen)
        assert real == quantized_weight_bytes((out_f, in_f), qt, double_quant=dq), (out_f, in_f)
        codes.append(qs)
    # The code tables are per-weight tensors, not shared between weights.
    assert codes[0].code.data_ptr() != codes[1].code.data_ptr()
    if dq:
        assert codes[0].state2.code.data_ptr() != codes[1].state2.code.data_ptr()


def test_4bit_layout_parts() -> None:
    # (300, 70): n=21000, 329 blocks of 64 (last partial), nested: ceil(329/256)=2.
    lay = bl.quant_weight_layout((300, 70), "nf4", double_quant=True)
    assert (lay.data, lay.absmax, lay.code, lay.nested) == (10500, 329, 64, 4 + 2 * 4 + 1024)
    assert quantized_weight_bytes((300, 70), "fp4") == 10500 + 329 * 4 + 64
    assert quantized_weight_bytes((7,), "nf4", blocksize=128) == 4 + 4 + 64  # odd n rounds up


def test_int8_weight_bytes_match_bitsandbytes() -> None:
    # Int8Params.to("cpu") of an fp weight quantizes on CPU (int8_vectorwise_quant default kernel).
    bnb = pytest.importorskip("bitsandbytes")
    for out_f, in_f in SHAPES_4BIT:
        lin = bnb.nn.Linear8bitLt(in_f, out_f, bias=False, has_fp16_weights=False)
        lin.weight = bnb.nn.Int8Params(torch.randn(out_f, in_f), requires_grad=False, has_fp16_weights=False)
        lin = lin.to("cpu")
        weight = lin.weight
        assert weight.dtype == torch.int8 and weight.SCB.dtype == torch.float32
        tensors = [weight.data, weight.SCB] + ([weight.CB] if weight.CB is not None else [])
        real = _storage_bytes(tensors, set())  # CB is weight.data: counted once
        assert real == quantized_weight_bytes((out_f, in_f), "int8") == out_f * in_f + 4 * out_f


def test_weight_errors() -> None:
    with pytest.raises(ValueError, match="unknown quant"):
        quantized_weight_bytes((4, 4), "int4")
    with pytest.raises(ValueError, match="blocksize"):
        quantized_weight_bytes((4, 4), "nf4", blocksize=48)
    with pytest.raises(ValueError, match="shape"):
        quantized_weight_bytes((4, 0), "nf4")
    with pytest.raises(ValueError, match="dimension"):
        quantized_weight_bytes((), "int8")
    assert QUANT_CHOICES == ("nf4", "fp4", "int8")


# -------------------------------------------------------------------------------- optimizers


def _make_optimizer(name: str, params):
    if name == "adamw":
        return torch.optim.AdamW(params)
    if name == "adam":
        return torch.optim.Adam(params)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params)
    bnb = pytest.importorskip("bitsandbytes")
    cls = {
        "adamw-8bit": bnb.optim.AdamW8bit,
        "paged-adamw-8bit": bnb.optim.PagedAdamW8bit,
        "paged-adamw": bnb.optim.PagedAdamW,
        "lion": bnb.optim.Lion,
    }[name]
    return cls(params)


def _real_state_bytes(opt, params) -> int:
    """Bytes of every tensor in ``opt.state[p]``, shared tensors once.

    Excluded, after checking it is what the module says: torch Adam/AdamW's ``step``, a 0-dim
    fp32 tensor torch keeps on the CPU when neither fused nor capturable (host memory).
    Non-tensor entries (bitsandbytes' and Adafactor's int ``step``) are not bytes.
    """
    seen: set[int] = set()
    total = 0
    is_torch_adam = isinstance(opt, torch.optim.Adam)  # AdamW subclasses Adam in torch 2.14
    for p in params:
        for key, v in opt.state[p].items():
            if not isinstance(v, torch.Tensor):
                assert key == "step" and isinstance(v, int), (key, type(v))
                continue
            if key == "step" and is_torch_adam:
                assert v.dim() == 0 and v.dtype == torch.float32 and v.device.type == "cpu"
                continue
            total += _storage_bytes([v], seen)
    return total


_OPT_DTYPES = (
    [(name, torch.float32) for name in OPTIMIZER_CHOICES]
    + [
        (name, dt)
        for name in ("adamw", "adam", "sgd-momentum", "paged-adamw", "lion", "adafactor", "adamw-8bit")
        for dt in (torch.bfloat16,)
    ]
    + [("adafactor", torch.float64), ("adamw", torch.float64)]
)


@pytest.mark.parametrize(("name", "dtype"), _OPT_DTYPES, ids=lambda x: str(x).replace("torch.", ""))
def test_optimizer_state_bytes_match_real_state(name: str, dtype) -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, dtype=dtype)) for s in OPT_SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = _make_optimizer(name, params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bitsandbytes: "Paged optimizers are not supported on CPU"
        opt.step()
    elem_bytes = torch.empty((), dtype=dtype).element_size()
    assert _real_state_bytes(opt, params) == optimizer_state_bytes(name, OPT_SHAPES, elem_bytes)


def test_8bit_qmaps_are_shared_and_counted_once() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(64, 128), (4096, 2)]]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = bnb.optim.AdamW8bit(params)
    opt.step()
    s0, s1 = opt.state[params[0]], opt.state[params[1]]
    assert s0["qmap1"] is s1["qmap1"] and s0["qmap2"] is s1["qmap2"]
    assert s0["state1"].dtype == torch.uint8 and s0["absmax1"].dtype == torch.float32
    n = 64 * 128
    assert optimizer_state_bytes("adamw-8bit", [(64, 128)], 4) == 2 * n + 8 * (n // 256) + 2048
    # Only small tensors: fp32 states, no qmap in the state.
    assert optimizer_state_bytes("adamw-8bit", [(4095,)], 2) == 8 * 4095


def test_formulas_by_hand() -> None:
    assert optimizer_state_bytes("adamw", [(10, 10), (5,)], 2) == 2 * 105 * 2
    assert optimizer_state_bytes("sgd", [(10, 10)], 4) == 0
    assert optimizer_state_bytes("paged-adamw", [(10,)], 2) == 80
    assert optimizer_state_bytes("lion", [(10,)], 2) == 40
    # Adafactor (bf16 -> fp32 state): (3,4,5): row (3,4)=12, col (3,5)=15, RMS 1; (7,): 7 + 1.
    assert optimizer_state_bytes("adafactor", [(3, 4, 5), (7,)], 2) == 4 * (12 + 15 + 1 + 7 + 1)
    assert optimizer_state_bytes("adamw", [()], 4) == 8  # a scalar parameter
    assert optimizer_state_bytes("adamw", [], 4) == 0


def test_state_bytes_per_element() -> None:
    assert state_bytes_per_element("adamw", 2) == 4.0
    assert state_bytes_per_element("adam", 4) == 8.0
    assert state_bytes_per_element("sgd-momentum", 2) == 2.0
    assert state_bytes_per_element("sgd", 2) == 0.0
    assert state_bytes_per_element("adamw-8bit", 2) == 2 + 8 / 256
    assert state_bytes_per_element("paged-adamw-8bit", 4) == 2 + 8 / 256
    assert state_bytes_per_element("paged-adamw", 2) == 8.0
    assert state_bytes_per_element("lion", 2) == 4.0
    assert state_bytes_per_element("adafactor", 2) == 0.0
    # Consistent with the exact count for a large tensor.
    for name in OPTIMIZER_CHOICES:
        shape = (4096, 4096)
        exact = optimizer_state_bytes(name, [shape], 2) / (4096 * 4096)
        assert exact == pytest.approx(state_bytes_per_element(name, 2), abs=3e-3), name


def test_optimizer_names_and_errors() -> None:
    assert OPTIMIZER_CHOICES == (
        "adamw",
        "adam",
        "sgd-momentum",
        "sgd",
        "adamw-8bit",
        "paged-adamw-8bit",
        "paged-adamw",
        "adafactor",
        "lion",
    )
    assert PAGED == {"paged-adamw-8bit", "paged-adamw"} and PAGED <= BNB_OPTIMIZERS
    assert BNB_OPTIMIZERS == {"adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion"}
    assert optimizer_source("adamw-8bit") == "bitsandbytes.optim.AdamW8bit"
    assert optimizer_source("adafactor") == "transformers.optimization.Adafactor"
    for name in OPTIMIZER_CHOICES:
        src = optimizer_source(name)
        assert "\n" not in src and src.startswith(("bitsandbytes.", "torch.", "transformers."))
        assert src.startswith("bitsandbytes.") == (name in BNB_OPTIMIZERS)
    for fn in (
        lambda: optimizer_state_bytes("rmsprop", [(2,)], 4),
        lambda: state_bytes_per_element("adamw8", 2),
        lambda: optimizer_source("AdamW"),
    ):
        with pytest.raises(ValueError, match="unknown optimizer"):
            fn()
    with pytest.raises(ValueError, match="elem_bytes"):
        optimizer_state_bytes("adamw", [(2,)], 0)
    with pytest.raises(ValueError, match="shape"):
        optimizer_state_bytes("adamw", [(2, -1)], 2)


def test_module_stays_light() -> None:
    code = (
        "import sys, advisor.bnb_layout; "
        "bad = [m for m in ('torch', 'bitsandbytes', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(bl.__file__).rsplit("/advisor/", 1)[0])


@pytest.mark.parametrize("name", ["adamw-8bit", "paged-adamw-8bit", "paged-adamw", "lion"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_step_temporaries_as_measured(name: str, dtype: torch.dtype) -> None:
    """The peak of a bitsandbytes optimizer's step on CPU above what it held before (the profiler's allocator events)
    is ``advisor.memory.optimizer_step_temp_bytes``: its CPU update's fp32 copies of the tensor being stepped."""
    from advisor.choices import Device, Optimizer
    from advisor.measure import CpuPeakMeter
    from advisor.memory import optimizer_step_temp_bytes

    bnb = pytest.importorskip("bitsandbytes")
    n = 2**18
    p = torch.nn.Parameter(torch.randn(n, dtype=dtype))
    p.grad = torch.randn(n, dtype=dtype)
    opt = getattr(bnb.optim, optimizer_source(name).rsplit(".", 1)[1])([p], lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Paged optimizers are not supported on CPU"
        opt.step()  # the states are created
        with CpuPeakMeter() as meter:
            opt.step()
    expected = optimizer_step_temp_bytes(Optimizer(name), Device.CPU, n, p.element_size())
    assert meter.peak_bytes == pytest.approx(expected, rel=0.001), (meter.peak_bytes, expected)
    assert optimizer_step_temp_bytes(Optimizer(name), Device.CUDA, n, p.element_size()) == 0
