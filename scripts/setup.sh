#!/usr/bin/env bash
# Set up .venv with everything advisor needs. Idempotent: re-running with the same pyproject.toml is a no-op.
# Needs only Python 3.11 on a fresh machine. pip keeps no cache: torch and its CUDA libraries are about 5.5 GB
# installed, and a cached copy of the downloads doubled that on a small disk.
#   bash scripts/setup.sh          # the tool (torch, torchvision, transformers, peft, deepspeed, streamlit,
#                                  # bitsandbytes for QLoRA and 8-bit optimizers)
#   bash scripts/setup.sh --dev    # + test tools, and Debian's chromium/chromedriver for the browser test
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=0
[[ "${1:-}" == "--dev" ]] && DEV=1
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
STAMP=".venv/.advisor-setup-$(sha1sum pyproject.toml | cut -c1-12)-$DEV"
if [[ ! -f "$STAMP" ]]; then
  [[ -x .venv/bin/python ]] || "$PY" -m venv .venv
  # torch first, pinned: pip takes 2.14.1/0.29.1 from local disk on the dev machines.
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1"
  EXTRAS="deepspeed,app,bench,quant"
  [[ $DEV == 1 ]] && EXTRAS="$EXTRAS,test"
  # DS_BUILD_OPS=0: no CUDA/C++ op builds at install time (DeepSpeed installs pure Python).
  DS_BUILD_OPS=0 .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check -e ".[$EXTRAS]"
  if [[ $DEV == 1 ]]; then
    # The tests run ZeRO scripts on the CPU, where DeepSpeed's communication backend JIT-compiles its shared-memory
    # op (deepspeed/comm/torch.py build_shm_op, ShareMemCommBuilder) on first use: build it now, once, into torch's
    # extension directory (about 40 s on 2 cores), not inside the first test that launches DeepSpeed.
    DS_ACCELERATOR=cpu .venv/bin/python -c "from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder('ShareMemCommBuilder').load()" >/tmp/advisor-ds-op.log 2>&1 \
      || echo "setup: DeepSpeed's CPU shared-memory op did not build (see /tmp/advisor-ds-op.log)"
  fi
  rm -f .venv/.advisor-setup-*
  touch "$STAMP"
fi
if [[ $DEV == 1 ]] && ! command -v chromedriver >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
      >/tmp/advisor-apt.log 2>&1 || echo "setup: chromium install failed (see /tmp/advisor-apt.log); the browser test will skip"
  else
    echo "setup: chromium/chromedriver not installed (needs root + apt); the browser test will skip"
  fi
fi
