#!/usr/bin/env bash
# The GPU check in one command: on a machine with an NVIDIA GPU, run every GPU-marked test and
# the GPU benchmarks, and write the figures (with date and device) into docs/benchmarks.md.
#
#   bash scripts/gpu_check.sh            # from the repository root or anywhere
#
# Without an NVIDIA GPU it says so and exits 0 having run nothing. It works offline when torch,
# safetensors and transformers (and accelerate, for the side-by-side figures) are installed:
# accel_nb itself is installed with `pip install -e . --no-deps --no-build-isolation`, and other
# packages are pip-installed only when missing.
#
# Steps: 1. GPU and Python (.venv/bin/python, else the python3 whose torch sees CUDA)
#        2. missing packages only        3. pytest -m gpu (every GPU-marked test)
#        4. python -m benchmarks run big_model training (GPU load ratio, offload streaming
#           fraction of pinned H2D bandwidth, GPT-2-small bf16 train step vs plain PyTorch;
#           with 2+ GPUs, GPT-2-small bf16 step time with FSDP vs DDP)
#        5. a one-GPU notebook_launcher run in a real Jupyter kernel
#        6. docs/benchmarks.md: a "GPU run" section with those figures (the rest is kept)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi missing or sees none): nothing was run."
  exit 0
fi
echo "gpu_check: $(nvidia-smi -L | head -n 4)"

has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
PY=""
for candidate in "$ROOT/.venv/bin/python" "$(command -v python3 || true)" "$(command -v python || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && has_cuda_torch "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
  echo "gpu_check: an NVIDIA GPU is present but no Python here has a torch that sees it."
  echo "           Install a CUDA build of torch (https://pytorch.org/get-started/locally/) and run again."
  exit 1
fi
echo "gpu_check: using $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"

# -- 2. packages: accel_nb from this checkout, everything else only if missing ----------------------
PIP=("$PY" -m pip install -q --disable-pip-version-check)
# pyproject.toml's SPDX license string needs setuptools 77 to build; offline, the build uses the
# setuptools installed here (--no-build-isolation), so with an older one accel_nb runs from PYTHONPATH
if ! "$PY" -c 'import accel_nb, os, sys; sys.exit(0 if os.path.dirname(os.path.dirname(accel_nb.__file__)) == sys.argv[1] else 1)' "$ROOT" 2>/dev/null; then
  if "$PY" -c 'import sys, setuptools; sys.exit(0 if int(setuptools.__version__.split(".")[0]) >= 77 else 1)' 2>/dev/null; then
    "${PIP[@]}" -e . --no-deps --no-build-isolation >"$ROOT/.gpu-install.log" 2>&1 || {
      echo "gpu_check: could not install accel_nb from $ROOT (.gpu-install.log says why); running with PYTHONPATH instead"
    }
  else
    echo "gpu_check: setuptools here is older than 77 (needed to build accel_nb offline): running accel_nb from PYTHONPATH"
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
missing=()
for pair in numpy:numpy cloudpickle:cloudpickle safetensors:safetensors yaml:PyYAML psutil:psutil \
            pytest:pytest pytest_timeout:pytest-timeout jupyter_client:jupyter_client ipykernel:ipykernel \
            ipywidgets:ipywidgets transformers:transformers accelerate:accelerate; do
  "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu_check: installing missing packages: ${missing[*]}"
  "${PIP[@]}" "${missing[@]}" || echo "gpu_check: could not install ${missing[*]} (offline?); the steps needing them will say so"
fi

OUT=${GPU_CHECK_OUT:-$(mktemp -d)}
mkdir -p "$OUT"
status=0
# -- 3. every GPU-marked test ---------------------------------------------------------------------
echo "gpu_check: pytest -m gpu"
timeout "${GPU_CHECK_PYTEST_S:-300}" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$OUT/pytest.txt"
pytest_rc=${PIPESTATUS[0]}
[ "$pytest_rc" -eq 0 ] || status=1
# -- 4. the GPU benchmarks (their CPU rows come along) ----------------------------------------------
BENCHES=${GPU_CHECK_BENCHES:-big_model training fsdp}
echo "gpu_check: python -m benchmarks run $BENCHES"
# shellcheck disable=SC2086
timeout "${GPU_CHECK_BENCH_S:-300}" "$PY" -m benchmarks run $BENCHES --json "$OUT/bench.json" || status=1
# -- 5. one-GPU notebook_launcher in a real kernel --------------------------------------------------
echo "gpu_check: notebook_launcher on one GPU in a real kernel"
timeout "${GPU_CHECK_KERNEL_S:-180}" "$PY" scripts/gpu_check_report.py kernel-launch "$OUT/kernel.json" || status=1
# -- 5b. more GPU processes than GPUs: refused before any rank starts --------------------------------
echo "gpu_check: more GPU processes than GPUs, refused before start"
timeout 240 "$PY" scripts/gpu_check_report.py refusal "$OUT/refusal.json" || status=1
# -- 5c. one GPU, DeepSpeed ZeRO-2 with the optimizer offloaded to the CPU, vs the reference ------------
if "$PY" -c "import deepspeed" >/dev/null 2>&1; then
  echo "gpu_check: DeepSpeed ZeRO-2 optimizer offload on one GPU"
  timeout 600 "$PY" scripts/gpu_check_deepspeed.py "$OUT/deepspeed.json" || status=1
else
  echo "gpu_check: deepspeed is not installed here: the ZeRO-2 offload step is skipped (DS_BUILD_OPS=0 pip install deepspeed)"
fi
# -- 5d. bitsandbytes 8-bit / 4-bit loading on one GPU, vs the reference -------------------------------
if "$PY" -c "import bitsandbytes" >/dev/null 2>&1; then
  echo "gpu_check: bitsandbytes 8-bit and NF4 loading on one GPU"
  timeout 600 "$PY" scripts/gpu_check_quantization.py "$OUT/quantization.json" || status=1
else
  echo "gpu_check: bitsandbytes is not installed here: the quantized-loading step is skipped (pip install bitsandbytes)"
fi
# -- 6. docs/benchmarks.md ------------------------------------------------------------------------
"$PY" scripts/gpu_check_report.py write docs/benchmarks.md "$OUT" "$pytest_rc" || status=1
echo "gpu_check: figures written to docs/benchmarks.md (section 'GPU run'); raw results in $OUT"
exit $status
