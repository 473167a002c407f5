"""This machine's CPU, measured, so the step-time model can predict a CPU verification run.

A verification on a machine without a GPU runs its ranks as CPU processes over gloo (``advisor.verify``:
``MAX_CPU_RANKS`` at most, each with ``OMP_NUM_THREADS`` intra-op threads). No datasheet describes that
"GPU", so its figures are measured, with the ranks' thread counts and as many processes at once as the run
has ranks (they share the cores, the caches and the memory bus as the ranks do):

* matmul FLOP/s per dtype (fp32, bf16), as a linear layer trains: forward and backward of ``F.linear`` on
  512 x 512 (the three products of a training step, whose layouts run at up to 8x different speeds where bf16 is
  emulated, on CPUs without native bf16);
* convolution FLOP/s: forward + backward of a 3x3, 64 -> 64 channel fp32 convolution on 16 x 64 x 16 x 16 (a
  ResNet block at the small image sizes CPU runs use; oneDNN runs it at about 3/4 of the matmul rate here);
* memory bandwidth: ``torch.add(a, b, out=c)`` over fp32 tensors of 4 MiB (cache-resident, the size of a
  small model's activations; the figure the model uses) and 64 MiB (DRAM), bytes read + written as the
  roofline counts an op's bytes;
* transcendental element-wise ops: ``torch.exp`` over 1 MiB of fp32, bytes read + written (CPU vector units
  compute exp, log, sqrt and the activations and softmax built on them slower than the caches deliver bytes);
* fused attention FLOP/s, forward + backward of causal SDPA on 2 x 8 x 256 x 32, counted with
  ``torch.utils.flop_counter``'s SDPA formulas as the trace counts them;
* eager overhead per op: forward + backward of a tiny block (linear, layer norm, GELU, residual) whose kernels do
  almost nothing, per op that reads or writes data (the ops the trace records); the per-op dispatch of an add of
  8 elements is kept for reference;
* the optimizer step: ``torch.optim.AdamW`` over 16 fp32 tensors of 64 K elements, as bytes per second of the
  step model's 28 bytes per element;
* gloo all-reduce between the ranks (runs of 2 ranks or more): latency from an 8-byte buffer, bus bandwidth from
  16 MiB (``2(n-1)/n x S / (t - latency)``, nccl-tests' busbw definition); reduce-scatter and all-gather of 16 MiB
  too (``(n-1)/n x S / (t - latency)``): gloo does not run them as an all-reduce's halves.

Each rate is the best of 3 short rounds (noise only slows a benchmark down).

Every rank measures at the same time as the others (a barrier before each benchmark); a figure is the slowest
rank's (synchronous ranks wait for it). One calibration takes about 10 s on 2 cores, most of it the workers'
``import torch``; the result is cached (``advisor.cache``, namespace ``cpu-calibration``, keyed by the CPU
model and ISA flags, core count, ranks, threads per rank, torch version and this module's ``FORMAT``). A
calibration during which other processes kept the CPUs busy (``contended``) is cached for ``CONTENDED_TTL_S``
only, then measured again, so a busy spell does not stay in the cache.

Callers that run training on this machine must not hold ``advisor.processes.MachineLock`` when they call
``cpu_calibration``: it takes the lock itself while it measures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache import DiskCache, NullCache, library_versions, open_cache
from ..choices import Device, Precision
from ..gpu_presets import BusBw, GpuPreset
from ..processes import MachineLock, free_port
from .compute import Efficiency, Rates

if TYPE_CHECKING:
    from .comm import Fabric
    from .step import StepTime

NAMESPACE = "cpu-calibration"
FORMAT = 4  # bump when what is measured changes: older cached calibrations then miss
SECONDS_PER_BENCHMARK = 0.5
TIMEOUT_S = 120.0
CONTENDED_SHARE = 0.25  # other processes' CPU time above this share of all cores' time: contended
CONTENDED_TTL_S = 600.0  # how long a contended calibration is reused before it is measured again
_WORKER = Path(__file__).with_name("_calibrate_worker.py")
_ISA = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "asimd", "sve")

MEASUREMENTS = 0  # calibrations measured (not read from the cache) in this process: tests count them


@dataclass(frozen=True)
class CpuCalibration:
    """What one rank of a CPU verification run achieves while the other ranks run too. Rates per rank:
    FLOP/s, bytes/s; the all-reduce across ``ranks`` (None for one rank: nothing to reduce)."""

    ranks: int
    threads: int  # intra-op threads per rank
    matmul_fp32_flops_per_s: float
    matmul_bf16_flops_per_s: float
    conv_fp32_flops_per_s: float  # forward + backward of a 3x3 convolution
    mem_bytes_per_s: float  # cache-resident add (4 MiB tensors): the figure the roofline uses
    dram_bytes_per_s: float  # 64 MiB tensors, for reference
    op_overhead_s: float  # eager dispatch of one tiny op, for reference
    exp_bytes_per_s: float  # transcendental element-wise ops (exp, 1 MiB), bytes read + written
    attention_fp32_flops_per_s: float  # fused SDPA forward + backward, fp32
    attention_bf16_flops_per_s: float  # the same in bf16
    eager_op_s: float  # eager overhead per recorded op of a training step: added to every op of the roofline
    adamw_bytes_per_s: float  # torch.optim.AdamW's step, bytes as the step model counts them
    allreduce_busbw_gbps: float | None
    reduce_scatter_busbw_gbps: float | None
    all_gather_busbw_gbps: float | None
    allreduce_latency_s: float | None
    cpu: str
    torch: str
    measured_s: float  # wall seconds the calibration took
    contended: bool = False  # other processes kept the CPUs busy while it ran (cached for CONTENDED_TTL_S only)
    measured_at: float = 0.0  # time.time() when it was measured
    cached: bool = False  # read from the cache
    # the planned model's convolutions measured on this CPU (advisor.timing.cpu_conv; not stored with the rest)
    conv_s: tuple[tuple[tuple[int, ...], float], ...] = ()

    def source(self) -> str:
        """Where the rates come from, with every measured figure, in one line (the sources the plan quotes)."""
        bw, latency = "", self.allreduce_latency_s
        if self.allreduce_busbw_gbps:
            assert latency is not None, "the all-reduce is measured with its latency (_from_ranks)"
            bw = (
                f", gloo busbw all-reduce {self.allreduce_busbw_gbps:.2f} GB/s, reduce-scatter "
                f"{self.reduce_scatter_busbw_gbps:.2f}, all-gather {self.all_gather_busbw_gbps:.2f}, latency "
                f"{1e6 * latency:.0f} us"
            )
        return (
            f"measured on this machine ({self.cpu}, {self.ranks} rank(s) x {self.threads} thread(s) at once): "
            f"matmul fp32 {self.matmul_fp32_flops_per_s / 1e9:.1f} GFLOP/s, bf16 "
            f"{self.matmul_bf16_flops_per_s / 1e9:.2f} GFLOP/s, fp32 convolution "
            f"{self.conv_fp32_flops_per_s / 1e9:.1f} GFLOP/s, attention "
            f"{self.attention_fp32_flops_per_s / 1e9:.1f} GFLOP/s (bf16 {self.attention_bf16_flops_per_s / 1e9:.2f}), "
            f"memory {self.mem_bytes_per_s / 1e9:.1f} GB/s, exp {self.exp_bytes_per_s / 1e9:.1f} GB/s, "
            f"AdamW {self.adamw_bytes_per_s / 1e9:.1f} GB/s, {1e6 * self.eager_op_s:.1f} us per op" + bw
        )

    def preset(self) -> GpuPreset:
        """This CPU as the step-time model's "GPU": the measured rates as its peaks (fp32 also for fp16, which a
        CPU runs in software too), its memory bandwidth, and the gloo all-reduce as the link. ``tflops_tf32``
        carries the measured fp32 convolution rate: the roofline times fp32 convolutions at the TF32 peak where
        a GPU has one (``advisor.timing.compute.conv_peak_precision``) and fp32 matmuls at the FP32 peak, which is
        the split a CPU needs (CPUs have no TF32)."""
        src = self.source()
        busbw = (BusBw("pcie", self.ranks, self.allreduce_busbw_gbps, src),) if self.allreduce_busbw_gbps else ()
        return GpuPreset(
            name="cpu-calibrated",
            memory_mib=0,
            interconnect="pcie",
            link_gbps=0.0,
            source=src,
            tflops_bf16=self.matmul_bf16_flops_per_s / 1e12,
            tflops_fp16=None,
            tflops_tf32=self.conv_fp32_flops_per_s / 1e12,
            tflops_fp32=self.matmul_fp32_flops_per_s / 1e12,
            hbm_gbps=self.mem_bytes_per_s / 1e9,
            busbw=busbw,
            sources={f: src for f in ("tflops_bf16", "tflops_tf32", "tflops_fp32", "hbm_gbps")},
        )

    def extend(self, r: Rates, precision: Precision) -> Rates:
        """``r`` (the roofline's rates of ``preset()`` at ``precision``) with what only a CPU has: the attention
        rate of the precision's dtype (bf16 under bf16 autocast and pure bf16, else fp32), the transcendental
        rate, the eager overhead in series with every op, the optimizer step's measured rate, the model's measured
        convolutions, and no GPU dispatch floor (a CPU's dispatch is already in series)."""
        from dataclasses import replace

        attention = (
            self.attention_bf16_flops_per_s
            if precision in (Precision.BF16, Precision.PURE_BF16)
            else self.attention_fp32_flops_per_s
        )
        return replace(
            r,
            attention_flops_per_s=attention,
            transcendental_bytes_per_s=self.exp_bytes_per_s,
            op_overhead_s=self.eager_op_s,
            optimizer_bytes_per_s=self.adamw_bytes_per_s,
            dispatch_s=0.0,
            conv_s=self.conv_s,
        )

    def efficiency(self) -> Efficiency:
        """1 and 1: the rates are achieved ones already (``--mfu`` / ``--bandwidth-efficiency`` still apply)."""
        return Efficiency(1.0, 1.0, self.source())

    def fabric(self, f: Fabric) -> Fabric:
        """``advisor.timing.comm.Fabric`` ``f`` with gloo's measured latency in place of NCCL's model (the
        whole measured all-reduce latency per collective, nothing per ring step) and its measured reduce-scatter
        and all-gather bandwidths."""
        from dataclasses import replace

        if self.allreduce_latency_s is None:
            return f
        own = tuple(
            (k, v)
            for k, v in (("reduce_scatter", self.reduce_scatter_busbw_gbps), ("all_gather", self.all_gather_busbw_gbps))
            if v
        )
        return replace(f, base_latency_s=self.allreduce_latency_s, intra_step_latency_s=0.0, collective_busbw_gbps=own)

    def step_s(self, t: StepTime) -> float:
        """Seconds of ``t`` (an ``advisor.timing.step.StepTime``) on these CPU ranks. When the ranks' threads fill
        every core, nothing is left to run gloo on: its copies and reductions take the cores compute runs on, so no
        communication hides behind compute (the strategies' overlap rules are a GPU's, whose copy engines and
        NCCL kernels run beside the compute): compute + all communication + the optimizer step."""
        if self.ranks * self.threads >= (os.cpu_count() or 1):
            return t.compute_s + t.comm_s + t.optimizer_s
        return t.step_s

    def as_dict(self) -> dict[str, object]:
        """Every field by name but the model's convolutions (``conv_s``: the plan's, not the machine's)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "conv_s"}

    def document(self) -> dict[str, object]:
        """What the cache stores: one JSON object, ``"device": "cpu"`` and this CPU's ISA flags (``isa_flags``)
        first, then every field (as a GPU's calibration is stored with ``"device": "cuda"``)."""
        return {"device": Device.CPU, "isa": isa_flags(), **self.as_dict()}


def isa_flags() -> list[str]:
    """The ISA flags of this CPU that decide matmul speed (``_ISA`` present in /proc/cpuinfo); [] unknown."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith(("flags", "Features"))), [])
    return [f for f in _ISA if f in flags]


def cpu_model() -> str:
    """The CPU's model name and the ISA flags that decide matmul speed (/proc/cpuinfo), or the platform's."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine() or "unknown"
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(("model name", "Model"))), "unknown")
    isa = isa_flags()
    return f"{name} [{' '.join(isa)}]" if isa else name


def cache_key(ranks: int, threads: int) -> dict[str, object]:
    """The disk cache's key of a calibration of ``ranks`` x ``threads`` on this CPU with this torch."""
    return {
        "format": FORMAT,
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 0,
        "ranks": ranks,
        "threads": threads,
        "torch": library_versions()["torch"],
    }


def _busy_s() -> float | None:
    """Non-idle CPU seconds of the whole machine since boot, all cores (/proc/stat), or None."""
    try:
        parts = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return (sum(parts[:8]) - parts[3] - (parts[4] if len(parts) > 4 else 0)) / tick


class OtherCpu:
    """How much of the machine's CPU time other processes took between ``start()`` and ``share()``: the
    machine's busy time (/proc/stat) minus this process's and its reaped children's (``os.times``), as a share
    of all cores' time. Children must have been waited for before ``share()`` (their time counts only then)."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> OtherCpu:
        self._t0, self._busy0, self._own0 = time.perf_counter(), _busy_s(), self._own()
        return self

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def share(self) -> float | None:
        """Others' CPU seconds / (cores x wall seconds), 0..1; None where /proc/stat cannot be read."""
        busy, wall = _busy_s(), time.perf_counter() - self._t0
        if busy is None or self._busy0 is None or wall <= 0:
            return None
        others = (busy - self._busy0) - (self._own() - self._own0)
        return min(1.0, max(0.0, others / ((os.cpu_count() or 1) * wall)))


def _from_ranks(
    per_rank: list[dict[str, float]], ranks: int, threads: int, seconds: float, contended: bool
) -> CpuCalibration:
    """A ``CpuCalibration`` from every rank's figures: the slowest rank's rates (synchronous ranks wait for it)."""

    def slowest(key: str) -> float:
        return min(r[key] for r in per_rank)

    busbw = latency = rs_busbw = ag_busbw = None
    if ranks > 1:
        latency = max(r["allreduce_8B_s"] for r in per_rank)
        n, nbytes = len(per_rank), 4 * 2**22

        def gbps(key: str, factor: float) -> float:  # nccl-tests' busbw: factor x S / (t - latency)
            return factor * nbytes / max(max(r[key] for r in per_rank) - latency, 1e-9) / 1e9

        busbw = gbps("allreduce_16MiB_s", 2 * (n - 1) / n)
        rs_busbw = gbps("reduce_scatter_16MiB_s", (n - 1) / n)
        ag_busbw = gbps("all_gather_16MiB_s", (n - 1) / n)
    return CpuCalibration(
        ranks=ranks,
        threads=threads,
        matmul_fp32_flops_per_s=slowest("matmul_fp32_flops_per_s"),
        matmul_bf16_flops_per_s=slowest("matmul_bf16_flops_per_s"),
        conv_fp32_flops_per_s=slowest("conv_fp32_flops_per_s"),
        mem_bytes_per_s=slowest("add_cache_bytes_per_s"),
        dram_bytes_per_s=slowest("add_dram_bytes_per_s"),
        op_overhead_s=max(r["tiny_op_s"] for r in per_rank),
        exp_bytes_per_s=slowest("exp_bytes_per_s"),
        attention_fp32_flops_per_s=slowest("attention_fp32_flops_per_s"),
        attention_bf16_flops_per_s=slowest("attention_bf16_flops_per_s"),
        eager_op_s=max(r["eager_op_s"] for r in per_rank),
        adamw_bytes_per_s=slowest("adamw_bytes_per_s"),
        allreduce_busbw_gbps=busbw,
        reduce_scatter_busbw_gbps=rs_busbw,
        all_gather_busbw_gbps=ag_busbw,
        allreduce_latency_s=latency,
        cpu=cpu_model(),
        torch=library_versions()["torch"],
        measured_s=seconds,
        contended=contended,
        measured_at=time.time(),
    )


def measure(
    ranks: int, threads: int = 1, seconds: float = SECONDS_PER_BENCHMARK, timeout_s: float = TIMEOUT_S
) -> CpuCalibration:
    """Run the benchmarks now: ``max(ranks, 1)`` worker processes at once, each with ``threads`` intra-op threads
    (one rank measures no all-reduce: a second process would change the contention it measures).

    Raises:
        RuntimeError: a worker failed or ran past ``timeout_s``.
    """
    global MEASUREMENTS
    ranks = max(1, ranks)
    port = free_port()
    env = dict(
        os.environ,
        WORLD_SIZE=str(ranks),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
        CALIBRATE_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    t0, others = time.perf_counter(), OtherCpu()
    procs = [
        subprocess.Popen(
            [sys.executable, str(_WORKER), str(seconds)],
            env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        for r in range(ranks)
    ]
    outputs, failed = [], []
    try:
        for p in procs:
            left = max(1.0, timeout_s - (time.perf_counter() - t0))
            try:
                out, err = p.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"the CPU calibration ran past {timeout_s:.0f} s") from None
            outputs.append(out)
            if p.returncode != 0:
                failed.append((err or out).strip().splitlines()[-1:] or [f"exit code {p.returncode}"])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = time.perf_counter() - t0
    contention = others.share()
    if failed:
        raise RuntimeError(f"the CPU calibration failed: {failed[0][0]}")
    line = next((ln for ln in outputs[0].splitlines() if ln.startswith("CALIBRATION ")), None)
    if line is None:
        raise RuntimeError("the CPU calibration printed no figures")
    per_rank = json.loads(line.split(" ", 1)[1])
    contended = contention is not None and contention > CONTENDED_SHARE
    MEASUREMENTS += 1
    return _from_ranks(per_rank, ranks, threads, wall, contended)


def cpu_calibration(
    ranks: int,
    threads: int = 1,
    *,
    cache: DiskCache | NullCache | None = None,
    refresh: bool = False,
    seconds: float | None = None,
) -> CpuCalibration:
    """This machine's calibration for ``ranks`` CPU ranks of ``threads`` threads each: from the cache
    (``open_cache()`` unless ``cache`` is given) or measured now (``measure``, holding ``MachineLock`` so no
    verification competes for the cores) and cached (a ``contended`` one for ``CONTENDED_TTL_S``). A measurement
    that other processes disturbed (``contended``) never replaces a cached one taken on an idle machine: that one
    is returned (``cached`` True) and kept. ``seconds``: each benchmark's duration (None: ``SECONDS_PER_BENCHMARK``,
    read at the call).

    Raises:
        RuntimeError: the measurement failed.
        advisor.processes.VerifyBusy: a verification holds this machine's lock.
    """
    cache = open_cache() if cache is None else cache
    if not refresh:
        hit = cached_calibration(ranks, threads, cache)
        if hit is not None:
            return hit
    with MachineLock():
        cal = measure(ranks, threads, SECONDS_PER_BENCHMARK if seconds is None else seconds)
    if cal.contended:
        idle = cached_calibration(ranks, threads, cache)
        if idle is not None and not idle.contended:
            return idle
    cache.put(NAMESPACE, cache_key(ranks, threads), cal.document())
    return cal


def cached_calibration(ranks: int, threads: int, cache: DiskCache | NullCache) -> CpuCalibration | None:
    """The cached calibration ``cpu_calibration`` would use (None: it would measure): a contended one only
    while younger than ``CONTENDED_TTL_S``."""
    hit = cache.get(NAMESPACE, cache_key(ranks, threads))
    if not isinstance(hit, dict):
        return None
    try:
        fields = [k for k in CpuCalibration.__dataclass_fields__ if k not in ("cached", "conv_s")]
        cal = CpuCalibration(**{k: hit[k] for k in fields}, cached=True)
    except (KeyError, TypeError):
        return None  # an entry of another shape: measure again
    if cal.contended and time.time() - cal.measured_at >= CONTENDED_TTL_S:
        return None
    return cal
