"""Shim at the reference's ``accelerate.utils.environment`` path: environment-variable helpers.

    from accel_nb.utils.environment import patch_environment, purge_accelerate_environment

Nothing is defined here; each name is accel_nb's one implementation, imported on first use.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        [
            "are_libraries_initialized",
            "clear_environment",
            "convert_dict_to_env_variables",
            "get_int_from_env",
            "parse_choice_from_env",
            "parse_flag_from_env",
            "patch_environment",
            "purge_accelerate_environment",
            "str_to_bool",
        ],
        "accel_nb.environment",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
