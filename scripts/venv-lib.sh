# Sourced by the setup scripts (setup-env.sh, setup-xla-env.sh, setup-stack-env.sh):
#   need_disk GB WHAT   stop with a clear error unless GB gigabytes are free where the venv goes
#   venv_pip ARGS...    pip of $VENV, its output appended to $VENV_LOG and shown only when it fails;
#                       a failing install stops the script (it used to be swallowed: a disk that
#                       filled up mid-install left a half-built venv that the tests then met)
# pip keeps no cache: the CUDA wheels the XLA venv needs would double its footprint on disk.
export PIP_NO_CACHE_DIR=1
need_disk() {
  local gb=$1 what=$2 avail mount
  avail=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
  mount=$(df -P . | awk 'NR==2 {print $6}')
  if [ "$avail" -lt "$gb" ]; then
    echo "error: building $what needs about $gb GB of free disk; $mount has $avail GB free." >&2
    echo "       Free some space (old clones and their venvs, /tmp) and run it again." >&2
    exit 1
  fi
}
venv_pip() {
  if ! "$VENV/bin/python" -m pip "$@" >>"$VENV_LOG" 2>&1; then
    grep -v "is ignored" "$VENV_LOG" | tail -40 >&2
    echo "$(basename "$0"): 'pip $*' failed (the lines above; the whole log: $VENV_LOG)" >&2
    exit 1
  fi
}
