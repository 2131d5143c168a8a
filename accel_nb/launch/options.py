"""What the user asked of a launch, as one value: built by each face, checked once, read by every step.

``notebook_launcher``, ``debug_launcher`` and ``%%accelerate`` each build a ``LaunchOptions``;
the plan, the run and the display read it. Everything that can be checked without looking at the
hardware is checked here, with a ``LaunchSetupError`` that names the option and the fix.

    options = LaunchOptions(num_processes=2, cpu=True, mixed_precision="bf16", timeout=60)
    options.show                   # None: every rank's output is shown
    LaunchOptions(start_method="thread")    # LaunchSetupError naming the choices
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import LAUNCHER_RDZV_BACKENDS, START_METHODS
from ..counts import is_count, whole_number
from ..precision.setting import validate_mixed_precision
from .errors import LaunchSetupError

RDZV_BACKENDS_SAID = ", ".join(repr(b) for b in LAUNCHER_RDZV_BACKENDS)  # 'static', 'c10d'


def parse_show_ranks(show_ranks: Any) -> set[int] | None:
    """``"all"``/None -> None (every rank); ``0`` -> {0}; ``[0, 2]`` or ``"0,2"`` -> {0, 2}.

    parse_show_ranks("0,2")   # {0, 2}
    """
    if show_ranks is None or show_ranks == "all":
        return None
    try:
        if isinstance(show_ranks, bool):
            raise TypeError
        if isinstance(show_ranks, int):
            return {show_ranks}
        if isinstance(show_ranks, str):
            return {int(x) for x in show_ranks.split(",") if x.strip()}
        return {int(x) for x in show_ranks}
    except (TypeError, ValueError):
        raise ValueError(
            f"show_ranks={show_ranks!r} names no ranks; use 'all', a rank (0), a list ([0, 2]) or '0,2'"
        ) from None


def _whole_at_least_one(name: str, value: Any) -> int | None:
    if value is None:
        return None
    number = whole_number(value)
    if number is None:
        raise LaunchSetupError(f"{name}={value!r} must be a whole number of at least 1")
    if number < 1:
        raise LaunchSetupError(f"{name}={number} must be at least 1")
    return number


def _port(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise LaunchSetupError(
            f"use_port={value!r} is not a port number; give a number between 1024 and 65535, or None"
        ) from None
    if not 0 < port < 65536:
        raise LaunchSetupError(
            f"use_port={port} is not a TCP port; give a number between 1024 and 65535 or None to pick a free one"
        )
    return port


@dataclass(frozen=True)
class LaunchOptions:
    """Every choice a launch accepts (see ``notebook_launcher`` for each one's meaning), checked on creation."""

    num_processes: int | None = None
    mixed_precision: str | None = None
    master_addr: str = "127.0.0.1"
    use_port: int | None = None
    start_method: str = "auto"
    cpu: bool = False
    gradient_accumulation_steps: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    show_ranks: Any = "all"
    keep_logs: bool | None = None
    progress: Any = None
    num_nodes: int = 1  # machines of the job; node_rank is this one (0: the one at master_addr)
    node_rank: int = 0
    rdzv_backend: str = "static"
    rdzv_timeout: float | None = None  # seconds to wait for the other machines (None: 600)
    xla: bool | None = None  # XLA devices: None when an XLA runtime is present and cpu is not asked

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "num_processes", _whole_at_least_one("num_processes", self.num_processes))
        if self.mixed_precision is not None:
            try:
                set_(self, "mixed_precision", validate_mixed_precision(self.mixed_precision))
            except ValueError as exc:
                raise LaunchSetupError(str(exc)) from None
        if self.start_method not in START_METHODS:
            raise LaunchSetupError(
                f"start_method={self.start_method!r} is not one of {', '.join(map(repr, START_METHODS))}"
            )
        set_(self, "use_port", _port(self.use_port))
        set_(
            self,
            "gradient_accumulation_steps",
            _whole_at_least_one("gradient_accumulation_steps", self.gradient_accumulation_steps),
        )
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise LaunchSetupError(f"env={self.env!r} must be a dict of strings to strings")
        set_(self, "env", dict(self.env))
        if self.timeout is not None:
            try:
                timeout = float(self.timeout)
            except (TypeError, ValueError):
                raise LaunchSetupError(f"timeout={self.timeout!r} is not a number of seconds") from None
            if not timeout > 0 or math.isinf(timeout):
                raise LaunchSetupError(
                    f"timeout={self.timeout!r} must be more than 0 seconds (None: no hang watchdog)"
                )
            set_(self, "timeout", timeout)
        try:
            parse_show_ranks(self.show_ranks)
        except ValueError as exc:
            raise LaunchSetupError(str(exc)) from None
        set_(self, "cpu", bool(self.cpu))
        if self.xla is not None and not isinstance(self.xla, bool):
            raise LaunchSetupError(
                f"xla={self.xla!r} must be True, False or None (None: XLA when an XLA runtime is present)"
            )
        check_machine_options(self)

    @property
    def show(self) -> set[int] | None:
        """The ranks whose output is shown (None: every rank)."""
        return parse_show_ranks(self.show_ranks)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in order (what ``notebook_launcher`` accepts besides the function and its arguments)."""
        return tuple(f.name for f in fields(cls))


def check_machine_options(options: Any) -> None:
    """``LaunchOptions``' machine fields: ``LaunchSetupError`` naming the option and the fix.

    num_nodes >= 1, 0 <= node_rank < num_nodes, rdzv_backend static or c10d, rdzv_timeout > 0.
    """
    for name, low in (("num_nodes", 1), ("node_rank", 0)):
        value = getattr(options, name)
        if not is_count(value, low):
            raise LaunchSetupError(f"{name}={value!r} must be a whole number of at least {low}")
    if options.node_rank >= options.num_nodes:
        raise LaunchSetupError(
            f"node_rank={options.node_rank} must be smaller than num_nodes={options.num_nodes} "
            f"(machines are numbered 0 to {options.num_nodes - 1}; 0 is the one at master_addr)"
        )
    if options.rdzv_backend not in LAUNCHER_RDZV_BACKENDS:
        raise LaunchSetupError(f"rdzv_backend={options.rdzv_backend!r} is not one of {RDZV_BACKENDS_SAID}")
    timeout = options.rdzv_timeout
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise LaunchSetupError(f"rdzv_timeout={timeout!r} must be a number of seconds above 0 (None: 600)")
