"""The golden plans (tests/golden/): 25 ``--json`` plans saved before the schema/strategies refactor of
issue 11 must come out identical, except for the fields that refactor added. A change that moves an
estimate on purpose regenerates them (``python -m tests.golden.corpus``) and says why in its commit."""

from __future__ import annotations

import json

import pytest

from tests.golden.corpus import CASES, GOLDEN, ROOT, plan_case

# The plans, not the cache: no what-if traces (tests/conftest.py), which were 19 of the 83 traces made here.
pytestmark = pytest.mark.usefixtures("no_what_if_traces")

# Fields issue 11 added (schema_version 2): the inputs echo, where host RAM came from, and what each
# strategy declares about itself.
ADDED_TOP = {"inputs", "schema_version"}
ADDED_HARDWARE = {"host_mem_state"}
ADDED_ROW = {"framework", "launcher", "short_of", "comm_pattern"}
# Added with the mixture-of-experts counts (issue 12): parameters used per token.
ADDED_MODEL = {"num_active_params"}
# Added with the step-time model (issue 13): each row's time object, what the times were computed with, and the
# recommended micro-batch.
ADDED_TOP |= {"timing"}
ADDED_ROW |= {"time"}
ADDED_RECOMMENDATION = {"micro_batch_size"}


def _without_added(doc: dict) -> dict:
    doc = {k: v for k, v in doc.items() if k not in ADDED_TOP}
    doc["hardware"] = {k: v for k, v in doc["hardware"].items() if k not in ADDED_HARDWARE}
    doc["model"] = {k: v for k, v in doc["model"].items() if k not in ADDED_MODEL}
    doc["strategies"] = [{k: v for k, v in s.items() if k not in ADDED_ROW} for s in doc["strategies"]]
    if "recommendation" in doc:
        doc["recommendation"] = {k: v for k, v in doc["recommendation"].items() if k not in ADDED_RECOMMENDATION}
    return doc


# The plans were saved in a checkout at /work/main; config-file paths name the checkout that runs.
SAVED_IN = "/work/main"
GOLD = json.loads(GOLDEN.read_text().replace(SAVED_IN, "<checkout>"))


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
@pytest.mark.parametrize("name", list(CASES))
def test_plan_is_unchanged(name):
    new = _without_added(json.loads(json.dumps(plan_case(CASES[name])).replace(str(ROOT), "<checkout>")))
    old = _without_added(GOLD[name])
    for key in old:
        assert new.get(key) == old[key], f"{name}: {key} changed"
    assert set(new) == set(old)


def test_the_added_fields_are_there():
    doc = plan_case(CASES["llama_small-4xH200-offload-host"])
    assert doc["schema_version"] == 2 and doc["hardware"]["host_mem_state"] == "given"
    assert {r["name"]: r.get("short_of") for r in doc["strategies"] if r["applicable"]}["zero3_offload"] in (
        None,
        "host RAM",
        "GPU memory",
    )
    assert all({"framework", "launcher"} <= set(r) for r in doc["strategies"])


def test_a_replicated_strategy_that_fits_a_smaller_micro_batch_is_said_to():
    """'DDP does not fit' is the verdict at the plan's micro-batch: where DDP fits a smaller one, the reason names
    both, and the smaller one is the DDP row's largest (its max mb column). Four golden plans have such a DDP."""
    import re

    said = 0
    for plan in json.loads(GOLDEN.read_text()).values():
        rows = {r["title"]: r for r in plan["strategies"]}
        mb = plan["training"]["micro_batch_size"]
        for reason in plan["recommendation"]["reasons"]:
            m = re.match(
                r"(\S+) does not fit(?: at micro-batch (\d+))? \(.*?(?:; it fits at micro-batch (\d+) or below)?\)",
                reason,
            )
            if not m:
                continue
            largest = rows[m.group(1)]["max_micro_batch_size"]
            if 0 < largest < mb:
                assert m.group(2) == str(mb) and m.group(3) == str(largest), reason
                said += 1
            else:
                assert m.group(2) is None and m.group(3) is None, reason
    assert said == 4


def test_nothing_fits_lists_only_the_rows_short_of_gpu_memory():
    """A new user's find: 'no strategy fits: ... ZeRO-3 + CPU offload 15.01 GiB ... per GPU vs 80.00 GiB available'
    listed rows that fit the GPU and were short of host RAM. The first reason lists the rows short of GPU memory
    with their device totals, then names the others as fitting the GPU (their host RAM reasons follow)."""
    checked = 0
    for plan in json.loads(GOLDEN.read_text()).values():
        first = (plan["recommendation"]["reasons"] or [""])[0]
        if not first.startswith("no strategy fits: "):
            continue
        listed, _, rest = first.removeprefix("no strategy fits: ").partition(" per GPU vs ")
        for row in (r for r in plan["strategies"] if r["applicable"]):
            # each part is "<title> <n> GiB"; a row short of GPU memory may be left out (single beside a cluster)
            in_gpu_list = any(part.rsplit(" ", 2)[0] == row["title"] for part in listed.split("; "))
            assert not in_gpu_list or row["short_of"] == "GPU memory", (row["title"], row["short_of"], first)
            if row["short_of"] == "host RAM":
                assert row["title"] in rest and "fit the GPU" in rest, first
        checked += 1
    assert checked >= 1
