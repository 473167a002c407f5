"""oneDNN's CPU convolution scratch: the transient weight-gradient buffer no fake-tensor trace can see.

On CPUs without AVX-512, oneDNN computes some convolutions' weight gradient with its ``x64:gemm:jit`` kernel,
whose scratch buffer comes from the c10 allocator while ``aten::convolution_backward`` runs and is freed before
it returns. ``cpu_conv_scratch_bytes`` gives its size (see the function for the rule and its sources); the
trace's dispatch mode (``advisor.trace.live_bytes``) adds it as a transient event right after that op.
"""

from __future__ import annotations

from collections.abc import Sequence

# oneDNN books every scratchpad entry with 128 bytes of alignment slack (``memory_tracking::registry_t::book``:
# capacity = size + default_alignment); PyTorch runs oneDNN with a user scratchpad that ideep allocates from
# the c10 CPU allocator, registry size and all.
_ONEDNN_SCRATCH_ALIGN = 128
_AVX2_F32_SIMD = 8  # simd_w of oneDNN's gemm convolution on AVX2: 32-byte vectors / 4-byte floats


def onednn_gemm_bwd_weights_machine() -> bool:
    """Whether this machine's PyTorch computes some fp32 convolution weight gradients with oneDNN's
    ``x64:gemm:jit`` kernel (and so books ``cpu_conv_scratch_bytes``): mkldnn available and enabled, and
    an x86 CPU with AVX2 but no AVX-512 (ATen's capability is "AVX2" and the CPU reports no AVX-512).
    With AVX-512 (or AMX) the ``jit:avx512_common`` kernel takes every such convolution; other ISAs
    (ARM, x86 without AVX2) take other kernels that were not measured: False for them."""
    import torch

    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        return False
    has_avx512 = getattr(torch.cpu, "_is_avx512_supported", None)
    return not (has_avx512 is not None and has_avx512())


def _onednn_avx2_bwd_weights_applies(
    ih: int,
    iw: int,
    kh: int,
    kw: int,
    oh: int,
    ow: int,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> bool:
    """oneDNN's ``jit_avx2_conv_bwd_weights_kernel_f32::init_conf`` accepts the shape (it is tried before
    the gemm kernel, ``cpu_convolution_list.cpp``): no dilation, ``kw < 14``, ``kh <= ih`` ([bwd_w:r2];
    [bwd_w:r1] ``kh <= t_pad + ih`` follows), ``t_pad < kh`` and every padding below the extended kernel.
    Channels need no multiple of 8 (plain-layout channels are padded to the 8-blocked layout)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ext_kh, ext_kw = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    b_pad = max(0, (oh - 1) * sh + ext_kh - (ih + ph))
    r_pad = max(0, (ow - 1) * sw + ext_kw - (iw + pw))
    boundaries_ok = ph < ext_kh and b_pad < ext_kh and pw < ext_kw and r_pad < ext_kw
    params_ok = dh == 1 and dw == 1 and kw < 14 and kh <= ih and ph < kh
    return boundaries_ok and params_ok


def cpu_conv_scratch_bytes(
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    threads: int = 1,
) -> int:
    """Bytes that oneDNN's ``x64:gemm:jit`` weight-gradient kernel books from the c10 allocator for one
    2-D convolution (fp32, NCHW, groups 1, not transposed) on an AVX2 CPU without AVX-512, while
    ``aten::convolution_backward`` runs; 0 when another kernel computes it. ``threads``: the intra-op
    threads of the run (``torch.get_num_threads()``; 1 in ``--verify``'s ranks, OMP_NUM_THREADS=1).

    The rule, from oneDNN's sources (``src/cpu/gemm_convolution_utils.cpp``, ``init_conf``, branch
    ``!is_nspc && is_bwd_w``; checked with ONEDNN_VERBOSE on torch 2.14.1 / oneDNN 3.12, AMD EPYC AVX2):

    * the kernel runs when PyTorch uses mkldnn (fp32 and batch >= 2 for a kernel larger than 1x1,
      ``ConvParams::use_mkldnn``) and the jit:avx2 kernel declines (``_onednn_avx2_bwd_weights_applies``:
      in practice a kernel taller than its input, such as a 3x3 convolution on a 2x2 or 1x1 map);
    * threads: ``nthr = T`` with outer threading, which needs ``os / T < 256`` (os = OH * OW, integer
      division), batch != 1 and ``4 T W + 4 T IC KH KW 8 < limit``, where W is the weight in bytes
      (OC IC KH KW 4) and ``limit = min(1 GiB, 15 T (src + W + dst bytes))``; otherwise ``nthr = 1``;
    * ``book<float>(key_conv_wei_reduction, nthr * weights_d.size())``: size() is already bytes, so
      ``4 nthr W`` bytes (most of it never written), booked even when nthr is 1;
    * the im2col columns ``4 nthr IC KH KW OH OW`` bytes (0 for a 1x1 stride-1 kernel that keeps the map),
      with the os-block reduction oneDNN applies when they would pass the limit;
    * each booking plus 128 bytes of alignment; over the limit the kernel declines (the reference kernel
      then runs, with no scratch).

    So ``extra = nthr (4 W + 4 IC KH KW OH OW) + 256``. Measured (c10 allocator, profiler "Total
    Allocated"): one 512->512 3x3 convolution on a 2x2 map, batch 4: 37,822,720 B at T = 1 and
    75,645,184 B at T = 2, both exactly this.
    """
    threads = int(threads)
    if threads <= 0:
        return 0
    n, ic, ih, iw = (int(x) for x in input_shape)
    oc, _, kh, kw = (int(x) for x in weight_shape)
    (sh, sw), (ph, pw), (dh, dw) = (tuple(int(v) for v in x) for x in (stride, padding, dilation))
    oh = (ih + 2 * ph - ((kh - 1) * dh + 1)) // sh + 1
    ow = (iw + 2 * pw - ((kw - 1) * dw + 1)) // sw + 1
    if n < 2 or oh < 1 or ow < 1:  # batch 1: PyTorch takes slow_conv2d for small inputs, not oneDNN
        return 0
    if _onednn_avx2_bwd_weights_applies(ih, iw, kh, kw, oh, ow, (sh, sw), (ph, pw), (dh, dw)):
        return 0
    weights, ks, os_ = oc * ic * kh * kw * 4, kh * kw, oh * ow
    src, dst = n * ic * ih * iw * 4, n * oc * oh * ow * 4
    limit = min(1 << 30, 15 * threads * (src + weights + dst))
    thr_mem_estimate = 4 * threads * weights + 4 * threads * ic * ks * _AVX2_F32_SIMD
    nthr = threads if thr_mem_estimate < limit and os_ // threads < 256 else 1
    booked = 4 * nthr * weights + _ONEDNN_SCRATCH_ALIGN
    if booked > limit:
        return 0
    keeps_map = oh == ih and ow == iw and sh == 1 and sw == 1 and ks == 1
    im2col = 0 if keeps_map else ic * ks * os_  # elements per thread
    if im2col:
        available = limit - booked
        if available < 4 * nthr * im2col:  # oneDNN shrinks the os block to fit
            os_block = max(_AVX2_F32_SIMD, int(available // (4 * nthr * ic * ks) * 0.05))
            im2col = ic * ks * os_block
        booked += 4 * nthr * im2col + _ONEDNN_SCRATCH_ALIGN
    return booked if booked <= limit else 0


_CONV_BACKWARD_ARGS = (
    "grad_output",
    "input",
    "weight",
    "bias_sizes",
    "stride",
    "padding",
    "dilation",
    "transposed",
    "output_padding",
    "groups",
    "output_mask",
)


def _conv_backward_scratch(args: tuple, kwargs: dict, threads: int) -> int:
    """``cpu_conv_scratch_bytes`` of one ``aten.convolution_backward`` call, 0 unless it is a case the
    rule covers: weight gradient wanted, fp32, 4-D NCHW (contiguous input and weight; channels-last goes
    oneDNN's nspc path, which books differently and was not measured), groups 1, not transposed."""
    import torch

    a = dict(zip(_CONV_BACKWARD_ARGS, args)) | kwargs
    inp, weight, mask = a["input"], a["weight"], a["output_mask"]
    if (
        a["transposed"]
        or a["groups"] != 1
        or not mask[1]
        or inp.dim() != 4
        or inp.dtype != torch.float32
        or weight.dtype != torch.float32
        or a["grad_output"].dtype != torch.float32
        or not inp.is_contiguous()
        or not weight.is_contiguous()
    ):
        return 0
    return cpu_conv_scratch_bytes(
        tuple(inp.shape), tuple(weight.shape), a["stride"], a["padding"], a["dilation"], threads
    )
