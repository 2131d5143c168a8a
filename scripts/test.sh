#!/usr/bin/env bash
# The test suite: set up the environment (venv, packages, Chromium for the browser tests),
# then run every test, fast unit tests first, then multi-process, real-kernel, notebook and
# browser tests (conftest.py orders them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; browser tests will be skipped"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
