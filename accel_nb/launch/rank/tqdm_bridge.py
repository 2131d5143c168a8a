"""tqdm bars made inside a rank show as that rank's progress row, never as a widget or a ``\\r`` line.

Libraries (the HF Trainer, datasets, diffusers) draw progress with ``tqdm.auto`` — in a Jupyter
kernel that is the ipywidgets bar of ``tqdm.notebook``. In a rank forked from the kernel such a
bar would send its widget messages on the kernel's sockets from a child process ("attempted to
send message from fork"), and its bar would freeze at 0 %. :func:`install`, called once in each
rank before user code runs, makes every tqdm class report through accel_nb's event channel:

- ``tqdm.std.tqdm`` (the base of every tqdm bar: ``tqdm.tqdm``, ``tqdm.auto``, ``tqdm.asyncio``,
  library subclasses) sends a ``Progress`` event (n, total, desc, postfix, rate) where it would
  have drawn, and a last one with ``done=True`` when it closes; nothing is printed;
- ``tqdm.notebook.tqdm`` becomes the same plain bar (no widget is created), whether
  ``tqdm.notebook`` was imported before the launch or is imported later in the rank.

tqdm's own throttling (``mininterval``, 0.1 s by default) decides how often a bar reports.

    install()               # in the rank, before the user's function runs
    for x in tqdm.auto.tqdm(range(50)): ...   # -> the rank's row reads 50/50
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import os
import sys
import types
from typing import Any

from ... import events
from ...progress_format import plain_value

_counter = itertools.count(1)


def install() -> bool:
    """Route every tqdm bar of this process to the event channel; False when tqdm is not installed."""
    if "tqdm" not in sys.modules and importlib.util.find_spec("tqdm") is None:
        return False
    import tqdm.std

    base = tqdm.std.tqdm
    if getattr(base, "_accel_nb_bridge", False):
        return True
    base.display = _display
    base.close = _close
    base.clear = _noop
    base.set_postfix = _set_postfix
    base._accel_nb_bridge = True
    notebook = sys.modules.get("tqdm.notebook")
    if notebook is not None:
        _make_plain(notebook.tqdm_notebook, base)
    else:  # a later ``import tqdm.notebook`` (tqdm.auto does it in a kernel) gets plain bars
        sys.modules["tqdm.notebook"] = _plain_notebook_module(tqdm.std)
        tqdm.notebook = sys.modules["tqdm.notebook"]
    return True


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _name(bar: Any) -> str:
    name = getattr(bar, "_accel_nb_name", None)
    if name is None:
        name = bar._accel_nb_name = f"tqdm {next(_counter)}"
    return name


def _event(bar: Any, done: bool) -> events.Progress:
    fmt = bar.format_dict
    rate = fmt.get("rate")
    elapsed = fmt.get("elapsed") or 0.0
    if not rate and elapsed > 0 and bar.n:
        rate = bar.n / elapsed
    total = bar.total
    return events.Progress(
        rank=_rank(),
        name=_name(bar),
        n=int(bar.n),
        total=int(total) if total is not None and total != float("inf") else None,
        metrics=dict(getattr(bar, "_accel_nb_metrics", None) or {}),
        desc=(bar.desc or "").rstrip(": ") or None,
        rate=float(rate) if rate else None,
        done=done,
    )


def _display(self: Any, msg: Any = None, pos: Any = None, **_: Any) -> bool:
    """Where tqdm would draw the bar: send it to the launching notebook instead."""
    events.emit(_event(self, done=False))
    return True


def _close(self: Any) -> None:
    """End the bar: the final state with ``done=True``; prints nothing; idempotent like tqdm's."""
    if self.disable:
        return
    self.disable = True
    try:
        self._decr_instances(self)
    except (AttributeError, KeyError, ValueError):  # a half-built bar (its __init__ raised)
        pass
    events.emit(_event(self, done=True))


def _noop(self: Any, *args: Any, **kwargs: Any) -> None:
    return None


def _set_postfix(self: Any, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
    """Keep the values as metrics (shown next to the rank's bar); tqdm's text form too."""
    metrics = dict(ordered_dict or {})
    metrics.update(kwargs)
    self._accel_nb_metrics = {str(k): plain_value(v) for k, v in metrics.items()}
    self.postfix = ", ".join(f"{k}={v}" for k, v in self._accel_nb_metrics.items())
    if refresh:
        self.refresh()


def _make_plain(cls: type, base: type) -> None:
    """Make the notebook bar class behave as the (bridged) plain bar: no widget, no display()."""
    for name in list(vars(cls)):
        if name.startswith("__") and name not in ("__init__", "__iter__"):
            continue
        if name in vars(base) or hasattr(base, name):
            setattr(cls, name, inspect.getattr_static(base, name))
        else:
            delattr(cls, name)


def _plain_notebook_module(std: Any) -> types.ModuleType:
    """A stand-in for ``tqdm.notebook`` whose bars are the plain, bridged ``tqdm.std.tqdm``."""
    module = types.ModuleType("tqdm.notebook", "tqdm.notebook inside an accel_nb rank: plain bars")
    module.tqdm = module.tqdm_notebook = std.tqdm
    module.trange = module.tnrange = std.trange
    module.IProgress = object  # what tqdm.autonotebook checks before choosing the notebook bar
    module.WARN_NOIPYW = ""
    module.__all__ = ["tqdm_notebook", "tnrange", "tqdm", "trange"]
    return module
