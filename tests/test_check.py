"""``advisor check``: the multi-GPU pitfall linter. A bad/good script pair per rule (exact findings),
the scripts this project generates (no findings, and findings once a safeguard is removed), edge
cases of guards, aliases and tracing, and the CLI's exit codes and one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from advisor.check import RULES, CheckError, Finding, check_files, check_paths, check_source
from advisor.check.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "check"
TINY = str(ROOT / "tests" / "data" / "tiny_llama.json")

# rule -> the exact (rule, line) findings of tests/data/check/<rule>_bad.py
EXPECTED = {
    "MG001": [("MG001", 13)],
    "MG002": [("MG002", 18), ("MG002", 20)],
    "MG003": [("MG003", 19)],
    "MG004": [("MG004", 14), ("MG004", 21), ("MG004", 25)],
    "MG005": [("MG005", 22)],
    "MG006": [("MG006", 30), ("MG006", 32)],
    "MG007": [("MG007", 29), ("MG007", 32)],
    "MG008": [("MG008", 22), ("MG008", 26)],
    "MG009": [("MG009", 13), ("MG009", 22), ("MG009", 29), ("MG009", 32)],
    "MG010": [("MG010", 14)],
    "MG011": [("MG011", 24)],
    "MG012": [("MG012", 11), ("MG012", 27)],
    "MG013": [("MG013", 9)],
    "MG014": [("MG014", 28)],
    "MG015": [("MG015", 16)],
}


def _pairs(findings: list[Finding]) -> list[tuple[str, int]]:
    return [(f.rule, f.line) for f in findings]


def _check(path: Path) -> list[Finding]:
    return check_source(path.read_text(), str(path))


# --- one bad/good pair per rule ----------------------------------------------------------------
def test_every_rule_has_a_pair_and_documentation():
    assert list(RULES) == sorted(EXPECTED) == [f"MG{i:03d}" for i in range(1, 16)]
    for rule_id, rule in RULES.items():
        assert (DATA / f"{rule_id.lower()}_bad.py").is_file() and (DATA / f"{rule_id.lower()}_good.py").is_file()
        assert rule.severity in ("error", "warning", "info")
        assert ("docs/decisions.md:" if rule_id == "MG001" else "docs/pitfalls.md:") in rule.doc, rule_id
        assert rule.fix and rule.title, rule_id
        note = rule.pitfall
        assert note == "decision rules" if rule_id == "MG001" else note.startswith("pitfall")


@pytest.mark.parametrize("rule_id", sorted(EXPECTED))
def test_bad_script_gives_exactly_its_findings(rule_id):
    findings = _check(DATA / f"{rule_id.lower()}_bad.py")
    assert _pairs(findings) == EXPECTED[rule_id]
    rule = RULES[rule_id]
    for f in findings:
        assert f.pitfall == rule.pitfall and f.col >= 1
        # the rule's fix, except print/log lines, which need no barrier (their own one-sentence fix)
        assert f.fix == rule.fix if f.severity != "info" or rule_id != "MG009" else "print per-rank lines" in f.fix
        assert f.format().startswith(f"{f.path}:{f.line}: {rule_id} ") and "; fix: " in f.format()


@pytest.mark.parametrize("rule_id", sorted(EXPECTED))
def test_good_twin_is_clean(rule_id):
    assert _check(DATA / f"{rule_id.lower()}_good.py") == []


def test_print_and_log_findings_are_info():
    severities = {f.line: f.severity for f in _check(DATA / "mg009_bad.py")}
    assert severities == {13: "warning", 22: "info", 29: "info", 32: "warning"}


# --- the generator and the checker agree ----------------------------------------------------------
GENERATED = (
    [
        ("llama", s)
        for s in (
            "single",
            "ddp",
            "zero1",
            "zero2",
            "zero3",
            "zero2_offload",
            "zero3_offload",
            "fsdp2",
            "fsdp2_noreshard",
            "fsdp2_offload",
            "tp",
        )
    ]
    + [("llama4", "tp_dp")]
    + [("resnet18", s) for s in ("single", "ddp", "zero2", "zero3", "fsdp2")]
)


@pytest.fixture(scope="module")
def generated() -> dict[tuple[str, str], str]:
    """train.py for each (model, strategy) in GENERATED; three plans, built once."""
    from advisor.plan import plan
    from advisor.schema import PlanInputs, plan_inputs
    from strategies.render import render_files

    def tiny(gpus: int, **training) -> PlanInputs:
        return plan_inputs(
            config_path=TINY,
            seq_len=32,
            gpus=gpus,
            interconnect="nvlink",
            detect_hardware=False,
            precision="fp32",
            micro_batch_size=2,
            **training,
        )

    plans = {
        "llama": plan(tiny(2)),
        "llama4": plan(tiny(4, tp_degree=2)),
        "resnet18": plan(plan_inputs(model="resnet18", gpus=2, detect_hardware=False, interconnect="nvlink")),
    }
    return {(m, s): render_files(plans[m], s)["train.py"] for m, s in GENERATED}


@pytest.mark.slow  # over 5 s on 2 cores (the fast subset, -m 'not slow', stays under 3 minutes)
@pytest.mark.parametrize("model,strategy", GENERATED)
def test_generated_scripts_are_clean(generated, model, strategy):
    assert check_source(generated[(model, strategy)], f"{model}-{strategy}/train.py") == []


# Remove one safeguard from a generated script: the rule guarding it must fire (so "clean" above is
# not clean by blindness). (model, strategy, text in the script, replacement, expected rule)
# The generated scripts keep the wrapper in ``run.model`` (templates/loop.py's Run), an attribute assigned in another
# function than the save: the checker follows an attribute assigned once in the file (advisor/check/scope.py).
MUTATIONS = [
    ("resnet18", "ddp", "if run.rank == 0:\n        export_weights(", "if 1:\n        export_weights(", "MG009"),
    pytest.param(
        "llama",
        "ddp",
        "export_weights(run.module, args)",
        "torch.save(run.model.state_dict(), 'model.pt')",
        "MG007",
    ),
    pytest.param(
        "llama",
        "ddp",
        "export_weights(run.module, args)",
        "torch.save(run.model, 'model.pt')",
        "MG006",
    ),
    ("llama", "ddp", "    dist.destroy_process_group()\n", "    pass\n", "MG013"),
    ("llama", "ddp", 'if int(os.environ.get("RANK", "0")) == 0:\n        print', "if True:\n        print", "MG009"),
    ("llama", "ddp", "torch.cuda.set_device(local_rank)", "torch.cuda.set_device(rank)", "MG004"),
    ("llama", "ddp", "sampler=sampler, num_workers", "sampler=sampler, shuffle=True, num_workers", "MG002"),
    (
        "resnet18",
        "ddp",
        "        run.module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(run.module)",
        "        run.module = torch.nn.Sequential(run.module, torch.nn.BatchNorm1d(8))",
        "MG010",
    ),
    ("llama", "tp", "            g.div_(run.dp_size)", "            pass", "MG012"),
    ("llama", "zero3", "deepspeed.init_distributed(", "print(", "MG009"),
]


@pytest.mark.parametrize("model,strategy,old,new,rule_id", MUTATIONS)
def test_removing_a_safeguard_from_a_generated_script_is_found(generated, model, strategy, old, new, rule_id):
    script = generated[(model, strategy)]
    assert script.count(old) == 1
    assert [f.rule for f in check_source(script.replace(old, new))] == [rule_id]


# --- edge cases: aliases, guards, tracing (source, expected (rule, line) list) -----------------------
DIST = "import os\nimport torch\nimport torch.distributed as dist\n"  # 3 lines
SAVE = 'torch.save(model.module.state_dict(), "m.pt")'
SNIPPETS = {
    "dp via torch.nn": ("import torch\nm = torch.nn.DataParallel(net)\n", [("MG001", 2)]),
    "dp via module path": ("from torch.nn.parallel.data_parallel import DataParallel as DP\nDP(net)\n", [("MG001", 2)]),
    "isinstance is not a use": ("from torch import nn\nok = isinstance(m, nn.DataParallel)\n", []),
    "ddp alias by assignment": (
        DIST + "Wrap = torch.nn.parallel.DistributedDataParallel\ndef main():\n"
        "    m = Wrap(net)\n"
        "    dist.init_process_group('nccl')\n    dist.destroy_process_group()\n",
        [("MG005", 6)],
    ),
    "no init in function": (
        DIST + "from torch.nn.parallel import DistributedDataParallel as DDP\ndef wrap(m):\n    return DDP(m)\n",
        [],
    ),
    "guard get_rank": (DIST + f"if dist.get_rank() == 0:\n    {SAVE}\n", []),
    "guard local_rank in": (DIST + f"if args.local_rank in (-1, 0):\n    {SAVE}\n", []),
    "guard not rank": (DIST + f"if not rank:\n    {SAVE}\n", []),
    "guard env": (DIST + f'if int(os.environ["RANK"]) == 0:\n    {SAVE}\n', []),
    "guard main flag": (DIST + f"if accelerator.is_main_process and epoch > 3:\n    {SAVE}\n", []),
    "guard else of nonzero": (DIST + f"if rank != 0:\n    pass\nelse:\n    {SAVE}\n", []),
    "guard and": (DIST + f"rank == 0 and {SAVE}\n", []),
    "guard early return": (
        DIST + f"def save(model):\n    if dist.get_rank() != 0:\n        return\n    {SAVE}\nsave(model)\n",
        [],
    ),
    "guard continue": (DIST + f"for model in models:\n    if rank > 0:\n        continue\n    {SAVE}\n", []),
    "guard decorator": (DIST + f"@rank_zero_only\ndef save(model):\n    {SAVE}\nsave(model)\n", []),
    "guard caller": (DIST + f"def save(model):\n    {SAVE}\nif rank == 0:\n    save(model)\n", []),
    "never called": (DIST + f"def save(model):\n    {SAVE}\n", []),
    "per-rank shard file": (
        DIST + 'torch.save(model.state_dict(), f"shard_rank{dist.get_rank()}.pt")\n'
        'torch.save(model.state_dict(), f=f"opt_{rank}.pt")\n',
        [],
    ),
    "shared file is not": (DIST + 'torch.save(model.state_dict(), f"model_{epoch}.pt")\n', [("MG009", 4)]),
    "unguarded caller": (DIST + f"def save(model):\n    {SAVE}\nsave(model)\n", [("MG009", 5)]),
    "spawned": (DIST + f"def train(model):\n    {SAVE}\nmp.spawn(train, nprocs=4)\n", [("MG009", 5)]),
    "not a guard": (
        DIST + f"if epoch % 10 == 0:\n    {SAVE}\nif rank != 1:\n    {SAVE}\n",
        [("MG009", 5), ("MG009", 7)],
    ),
    "not distributed": (f"import torch\n{SAVE}\nprint('done')\n", []),
    "stderr print": (DIST + "import sys\nprint('oops', file=sys.stderr)\n", []),
    "local rank device": (DIST + 'lr = int(os.environ["LOCAL_RANK"])\ntorch.cuda.set_device(lr)\n', []),
    "getenv rank": (DIST + 'rank = int(os.getenv("RANK", "0"))\nmodel.cuda(rank)\n', [("MG004", 5)]),
    "spawn parameter": (DIST + "def main(rank, world):\n    torch.cuda.set_device(rank)\n", []),
    "get_rank device": (DIST + 'r = dist.get_rank()\nd = torch.device("cuda", r)\n', [("MG004", 5)]),
    "modulo is fine": (DIST + "torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())\n", []),
    "from os import environ": (
        "from os import environ\nrank = int(environ['RANK'])\nx = t.to(f'cuda:{rank}')\n",
        [("MG004", 3)],
    ),
    "sampler returned": (
        "from torch.utils.data import DataLoader, DistributedSampler\ndef make(ds):\n"
        "    s = DistributedSampler(ds)\n    return DataLoader(ds, sampler=s), s\n",
        [],
    ),
    "sampler at module level": (
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "s = DistributedSampler(ds)\ndef epoch(e):\n    s.set_epoch(e)\n",
        [],
    ),
    "sampler via loader": (
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "s = DistributedSampler(ds)\nl = DataLoader(ds, sampler=s)\nfor e in range(3):\n"
        "    l.sampler.set_epoch(e)\n",
        [],
    ),
    "loader returned": (
        "from torch.utils.data import DataLoader, DistributedSampler\ndef make(ds):\n"
        "    s = DistributedSampler(ds)\n    loader = DataLoader(ds, sampler=s)\n"
        "    return loader\n",
        [],
    ),
    "loader kept": (
        "from torch.utils.data import DataLoader, DistributedSampler\ndef train(ds):\n"
        "    s = DistributedSampler(ds)\n    loader = DataLoader(ds, sampler=s)\n"
        "    for epoch in range(3):\n        for i, b in enumerate(tqdm(loader)):\n            step(b)\n",
        [("MG003", 3)],
    ),
    "set_epoch once": (
        "from torch.utils.data import DistributedSampler\ns = DistributedSampler(ds)\ns.set_epoch(0)\n",
        [("MG003", 2)],
    ),
    "load map_location positional": (DIST + "sd = torch.load(path, 'cpu')\nsd = torch.load(path, **kw)\n", []),
    "load outside distributed": ("import torch\nsd = torch.load(path)\n", []),
    "allreduce of a metric": (DIST + "dist.all_reduce(loss)\n", []),
    "allreduce avg": (DIST + "for p in ps:\n    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)\n", []),
    "allreduce divided later": (
        DIST + "def sync(ps):\n    for p in ps:\n        dist.all_reduce(p.grad)\n"
        "        p.grad.div_(dist.get_world_size())\n",
        [],
    ),
    "bn layer": (
        DIST + "from torch import nn\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\nm = DDP(net)\n",
        [("MG010", 6)],
    ),
    "bn get_model": (
        DIST + "import torchvision\nm = torch.nn.parallel.DistributedDataParallel("
        "torchvision.models.get_model('resnet50'))\n",
        [("MG010", 5)],
    ),
    "bn without ddp": ("from torch import nn\nnet = nn.BatchNorm2d(8)\n", []),
    "streaming dataset": (
        "from datasets import load_dataset\nfrom torch.utils.data import DistributedSampler\n"
        "ds = load_dataset('c4', streaming=True)\ns = DistributedSampler(ds, shuffle=False)\n",
        [("MG014", 4)],
    ),
    "per-node guard": (DIST + f"if not args.mp or (args.mp and args.rank % ngpus_per_node == 0):\n    {SAVE}\n", []),
    "device from int": (DIST + "r = dist.get_rank()\nx = torch.randn(2, device=torch.device(r))\n", [("MG004", 5)]),
    "grad count is no gradient": (
        DIST + "num_grad_none = torch.tensor(sum(p.grad is None for p in ps))\ndist.all_reduce(num_grad_none)\n",
        [],
    ),
    "grad buffer": (
        DIST + "flat_grads = torch.cat([g.flatten() for g in gs])\ndist.all_reduce(flat_grads)\n",
        [("MG012", 5)],
    ),
    "nanogpt sync flag": (
        DIST + "from torch.nn.parallel import DistributedDataParallel as DDP\nm = DDP(net)\n"
        "for i, b in enumerate(data):\n    m.require_backward_grad_sync = (i + 1) % 4 == 0\n"
        "    m(b).sum().backward()\n    if (i + 1) % 4 == 0:\n        opt.step()\n",
        [],
    ),
    "accumulation without no_sync": (
        DIST + "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "m = DDP(net)\nfor i, b in enumerate(data):\n    m(b).sum().backward()\n"
        "    if i % 4:\n        continue\n    optimizer.step()\n",
        [("MG011", 7)],
    ),
    "nested syntax ok": ("x = " + "(" * 50 + "1" + ")" * 50 + "\n", []),
}

# Regressions from a user's report: (source, expected (rule, line) list). Each failed before its fix.
DDP_IMPORT = DIST + "from torch.nn.parallel import DistributedDataParallel as DDP\n"  # 4 lines
REPORTED = {
    # MG007: the PyTorch DDP tutorial saves ddp_model.state_dict() and loads it back into ddp_model
    "ddp tutorial checkpoint": (
        DDP_IMPORT + "def demo(rank):\n    ddp_model = DDP(net.to(rank), device_ids=[rank])\n"
        "    if rank == 0:\n        torch.save(ddp_model.state_dict(), 'ckpt.pt')\n"
        "    dist.barrier()\n    ddp_model.load_state_dict(torch.load('ckpt.pt', "
        "map_location={'cuda:0': f'cuda:{rank}'}))\n",
        [],
    ),
    "ddp loaded into another ddp name": (
        DDP_IMPORT + "a = DDP(net)\nif rank == 0:\n"
        "    torch.save(a.state_dict(), 'c.pt')\nb = DDP(net2)\n"
        "b.load_state_dict(torch.load('c.pt', map_location='cpu'))\n",
        [],
    ),
    "ddp saved, loaded into the plain model": (
        DDP_IMPORT + "a = DDP(net)\nif rank == 0:\n"
        "    torch.save(a.state_dict(), 'c.pt')\n"
        "net.load_state_dict(torch.load('c.pt', map_location='cpu'))\n",
        [("MG007", 7)],
    ),
    # MG008: CPU-side state (scheduler, scaler, RNG) needs no map_location; models and optimizers do
    "load scheduler state": (DIST + "sched.load_state_dict(torch.load('scheduler.pt', weights_only=True))\n", []),
    "load trainer cpu states": (
        DIST + "checkpoint_rng_state = torch.load(rng_file, weights_only=True)\n"
        "self.lr_scheduler.load_state_dict(\n    torch.load(os.path.join(checkpoint, "
        "SCHEDULER_NAME), weights_only=True))\n"
        "self.accelerator.scaler.load_state_dict(torch.load(os.path.join(checkpoint, "
        "SCALER_NAME)))\nrng = torch.load(f'rng_state_{rank}.pth')\n"
        "epoch = torch.load('epoch.pt')\nsampler.load_state_dict(torch.load(p))\n",
        [],
    ),
    "load model, optimizer, checkpoint": (
        DIST + "model.load_state_dict(torch.load('model.pt'))\n"
        "optimizer.load_state_dict(torch.load('optimizer.pt', weights_only=True))\n"
        "ckpt = torch.load('checkpoint_epoch_5.pt')\n"
        "state = torch.load(args.resume)\n"
        "sched.load_state_dict(torch.load(args.resume)['scheduler'])\n"
        "model_rng = torch.load(p)\n",
        [("MG008", 4), ("MG008", 5), ("MG008", 6), ("MG008", 7), ("MG008", 8), ("MG008", 9)],
    ),
    # MG013: teardown under an alias, in a helper from another file; DeepSpeed's init; no call, no teardown
    "destroy under an alias": (
        "import torch.distributed as dist\n"
        "from torch.distributed import destroy_process_group as cleanup\n"
        "dist.init_process_group('nccl')\ncleanup()\n",
        [],
    ),
    "destroy by assignment alias": (
        "import torch.distributed as dist\nbye = dist.destroy_process_group\ndist.init_process_group('nccl')\nbye()\n",
        [],
    ),
    "destroy at exit": (
        "import atexit\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "atexit.register(dist.destroy_process_group)\n",
        [],
    ),
    "teardown helper elsewhere": (
        "import torch.distributed as dist\nimport utils\n"
        "dist.init_process_group('nccl')\nutils.cleanup_distributed()\n",
        [],
    ),
    "teardown helper imported": (
        "import torch.distributed as dist\nfrom common import teardown\ndist.init_process_group('nccl')\nteardown()\n",
        [],
    ),
    "deepspeed init": ("import deepspeed\ndeepspeed.init_distributed()\n", []),
    "destroy without parentheses": (
        "import torch.distributed as dist\ndist.init_process_group('nccl')\ndist.destroy_process_group\n",
        [("MG013", 2)],
    ),
    "in-file cleanup that does not destroy": (
        "import torch.distributed as dist\ndef cleanup():\n    pass\ndist.init_process_group('nccl')\ncleanup()\n",
        [("MG013", 4)],
    ),
    # MG009: per-rank lines with the rank in them are what the fix recommends
    "prints with the rank": (
        "import logging\n" + DIST + "rank = dist.get_rank()\nprint(f'[rank {rank}] starting')\n"
        "print('[rank {}] up'.format(dist.get_rank()))\n"
        "print('local %s' % os.environ['LOCAL_RANK'])\n"
        "print('device', device_id)\nprint(f'{args.local_rank}: ready')\n"
        "logging.info('rank %d ready', rank)\nprint('done')\n",
        [("MG009", 12)],
    ),
    "torchrun tutorial print": (
        DIST + "class Trainer:\n    def __init__(self, gpu_id):\n        self.gpu_id = gpu_id\n"
        "    def _run_epoch(self, epoch):\n        print(f'[GPU{self.gpu_id}] Epoch {epoch}')\n"
        "    def train(self):\n        self._run_epoch(0)\n        print(f'epoch done')\n"
        "Trainer(0).train()\n",
        [("MG009", 11)],
    ),
    # MG003: a sampler made inside the DataLoader call, looped over epochs, never set_epoch'd
    "inline sampler": (
        "from torch.utils.data import DataLoader, DistributedSampler\ndef train(ds, model):\n"
        "    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))\n"
        "    for epoch in range(10):\n        for i, x in enumerate(loader):\n            model(x)\n",
        [("MG003", 3)],
    ),
    "inline sampler with loader.sampler.set_epoch": (
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))\nfor epoch in range(10):\n"
        "    loader.sampler.set_epoch(epoch)\n    for x in loader:\n        model(x)\n",
        [],
    ),
    "inline sampler, one loader per dataset": (
        "from torch.utils.data import DataLoader, DistributedSampler\nfor ds in datasets:\n"
        "    loader = DataLoader(ds, sampler=DistributedSampler(ds))\n    for x in loader:\n        model(x)\n",
        [],
    ),
    "inline sampler, no shuffle or handed away": (
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "a = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))\n"
        "b = DataLoader(ds, sampler=DistributedSampler(ds))\nfor epoch in range(10):\n"
        "    for x in a:\n        model(x)\n    run_epoch(b)\n",
        [],
    ),
    # MG011: no_sync in one function does not excuse another
    "no_sync in another function": (
        DDP_IMPORT + "def good(net, data, opt):\n    m = DDP(net)\n"
        "    for i, b in enumerate(data):\n        with m.no_sync():\n"
        "            m(b).sum().backward()\n        if (i + 1) % 4 == 0:\n"
        "            opt.step()\ndef bad(net, data, opt):\n    m = DDP(net)\n"
        "    for i, b in enumerate(data):\n        m(b).sum().backward()\n"
        "        if (i + 1) % 4 == 0:\n            opt.step()\n",
        [("MG011", 15)],
    ),
    "no_sync through a helper": (
        DDP_IMPORT + "import contextlib\nclass T:\n    def __init__(self, net):\n"
        "        self.m = DDP(net)\n        self.sync = self.m.no_sync\n"
        "    def ctx(self, i):\n        return contextlib.nullcontext() if i % 4 == 3 "
        "else self.m.no_sync()\n    def fit(self, data, opt):\n"
        "        for i, b in enumerate(data):\n            with self.ctx(i):\n"
        "                self.m(b).sum().backward()\n            if i % 4 == 3:\n"
        "                opt.step()\n    def fit2(self, data, opt):\n"
        "        for i, b in enumerate(data):\n            with self.sync():\n"
        "                self.m(b).sum().backward()\n            if i % 4 == 3:\n"
        "                opt.step()\n",
        [],
    ),
}


@pytest.mark.parametrize("name", sorted(REPORTED))
def test_reported_case(name):
    source, expected = REPORTED[name]
    assert _pairs(check_source(source)) == expected


def test_set_epoch_once_says_it_is_not_in_the_epoch_loop():
    source, _ = SNIPPETS["set_epoch once"]
    message = check_source(source)[0].message
    assert "`s.set_epoch(...)` is called, but not inside the epoch loop" in message and "only once" not in message
    never = check_source(SNIPPETS["loader kept"][0])[0].message
    assert "`s.set_epoch(epoch)` is never called" in never


def test_cost_grows_linearly_with_module_level_code(monkeypatch):
    """The rank-0 guard search used to rescan every earlier statement of a block for each print or
    save in it: quadratic in a flat script (16 s at 20k lines). Count the guard tests it makes."""
    from advisor.check import guards

    calls = []
    real = guards._holds
    monkeypatch.setattr(guards, "_holds", lambda *a: calls.append(1) or real(*a))
    for n in (500, 2000):
        calls.clear()
        body = "".join(f"if step == {i}:\n    step += 1\nprint('step', step)  # advisor: ignore\n" for i in range(n))
        check_source(DIST + "dist.init_process_group('nccl')\n" + body + "dist.destroy_process_group()\n")
        assert len(calls) < 8 * n, (n, len(calls))


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet(name):
    source, expected = SNIPPETS[name]
    assert _pairs(check_source(source)) == expected


def test_select_and_ignore_in_the_api():
    path = DATA / "mg009_bad.py"
    text = path.read_text()
    assert _pairs(check_source(text, select=["MG009"], ignore=["MG009"])) == []
    assert len(check_source(text, ignore=["MG009"])) == 0
    assert check_paths([path, DATA / "mg013_bad.py"]) == _check(path) + _check(DATA / "mg013_bad.py")


def test_inline_ignore_comments():
    lines = (DATA / "mg002_bad.py").read_text().splitlines()
    lines[17] += "  # advisor: ignore[MG003, mg002]"
    assert _pairs(check_source("\n".join(lines))) == [("MG002", 20)]
    lines[19] += "  # advisor: ignore[MG001]"
    assert _pairs(check_source("\n".join(lines))) == [("MG002", 20)]
    lines[19] += "  # Advisor: ignore"
    assert check_source("\n".join(lines)) == []
    quoted = "from torch import nn\nx = nn.DataParallel(m, name='# advisor: ignore')\n"
    assert _pairs(check_source(quoted)) == [("MG001", 2)]


def test_parse_errors_name_the_line():
    with pytest.raises(CheckError) as err:
        check_source("import torch\n\ndef main(:\n    pass\n", "train.py")
    assert str(err.value).startswith("train.py:3: cannot parse: ") and err.value.line == 3
    with pytest.raises(CheckError, match=r"^x.py:2: cannot parse: NUL byte"):
        check_source("a = 1\nb = '\x00'\n", "x.py")


def test_pathological_sources():
    huge = "import torch.distributed as dist\nfor p in ps:\n    dist.all_reduce(p.grad[0x" + "F" * 5000 + "])\n"
    assert _pairs(check_source(huge)) == [("MG012", 3)]  # the message cannot print the literal: no crash
    with pytest.raises(CheckError, match=r"^<string>:1: cannot parse: "):
        check_source("x = " + "9" * 5000 + "\n")
    deep = "import torch\nx = " + "-" * 5000 + "1\ntorch.save(model, 'm.pt')\n"
    try:
        assert _pairs(check_source(deep)) == [("MG006", 3)]
    except CheckError as err:
        assert "cannot parse" in str(err)


def test_python_warnings_in_the_checked_file_stay_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_source('import re\nnumber = re.compile("\\d+")\nx = 1if number else 2\n') == []


def test_finding_is_frozen_and_serialisable():
    finding = _check(DATA / "mg001_bad.py")[0]
    with pytest.raises(AttributeError):
        finding.line = 1
    assert set(finding.to_dict()) == {"path", "line", "col", "rule", "severity", "message", "fix", "pitfall"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted((DATA).glob("*.py"))),
    st.integers(0, 200),
    st.integers(1, 30),
    st.text(alphabet="()[]{}:=.,'\"\n #\\ \tifdelsx0123", max_size=20),
)
def test_mangled_scripts_never_crash(path, start, length, junk):
    """Any cut or splice of a real script: findings or a CheckError, never another exception."""
    lines = path.read_text().splitlines(keepends=True)
    text = "".join(lines[:start]) + junk + "".join(lines[start + length :])
    try:
        findings = check_source(text, "x.py")
    except CheckError as err:
        assert str(err).startswith("x.py:") and "\n" not in str(err)
    else:
        assert all(f.rule in RULES for f in findings)


# --- CLI -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def junk(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("junk")
    (d / "broken.py").write_text("import torch\n\nfor x in range(3)\n    pass\n")
    (d / "binary.py").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe")
    (d / "latin.py").write_bytes(b"x = 1\ny = '\xe9'\n")
    (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    return {
        "broken": str(d / "broken.py"),
        "binary": str(d / "binary.py"),
        "latin": str(d / "latin.py"),
        "png": str(d / "image.png"),
        "dir": str(d),
    }


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_cli_exit_codes(capsys):
    code, out, err = _run(capsys, str(DATA / "mg001_good.py"), str(DATA / "mg013_good.py"))
    assert (code, out) == (0, "") and "no findings" in err
    code, out, _ = _run(capsys, str(DATA / "mg002_bad.py"))
    assert code == 1
    assert out.splitlines()[0] == (
        f"{DATA / 'mg002_bad.py'}:18: MG002 DistributedSampler and shuffle=True are exclusive: the DataLoader "
        "refuses both (pitfall 3, docs/pitfalls.md); fix: drop shuffle=True from the DataLoader (DistributedSampler "
        "shuffles) and call sampler.set_epoch(epoch) each epoch"
    )
    code, out, _ = _run(capsys, str(DATA / "mg010_bad.py"))  # info only: printed, exit 0
    assert code == 0 and " MG010 " in out
    code, _, _ = _run(capsys, str(DATA / "mg009_bad.py"), "--select", "MG009")
    assert code == 1


def test_cli_json(capsys):
    code, out, err = _run(capsys, "--json", str(DATA / "mg007_bad.py"), str(DATA / "mg007_good.py"))
    doc = json.loads(out)
    assert code == 1 and err == ""
    assert [(d["rule"], d["line"], d["severity"]) for d in doc] == [("MG007", 29, "warning"), ("MG007", 32, "warning")]
    assert doc[0]["pitfall"] == "pitfall 7" and doc[0]["path"].endswith("mg007_bad.py")
    code, out, _ = _run(capsys, "--json", str(DATA / "mg007_good.py"))
    assert (code, json.loads(out)) == (0, [])


def test_cli_select_ignore_and_rules(capsys):
    bad = str(DATA / "mg009_bad.py")
    assert _run(capsys, bad, "--ignore", "MG009")[0] == 0
    assert _run(capsys, bad, "--select", "mg001,MG002")[0] == 0
    code, out, _ = _run(capsys, "--list-rules")
    assert code == 0 and len(out.splitlines()) == len(RULES) and out.startswith("MG001")
    code, out, _ = _run(capsys, "--list-rules", "--json")
    assert [r["id"] for r in json.loads(out)] == list(RULES)


@pytest.mark.parametrize(
    "argv,needles",
    [
        ([], ["no files to check"]),
        (["{broken}"], ["{broken}:3: cannot parse: "]),
        (["{binary}"], ["{binary}:1: cannot parse: NUL byte"]),
        (["{latin}"], ["{latin}:2: cannot parse: not utf-8 text"]),
        (["{png}"], ["{png}:", "cannot parse"]),
        (["{dir}"], ["is a directory"]),
        (["/nonexistent/train.py"], ["/nonexistent/train.py: cannot read: No such file"]),
        (["--select", "MG099", "x.py"], ["unknown rule id 'MG099'", "MG001, MG002"]),
        (["--ignore", "", "x.py"], ["--ignore", "valid ids"]),
        (["--select", "", "x.py"], ["--select needs at least one rule id", "valid ids"]),
        (["--select", " , ", "x.py"], ["--select needs at least one rule id"]),
        (["--bogus"], ["unrecognized arguments", "--help"]),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(capsys, junk, argv, needles):
    code, out, err = _run(capsys, *(a.format(**junk) for a in argv))
    assert code == 2 and out == ""
    assert err.startswith("advisor: error: ") and err.count("\n") == 1
    for needle in needles:
        assert needle.format(**junk) in err


def test_cli_bad_file_does_not_hide_the_others(capsys, junk):
    bad, good = str(DATA / "mg001_bad.py"), str(DATA / "mg013_good.py")
    code, out, err = _run(capsys, junk["broken"], bad, junk["binary"], good)
    assert code == 2 and [line.split(": ")[0] for line in out.splitlines()] == [f"{bad}:13"]
    lines = err.splitlines()
    assert lines[:2] == [
        f"advisor: error: {junk['broken']}:3: cannot parse: expected ':'",
        f"advisor: error: {junk['binary']}:1: cannot parse: NUL byte (a binary file, not Python source)",
    ]
    assert len(lines) == 4 and "2 file(s)" in lines[2] and "2 more could not be checked" in lines[2]
    assert lines[3].startswith(f"advisor check: {bad} use(s) no torch.distributed")  # DataParallel: one process
    code, out, err = _run(capsys, "--json", junk["broken"], bad, "/nonexistent/train.py")
    assert code == 2 and [(d["rule"], d["line"]) for d in json.loads(out)] == [("MG001", 13)]
    assert err.splitlines() == [
        f"advisor: error: {junk['broken']}:3: cannot parse: expected ':'",
        "advisor: error: /nonexistent/train.py: cannot read: No such file or directory",
    ]
    code, out, _ = _run(capsys, "--json", junk["broken"])
    assert (code, json.loads(out)) == (2, [])
    findings, errors = check_files([junk["latin"], bad])
    assert _pairs(findings) == [("MG001", 13)] and [e.line for e in errors] == [2]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the 3.12 grammar parses it")
@pytest.mark.parametrize(
    "source",
    [
        "def f[T](x: T):\n    return x\n",
        "class Box[T]:\n    pass\n",
        "type Vector = list[float]\n",
        "x = 1\nasync def g[T](): pass\n",
    ],
)
def test_python_312_syntax_gets_a_hint(source):
    with pytest.raises(CheckError) as err:
        check_source(source, "new.py")
    here = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    assert str(err.value).startswith("new.py:") and "Python 3.12 syntax" in str(err.value) and here in str(err.value)
    with pytest.raises(CheckError) as err:
        check_source("def f(:\n    pass\n", "old.py")
    assert "3.12" not in str(err.value)


def test_cli_reads_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((DATA / "mg001_bad.py").read_bytes())))
    code, out, err = _run(capsys, "-", str(DATA / "mg013_good.py"))
    assert code == 1 and out.startswith("<stdin>:13: MG001 ") and "2 file(s)" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"def broken(:\n")))
    code, out, err = _run(capsys, "--json", "-")
    assert (code, json.loads(out)) == (2, []) and err.startswith("advisor: error: <stdin>:1: cannot parse: ")
    monkeypatch.setattr(sys, "stdin", io.StringIO("from torch import nn\nnn.DataParallel(m)\n"))  # no byte buffer
    assert _run(capsys, "-")[1].startswith("<stdin>:2: MG001 ")
    from advisor.check.cli import build_parser

    assert "reads one from stdin" in build_parser().format_help()


def test_cli_as_a_module(junk):
    env_python = [sys.executable, "-m", "advisor.check.cli"]
    ok = subprocess.run([*env_python, str(DATA / "mg001_bad.py")], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 1 and ":13: MG001 " in ok.stdout
    bad = subprocess.run([*env_python, junk["broken"]], cwd=ROOT, capture_output=True, text=True)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == f"advisor: error: {junk['broken']}:3: cannot parse: expected ':'"
        and "Traceback" not in bad.stderr
    )
    piped = subprocess.run(
        [*env_python, "-"], cwd=ROOT, capture_output=True, text=True, input=(DATA / "mg001_bad.py").read_text()
    )
    assert piped.returncode == 1 and piped.stdout.startswith("<stdin>:13: MG001 ")


def test_single_process_script_gets_a_pointer(tmp_path, capsys):
    script = tmp_path / "single.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nprint(model)\n")
    assert main([str(script)]) == 0
    err = capsys.readouterr().err
    assert f"{script} use(s) no torch.distributed" in err and "--emit DIR" in err
    assert main([str(DATA / "mg002_good.py")]) == 0
    assert "use(s) no torch.distributed" not in capsys.readouterr().err


def test_mg013_only_for_scripts():
    """A library module that only defines setup() leaves the teardown to its caller; a script must destroy."""
    module = "import torch.distributed as dist\ndef setup():\n    dist.init_process_group('nccl')\n"
    assert _pairs(check_source(module)) == []
    assert _pairs(check_source(module + "if __name__ == '__main__':\n    setup()\n")) == [("MG013", 3)]
    assert _pairs(check_source(module + "setup()\n")) == [("MG013", 3)]


SINGLE_BRANCH = {
    "else of if ddp (nanoGPT)": (
        "import os, torch\nimport torch.distributed as dist\n"
        "ddp = int(os.environ.get('RANK', -1)) != -1\nif ddp:\n"
        "    dist.init_process_group('nccl')\nelse:\n    torch.save({}, 'm.pt')\n",
        [],
    ),
    "if not ddp": (
        "import os, torch\nimport torch.distributed as dist\nddp = 'RANK' in os.environ\nif ddp:\n"
        "    dist.init_process_group('nccl')\nif not ddp:\n    torch.save({}, 'm.pt')\n",
        [],
    ),
    "timm else log": (
        "import logging, torch\n_logger = logging.getLogger('train')\nif args.distributed:\n"
        "    torch.distributed.init_process_group(backend='nccl')\nelse:\n"
        "    _logger.info('Training with a single process on 1 device.')\n",
        [],
    ),
    "torchvision print silencer": (
        "import torch\nimport utils\nutils.init_distributed_mode(args)\nprint(args)\n"
        "model = torch.nn.parallel.DistributedDataParallel(model)\n",
        [],
    ),
    "silencer does not cover saves": (
        "import torch\nimport utils\nutils.init_distributed_mode(args)\n"
        "model = torch.nn.parallel.DistributedDataParallel(model)\n"
        "torch.save(model.module.state_dict(), 'm.pt')\n",
        [("MG009", 5)],
    ),
    "else of an unrelated if": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "if epoch > 3:\n    pass\nelse:\n    torch.save({}, 'm.pt')\n",
        [("MG009", 7)],
    ),
}


@pytest.mark.parametrize("name", sorted(SINGLE_BRANCH))
def test_single_process_branches_and_print_silencers(name):
    source, expected = SINGLE_BRANCH[name]
    assert _pairs(check_source(source, select=["MG009"])) == expected


def test_framework_scripts_are_not_called_single_process(tmp_path, capsys):
    script = tmp_path / "clm.py"
    script.write_text("from accelerate import Accelerator\naccelerator = Accelerator()\n")
    assert main([str(script)]) == 0
    assert "use(s) no torch.distributed" not in capsys.readouterr().err


def test_an_attribute_with_one_known_value_is_followed():
    """``run.model = DDP(...)`` in one function, saved in another: MG006/MG007 see the wrapper through the attribute;
    an attribute given two known values is not followed (which one is saved is unknown)."""
    wrap = "\ndef wrap(run):\n    run.model = DDP(run.module)\n"
    src = (
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        + wrap
        + "\ndef main(run):\n    run.model, run.other = make()\n    wrap(run)\n"
        "    torch.save(run.model.state_dict(), 'm.pt')\n    torch.save(run.model, 'm.pt')\n"
    )
    assert sorted(f.rule for f in check_source(src, "x.py")) == ["MG006", "MG007"]
    twice = src.replace("    wrap(run)\n", "    wrap(run)\n    run.model = run.model.module\n")
    assert [f.rule for f in check_source(twice, "x.py")] == []
