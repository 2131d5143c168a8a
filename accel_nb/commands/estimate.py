"""``accel-nb estimate-memory``: how much memory a model needs to load, and to train with Adam, per dtype.

The model is built on the meta device (no weights are downloaded) from its config: a Hub repo id (its
``config.json`` is fetched; ``transformers`` or ``timm``), or a local folder with a ``config.json`` (or that
file itself), which needs no network.

    accel-nb estimate-memory bert-base-cased
    accel-nb estimate-memory ./my_model --dtypes float32 float16     # a folder with config.json, offline

The sizes: the largest layer (what must fit on one device when the rest is offloaded), the total, and training
with Adam at batch size 1 (weights, gradients and two optimizer states; activations not counted). The
reference's names (``accelerate.commands.estimate``) are here too.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..config.command_line import PROG

__all__ = [
    "DTYPES",
    "add_parser",
    "add_timm_hub_prefix",
    "check_has_model",
    "create_ascii_table",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "estimate_training_usage",
    "gather_data",
    "run",
    "verify_on_hub",
]

DTYPES = ("float32", "float16", "int8", "int4")
_SHRINK = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}  # bytes of float32 per byte of the dtype


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model info for ``repo``; ``"gated"`` when access is refused, ``"repo"`` when there is no such repo.

    Raises ``OSError`` when the Hub cannot be reached (``HF_HUB_OFFLINE``, no network).
    """
    from huggingface_hub import model_info  # deferred: import time (only for a Hub model)
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except GatedRepoError:
        return "gated"
    except RepositoryNotFoundError:
        return "repo"
    except OSError as exc:
        raise OSError(
            f"cannot reach the Hugging Face Hub for `{repo}` ({type(exc).__name__}: {exc}); without network, give a "
            "local folder that holds the model's config.json"
        ) from exc


def add_timm_hub_prefix(model_name: str) -> str:
    """The name ``timm.create_model`` needs: Hub repo ids (``org/name``) get ``hf-hub:``; bare architecture names
    and names with a source prefix already (``local-dir:...``) stay as they are."""
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def check_has_model(error: BaseException) -> str:
    """Which library failed to find a model in a repo it could read (``timm``, ``transformers``), else ``unknown``."""
    from ..availability import is_timm_available, is_transformers_available  # deferred: import time

    message = str(error)
    if is_timm_available() and (
        (isinstance(error, RuntimeError) and "Unknown model" in message)
        or type(error).__name__ == "EntryNotFoundError"
        or (isinstance(error, KeyError) and "architecture" in message)
    ):
        return "timm"
    if is_transformers_available() and isinstance(error, (OSError, ValueError)):
        if "does not appear to have a file named" in message or "Unrecognized model in" in message:
            return "transformers"
    return "unknown"


def _local_config(model_name: str) -> str | None:
    """The folder of a local ``config.json`` named by ``model_name`` (the folder or the file), else None."""
    if os.path.isdir(model_name) and os.path.isfile(os.path.join(model_name, "config.json")):
        return model_name
    if os.path.basename(model_name) == "config.json" and os.path.isfile(model_name):
        return os.path.dirname(os.path.abspath(model_name))
    return None


def _transformers_model(source: str, trust_remote_code: bool, token: str | None, auto_map: Any) -> Any:
    import torch  # deferred: import time (torch and transformers only when a model is built)
    import transformers

    from ..big_model import init_empty_weights

    config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, token=token)
    auto_map = auto_map if isinstance(auto_map, dict) else getattr(config, "auto_map", None)
    constructor = transformers.AutoModel
    if isinstance(auto_map, dict):  # remote code may name its own AutoModelFor... class
        head = next((k for k in auto_map if k.startswith("AutoModelFor")), None)
        if head is not None:
            constructor = getattr(transformers, head)
    with init_empty_weights():
        return constructor.from_config(config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code)


def create_empty_model(
    model_name: str,
    library_name: str | None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> Any:
    """The model ``model_name`` names, built in float32 on the meta device (no weights).

    ``model_name``: a Hub repo id, or a local folder with a ``config.json`` (read with ``transformers``).
    ``library_name``: ``transformers`` or ``timm``; for a Hub repo the Hub's metadata says when it is None.
    """
    from ..availability import is_timm_available, is_transformers_available  # deferred: import time

    local = _local_config(model_name)
    if local is not None:
        if library_name not in (None, "transformers"):
            raise ValueError(
                f"a local config.json is read with transformers, not --library_name {library_name}"
            )
        if not is_transformers_available():
            raise ImportError(f"reading {model_name} needs transformers: pip install transformers")
        return _transformers_model(local, trust_remote_code, access_token, None)
    info = verify_on_hub(model_name, access_token)
    if info == "gated":
        raise OSError(
            f"Repo for model `{model_name}` is gated: log in with `hf auth login` (with access to it) and try again"
        )
    if info == "repo":
        raise OSError(
            f"Repo for model `{model_name}` does not exist on the Hub (a private repo needs `hf auth login`); "
            "a local folder needs a config.json"
        )
    library_name = library_name or getattr(info, "library_name", None)
    if not library_name:
        raise ValueError(
            f"Model `{model_name}` has no library metadata on the Hub: give --library_name transformers or timm"
        )
    if library_name == "transformers":
        if not is_transformers_available():
            raise ImportError(f"To check `{model_name}`, install transformers: pip install transformers")
        if getattr(info, "config", None) is None:
            raise RuntimeError(
                f"Tried to load `{model_name}` with `transformers` but it does not have any metadata."
            )
        print(f"Loading pretrained config for `{model_name}` from `transformers`...")
        return _transformers_model(model_name, trust_remote_code, access_token, info.config.get("auto_map"))
    if library_name == "timm":
        if not is_timm_available():
            raise ImportError(f"To check `{model_name}`, install timm: pip install timm")
        import timm  # deferred: optional dependency

        from ..big_model import init_empty_weights

        print(f"Loading pretrained config for `{model_name}` from `timm`...")
        with init_empty_weights():
            return timm.create_model(add_timm_hub_prefix(model_name), pretrained=False)
    raise ValueError(f"Library `{library_name}` is not supported: give --library_name transformers or timm")


def estimate_training_usage(
    bytes: int, mixed_precision: str, msamp_config: str | None = None
) -> dict[str, int]:
    """Bytes for training with Adam at batch size 1: ``{"model", "optimizer", "gradients", "step"}`` (-1: unknown).

    ``bytes`` is the model's float32 size; float32 training keeps weights, gradients and two Adam states in float32;
    float16/bfloat16 (and fp8 without MS-AMP) keep float32 master weights and add half-precision gradients.
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    full, half = bytes, bytes // 2
    if mixed_precision == "float32":
        sizes.update(model=full, gradients=full, optimizer=full * 2, step=full * 4)
    elif mixed_precision in ("float16", "bfloat16") or (mixed_precision == "fp8" and msamp_config is None):
        sizes.update(model=full, gradients=full + half, optimizer=full * 2, step=full * 2)
    return sizes


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """One row per dtype of ``args.dtypes``: ``[dtype, largest layer bytes, total bytes, training sizes]``."""
    try:
        model = create_empty_model(args.model_name, args.library_name, args.trust_remote_code)
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        library = check_has_model(exc)
        if library != "unknown":
            raise RuntimeError(
                f"Tried to load `{args.model_name}` with `{library}` but a possible model to load was not found "
                "inside the repo."
            ) from exc
        raise
    from ..big_model.module_helpers import calculate_maximum_sizes  # deferred: import time (torch)

    total, (largest, _) = calculate_maximum_sizes(model)
    return [
        [dtype, largest / _SHRINK[dtype], total / _SHRINK[dtype], estimate_training_usage(total, dtype)]
        for dtype in args.dtypes
    ]


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A boxed table of ``rows`` under ``headers`` and ``title`` (cells centred)."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows)]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def line(cells: list[str]) -> str:
        return "│" + "│".join(str(c).center(w) for c, w in zip(cells, widths)) + "│"

    out = [
        "┌" + "─" * inner + "┐",
        "│" + title.center(inner) + "│",
        "├" + "┬".join("─" * w for w in widths) + "┤",
    ]
    out += [line(headers), "├" + "┼".join("─" * w for w in widths) + "┤"]
    out += [line(r) for r in rows]
    out.append("└" + "┴".join("─" * w for w in widths) + "┘")
    return "\n".join(out)


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``estimate-memory`` parser: a subcommand of ``subparsers`` when given, else a parser of its own."""
    description = "Estimate the memory a model needs to load and to train, per dtype (built without weights)."
    if subparsers is not None:
        parser = subparsers.add_parser(
            "estimate-memory",
            help="memory a model needs to load and train, per dtype",
            description=description,
        )
    else:
        parser = argparse.ArgumentParser(f"{PROG} estimate-memory", description=description)
    parser.add_argument("model_name", help="a Hub repo id, or a local folder with the model's config.json")
    parser.add_argument(
        "--library_name",
        choices=("timm", "transformers"),
        default=None,
        help="needed when the Hub does not say",
    )
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES), help="dtypes to show")
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="run the model code the repo ships (only for repos whose code you have read)",
    )
    return parser


def add_parser(sub: Any) -> None:
    """The ``estimate-memory`` subcommand of the ``accel-nb`` parser."""
    estimate_command_parser(sub)


def estimate_command(args: argparse.Namespace) -> str:
    """Print (and return) the table of :func:`gather_data`'s sizes."""
    from ..misc import convert_bytes  # deferred: import time

    rows = []
    for dtype, largest, total, training in gather_data(args):
        peak = max(training.values())
        rows.append(
            [
                dtype,
                convert_bytes(largest),
                convert_bytes(total),
                convert_bytes(peak) if peak != -1 else "N/A",
            ]
        )
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    table = create_ascii_table(headers, rows, f"Memory Usage for loading `{args.model_name}`")
    print(table)
    return table


def run(ns: argparse.Namespace) -> int:
    """``accel-nb estimate-memory``: 0, or 2 with a one-line error."""
    try:
        estimate_command(ns)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        print(f"{PROG} estimate-memory: error: {exc}", file=sys.stderr)
        return 2
    return 0
