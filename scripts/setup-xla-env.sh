#!/usr/bin/env bash
# Create (or reuse) ./.venv-xla: torch 2.9.0 + torch-xla 2.9.0 and accel_nb (editable), for the
# tests in tests/xla/ on XLA's CPU backend (PJRT_DEVICE=CPU). Kept apart from ./.venv because
# torch_xla imports only with exactly the torch it was built against.
# Idempotent: re-running with an unchanged pyproject.toml and this script installs nothing.
# On success it touches .venv-xla/.ready.
#   bash scripts/setup-xla-env.sh
#   XLA_TORCH_VERSION=2.8.0 XLA_VENV=.venv-xla28 bash scripts/setup-xla-env.sh   # Kaggle's pairing, kept apart
#   PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -q -p no:cacheprovider tests/xla
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh
PY=${PYTHON:-python3}
VENV=${XLA_VENV:-.venv-xla}
TORCH_VERSION=${XLA_TORCH_VERSION:-2.9.0}
TORCH_XLA_VERSION=$TORCH_VERSION  # torch_xla's releases pair with the torch of the same number
PINS=requirements/xla.txt  # a constraints file (docs/versions.md); ACCEL_NB_UNPINNED=1 ignores it
constraints=(-c "$PINS")
{ [ "${ACCEL_NB_UNPINNED:-0}" = "1" ] || [ ! -f "$PINS" ]; } && constraints=()
stamp=$VENV/.accel_nb-xla-installed
want=$( (cat pyproject.toml "$0"; echo "$TORCH_VERSION"; [ ${#constraints[@]} -eq 0 ] && echo unpinned || cat "$PINS") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$VENV/.ready" ]; then
  exit 0
fi
rm -f "$VENV/.ready"
if [ ! -x "$VENV/bin/python" ]; then
  need_disk 10 "$VENV (torch 2.9 with its CUDA libraries, torch_xla)"
  "$PY" -m venv "$VENV"
fi
VENV_LOG=$VENV/install.log
: >"$VENV_LOG"
venv_pip install -q --upgrade ${constraints[@]+"${constraints[@]}"} pip
# torch_xla works only with exactly the torch it was built against; PyPI's torch 2.9.0 is a
# CUDA build (large download), which torch_xla's CPU backend uses without a GPU.
venv_pip install -q ${constraints[@]+"${constraints[@]}"} "torch==$TORCH_VERSION" "torch-xla==$TORCH_XLA_VERSION"
# accel_nb itself without its dependency list (that would pull the newest torch), then its
# small dependencies and what tests/xla needs (pytest, a real Jupyter kernel).
if ! "$VENV/bin/python" -m pip install -q --no-deps -e . >"$VENV/.editable-install.log" 2>&1; then
  cat "$VENV/.editable-install.log" >&2  # setuptools' deprecation notes stay in the log unless it fails
  exit 1
fi
venv_pip install -q ${constraints[@]+"${constraints[@]}"} numpy "cloudpickle>=2.2" "safetensors>=0.4" "PyYAML>=6" "psutil>=5.9" \
  "pytest>=8" pytest-timeout "ipykernel>=6" "jupyter_client>=8" "nbclient>=0.10" "nbformat>=5" \
  "ipywidgets>=8" "IPython>=8"
PJRT_DEVICE=CPU "$VENV/bin/python" -c "
import torch, torch_xla, accel_nb
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', torch.__version__
print('torch', torch.__version__, 'torch_xla', torch_xla.__version__, 'device', torch_xla.device())
"
echo "$want" > "$stamp"
touch "$VENV/.ready"
