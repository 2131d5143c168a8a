#!/usr/bin/env bash
# Create (or reuse) ./.venv and install accel_nb with everything the demo and the tests need, at the
# versions pinned in requirements/main.txt (a constraints file: what the suite was last tested with;
# docs/versions.md says how to refresh it). Idempotent: re-running with unchanged pyproject.toml,
# pins and script installs nothing.
#   ACCEL_NB_VENV=DIR        build DIR instead of ./.venv
#   ACCEL_NB_UNPINNED=1      ignore the pins: today's newest releases, upgraded at most once a day
#                            (scripts/test-newest.sh)
# pip's own output goes to DIR/install.log and is shown only when an install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh
PY=${PYTHON:-python3}
VENV=${ACCEL_NB_VENV:-.venv}
PINS=requirements/main.txt
BNB_OLDEST=0.50.0  # the oldest bitsandbytes the extra allows, beside the pinned one (tests/test_bnb_layout.py)
constraints=(-c "$PINS")
[ "${ACCEL_NB_UNPINNED:-0}" = "1" ] && constraints=()
if [ ! -x "$VENV/bin/python" ]; then
  need_disk 4 "$VENV (torch and the extras)"
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.accel_nb-installed
want=$( (cat pyproject.toml "$0"; [ ${#constraints[@]} -eq 0 ] && date +unpinned-%F || cat "$PINS") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  VENV_LOG=$VENV/install.log
  : >"$VENV_LOG"
  venv_pip install -q --upgrade ${constraints[@]+"${constraints[@]}"} pip
  # The CPU build of torch first, pinned, so nothing pulls the multi-GB CUDA build.
  venv_pip install -q ${constraints[@]+"${constraints[@]}"} "torch==2.13.0"
  if [ ${#constraints[@]} -eq 0 ]; then
    DS_BUILD_OPS=0 venv_pip install -q --upgrade --upgrade-strategy eager -e ".[dev,bench]" "torch==2.13.0"
  else
    DS_BUILD_OPS=0 venv_pip install -q "${constraints[@]}" -e ".[dev,bench]"
  fi
  venv_pip install -q --no-deps --upgrade --target "$VENV/bitsandbytes-$BNB_OLDEST" "bitsandbytes==$BNB_OLDEST"
  "$VENV/bin/python" -c "import accel_nb, torch, cloudpickle, safetensors, yaml, psutil"
  echo "$want" > "$stamp"
fi
