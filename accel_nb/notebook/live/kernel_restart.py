"""What a launch's live view says when its kernel restarts or goes away.

Two mechanisms, because front-ends differ: the kernel's ``do_shutdown`` is wrapped so every live
view pushes a final "the kernel is restarting" state before the reply (clients that still read the
old kernel's messages show it), and running rows carry a CSS pair that a front-end which marks the
view disconnected (JupyterLab drops the old kernel's last messages) switches to its "gone" text.

    LIVE_VIEWS.add(view); watch_kernel_shutdown()      # view.kernel_shutting_down(restart) is called
    html = GONE_CSS + live_or_gone("running", "stopped (kernel gone)")
"""

from __future__ import annotations

import weakref
from typing import Any

# A frontend marks a widget view ``jupyter-widgets-disconnected`` when its kernel restarts or goes
# (JupyterLab drops what the old kernel sends once a restart is asked): a running view then shows its
# "gone" text instead of a frozen "running · ETA". Final states (done, failed, stopped) have no such pair.
GONE_CSS = (
    "<style>.jupyter-widgets-disconnected .accel-nb-live{display:none!important}"
    ".jupyter-widgets-disconnected .accel-nb-gone{display:inline!important}</style>"
)
GONE_NOTE = "stopped: the kernel restarted or went away (its ranks end with it)"


def live_or_gone(live_html: str, gone_html: str) -> str:
    """``live_html`` while the kernel is there; ``gone_html`` once the frontend lost it (CSS only)."""
    return (
        f"<span class='accel-nb-live'>{live_html}</span>"
        f"<span class='accel-nb-gone' style='display:none'>{gone_html}</span>"
    )


LIVE_VIEWS: weakref.WeakSet = weakref.WeakSet()  # views whose launch (or session) is still going
HOOKED_KERNELS: list[Any] = []


def watch_kernel_shutdown() -> None:
    """Once per kernel: when it is asked to shut down or restart, every live view says so first.

    A restart interrupts the cell and kills the kernel within seconds, often before the launch's
    own end reaches the widget; the frontend would keep the last "running · ETA" forever. The
    kernel's ``do_shutdown`` runs on its control thread (the cell may still be running), before
    the shutdown reply, so the final state is on its way before the old kernel goes.
    """
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    except Exception:  # noqa: BLE001 - no kernel: nothing to watch
        return
    if kernel is None or not hasattr(kernel, "do_shutdown") or any(k is kernel for k in HOOKED_KERNELS):
        return
    original = kernel.do_shutdown

    def do_shutdown(restart: bool, *args: Any, **kwargs: Any) -> Any:
        for view in list(LIVE_VIEWS):
            try:
                view.kernel_shutting_down(bool(restart))
            except Exception:  # noqa: BLE001 - the shutdown itself must go on
                pass
        return original(restart, *args, **kwargs)

    kernel.do_shutdown = do_shutdown
    HOOKED_KERNELS.append(kernel)
