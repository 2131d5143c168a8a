#!/usr/bin/env bash
# The test suite on a loaded machine: scripts/test.sh (the README's command) with a CPU hog on every
# core for the whole run, to find tests that pass only on a quiet machine.
#
#   bash scripts/stress_test.sh                          # the whole suite, once
#   STRESS_RUNS=3 bash scripts/stress_test.sh            # three times in a row, a summary at the end
#   bash scripts/stress_test.sh tests/test_cli.py -x     # pytest arguments, passed on to scripts/test.sh
#
# STRESS_HOGS sets the number of busy-loop processes (default: one per core). Each hog is a bounded
# busy loop that also ends by itself when this script is gone (it watches its parent), and the trap
# below stops them on every exit, Ctrl-C included.
set -uo pipefail
cd "$(dirname "$0")/.."

hogs=${STRESS_HOGS:-$(nproc)}
runs=${STRESS_RUNS:-1}
pids=()

stop_hogs() {
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null
  done
  pids=()
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

HOG='
import os
parent = os.getppid()
n = 0
while True:
    n += 1
    if n % 2_000_000 == 0 and os.getppid() != parent:  # the script is gone: so is the hog
        break
'
for _ in $(seq 1 "$hogs"); do
  python3 -c "$HOG" &
  pids+=($!)
done
echo "== stress: $hogs busy-loop process(es) on $(nproc) core(s): ${pids[*]} =="

status=0
summary=()
for run in $(seq 1 "$runs"); do
  echo "== stress run $run/$runs: bash scripts/test.sh $* =="
  start=$(date +%s)
  bash scripts/test.sh "$@"
  code=$?
  summary+=("run $run/$runs: $([ "$code" -eq 0 ] && echo passed || echo "FAILED (exit $code)") in $(( $(date +%s) - start )) s")
  [ "$code" -eq 0 ] || status=$code
done
echo "== stress summary ($hogs hog(s)) =="
printf '%s\n' "${summary[@]}"
exit "$status"
