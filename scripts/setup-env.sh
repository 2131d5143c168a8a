#!/usr/bin/env bash
# Create (or reuse) ./.venv and install accel_nb with everything the demo and the tests need.
# Idempotent: re-running with an unchanged pyproject.toml installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.accel_nb-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # The CPU build of torch first, pinned, so nothing pulls the multi-GB CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  DS_BUILD_OPS=0 .venv/bin/python -m pip install -q -e ".[dev,bench]" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import accel_nb, torch, cloudpickle, safetensors, yaml, psutil" 
  echo "$want" > "$stamp"
fi
