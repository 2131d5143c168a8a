#!/usr/bin/env bash
# The newest-releases job: the suite's dependency-sensitive tests (quantization, DeepSpeed, Megatron, trackers,
# transformers-based tests, the reference side by side) against today's newest release of every
# package, in ./.venv-newest (rebuilt with pip's --upgrade at most once a day). The pinned suite
# (scripts/test.sh, requirements/*.txt) tests what was last tested; this job shows drift first: a
# failure here with the pinned suite green means a new release changed something. Fix accel_nb (or
# bound the range in pyproject.toml) before refreshing the pins (docs/versions.md).
#   bash scripts/test-newest.sh [pytest args]     (default: the files below)
set -euo pipefail
cd "$(dirname "$0")/.."
ACCEL_NB_UNPINNED=1 ACCEL_NB_VENV=.venv-newest bash scripts/setup-env.sh
.venv-newest/bin/python - <<'PY'
import importlib.metadata as md
names = ["torch", "bitsandbytes", "torchao", "deepspeed", "megatron-core", "transformers", "accelerate", "tensorboard",
         "mlflow-skinny", "wandb", "comet_ml", "safetensors", "numpy", "ipykernel", "ipywidgets"]
print("newest-releases job:", ", ".join(f"{n} {md.version(n)}" for n in names))
PY
files=(
  tests/test_bnb_layout.py tests/test_quantization.py tests/test_quantization_memory.py tests/test_bnb_replace.py
  tests/test_deepspeed.py tests/test_deepspeed_config.py tests/test_deepspeed_launch.py
  tests/test_megatron.py
  tests/test_tracking.py tests/test_third_party.py tests/test_serialization.py
  tests/test_big_model.py tests/test_big_model_planning.py tests/test_migration_big_model.py
  tests/test_migration_helpers.py tests/test_parallel_tp.py tests/test_progress_tqdm.py
  tests/test_public_paths.py tests/test_reference_examples.py
)
[ "$#" -gt 0 ] && files=("$@")
exec .venv-newest/bin/python -m pytest -q -p no:cacheprovider -rf "${files[@]}"
