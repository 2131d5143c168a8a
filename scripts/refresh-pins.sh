#!/usr/bin/env bash
# Refresh the pins (requirements/*.txt, the constraints files the test venvs are built with): build
# each venv from today's newest releases in a temporary folder and freeze it.
#   bash scripts/refresh-pins.sh [main] [xla] [colab] [kaggle]     (default: all four)
# Then: run bash scripts/test.sh (it rebuilds the venvs on the new pins), update docs/versions.md's
# table, and commit requirements/ with it. See docs/versions.md.
set -euo pipefail
cd "$(dirname "$0")/.."
envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(main xla colab kaggle)
tmp=$(mktemp -d "$PWD/.venv-pins.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for env in "${envs[@]}"; do
  dir=$tmp/$env
  case $env in
    main) ACCEL_NB_UNPINNED=1 ACCEL_NB_VENV=$dir bash scripts/setup-env.sh ;;
    xla) ACCEL_NB_UNPINNED=1 XLA_VENV=$dir bash scripts/setup-xla-env.sh ;;
    colab | kaggle) ACCEL_NB_UNPINNED=1 ACCEL_NB_STACK_VENV=$dir bash scripts/setup-stack-env.sh "$env" ;;
    *) echo "unknown venv '$env': main, xla, colab or kaggle" >&2; exit 2 ;;
  esac
  {
    echo "# The $env test venv's packages, a constraints file for its setup script. Made by"
    echo "# scripts/refresh-pins.sh $env on $(date +%F) ($("$dir/bin/python" -V), $(uname -sm)); docs/versions.md says when and how."
    "$dir/bin/python" -m pip freeze --all --exclude-editable 2>/dev/null | grep -iv '^accel[-_]nb'
  } >"requirements/$env.txt"
  echo "requirements/$env.txt: $(grep -vc '^#' "requirements/$env.txt") packages"
done
