"""The one place that knows the two ipywidgets generations apart (7.7 on Colab, 8.x elsewhere).

accel_nb's widgets use only what both generations have, except where this module chooses:

- showing a widget: ipywidgets 7 widgets have no ``_repr_mimebundle_`` (they display through
  ``_ipython_display_``), 8 has it. ``view_bundle`` builds the same output bundle for both from
  the widget's ``model_id``, so a caller can add its own ``text/plain`` / ``image/png`` and show it
  with IPython's public ``display(bundle, raw=True, display_id=True)`` (and ``DisplayHandle.update``).
- Accordion titles: a ``titles`` tuple on 8, ``set_title(i, title)`` / ``get_title(i)`` on 7.

    from accel_nb.notebook.widget_compat import set_titles, view_bundle
    set_titles(accordion, ["rank 0 output", "rank 1 output"])
    handle = display(view_bundle(box, "text for viewers without widgets"), raw=True, display_id=True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["WIDGET_VIEW_MIME", "get_titles", "ipywidgets_major", "set_titles", "view_bundle"]

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"


def ipywidgets_major() -> int:
    """7 or 8: the installed ipywidgets generation (``ImportError`` without ipywidgets)."""
    import ipywidgets

    return int(str(ipywidgets.__version__).split(".")[0])


def view_bundle(widget: Any, text: str | None = None) -> dict[str, Any]:
    """The output bundle that shows ``widget`` (both generations), with ``text`` as its ``text/plain``.

    A widget without a comm (closed, or created outside a kernel) has no view: a ``RuntimeError``
    says so rather than an empty output.
    """
    model_id = getattr(widget, "model_id", None)
    if not model_id:
        raise RuntimeError(
            f"{type(widget).__name__} has no model in this kernel (closed, or no kernel): nothing to show"
        )
    if text is None:
        text = repr(widget)
        if len(text) > 110:
            text = text[:110] + "..."
    # the view version is 2.0 in both generations (ipywidgets 7.x and 8.x front-ends read it)
    return {
        "text/plain": text,
        WIDGET_VIEW_MIME: {"version_major": 2, "version_minor": 0, "model_id": model_id},
    }


def set_titles(accordion: Any, titles: Iterable[str]) -> None:
    """Give an Accordion's (or Tab's) pages their titles, one sync on 8."""
    titles = [str(t) for t in titles]
    if ipywidgets_major() >= 8:
        accordion.titles = tuple(titles)
        return
    for i, title in enumerate(titles):
        if accordion.get_title(i) != title:
            accordion.set_title(i, title)


def get_titles(accordion: Any) -> list[str]:
    """An Accordion's page titles, one per child (``""`` where none was set)."""
    if ipywidgets_major() >= 8:
        return list(accordion.titles)
    return [accordion.get_title(i) or "" for i in range(len(accordion.children))]
