#!/usr/bin/env bash
# Open JupyterLab on notebooks/ (the environment is created first if needed).
#   bash scripts/open_lab.sh [--port 8888] [extra jupyter lab options]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-root)
exec .venv/bin/jupyter lab --notebook-dir=notebooks "${extra[@]}" "$@"
