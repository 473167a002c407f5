"""The GPU truth run: advisor's estimates for one H200 against the emitted scripts run on one.

    python -m bench.gpu prepare --out bench/gpu_cases          # here (CPU): plan, emit, expected.json per case
    python -m bench.gpu run --cases bench/gpu_cases --out $OUT  # there (GPU): calibrate, run each case, measure
    python -m bench.gpu render --results DIR                   # here: DIR's results -> bench/GPU.md
    python -m bench.gpu wheels --out .whl                      # here: deepspeed and a slim bitsandbytes to carry

How to carry the cases (and optional wheels) to the lent machine: bench/README.md, "GPU truth run".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from advisor.faces import OneLineParser, positive_float, run_face


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="plan and emit each case for the GPU preset, here")
    prep.add_argument("--out", type=Path, default=Path("bench/gpu_cases"), help="folder for the case folders")
    prep.add_argument("--gpu", default=None, help="GPU preset to plan for (default: the lent machine's, H200-141GB)")
    prep.add_argument("--only", action="append", default=[], metavar="REGEX", help="cases whose id matches")
    run = sub.add_parser("run", help="run the prepared cases on this machine's GPU")
    run.add_argument("--cases", type=Path, default=Path("bench/gpu_cases"), help="the folder prepare wrote")
    run.add_argument("--out", type=Path, required=True, help="folder for machine.json, results.jsonl, logs")
    run.add_argument("--deadline", type=positive_float, default=None, help="seconds for the whole run (default 480)")
    run.add_argument("--no-calibrate", action="store_true", help="skip `advisor calibrate`")
    run.add_argument("--only", action="append", default=[], metavar="REGEX", help="cases whose id matches")
    ren = sub.add_parser("render", help="write bench/GPU.md from a run's folder")
    ren.add_argument("--results", type=Path, required=True, help="the folder run wrote ($OUT, fetched)")
    ren.add_argument("--md", type=Path, default=None, help="where to write (default bench/GPU.md)")
    whl = sub.add_parser("wheels", help="download/build the wheels to carry (deepspeed, slim bitsandbytes)")
    whl.add_argument("--out", type=Path, default=Path(".whl"), help="folder for the wheels")
    return p


def _main(argv: list[str]) -> int:
    from advisor.errors import AdvisorError

    args = _parser().parse_args(argv)
    if args.command == "prepare":
        from .gpu_prepare import CASES, GPU_PRESET, prepare, select

        cases = select(CASES, args.only)
        if not cases:
            raise AdvisorError(f"no case matches {args.only}")
        folders = prepare(cases, args.out, args.gpu or GPU_PRESET)
        print(f"wrote {len(folders)} case folders into {args.out}")
        return 0
    if args.command == "run":
        from .gpu_run import DEADLINE_S, run

        if not (args.cases / ".").is_dir():
            raise AdvisorError(f"--cases {args.cases}: no such folder (run `python -m bench.gpu prepare` first)")
        try:
            results = run(
                args.cases, args.out, args.deadline or DEADLINE_S, calibrate=not args.no_calibrate, only=args.only
            )
        except ValueError as err:
            raise AdvisorError(str(err)) from None
        done = sum(r["status"] == "ok" for r in results)
        print(f"{done} of {len(results)} cases measured; results in {args.out}")
        return 0
    if args.command == "wheels":
        from .gpu_wheels import build

        try:
            build(args.out)
        except RuntimeError as err:
            raise AdvisorError(str(err)) from None
        return 0
    from .gpu_render import GPU_MD, write

    try:
        path = write(args.results, args.md or GPU_MD)
    except FileNotFoundError as err:
        raise AdvisorError(f"--results {args.results}: {err.strerror}: {err.filename}") from None
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, with a one-line error)."""
    return run_face(lambda: _main(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
