"""A training script's ``--name value`` arguments as a dict of typed values (the hyperparameters form
SageMaker takes; the reference's ``accelerate.utils.launch._convert_nargs_to_dict``).

    script_args_to_dict(["--lr", "5e-5", "--epochs", "3", "--fp16", "True", "--model", "bert"])
    # {'lr': 5e-05, 'epochs': 3, 'fp16': True, 'model': 'bert'}

Numbers become ``int`` (whole) or ``float``, ``True``/``False`` become booleans, anything else stays a
string. A flag without a value (``--do_train --epochs 3``) is an error: a dict needs a value per name.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["script_args_to_dict"]


def _typed(text: str) -> Any:
    try:
        number = float(text)
    except ValueError:
        return {"True": True, "False": False}.get(text, text)
    return int(number) if number.is_integer() else number


def script_args_to_dict(args: list[str]) -> dict[str, Any]:
    """``{name: typed value}`` for ``args`` given as ``--name value`` pairs; see the module's docstring."""
    parser = argparse.ArgumentParser(add_help=False)
    for index, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        value_follows = index + 1 < len(args) and not args[index + 1].startswith("-")
        if not value_follows:
            raise ValueError(
                f"script argument {arg} has no value: SageMaker doesn’t support argparse actions for "
                f"`store_true` or `store_false`; give every flag an explicit value ({arg} True)"
            )
        parser.add_argument(arg, type=_typed)
    return vars(parser.parse_args(args))
