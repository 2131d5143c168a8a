#!/usr/bin/env bash
# The test suite: set up the environment (venvs pinned by requirements/, packages, Chromium for the browser tests),
# then run every test, fast unit tests first, then multi-process, real-kernel, notebook and
# browser tests (conftest.py orders them), then the XLA job (tests/xla in its own venv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; browser tests will be skipped"
fi
status=0
# --durations: the slowest tests, so CI's log says where its time goes (docs/versions.md, issue 39)
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@" || status=$?
# The XLA job, after the whole main suite (not when a selection of tests was given): tests/xla in
# ./.venv-xla (torch 2.9.0 + torch-xla 2.9.0, built once by setup-xla-env.sh and reused), on
# XLA's CPU backend. ACCEL_NB_SKIP_XLA=1 skips it.
if [ "$#" -eq 0 ] && [ "${ACCEL_NB_SKIP_XLA:-0}" != "1" ]; then
  echo "== XLA job: tests/xla on XLA's CPU backend (ACCEL_NB_SKIP_XLA=1 skips it) =="
  if bash scripts/setup-xla-env.sh; then
    # XLA's CPU backend runs the devices as threads; accel_nb waits out each collective before the
    # next graph, which removed the aborts in XLA's own collective rendezvous ("Termination timeout
    # for `all reduce ...`", docs/tpu.md). Nothing is rerun: if that abort shows again, say so.
    xla_log=$(mktemp)
    xla_status=0
    PJRT_DEVICE=CPU .venv-xla/bin/python -m pytest -q -p no:cacheprovider -rf tests/xla 2>&1 | tee "$xla_log" || xla_status=$?
    if [ "$xla_status" -ne 0 ] && grep -q "rendezvous.cc.*Termination timeout" "$xla_log"; then
      echo "== XLA job: XLA's CPU backend aborted a collective rendezvous (Termination timeout): see docs/tpu.md, 'Devices as threads'; not rerun, please report it with this output =="
    fi
    [ "$xla_status" -eq 0 ] || status=$xla_status
    rm -f "$xla_log"
  else
    echo "error: ./.venv-xla could not be built (bash scripts/setup-xla-env.sh); ACCEL_NB_SKIP_XLA=1 skips the XLA job"
    status=1
  fi
fi
# The notebook-stack jobs, after the XLA job (not when a selection of tests was given): tests/stacks
# in ./.venv-colab (Colab's IPython 7.34 / ipykernel 6.17 / ipywidgets 7.7.1 / notebook 6.5.7, classic
# Notebook 6 in the browser) and ./.venv-kaggle (ipywidgets 8.1.5 / ipykernel 6.29, JupyterLab 4),
# each built once by setup-stack-env.sh and reused. ACCEL_NB_SKIP_STACKS=1 skips them.
if [ "$#" -eq 0 ] && [ "${ACCEL_NB_SKIP_STACKS:-0}" != "1" ]; then
  for stack in colab kaggle; do
    echo "== $stack job: tests/stacks in ./.venv-$stack (ACCEL_NB_SKIP_STACKS=1 skips it) =="
    if bash scripts/setup-stack-env.sh "$stack"; then
      ".venv-$stack/bin/python" -m pytest -q -p no:cacheprovider -rf tests/stacks || status=$?
    else
      echo "error: ./.venv-$stack could not be built (bash scripts/setup-stack-env.sh $stack); ACCEL_NB_SKIP_STACKS=1 skips the stack jobs"
      status=1
    fi
  done
fi
exit "$status"
