"""Safetensors checkpoints in the Hugging Face sharded layout: write, index, validate, load.

``files`` holds the names, the error type and atomic writes; ``writing`` the sharded save;
``reading`` headers, the validated index and loading. Everything public is importable from here.

One file ``model.safetensors`` when the weights fit in ``max_shard_size``, otherwise
``model-00001-of-0000N.safetensors`` ... plus ``model.safetensors.index.json``
(``{"metadata": {"total_size": ...}, "weight_map": {name: file}}``) -- the layout transformers,
accelerate and ``accel_nb.load_checkpoint_in_model`` read.

    files = save_sharded_safetensors(model.state_dict(), "out", max_shard_size="500MB")
    index = index_checkpoint("out")              # cheap: headers only, no tensor data read
    load_safetensors_into(fresh_model, index)    # checks everything first, then copies

Tied weights (several names, one storage) are written once under the first name; the other names
are recorded as aliases (safetensors metadata key ``accel_nb.aliases`` and index metadata key
``aliases``) so loaders fill them from the saved tensor.
"""

from .files import (
    ALIASES_KEY,
    SAFE_INDEX_SUFFIX,
    SAFE_WEIGHTS_NAME,
    SAVE_ID_KEY,
    CheckpointError,
    atomic_write_bytes,
    fsync_path,
    parse_size,
)
from .reading import (
    CheckpointIndex,
    LoadResult,
    TensorHeader,
    check_against,
    index_checkpoint,
    load_safetensors_into,
    load_safetensors_state_dict,
    read_safetensors_header,
    tensor_info,
)
from .writing import dedupe_shared_tensors, plan_shards, save_sharded_safetensors, shard_file_name

__all__ = [
    "ALIASES_KEY",
    "SAFE_INDEX_SUFFIX",
    "SAFE_WEIGHTS_NAME",
    "SAVE_ID_KEY",
    "CheckpointError",
    "CheckpointIndex",
    "LoadResult",
    "TensorHeader",
    "atomic_write_bytes",
    "check_against",
    "dedupe_shared_tensors",
    "fsync_path",
    "index_checkpoint",
    "load_safetensors_into",
    "load_safetensors_state_dict",
    "parse_size",
    "plan_shards",
    "read_safetensors_header",
    "save_sharded_safetensors",
    "shard_file_name",
    "tensor_info",
]
