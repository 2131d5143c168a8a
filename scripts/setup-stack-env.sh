#!/usr/bin/env bash
# Create (or reuse) the venv of one notebook stack people use, for tests/stacks:
#   colab  -> ./.venv-colab : Colab's kernel stack, exactly IPython 7.34.0, ipykernel 6.17.1,
#             ipywidgets 7.7.1, notebook 6.5.7 (classic front-end), jupyter_client 7.4.9
#   kaggle -> ./.venv-kaggle: Kaggle's, ipywidgets 8.1.5, ipykernel 6.29.x, IPython 8, JupyterLab 4
# accel_nb goes in with `pip install --no-deps -e .` plus its core dependencies, so nothing of
# the stack is upgraded; torch is the CPU wheel 2.13.0 (from this machine's disk).
# Idempotent: re-running with an unchanged pyproject.toml and this script installs nothing.
#   bash scripts/setup-stack-env.sh colab
#   .venv-colab/bin/python -m pytest -q -p no:cacheprovider tests/stacks
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv-lib.sh
STACK=${1:?usage: setup-stack-env.sh colab|kaggle}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}  # Python 3.11 where there is one
case "$STACK" in
  colab)
    STACK_PINS=(IPython==7.34.0 ipykernel==6.17.1 ipywidgets==7.7.1 "widgetsnbextension==3.6.*" notebook==6.5.7
                jupyter_client==7.4.9 traitlets==5.7.1)
    ;;
  kaggle)
    STACK_PINS=(ipywidgets==8.1.5 "ipykernel>=6.29,<6.30" "IPython>=8,<9" "jupyterlab>=4,<5" "jupyter_client>=8")
    ;;
  *) echo "unknown stack '$STACK': use colab or kaggle" >&2; exit 2 ;;
esac
VENV=${ACCEL_NB_STACK_VENV:-.venv-$STACK}
PINS=requirements/$STACK.txt  # a constraints file (docs/versions.md); ACCEL_NB_UNPINNED=1 ignores it
constraints=(-c "$PINS")
{ [ "${ACCEL_NB_UNPINNED:-0}" = "1" ] || [ ! -f "$PINS" ]; } && constraints=()
stamp=$VENV/.accel_nb-stack-installed
want=$( (cat pyproject.toml "$0"; echo "$STACK"; [ ${#constraints[@]} -eq 0 ] && echo unpinned || cat "$PINS") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$VENV/.ready" ]; then
  exit 0
fi
rm -f "$VENV/.ready"
if [ ! -x "$VENV/bin/python" ]; then
  need_disk 4 "$VENV (torch and the $STACK stack)"
  "$PY" -m venv "$VENV"
fi
VENV_LOG=$VENV/install.log
: >"$VENV_LOG"
venv_pip install -q --upgrade ${constraints[@]+"${constraints[@]}"} pip
venv_pip install -q ${constraints[@]+"${constraints[@]}"} "torch==2.13.0"
# the stack, pinned, together with what the tests need (a real kernel, notebook execution,
# the browser driver), in one resolve so none of them moves the pins
venv_pip install -q ${constraints[@]+"${constraints[@]}"} "${STACK_PINS[@]}" numpy "cloudpickle>=2.2" "safetensors>=0.4" "PyYAML>=6" "psutil>=5.9" \
  "matplotlib>=3.7" "pytest>=8" pytest-timeout "nbclient>=0.7" "nbformat>=5" "nbconvert>=7" "playwright>=1.40" \
  "tensorboard>=2.14" "transformers>=4.40" \
  "bitsandbytes>=0.50" "torchao>=0.18"
# (the last line: what the notebooks import; both runtimes ship tensorboard and transformers, and
# big_model_inference.ipynb's section 7 needs accel_nb's quantization extra, which a user of either
# runtime installs with pip install "accel_nb[quantization]")
if ! "$VENV/bin/python" -m pip install -q --no-deps -e . >"$VENV/.editable-install.log" 2>&1; then
  cat "$VENV/.editable-install.log" >&2
  exit 1
fi
"$VENV/bin/python" - "$STACK" <<'PY'
import sys, importlib.metadata as md
import accel_nb, torch  # noqa: F401
want = {"colab": {"ipython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1", "notebook": "6.5.7",
                  "jupyter_client": "7.4.9"},
        "kaggle": {"ipywidgets": "8.1.5"}}[sys.argv[1]]
for name, version in want.items():
    have = md.version(name)
    assert have == version, f"{name} {have} installed, the {sys.argv[1]} stack pins {version}"
if sys.argv[1] == "kaggle":  # the front-end the browser test opens
    assert md.version("jupyterlab").startswith("4."), md.version("jupyterlab")
print(sys.argv[1], {n: md.version(n) for n in ("ipython", "ipykernel", "ipywidgets", "jupyter_client", "torch")})
PY
echo "$STACK" > "$VENV/.accel_nb-stack"  # tests/stacks/conftest.py: which stack this venv is
echo "$want" > "$stamp"
touch "$VENV/.ready"
