"""Time convolution calls on this CPU for ``advisor.timing.cpu_conv``: run as a script, imports torch only.

stdin: one JSON object, ``{"threads": T, "seconds": S, "calls": [[...], ...]}``, each call the
``advisor.timing.compute.CONV_PARAM_FIELDS`` integers of one ``aten.convolution`` (call 0) or
``aten.convolution_backward`` (call 8 + its output mask) of a traced training step. Each is run on random tensors of
its shapes with T intra-op threads (PyTorch picks the kernel by them: ``ConvParams::use_mkldnn``), once to warm up,
then repeatedly for about S seconds (at least 3 times); its time is the median. Prints one line ``CONV <json>``: the
seconds of each call, in order.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

request = json.load(sys.stdin)
torch.set_num_threads(int(request["threads"]))
aten = torch.ops.aten


def timed(fn: object, seconds: float) -> float:
    """Median seconds of ``fn()`` over repeated calls filling about ``seconds`` (at least 3), after one warm-up."""
    fn()  # type: ignore[operator]
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def seconds_of(call: list[int], seconds: float) -> float:
    n, c, h, w, w0, w1, kh, kw, sh, sw, ph, pw, dh, dw, groups, transposed, oph, opw, size, which = call
    dtype = torch.float32 if size == 4 else torch.bfloat16
    x = torch.randn(n, c, h, w, dtype=dtype)
    weight = torch.randn(w0, w1, kh, kw, dtype=dtype)
    args = ([sh, sw], [ph, pw], [dh, dw], bool(transposed), [oph, opw], groups)
    if which == 0:
        return timed(lambda: aten.convolution(x, weight, None, *args), seconds)
    grad_out = torch.randn_like(aten.convolution(x, weight, None, *args))
    mask = [bool(which & 1), bool(which & 2), bool(which & 4)]
    bias = [w1 * groups if transposed else w0] if mask[2] else None
    return timed(lambda: aten.convolution_backward(grad_out, x, weight, bias, *args, mask), seconds)


with torch.no_grad():
    result = [seconds_of(call, float(request["seconds"])) for call in request["calls"]]
print("CONV " + json.dumps(result), flush=True)
