"""The optional packages the lent GPU machine lacks, as wheels to carry (``python -m bench.gpu wheels --out .whl``,
here, where pip reaches the registry): DeepSpeed built as pure Python (``DS_BUILD_OPS=0``: its ops would compile on
first use there; the scripts' ZeRO runs use a torch optimizer, so none is needed) with the five dependencies the
machine's package list lacks, and bitsandbytes slimmed to the CUDA 13.0 and CPU libraries (the machine's torch is
2.11.0+cu130; the full wheel carries one library per CUDA and ROCm version). The device tool carries 64 MiB at
most, the checkout included: ``WHEEL_BUDGET_BYTES`` is what is left for wheels.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

DEEPSPEED = "deepspeed==0.19.8"  # the version ENGINEERING_NOTES checked (DS_BUILD_OPS=0, ZeRO 2 and 3 train)
# What deepspeed 0.19.8 and pydantic 2.14.4 require (their METADATA's Requires-Dist) less what the machine has
# (the device tool's KINDS.md, "Python packages already there"); typing-extensions for pydantic's >= 4.16.
DEEPSPEED_DEPS = (
    "hjson==3.1.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
)
BITSANDBYTES = "bitsandbytes==0.50.2"
KEEP_LIBS = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")  # torch 2.11.0+cu130 there (KINDS.md)
WHEEL_BUDGET_BYTES = 48 * 2**20  # 64 MiB carried in all, less the checkout and the prepared cases
# The device tool's README: wheels for Python 3.12 on x86-64 Linux, matched by each manylinux tag.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip
_LIB = re.compile(r"(^|/)libbitsandbytes_[a-z0-9]+\.(so|dll|dylib)$")


def slim_wheel(wheel: Path, keep: tuple[str, ...] = KEEP_LIBS) -> Path:
    """Rewrite ``wheel`` in place without the bitsandbytes native libraries not named in ``keep`` (their lines
    dropped from RECORD too); returns it. Raises ``zipfile.BadZipFile`` for a file that is not a wheel."""
    with tempfile.TemporaryDirectory() as tmp:
        slim = Path(tmp) / wheel.name
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
            drop = {n for n in src.namelist() if _LIB.search(n) and n.rsplit("/", 1)[-1] not in keep}
            for info in src.infolist():
                if info.filename in drop:
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines()
                    data = ("\n".join(x for x in lines if x.split(",", 1)[0] not in drop) + "\n").encode()
                dst.writestr(info, data)
        os.replace(slim, wheel)
    return wheel


def _pip(args: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args[:2])} failed: {(done.stderr.strip().splitlines() or [''])[-1]}")


def build(out: Path, say: Callable[[str], None] = print) -> list[Path]:
    """Download and build the wheels into ``out``; returns them.

    Raises:
        RuntimeError: pip failed (no registry, no such version), or the wheels exceed ``WHEEL_BUDGET_BYTES``.
    """
    out.mkdir(parents=True, exist_ok=True)
    binary = ["download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    binary += [a for p in PLATFORMS for a in ("--platform", p)] + ["-d", str(out)]
    with tempfile.TemporaryDirectory() as tmp:
        _pip(["download", "--no-deps", "--no-binary", ":all:", DEEPSPEED, "-d", tmp])
        (sdist,) = Path(tmp).glob("deepspeed-*.tar.gz")
        _pip(
            ["wheel", "--no-deps", "--no-build-isolation", str(sdist), "-w", str(out)],
            dict(os.environ, DS_BUILD_OPS="0"),
        )
    _pip([*binary, *DEEPSPEED_DEPS, BITSANDBYTES])
    for wheel in out.glob("bitsandbytes-*.whl"):
        slim_wheel(wheel)
    wheels = sorted(out.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        say(f"{w.name}: {w.stat().st_size / 2**20:.2f} MiB")
    say(f"{len(wheels)} wheels, {total / 2**20:.2f} MiB in {out}")
    if total > WHEEL_BUDGET_BYTES:
        raise RuntimeError(
            f"the wheels take {total / 2**20:.1f} MiB, over the {WHEEL_BUDGET_BYTES / 2**20:.0f} MiB left"
        )
    return wheels
