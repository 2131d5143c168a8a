"""IPython magics: ``%%accelerate`` runs a cell on N processes; ``%accelerate_config``, ``%accelerate_env``.

    %load_ext accel_nb

    %%accelerate -n 2 --return model,history
    accelerator = Accelerator()
    model, opt = accelerator.prepare(model, opt)
    history = train(model, opt)

The cell becomes a ``CellPayload`` run by the same worker entry as ``notebook_launcher``: with
fork it sees the notebook's namespace as it is; with spawn the namespace is cloudpickled (modules
re-imported by name, unpicklable names skipped with a warning). A cell that does not compile is a
one-line ``UsageError`` before anything starts; tracebacks name the cell ``<accelerate-cell-N>``
with ``N`` its prompt number.
"""

from __future__ import annotations

import sys
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from .. import config as config_module
from ..launch import cuda_guard
from ..launch.payload import CellPayload
from ..launch.plan import MAGIC_CHOICES, check_gpu_processes
from .debug_magic import remember_failed_one_shot
from .magic_flags import (
    USAGE,
    as_cell_lines,
    cell_filename,
    launch_options,
    parse_accelerate_line,
    saved_config,
)


@magics_class
class AccelerateMagics(Magics):
    """``%%accelerate``, ``%accelerate_config`` and ``%accelerate_env``."""

    @cell_magic("accelerate")
    def accelerate(self, line: str, cell: str) -> None:
        """Run this cell on N processes (see ``%%accelerate --help`` for the flags)."""
        __tracebackhide__ = True
        if line.strip() in ("-h", "--help"):
            print(USAGE)
            return
        from .session_magics import active_session, run_cell_on_session

        session = active_session()
        if session is not None:  # %accelerate start: the cell runs on the warm workers
            return run_cell_on_session(self, session, line, cell)
        args = parse_accelerate_line(line)
        from .launcher import launch_payload

        options = launch_options(args, saved_config())
        # refused in the magic's own flags, before anything starts
        check_gpu_processes(options, MAGIC_CHOICES)
        return_rank = args.rank if isinstance(args.rank, int) else 0
        payload = self._cell_payload(cell, args.return_names, return_rank)
        remember_failed_one_shot(line)  # until it succeeds: %accelerate debug then says how to get a session
        results = launch_payload(payload, options)
        remember_failed_one_shot(None)
        if args.return_names:
            if return_rank >= len(results):
                raise UsageError(f"%%accelerate: --rank {return_rank} but only {len(results)} processes ran")
            values = results[return_rank] or {}
            self.shell.user_ns.update(values)
            print(
                f"[accel_nb] {', '.join(args.return_names)} copied from rank {return_rank} into the notebook"
            )

    def _cell_payload(self, cell: str, return_names: tuple[str, ...], return_rank: int) -> CellPayload:
        """The cell as a payload named after its prompt number; a cell that does not compile is a UsageError."""
        filename = cell_filename(self.shell)
        try:
            return CellPayload(
                as_cell_lines(cell),
                self.shell.user_ns,
                filename=filename,
                return_names=return_names,
                return_rank=return_rank,
            )
        except SyntaxError as exc:
            where = f"line {exc.lineno}" + (f": {exc.text.strip()}" if exc.text else "")
            raise UsageError(
                f"%%accelerate: the cell does not compile, nothing was launched: {exc.msg} ({where})"
            ) from None

    @line_magic("accelerate")
    def accelerate_session(self, line: str = "") -> None:
        """``%accelerate start|status|stop|restart|push|pull``: warm workers that keep their state across cells."""
        __tracebackhide__ = True
        from .session_magics import session_verb

        return session_verb(self.shell, line)

    @line_magic("accelerate_config")
    def accelerate_config(self, line: str = "") -> None:
        """Print the launch config that ``%%accelerate`` uses when flags are absent."""
        path = config_module.find_config_file()
        cfg = saved_config()
        if cfg is None:
            where = config_module.default_config_path()
            print(f"No saved launch config (looked for {where}).")
            print(
                "%%accelerate defaults: every GPU, else 1 CPU process; mixed_precision=no; start_method=auto."
            )
            print("Write one with `accel-nb config default` or accel_nb.config_wizard().")
            return
        print(f"Launch config from {path}:")
        data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
        for key, value in data.items():
            print(f"  {key}: {value}")

    @line_magic("accelerate_env")
    def accelerate_env(self, line: str = "") -> None:
        """Print the hardware/software report to paste into a bug report."""
        from ..env_report import environment_report

        print(environment_report())


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics; from now on remember which line first initialises CUDA."""
    ipython.register_magics(AccelerateMagics)
    cuda_guard.install_cuda_init_recorder()
    if "torch" not in sys.modules:
        import torch  # noqa: F401 - so the recorder sees the first CUDA initialisation

        cuda_guard.install_cuda_init_recorder()


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo beyond what IPython does (magics stay registered until the kernel restarts)."""
