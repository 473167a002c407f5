"""The plan's memory and time on the page: per-GPU memory by component and seconds per optimizer step as
long-form frames and Altair charts (one row per strategy), each bar with a whisker for its error band, and the
per-strategy table. Frames and the table are built from ``advisor.plan.plan_to_dict``'s document; sizes are
shown in GiB (2**30 bytes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import altair as alt
import pandas as pd
import streamlit as st

from advisor.page.words import md, page_text
from advisor.units import GiB

if TYPE_CHECKING:
    from advisor.document import PlanDoc, StrategyDoc

# The chart's components, bottom to top: Breakdown fields (plan_to_dict keys) -> legend labels, then
# what nvidia-smi shows beyond the peak allocated.
BREAKDOWN = {
    "params": "params",
    "grads": "grads",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "buffers": "buffers",
    "other": "other",
}
OVERHEAD = "device overhead"
COMPONENTS = (*BREAKDOWN.values(), OVERHEAD)


def memory_frame(doc: PlanDoc) -> pd.DataFrame:
    """Long-form per-GPU GiB by component for every applicable strategy (device overhead = device
    total - peak allocated)."""
    rows = []
    for s in doc["strategies"]:
        if not s["applicable"]:
            continue
        b = s["per_gpu_bytes"]
        parts = {label: b[key] for key, label in BREAKDOWN.items()} | {OVERHEAD: b["device_total"] - b["total"]}
        for order, (component, n) in enumerate(parts.items()):
            rows.append(
                {
                    "strategy": s["title"],
                    "component": component,
                    "order": order,
                    "GiB": n / GiB,
                    "device total GiB": b["device_total"] / GiB,
                }
            )
    return pd.DataFrame(rows)


def memory_band_frame(doc: PlanDoc) -> pd.DataFrame:
    """One row per applicable strategy: the whisker at the end of its memory bar, the device total moved by the
    peak allocated's error band (``memory_error_band``; the device overhead is a rule, not banded), GiB."""
    rows = []
    for s in doc["strategies"]:
        band = s.get("memory_error_band")
        if not s["applicable"] or band is None:
            continue
        b = s["per_gpu_bytes"]
        rows.append(
            {
                "strategy": s["title"],
                "low GiB": (b["device_total"] + b["total"] * band["low"]) / GiB,
                "high GiB": (b["device_total"] + b["total"] * band["high"]) / GiB,
                "band": band["based_on"],
            }
        )
    return pd.DataFrame(rows, columns=["strategy", "low GiB", "high GiB", "band"])


def _whiskers(frame: pd.DataFrame, low: str, high: str, strategy_order: list[str], title: str) -> alt.Chart:
    """Vega-Lite errorbar marks from ``low`` to ``high`` on each strategy's row (pre-computed extents: x, x2),
    under the bars' axis ``title`` (layers share the axis, and Vega-Lite would join differing titles)."""
    return (
        alt.Chart(frame)
        .mark_errorbar(ticks=True, color="black", thickness=1.5)
        .encode(
            y=alt.Y("strategy:N", sort=strategy_order, title=None),
            x=alt.X(f"{low}:Q", title=title),
            x2=alt.X2(f"{high}:Q"),
            tooltip=[
                "strategy:N",
                alt.Tooltip(f"{low}:Q", format=".4g"),
                alt.Tooltip(f"{high}:Q", format=".4g"),
                alt.Tooltip("band:N", title="error band"),
            ],
        )
    )


CHART_ROW_PX = 32  # height per strategy: each bar has a row of its own and its whole title as the label
CHART_AXES_PX = 70  # the axis and its title below the bars


def memory_chart(
    frame: pd.DataFrame,
    capacity_bytes: int,
    strategy_order: list[str],
    zoom: bool = False,
    bands: pd.DataFrame | None = None,
) -> alt.Chart | alt.LayerChart | alt.FacetChart:
    """Horizontal stacked bars, one row per strategy labelled with its whole title (however many
    strategies: no label is dropped, turned or cut), a whisker at each bar's end for its error band (``bands``:
    ``memory_band_frame``), and a red dashed rule at the GPU's usable memory, named with its value in the axis
    title (theme-coloured text, readable on light and dark pages). ``zoom``: scale the axis to the longest bar
    (the capacity line is left out when it lies beyond)."""
    cap = capacity_bytes / GiB
    whisker_end = float(bands["high GiB"].max()) if bands is not None and not bands.empty else 0.0
    longest = max(float(frame["device total GiB"].max()), whisker_end)
    top = longest * 1.05
    zoomed = zoom and 0 < top < cap
    title = (
        f"per-GPU memory (GiB); red dashed line: GPU memory {cap:.2f} GiB"
        if not zoomed
        else f"per-GPU memory (GiB); GPU memory {cap:.2f} GiB is beyond this scale"
    )
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y(
                "strategy:N",
                sort=strategy_order,
                title=None,
                axis=alt.Axis(labelLimit=0, labelOverlap=False, labelAngle=0, labelPadding=6),
            ),
            x=alt.X(
                "sum(GiB):Q", stack="zero", title=title, scale=alt.Scale(domain=[0, top]) if zoomed else alt.Scale()
            ),
            color=alt.Color("component:N", sort=list(COMPONENTS), title="component"),
            order=alt.Order("order:Q"),
            tooltip=[
                "strategy:N",
                "component:N",
                alt.Tooltip("GiB:Q", format=".2f"),
                alt.Tooltip("device total GiB:Q", format=".2f"),
            ],
        )
        .properties(height=CHART_ROW_PX * len(strategy_order) + CHART_AXES_PX)
    )
    layers: list[alt.Chart] = [bars]
    if bands is not None and not bands.empty:
        layers.append(_whiskers(bands, "low GiB", "high GiB", strategy_order, title))
    if not zoomed:
        line = pd.DataFrame({"GiB": [cap]})
        layers.append(
            alt.Chart(line)
            .mark_rule(color="red", strokeDash=[6, 4], size=2)
            .encode(x="GiB:Q", tooltip=[alt.Tooltip("GiB:Q", format=".2f", title="GPU memory (GiB)")])
        )
    return layers[0] if len(layers) == 1 else alt.layer(*layers)


TIME_PARTS: tuple[tuple[Literal["compute_s", "exposed_comm_s", "optimizer_s"], str], ...] = (
    ("compute_s", "compute"),
    ("exposed_comm_s", "communication not hidden"),
    ("optimizer_s", "optimizer"),
)


def time_frame(doc: PlanDoc) -> pd.DataFrame:
    """Long-form seconds per optimizer step by part for every timed strategy."""
    rows = []
    for s in doc["strategies"]:
        t = s.get("time")
        if not s["applicable"] or not t:
            continue
        for order, (key, label) in enumerate(TIME_PARTS):
            rows.append(
                {"strategy": s["title"], "part": label, "order": order, "seconds": t[key], "step (s)": t["step_s"]}
            )
    return pd.DataFrame(rows)


TIME_AXIS = "seconds per optimizer step (data loading not modelled)"


def time_band_frame(doc: PlanDoc) -> pd.DataFrame:
    """One row per timed strategy: its step time's error band (``time.error_band``) as seconds, the whisker on
    its time bar."""
    rows = []
    for s in doc["strategies"]:
        t = s.get("time")
        if not s["applicable"] or not t:
            continue
        band = t["error_band"]
        rows.append(
            {
                "strategy": s["title"],
                "low (s)": t["step_s"] * (1 + band["low"]),
                "high (s)": t["step_s"] * (1 + band["high"]),
                "band": band["based_on"],
            }
        )
    return pd.DataFrame(rows, columns=["strategy", "low (s)", "high (s)", "band"])


def time_chart(
    frame: pd.DataFrame, strategy_order: list[str], bands: pd.DataFrame | None = None
) -> alt.Chart | alt.LayerChart:
    """Horizontal stacked bars of one optimizer step's seconds per strategy, in the memory chart's rows, with a
    whisker for each step time's error band (``bands``: ``time_band_frame``)."""
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y(
                "strategy:N",
                sort=strategy_order,
                title=None,
                axis=alt.Axis(labelLimit=0, labelOverlap=False, labelAngle=0, labelPadding=6),
            ),
            x=alt.X("sum(seconds):Q", stack="zero", title=TIME_AXIS),
            color=alt.Color("part:N", sort=[label for _, label in TIME_PARTS], title="part"),
            order=alt.Order("order:Q"),
            tooltip=[
                "strategy:N",
                "part:N",
                alt.Tooltip("seconds:Q", format=".4f"),
                alt.Tooltip("step (s):Q", format=".4f"),
            ],
        )
        .properties(height=CHART_ROW_PX * len(strategy_order) + CHART_AXES_PX)
    )
    if bands is None or bands.empty:
        return bars
    return alt.LayerChart(layer=[bars, _whiskers(bands, "low (s)", "high (s)", strategy_order, TIME_AXIS)])


NONE_CELL = "—"  # a cell with nothing to show (not Markdown syntax, unlike "-")
TABLE_COLUMNS = (
    "strategy",
    "name",
    "fits",
    "device total (GiB)",
    "peak allocated (GiB)",
    "max micro-batch",
    "grad. accumulation steps",
    "global batch",
    "host RAM / node (GiB)",
    "note",
)


def _fits_text(s: StrategyDoc) -> str:
    """yes / no / ? (the verdict waits for host RAM nobody gave)."""
    return "?" if s["fits"] is None else "yes" if s["fits"] else "no"


def _note(s: StrategyDoc) -> str:
    """Where the peak is and what is short, in the page's words (``page_text``)."""
    short = s["short_of"]
    what = (
        "host RAM per node unknown: give --host-mem"
        if short == "host RAM unknown"
        else f"short of {short}"
        if short
        else None
    )
    return page_text(f"peak in the {s['peak_phase']}" + (f"; {what}" if what else ""))


def strategy_table(doc: PlanDoc) -> pd.DataFrame:
    """One row per strategy, as the text shown (a static table: nothing is cut or shown as "None"): fits,
    GiB, max micro-batch, accumulation steps, host RAM; "n/a" and the whole reason when n/a."""
    rows = []
    for s in doc["strategies"]:
        row = dict.fromkeys(TABLE_COLUMNS, NONE_CELL) | {"strategy": s["title"], "name": s["name"]}
        if not s["applicable"]:
            rows.append(row | {"fits": "n/a", "note": "n/a: " + page_text(s["reason"] or "does not apply")})
            continue
        b, host = s["per_gpu_bytes"], s["host_bytes_per_node"]
        rows.append(
            row
            | {
                "fits": _fits_text(s),
                "device total (GiB)": f"{b['device_total'] / GiB:.2f}",
                "peak allocated (GiB)": f"{b['total'] / GiB:.2f}",
                "max micro-batch": str(s["max_micro_batch_size"]),
                "grad. accumulation steps": str(s["gradient_accumulation_steps"]),
                "global batch": str(s["global_batch_size"]),
                "host RAM / node (GiB)": f"{host / GiB:.2f}" if host else NONE_CELL,
                "note": _note(s),
            }
        )
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def show_memory(doc: PlanDoc) -> None:
    """The stacked chart with the capacity line, then the table."""
    st.subheader("Per-GPU memory by strategy (GiB)")
    frame = memory_frame(doc)
    if frame.empty:
        st.info("no strategy applies to this model and hardware")
    else:
        order = [s["title"] for s in doc["strategies"] if s["applicable"]]
        zoom = st.toggle(
            "Scale to the bars",
            key="zoom",
            help="zoom in on small bars; the GPU memory line is hidden when it lies above them",
        )
        times = time_frame(doc)
        left, right = st.columns(2) if not times.empty else (st.container(), None)
        with left:
            capacity = doc["hardware"]["gpu_memory_bytes"]
            st.altair_chart(memory_chart(frame, capacity, order, zoom, memory_band_frame(doc)), width="stretch")
            st.caption(
                "Bars: peak allocated by component plus device overhead (CUDA context, NCCL buffers, "
                "allocator fragmentation), about what nvidia-smi shows. Whiskers: the peak's error band "
                "(measured runs). Red line: the GPU's usable memory."
            )
        if right is not None:
            with right:
                timed = [t for t in order if t in set(times["strategy"])]
                st.altair_chart(time_chart(times, timed, time_band_frame(doc)), width="stretch")
                st.caption(
                    "One optimizer step at the global batch: compute (forward + backward of every "
                    "micro-step), communication that compute does not hide, the optimizer step. Whiskers: the "
                    "step time's error band (published runs). Data loading is not modelled."
                )
    # st.table, not st.dataframe: a static table wraps long reasons instead of cutting them off. Its cells
    # are Markdown, so the text is escaped.
    st.table(strategy_table(doc).map(md), hide_index=True)


def ladder_frame(doc: PlanDoc) -> pd.DataFrame:
    """One row per rung of the plan's ladder (``ladder[]``) that has figures, in the ladder's order: its label,
    device total (GiB), peak allocated (GiB), throughput, whether it fits and whether it is the first that fits.
    Empty when the plan has no ladder."""
    rows = [
        {
            "rung": f"{i}. {r['label']}",
            "device total GiB": int(r["device_bytes"]) / GiB,  # type: ignore[call-overload]
            "peak GiB": int(r["peak_bytes"] or 0) / GiB,  # type: ignore[call-overload]
            "throughput": r["throughput"],
            "unit": r["throughput_unit"],
            "fits": "first fit" if r["first_fit"] else ("fits" if r["fits"] else "does not fit"),
        }
        for i, r in enumerate(doc.get("ladder", []))
        if r["device_bytes"] is not None
    ]
    return pd.DataFrame(rows, columns=["rung", "device total GiB", "peak GiB", "throughput", "unit", "fits"])


def ladder_chart(frame: pd.DataFrame, capacity_bytes: int) -> alt.LayerChart | alt.FacetChart:
    """Horizontal bars of each rung's device total per GPU (cumulative: each rung adds its option to the ones
    above), coloured by whether it fits, and a red dashed rule at the GPU's usable memory."""
    cap = capacity_bytes / GiB
    order = list(frame["rung"])
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y("rung:N", sort=order, title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False)),
            x=alt.X("device total GiB:Q", title=f"per-GPU memory (GiB); red dashed line: GPU memory {cap:.2f} GiB"),
            color=alt.Color(
                "fits:N",
                scale=alt.Scale(domain=["does not fit", "fits", "first fit"], range=["#9e9e9e", "#7fb77e", "#2e7d32"]),
                title="on this GPU",
            ),
            tooltip=[
                "rung:N",
                alt.Tooltip("device total GiB:Q", format=".2f"),
                alt.Tooltip("peak GiB:Q", format=".2f"),
                alt.Tooltip("throughput:Q", format=",.0f"),
                "unit:N",
            ],
        )
        .properties(height=CHART_ROW_PX * len(order) + CHART_AXES_PX)
    )
    rule = (
        alt.Chart(pd.DataFrame({"GiB": [cap]}))
        .mark_rule(color="red", strokeDash=[6, 4], size=2)
        .encode(x="GiB:Q", tooltip=[alt.Tooltip("GiB:Q", format=".2f", title="GPU memory (GiB)")])
    )
    return alt.layer(bars, rule)


def show_ladder(doc: PlanDoc) -> None:
    """The memory-savings ladder as a chart, when the plan has one (the Memory-savings ladder box, or nothing
    fits)."""
    frame = ladder_frame(doc)
    if frame.empty:
        return
    strategy = str(doc["ladder"][0]["strategy"])
    st.subheader(f"Memory-savings ladder on {strategy} (GiB per GPU)")
    st.altair_chart(ladder_chart(frame, doc["hardware"]["gpu_memory_bytes"]), width="stretch")
    st.caption(
        "Each rung adds its option to the ones above, least slowdown per GiB saved first; the bar is the device "
        "total per GPU after it. Rungs the strategy cannot take, or that save nothing, are listed in the plan's "
        "JSON (ladder[]) with why."
    )
