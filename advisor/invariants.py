"""What every answer must satisfy, checked in one place (``violations``); ``plan()`` refuses to
return a plan that breaks one (``enforce``), so an impossible figure becomes a one-line error to
report instead of a table a user might trust.

The rules:

* every breakdown component is >= 0, the components sum to the peak, the device total is the peak
  plus the device overhead, and both are >= 0;
* among the data-parallel strategies without offload (``Strategy.sharding_stage``: 0 DDP, 1-3 ZeRO),
  a higher stage never holds more model states than a lower one (DDP from world size 2, see below);
* a timed row's terms are >= 0 and the exposed communication is at most all of it;
* a breakdown's named parts of its weights (``Breakdown.params_parts``) sum to its weights, and every line that
  quotes a total "per GPU in all" lists parts that sum to it within display rounding (a Mixtral QLoRA
  line listed 0.03 GiB of parts against 94.60 GiB in all, the fused expert weights missing);
* a row that does not surely fit names what is short (``short_of``: GPU memory, host RAM, or host RAM
  unknown) and says it with the figures (``fit_note``);
* the recommended strategy fits;
* no suggestion asks for what is already set (activation checkpointing when it is on);
* a larger cluster is suggested only after the cheaper fixes were named: activation checkpointing
  (when it is off) and CPU offload (when a strategy offloads).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from .errors import AdvisorError
from .hardware import Hardware
from .rows import Recommendation, StrategyRow
from .training_options import TrainingOptions

SHORT_OF = ("GPU memory", "host RAM", "host RAM unknown")
# Phrases that ask the user to turn activation checkpointing on.
ASKS_FOR_CHECKPOINTING = (
    "--activation-checkpointing",
    "turn on activation checkpointing",
    "try activation checkpointing",
)


class CheckedPlan(Protocol):
    """What the rules read of a plan (``advisor.plan.Plan``, which sits above this module)."""

    @property
    def rows(self) -> Sequence[StrategyRow]: ...

    @property
    def options(self) -> TrainingOptions: ...

    @property
    def hardware(self) -> Hardware: ...

    @property
    def recommendation(self) -> Recommendation: ...

    @property
    def warnings(self) -> Sequence[str]: ...

    def row(self, name: str) -> StrategyRow: ...


def violations(plan: CheckedPlan) -> list[str]:
    """Every rule ``plan`` (an ``advisor.plan.Plan``) breaks, one line each; [] when it holds."""
    out: list[str] = []
    rows = [(r, r.memory) for r in plan.rows if r.applicable and r.memory is not None]
    for r, m in rows:
        b = m.peak
        parts = b.as_dict()
        total = parts.pop("total", None)
        negative = {k: v for k, v in parts.items() if isinstance(v, int) and v < 0}
        if negative:
            out.append(f"{r.name}: negative component(s) {negative}")
        if total is not None and total != sum(v for v in parts.values() if isinstance(v, int)):
            out.append(f"{r.name}: components sum to {sum(parts.values())}, peak says {total}")
        if b.params_parts and sum(n for _, n in b.params_parts) != b.params:
            out.append(f"{r.name}: the weights' parts sum to {sum(n for _, n in b.params_parts)}, weights {b.params}")
        overhead = m.device_total - b.total
        if overhead < 0 or m.device_total < 0:
            out.append(f"{r.name}: device total {m.device_total} below the peak {b.total}")
        if m.host_bytes_per_node < 0 or r.load_host_bytes_per_node < 0:
            out.append(f"{r.name}: negative host RAM")
        t = r.time
        if t is not None:
            if min(t.compute_s, t.comm_s, t.exposed_comm_s, t.optimizer_s) < 0 or t.exposed_comm_s > t.comm_s * (
                1 + 1e-9
            ):
                out.append(
                    f"{r.name}: a negative time term, or exposed communication {t.exposed_comm_s} above all "
                    f"of it ({t.comm_s})"
                )
        if r.fits is not True:
            if r.short_of not in SHORT_OF:
                out.append(f"{r.name}: does not fit and names no short resource ({r.short_of!r})")
            elif not r.fit_note:
                out.append(f"{r.name}: does not fit ({r.short_of}) without the figures")
    # DDP (stage 0) joins the comparison from world size 2: at world size 1 DeepSpeed holds 16-bit
    # weights and gradients, an fp32 gradient partition, master weights and moments (20 bytes per
    # parameter under Adam) where DDP's autocast holds 16 (fp32 weights, gradients, moments), and that
    # is what the two really allocate; from world size 2 ZeRO-1's 4 + 16/N <= 16 bytes.
    # The same holds for the Adam family only: without optimizer moments (SGD) DeepSpeed's extra fp32
    # copies (master weights, cloned even in fp32, and the fp32 gradient partition) outweigh what it
    # shards, and ZeRO-1 really holds more than DDP (8 + 8/N bytes vs 8 in fp32).
    adam = plan.options.optimizer.is_adam
    lowest = 0 if plan.hardware.num_gpus >= 2 and adam else 1
    staged = sorted(
        (r.strategy.sharding_stage, m.model_state_bytes, r.name)
        for r, m in rows
        if r.strategy.sharding_stage is not None and r.strategy.sharding_stage >= lowest
    )
    for (s1, b1, n1), (s2, b2, n2) in zip(staged, staged[1:]):
        if s2 > s1 and b2 > b1:
            out.append(f"{n2} holds more model states ({b2}) than {n1} ({b1})")
    rec = plan.recommendation
    if rec.strategy is not None:
        chosen = plan.row(rec.strategy)
        if chosen.fits is not True:
            out.append(f"recommended {rec.strategy} does not surely fit")
    for text in rec.reasons + rec.warnings:
        bad = parts_do_not_add_up(text)
        if bad:
            out.append(bad)
    advice = [t.lower() for t in rec.reasons + rec.warnings + list(plan.warnings)]
    if plan.options.activation_checkpointing:
        for line in advice:
            if (
                any(p in line for p in ASKS_FOR_CHECKPOINTING)
                and "changes nothing" not in line
                and "drop --activation-checkpointing" not in line
            ):
                out.append(f"asks for activation checkpointing, which is on: {line[:80]!r}")
    if rec.min_gpus is not None and rec.min_gpus > plan.hardware.num_gpus:
        said = " ".join(t.lower() for t in rec.reasons)
        if not plan.options.activation_checkpointing and "activation checkpointing" not in said:
            out.append("suggests a larger cluster before naming activation checkpointing")
        if any(r.strategy.offload for r, _ in rows) and "offload" not in said:
            out.append("suggests a larger cluster before naming CPU offload")
    return out


IN_ALL = re.compile(r"; ([\d,]+\.\d\d) GiB per GPU in all")
GIB_FIGURE = re.compile(r"(?<![\w.])([\d,]+\.\d\d) GiB")


def listed_parts(text: str) -> list[tuple[list[float], float]]:
    """Each "(part X GiB, part Y GiB, ...; T GiB per GPU in all" in ``text``: ([X, Y, ...], T), the parts read back to
    the parenthesis that opens the list (parts may hold parentheses of their own)."""
    found = []
    for m in IN_ALL.finditer(text):
        depth, start = 0, 0
        for i in range(m.start() - 1, -1, -1):
            if text[i] == ")":
                depth += 1
            elif text[i] == "(":
                if depth == 0:
                    start = i + 1
                    break
                depth -= 1
        parts = [float(x.replace(",", "")) for x in GIB_FIGURE.findall(text[start : m.start()])]
        found.append((parts, float(m.group(1).replace(",", ""))))
    return found


def parts_do_not_add_up(text: str) -> str | None:
    """The rule for one line: its listed parts sum to the total it quotes, within the rounding of the figures shown
    (each to 0.005 GiB); None when they do (or it lists none)."""
    for parts, total in listed_parts(text):
        if abs(sum(parts) - total) > 0.005 * (len(parts) + 1) + 1e-9:
            return f"a line lists parts summing to {sum(parts):.2f} GiB against {total:.2f} GiB in all: {text[:120]!r}"
    return None


def enforce(plan: CheckedPlan) -> None:
    """Raise when ``plan`` breaks a rule (``violations``).

    Raises:
        AdvisorError: the first broken rule, as an internal error to report.
    """
    broken = violations(plan)
    if broken:
        raise AdvisorError(
            f"internal consistency check failed ({broken[0]}; {len(broken)} in all): this is a "
            "bug in advisor, please report it with the command line"
        )
