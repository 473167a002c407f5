"""Streamlit page for advisor: per-GPU memory by component for every strategy, the recommendation,
generated scripts and a verification run on this machine; a second tab checks a training script.

This file is the script ``streamlit run`` executes (``advisor page`` starts it from the installed package;
the repository's ``app.py`` runs the same ``main``)::

    advisor page                       # or, from the repository root: .venv/bin/streamlit run app.py

A thin face over ``advisor.plan.plan`` (the function the CLI calls): the page reads widgets into
``PlanInputs`` (``advisor.page.form``), caches the plan per input and draws the result. Sizes are bytes
internally and shown in GiB (2**30 bytes). Imports are absolute: run as a script, this file is no package's
module.
"""

from __future__ import annotations

import logging
import os

import streamlit as st

from advisor.document import PlanDoc, plan_to_dict
from advisor.errors import AdvisorError
from advisor.faces import quiet_library_logs
from advisor.page.charts import show_ladder, show_memory
from advisor.page.check_tab import show_check
from advisor.page.form import cached_plan, read_form
from advisor.page.runner import show_verify
from advisor.page.words import gib, md, one_line, say
from advisor.plan import Plan
from advisor.schema import get_field
from advisor.units import GiB, counted, fmt_count

log = logging.getLogger("advisor.app")

NO_SCRIPTS = "script generation not available"
# Widgets on the page that are not schema inputs (the schema's page fields are keyed by their names).
CONTROLS = ("config_file", "zoom", "verify", "check_text", "check_file")


def show_summary(p: Plan, doc: PlanDoc) -> None:
    """Parameter count and the hardware, prominently; the rest of the inputs as a caption."""
    model, hw, tr = doc["model"], doc["hardware"], doc["training"]
    # A wrapping row of content-wide metrics, not fixed columns: a long value ("16 x H100-80GB", a long
    # model name) takes the width it needs and moves to the next line instead of being cut with "...".
    with st.container(horizontal=True, wrap=True, gap="large"):
        st.metric(
            "Parameters",
            f"{model['num_params']:,}",
            width="content",
            help=f"{fmt_count(model['num_params'])}; trainable {model['num_trainable_params']:,}",
        )
        if model["num_trainable_params"] != model["num_params"]:  # LoRA or a frozen backbone
            st.metric(
                "Trainable",
                f"{model['num_trainable_params']:,}",
                width="content",
                help=f"{fmt_count(model['num_trainable_params'])} of {fmt_count(model['num_params'])}",
            )
        st.metric("Model", model["name"], width="content")
        st.metric("GPUs", f"{hw['num_gpus']} x {hw['gpu_name']}", width="content")
        st.metric(
            "GPU memory",
            f"{gib(hw['gpu_memory_bytes']):.2f} GiB",
            width="content",
            help="usable per GPU, GiB = 2**30 bytes",
        )
    shape = f"seq-len {model['seq_len']}" if p.spec.is_transformer else f"input {model['input_shape']}"
    st.caption(
        md(
            f"{model['source']}; {shape}; {tr['precision']}, {tr['optimizer']}, micro-batch "
            f"{tr['micro_batch_size']}/GPU, activation checkpointing "
            f"{'on' if tr['activation_checkpointing'] else 'off'}, attention {model['attention']}; "
            f"{counted(hw['gpus_per_node'], 'GPU')} per node x {counted(hw['num_nodes'], 'node')}, "
            f"{hw['interconnect']}" + (f", network {hw['network']}" if hw["network"] else "")
        )
    )


def show_recommendation(p: Plan) -> None:
    """The chosen strategy (or an explicit "nothing fits"), its reasons and every warning."""
    rec = p.recommendation
    if rec.strategy:
        st.success(md(f"Recommendation: {p.row(rec.strategy).title} ({rec.strategy})"))
    else:
        hw, need = p.hardware, ""
        if rec.min_gpus:
            assert rec.min_nodes is not None, "found with the GPUs (advisor.recommend)"
            need = (
                f" The smallest cluster that fits: {counted(rec.min_gpus, 'GPU')} "
                f"({counted(rec.min_nodes, 'node')} of {counted(rec.min_gpus // rec.min_nodes, 'GPU')}) with full "
                "sharding" + (f" ({rec.min_cluster_flags})" if rec.min_cluster_flags else "") + " (see the reasons)."
            )
        st.error(
            md(
                f"Nothing fits: no strategy fits {p.spec.name} on {hw.num_gpus} x {hw.gpu_name} "
                f"({hw.gpu_memory_bytes / GiB:.2f} GiB each).{need}"
            )
        )
    st.markdown("\n".join(f"- {say(r)}" for r in rec.reasons))
    warnings = p.warnings + rec.warnings
    if warnings:
        st.warning("\n".join(f"- {say(w)}" for w in warnings))


def choose_strategy(p: Plan) -> str | None:
    """The strategy for scripts and verification: the recommendation, or the user's pick while the recommendation
    it was made beside stands. A keyed selectbox keeps its value across reruns, so without the reset below the
    first plan's pick (gpt2 on one GPU: single) stayed after a change of model or GPUs made FSDP2 the answer and
    single not fit, and the downloads wrote a script the page had just said would run out of memory."""
    names = [r.name for r in p.rows if r.applicable]
    if not names:
        return None
    titles = {r.name: r.title for r in p.rows}
    rec = p.recommendation.strategy
    state = st.session_state
    if state.get("strategy_beside") != rec or state.get("strategy") not in names:
        state["strategy"] = rec if rec in names else names[0]
        state["strategy_beside"] = rec
    return st.selectbox(
        get_field("strategy").label,
        names,
        key="strategy",
        format_func=lambda n: f"{titles[n]} ({n})" + (" - recommended" if n == rec else ""),
    )


def _mime(file_name: str) -> str:
    """Content type for a generated file's download."""
    return {"py": "text/x-python", "json": "application/json", "sh": "text/x-shellscript"}.get(
        file_name.rsplit(".", 1)[-1], "text/plain"
    )


def show_downloads(p: Plan, strategy: str) -> None:
    """Download buttons for ``strategies.render.render_files``; an info line while it is missing."""
    try:
        from strategies.render import launch_command, render_files

        files = render_files(p, strategy)
        launch = launch_command(p, strategy)
    except (NotImplementedError, ImportError):
        st.info(f"{NO_SCRIPTS} yet for {strategy}")
        return
    except AdvisorError as err:
        st.info(md(f"{NO_SCRIPTS}: {err}"))
        return
    except Exception as err:  # another module's bug must not break the page
        log.exception("render_files failed")
        st.info(md(f"{NO_SCRIPTS}: {one_line(err)}"))
        return
    cols = st.columns(max(1, len(files)))
    for col, (name, text) in zip(cols, files.items()):
        col.download_button(
            f"Download {name}", text, file_name=name, mime=_mime(name), on_click="ignore", key=f"dl-{strategy}-{name}"
        )
    if launch:
        st.code(launch, language="bash")


def main() -> None:
    """The page: inputs in the sidebar; summary, recommendation, memory, scripts and verification in
    the first tab; the script checker in the second."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never contact a model hub (set at the entry point)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    quiet_library_logs()  # bitsandbytes' optional-kernel warning (advisor.faces)
    st.set_page_config(page_title="advisor: GPU memory for training", layout="wide")
    st.title("How much GPU memory will training need?")
    plan_tab, check_tab = st.tabs(["Memory and strategy", "Check my training script"])
    with check_tab:
        show_check()
    with plan_tab:
        show_plan()


def show_plan() -> None:
    """Plan from the sidebar's inputs: summary, recommendation, memory, scripts and verification."""
    try:
        form = read_form()
        p = cached_plan(form.key())
        doc = plan_to_dict(p)
    except AdvisorError as err:
        st.error(say(str(err)))
        return
    except Exception as err:  # a bug elsewhere: one line here, the traceback in the server log
        log.exception("planning failed")
        st.error(md(f"internal error while planning: {one_line(err)}"))
        return
    show_summary(p, doc)
    show_recommendation(p)
    show_memory(doc)
    show_ladder(doc)
    st.subheader("Training scripts")
    strategy = choose_strategy(p)
    if strategy is None:
        st.info("no strategy applies: nothing to generate or verify")
        return
    show_downloads(p, strategy)
    show_verify(form, strategy, p.spec.name)


if __name__ == "__main__":  # `streamlit run` executes the page as __main__
    main()
