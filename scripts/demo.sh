#!/usr/bin/env bash
# The main job: set up the environment, then run the quickstart demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if [ -f notebooks/quickstart.ipynb ] && [ -f examples/run_quickstart.py ]; then
  exec .venv/bin/python examples/run_quickstart.py "$@"
fi
exec .venv/bin/python examples/allreduce_demo.py "$@"
