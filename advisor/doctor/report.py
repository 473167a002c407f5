"""Input and output of ``advisor doctor``: the nodes file (deepspeed hostfile format), the per-node commands
and the comparison one-liner, and the text / JSON renderings of the checks."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Sequence

from ..errors import AdvisorError
from .checks import FAIL, PASS, TORCHRUN_DEFAULT_PORT, WARN, Check, DoctorOptions, Host

_HOST_LINE = re.compile(r"(?P<host>[A-Za-z0-9_.@:\[\]-]+)(?:\s+slots=(?P<slots>[1-9]\d{0,5}))?")
_MAX_NODES_FILE_BYTES = 1 << 20
# How each absent version reads in the text block.
_ABSENT = {
    "torch_cuda": "none (CPU build)",
    "deepspeed": "not installed",
    "transformers": "not installed",
    "driver": "none (no NVIDIA driver)",
}
_LABELS = {
    "python": "Python",
    "torch": "torch",
    "torch_cuda": "torch CUDA",
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "deepspeed": "deepspeed",
    "transformers": "transformers",
    "driver": "NVIDIA driver",
    "driver_cuda": "driver CUDA",
}


def parse_nodes_file(path: str) -> tuple[Host, ...]:
    """One host a line, ``#`` starts a comment, optional ``slots=N`` (as deepspeed's hostfile).

    Raises:
        AdvisorError: the file cannot be read, is not text, lists no host, a host twice, or a bad line.
    """
    try:
        if os.path.getsize(path) > _MAX_NODES_FILE_BYTES:
            raise AdvisorError(f"--nodes-file {path}: larger than 1 MiB, not a hostfile")
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise AdvisorError(f"--nodes-file {path}: no such file")
    except IsADirectoryError:
        raise AdvisorError(f"--nodes-file {path}: is a directory, expected a file with one hostname a line")
    except PermissionError:
        raise AdvisorError(f"--nodes-file {path}: not readable (permission denied)")
    except UnicodeDecodeError:
        raise AdvisorError(f"--nodes-file {path}: not a text file (expected one hostname a line)")
    except OSError as err:
        raise AdvisorError(f"--nodes-file {path}: cannot read it ({err.strerror or err})")
    hosts: list[Host] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _HOST_LINE.fullmatch(line)
        if not m:
            raise AdvisorError(
                f"--nodes-file {path} line {number}: expected 'HOSTNAME' or 'HOSTNAME slots=N' "
                f"(N from 1 to 999999), got {line[:60]!r}"
            )
        if any(h.name == m.group("host") for h in hosts):
            raise AdvisorError(f"--nodes-file {path} line {number}: host {m.group('host')!r} is listed twice")
        hosts.append(Host(m.group("host"), int(m.group("slots")) if m.group("slots") else None))
    if not hosts:
        raise AdvisorError(f"--nodes-file {path}: lists no host (one hostname a line, '#' comments)")
    return tuple(hosts)


def report_name(host: str) -> str:
    """The file a node's JSON report is saved to: ``doctor-HOST.json`` with odd characters replaced."""
    return "doctor-" + re.sub(r"[^A-Za-z0-9_.-]", "_", host) + ".json"


def node_commands(options: DoctorOptions) -> list[str]:
    """One shell line per host: ssh to it, run the same doctor (same Python, same working directory, same
    --data/--ckpt-dir paths: pitfall 18) with --json, save the report here. Nothing is run."""
    args = [sys.executable, "-m", "advisor", "doctor", "--json"]
    if options.master_port != TORCHRUN_DEFAULT_PORT:
        args += ["--master-port", str(options.master_port)]
    if options.data is not None:
        args += ["--data", os.path.abspath(options.data)]
    if options.ckpt_dir is not None:
        args += ["--ckpt-dir", os.path.abspath(options.ckpt_dir)]
    if options.timeout_s != 60.0:
        args += ["--timeout", f"{options.timeout_s:g}"]
    remote = f"cd {shlex.quote(os.getcwd())} && {shlex.join(args)}"
    return [f"ssh {shlex.quote(h.name)} {shlex.quote(remote)} > {report_name(h.name)}" for h in options.hosts]


# Prints every version that differs between the saved reports (driver versions may differ), every check that
# did not pass, and the reports that are empty (ssh or the doctor failed there); needs only Python.
_COMPARE = (
    'import glob,json; r={f:json.loads(open(f).read() or "{}") for f in sorted(glob.glob("doctor-*.json"))}; '
    '[print(f, "EMPTY: no report (see the ssh output)") for f,d in r.items() if not d]; '
    'v={f:d["versions"] for f,d in r.items() if d}; '
    'keys=sorted({k for d in v.values() for k in d if not k.startswith("driver")}); '
    "bad=[k for k in keys if len({str(d.get(k)) for d in v.values()})>1]; "
    '[print("DIFFERS", k, {f:d.get(k) for f,d in v.items()}) for k in bad]; '
    '[print(f, c["status"], c["name"]+":", c["detail"]) for f,d in r.items() for c in d.get("checks",[]) '
    'if c["status"]!="PASS"]; '
    'print(len(r), "reports;", "versions DIFFER (pitfall 18)" if bad else "versions match")'
)


def compare_command() -> str:
    """A one-line, Python-only comparison of the ``doctor-*.json`` reports in the current directory."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(_COMPARE)}"


def render_text(checks: Sequence[Check], versions: dict[str, str | None], options: DoctorOptions) -> str:
    """``STATUS  name: detail`` a check, an indented ``fix:`` under WARN/FAIL, the versions block, the
    per-node commands when a nodes file was given, and a count."""
    lines = []
    for c in checks:
        lines.append(f"{c.status}  {c.name}: {c.detail}")
        if c.fix and c.status != PASS:
            lines.append(f"      fix: {c.fix}")
    unchecked = [
        flag for flag, value in (("--data DIR", options.data), ("--ckpt-dir DIR", options.ckpt_dir)) if value is None
    ]
    if unchecked:
        lines.append(
            f"      (pass {' and '.join(unchecked)} to check "
            f"{'those paths' if len(unchecked) > 1 else 'that path'} too)"
        )
    width = max(len(label) for label in _LABELS.values())
    lines += ["", "Versions (every node needs the same Python, torch, CUDA: docs/pitfalls.md, pitfall 18):"]
    for key, value in versions.items():
        lines.append(f"  {_LABELS.get(key, key):<{width}}  {value if value is not None else _ABSENT.get(key, 'none')}")
    if options.hosts:
        lines += [
            "",
            f"Other nodes ({len(options.hosts)} in the nodes file): run each line here, then compare "
            "(same versions, and every check PASS on every node):",
        ]
        for host, command in zip(options.hosts, node_commands(options)):
            slots = f"  # slots={host.slots}" if host.slots else ""
            lines.append(f"  {command}{slots}")
        lines += ["Compare:", f"  {compare_command()}"]
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    lines += ["", f"{counts[PASS]} passed, {counts[WARN]} warning(s), {counts[FAIL]} failed"]
    return "\n".join(lines)


def render_json(checks: Sequence[Check], versions: dict[str, str | None], options: DoctorOptions, code: int) -> str:
    """``{"checks": [{name, status, detail, fix}], "versions": {...}, "exit_code": n}``, plus ``host`` and,
    with a nodes file, ``nodes`` (host, slots, command) and ``compare``."""
    import socket

    doc: dict[str, object] = {
        "host": socket.gethostname(),
        "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in checks],
        "versions": versions,
    }
    if options.hosts:
        doc["nodes"] = [
            {"host": h.name, "slots": h.slots, "command": cmd} for h, cmd in zip(options.hosts, node_commands(options))
        ]
        doc["compare"] = compare_command()
    doc["exit_code"] = code
    return json.dumps(doc, indent=2)
