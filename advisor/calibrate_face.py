"""``advisor calibrate``: measure this machine and keep the figures in the cache directory, where later plans
find them; ``advisor calibrate --show [--json]`` prints the stored calibrations.

With a CUDA GPU visible it measures the GPU (``advisor.timing.gpu_calibrate``: GEMMs per precision, ResNet-50's
convolutions, fused attention, HBM copies, eager dispatch, pinned PCIe copies and, with two or more GPUs, NCCL
collectives; about a minute) and plans for that GPU then time it with the calibrated constants. Without one it runs
the CPU calibration CPU verification runs use (``advisor.timing.calibrate``, per rank count; about 10 s each).
Exit code 0; 1 when the measurement failed; 2 for bad input (one line on stderr); 75 when a verification holds
this machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from .cache import DiskCache
from .cache_face import unusable_reason, write_problem
from .choices import Device
from .errors import AdvisorError
from .faces import OneLineParser, positive_int, run_face
from .processes import MachineLock
from .text_table import table
from .timing import calibrate as cpu
from .timing import gpu_calibrate
from .timing.gpu_calibration import GpuCalibration
from .verify_setup import CPU_RANK_THREADS, MAX_CPU_RANKS


def build_parser() -> OneLineParser:
    """The ``advisor calibrate`` argument parser."""
    p = OneLineParser(
        prog="advisor calibrate",
        description="Measure this machine's GPU (or, without one, its CPU for verification runs) and store the "
        "figures in advisor's cache directory; plans for that GPU then use them and say so.",
    )
    p.add_argument("--show", action="store_true", help="print the stored calibrations instead of measuring")
    p.add_argument("--json", action="store_true", help="print JSON (the stored documents) instead of text")
    p.add_argument(
        "--device", choices=[d.value for d in Device], default=None, help="what to measure (default: cuda if visible)"
    )
    p.add_argument(
        "--ranks",
        type=positive_int,
        nargs="+",
        default=None,
        metavar="N",
        help=f"CPU only: the rank counts of the verification runs to calibrate for (default: 1 2; at most "
        f"{MAX_CPU_RANKS})",
    )
    p.add_argument("--no-collectives", action="store_true", help="GPU only: skip the NCCL collectives (2+ GPUs)")
    return p


def _date(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t)) if t else "-"


def _shares(d: dict[str, float]) -> str:
    return " ".join(f"{p} {v:.2f}" for p, v in d.items()) or "-"


def _gpu_row(c: GpuCalibration) -> list[str]:
    rates = c.rates
    measured = [f"bf16 GEMM {rates.get('gemm_bf16_tflops', 0.0):.0f} TFLOP/s"] if "gemm_bf16_tflops" in rates else []
    measured += [f"HBM {rates.get('copy_fit_gbps', 0.0):.0f} GB/s", f"H2D {rates.get('h2d_gbps', 0.0):.1f} GB/s"]
    if "all_reduce_busbw_gbps" in rates:
        measured.append(f"all-reduce busbw {rates['all_reduce_busbw_gbps']:.0f} GB/s")
    constants = (
        f"gemm {_shares(c.gemm)}; conv {_shares(c.conv)}; attention {_shares(c.attention)}; bandwidth "
        f"{c.bandwidth:.2f}, half at {c.half_bandwidth_bytes / 2**20:.1f} MiB; dispatch {1e6 * c.dispatch_s:.1f} us; "
        f"GEMM rule error median {100 * c.gemm_error.get('median_abs', 0.0):.0f}%"
    )
    return [f"{c.gpu} ({c.preset or 'no preset'})", "cuda", c.date, c.driver, c.torch, constants, ", ".join(measured)]


def _cpu_entries(cache: DiskCache) -> list[dict[str, object]]:
    out = []
    for k in gpu_calibrate.namespace_keys(cache, cpu.NAMESPACE):
        v = cache.get(cpu.NAMESPACE, k)
        if isinstance(v, dict) and k.get("format") == cpu.FORMAT:
            out.append({"key": k, **v})
    return out


def _num(d: dict[str, object], key: str) -> float:
    x = d.get(key)
    return float(x) if isinstance(x, (int, float)) else 0.0


def _cpu_row(d: dict[str, object]) -> list[str]:
    k = d["key"] if isinstance(d["key"], dict) else {}
    constants = f"{k.get('ranks')} rank(s) x {k.get('threads')} thread(s); {k.get('cores')} cores"
    measured = (
        f"matmul fp32 {_num(d, 'matmul_fp32_flops_per_s') / 1e9:.1f} GFLOP/s, memory "
        f"{_num(d, 'mem_bytes_per_s') / 1e9:.1f} GB/s, {1e6 * _num(d, 'eager_op_s'):.1f} us per op"
        + (" (contended)" if d.get("contended") else "")
    )
    return [f"cpu: {k.get('cpu')}", "cpu", _date(_num(d, "measured_at")), "-", str(k.get("torch")), constants, measured]


def show(cache: DiskCache, as_json: bool) -> int:
    """Print the stored calibrations (GPU ones, then CPU ones) as a table, or as a JSON list of documents."""
    gpus, cpus = gpu_calibrate.stored(cache), _cpu_entries(cache)
    if as_json:
        docs = [{k: v for k, v in c.document().items() if k != "measurements"} for c in gpus]
        print(json.dumps({"directory": str(cache.directory), "calibrations": docs + cpus}, indent=2))
        return 0
    if not gpus and not cpus:
        print(f"no calibrations stored in {cache.directory} (run: advisor calibrate)")
        return 0
    columns = [
        ("device", "<", 0, ""),
        ("kind", "<", 0, "  "),
        ("date", "<", 0, "  "),
        ("driver", "<", 0, "  "),
        ("torch", "<", 0, "  "),
        ("constants", "<", 0, "  "),
        ("measured", "<", 0, "  "),
    ]
    rows: list[list[str] | str] = [*(_gpu_row(c) for c in gpus), *(_cpu_row(d) for d in cpus)]
    print(f"calibrations in {cache.directory}:")
    print("\n".join(table(columns, rows)))
    return 0


def _cuda_visible() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    except Exception:  # a broken driver: no GPU to measure
        return False


def _measure_gpu(cache: DiskCache, args: argparse.Namespace) -> int:
    print(
        "calibrating this machine's GPU: GEMMs, convolutions, attention, HBM copies, dispatch, PCIe and NCCL "
        "(about a minute)",
        file=sys.stderr,
    )
    try:
        with MachineLock():
            cal = gpu_calibrate.measure_gpu(collectives=not args.no_collectives)
    except RuntimeError as err:
        print(f"advisor: {err}", file=sys.stderr)
        return 1
    gpu_calibrate.store(cal, cache)
    if args.json:
        print(json.dumps(cal.document(), indent=2))
        return 0
    print(f"measured {cal.gpu} in {cal.measured_s:.0f} s (driver {cal.driver}, torch {cal.torch}, {cal.sm_count} SMs)")
    print("  " + _gpu_row(cal)[5])
    print("  measured: " + ", ".join(f"{k} {v:.3g}" for k, v in cal.rates.items()))
    if cal.preset is None:
        print(f"  ! {cal.gpu} has no advisor preset (no datasheet peaks): stored, but no plan can use it")
    else:
        print(f"stored in {cache.directory}; plans for {cal.preset} with torch {cal.torch} now use it")
    return 0


def _measure_cpu(cache: DiskCache, args: argparse.Namespace) -> int:
    if args.no_collectives:
        raise AdvisorError("--no-collectives is for a GPU calibration (NCCL); a CPU calibration has no collectives")
    args.ranks = args.ranks or [1, 2]
    bad = [r for r in args.ranks if r > MAX_CPU_RANKS]
    if bad:
        raise AdvisorError(f"--ranks {bad[0]}: CPU verification runs use at most {MAX_CPU_RANKS} ranks")
    docs = []
    for ranks in dict.fromkeys(args.ranks):
        print(
            f"calibrating this machine's CPU for {ranks} rank(s) (about 10 s): for CPU verification runs; plans for "
            "GPUs are unaffected",
            file=sys.stderr,
        )
        try:
            cal = cpu.cpu_calibration(ranks, CPU_RANK_THREADS, cache=cache, refresh=True)
        except RuntimeError as err:
            print(f"advisor: {err}", file=sys.stderr)
            return 1
        docs.append(cal.document())
        if args.json:
            continue
        if cal.cached:
            print(
                f"{ranks} rank(s): other processes were busy, so the calibration measured on an idle machine "
                f"({_date(cal.measured_at)}) is kept: {cal.source()}"
            )
        else:
            print(f"{ranks} rank(s): {cal.source()}" + (" (other processes were busy: rough)" if cal.contended else ""))
    if args.json:
        print(json.dumps(docs, indent=2))
    else:
        print(f"stored in {cache.directory}; CPU verification runs (advisor MODEL --verify) on this machine use it")
    return 0


def _face(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    cache = DiskCache()
    if args.show:
        given = [
            flag
            for flag, on in (
                ("--device", args.device),
                ("--ranks", args.ranks),
                ("--no-collectives", args.no_collectives),
            )
            if on
        ]
        if given:
            raise AdvisorError(f"--show prints the stored calibrations and measures nothing: drop {given[0]}")
        return show(cache, args.json)
    problem = unusable_reason(cache.directory) or write_problem(cache.directory)
    if problem:
        raise AdvisorError(
            f"{problem}: nowhere to store the calibration; set ADVISOR_CACHE_DIR to a writable directory"
        )
    visible = _cuda_visible()
    device = Device(args.device) if args.device else Device.CUDA if visible else Device.CPU
    if device == Device.CUDA and not visible:
        raise AdvisorError("--device cuda: no CUDA GPU is visible here (torch.cuda.is_available() is False)")
    if device == Device.CUDA and args.ranks:
        raise AdvisorError("--ranks is for a CPU calibration (--device cpu); a GPU calibration measures every GPU")
    return _measure_gpu(cache, args) if device == Device.CUDA else _measure_cpu(cache, args)


def main(argv: Sequence[str] | None = None) -> int:
    """``advisor calibrate [--show] [--json] [--device auto|cuda|cpu] [--ranks N ...]``; returns the exit code.
    ``argv`` excludes the program and the word ``calibrate``."""
    return run_face(lambda: _face(sys.argv[1:] if argv is None else argv))
