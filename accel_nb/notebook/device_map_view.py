"""See a device map: one bar per device, filled by the modules placed there, with budgets and headroom.

    view = show_device_map(model, max_memory={0: "6GiB", "cpu": "30GiB"},
                           no_split_module_classes=["GPT2Block"])
    view.set_budget(0, "8GiB")     # what a slider does: the map is recomputed on the (meta) model
    view.device_map                # the resulting {module: device}, ready for dispatch_model

In Jupyter the interactive view has one budget slider per device; exported notebooks get the
static HTML (``_repr_html_``), terminals the text summary (``str(view)``). Stable hooks for
browser tests: ``.accel-nb-device-bar[data-device="cpu"]``, ``.accel-nb-module[data-module=...]``,
``.accel-nb-budget-slider[data-device=...]``, ``.accel-nb-device-table``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..byte_sizes import human_bytes
from .device_map_html import PALETTE, device_map_html
from .device_map_html import bar_scale as _scale
from .device_map_html import device_name as _dev_name
from .device_map_html import scaled_to_contents as _scaled_to_contents


def _unit_of(nbytes: float) -> tuple[int, str]:
    """The unit human_bytes writes ``nbytes`` in (so a slider and the bars show the same figure)."""
    for power, name in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if abs(nbytes) >= 1024**power:
            return 1024**power, name
    return 1, "B"


def _order(device: Any) -> tuple[int, int]:
    from ..big_model.planning.sizes import device_order

    return device_order(device)


class DeviceMapView:
    """A device map with its sizes and budgets, renderable as HTML, text or an ipywidgets view."""

    def __init__(
        self,
        model: Any = None,
        device_map: Mapping[str, Any] | None = None,
        max_memory: Mapping[Any, Any] | None = None,
        no_split_module_classes: Iterable[str | type] | None = None,
        dtype: Any = None,
        quantization_config: Any = None,
    ) -> None:
        self.model = model
        if no_split_module_classes is None:  # a transformers model knows its blocks
            no_split_module_classes = getattr(model, "_no_split_modules", None)
        self.no_split_module_classes = list(no_split_module_classes or [])
        self.dtype = dtype
        self.error: str | None = None
        self.plan = None
        self._fixed_map = dict(device_map) if device_map is not None else None
        self._budgets: dict[Any, int] = {}
        self._widget = None
        self._html_widget = None
        self._units: dict[Any, tuple[int, str]] = {}  # device -> its slider's unit
        self._sliders_by_dev: dict[Any, Any] = {}
        self._shown_in: int | None = None
        self.quantization_config = quantization_config
        self._storage: dict[str, tuple[str, int, int]] | None = None
        if model is not None and quantization_config is None:  # a model load_and_quantize_model quantized
            self.quantization_config = getattr(model, "accel_nb_quantization", None)
        if model is not None and self.quantization_config is not None:
            self._storage = self._tensor_storage()
        from ..big_model.planning.sizes import get_max_memory

        if max_memory is not None or (model is not None and self._fixed_map is None):
            self._budgets = dict(get_max_memory(max_memory, init_cuda=False))
        self._recompute()

    # -- the model of the view -------------------------------------------------------------------
    def _tensor_storage(self) -> dict[str, tuple[str, int, int]] | None:
        """Each tensor's dtype and bytes once quantized (and unquantized); None if the config does not apply."""
        # deferred: torch and the quantization code load only for a quantized view
        from ..big_model.planning.sizes import as_dtype
        from ..big_model.quantization import QuantizationError, tensor_storage

        try:
            return tensor_storage(self.model, self.quantization_config, as_dtype(self.dtype))
        except QuantizationError as exc:
            self.error = str(exc)
            return None

    def _recompute(self) -> None:
        from ..big_model.planning.device_map import plan_device_map

        if self._fixed_map is not None or self.model is None:
            return
        try:
            if self.quantization_config is not None:
                self.plan = self._plan_quantized()
            else:
                self.plan = plan_device_map(
                    self.model, self._budgets, self.no_split_module_classes, self.dtype
                )
            self.error = None
        except ValueError as exc:  # QuantizationError is one
            self.error = str(exc)
        self._refresh()

    def _plan_quantized(self) -> Any:
        """The plan load_and_quantize_model makes: each weight to quantize counted at its quantized size."""
        # deferred: torch and the quantization code load only for a quantized view
        from ..big_model.planning.device_map import plan_device_map
        from ..big_model.quantization.layers import find_targets
        from ..big_model.quantization.sizes import (
            mark_quantized_sizes,
            special_dtypes_for,
            unmark_quantized_sizes,
        )

        config = self.quantization_config
        targets, _skip, fp32 = find_targets(self.model, config)
        marked = mark_quantized_sizes(self.model, config, targets)
        try:
            special = special_dtypes_for(self.model, config, fp32)
            return plan_device_map(self.model, self._budgets, self.no_split_module_classes, None, special)
        finally:
            unmark_quantized_sizes(marked)

    @property
    def device_map(self) -> dict[str, Any]:
        """The current map {module: device} (the last one that fit, if the budget is now too small)."""
        if self._fixed_map is not None:
            return dict(self._fixed_map)
        return dict(self.plan.device_map) if self.plan is not None else {}

    @property
    def budgets(self) -> dict[Any, int]:
        """Bytes allowed per device (what the sliders set)."""
        return dict(self._budgets)

    def set_budget(self, device: Any, budget: int | str) -> dict[str, Any]:
        """Change one device's budget and recompute the map on the model; returns the new map."""
        from ..big_model.planning.sizes import normalize_device, parse_memory

        if self.model is None:
            raise ValueError("this view was made from a plain device map; pass the model to recompute it")
        dev = normalize_device(device)
        self._budgets[dev] = parse_memory(budget)
        self._budgets = dict(sorted(self._budgets.items(), key=lambda kv: _order(kv[0])))
        self._recompute()
        self._sync_slider(dev)
        return self.device_map

    def _sync_slider(self, dev: Any) -> None:
        """The device's slider shows the budget just set (a later drag starts from it, no jump)."""
        slider = self._sliders_by_dev.get(dev)
        if slider is None or dev not in self._units:
            return
        unit = self._units[dev][0]
        value = self._budgets[dev] / unit
        if abs(slider.value - value) * unit < 1:  # it is the slider that set it (or the same figure)
            return
        with slider.hold_sync():
            if value >= slider.max:  # room above it, as the slider was built with (twice the figure)
                slider.max = 2 * value
            slider.value = value

    def colours(self) -> dict[str, str]:
        """Module -> colour: blocks next to each other on a device's bar never share a colour.

        Colours go round the palette in bar order (device by device), so two neighbours always differ.
        """
        out: dict[str, str] = {}
        i = 0
        for d in self.devices():
            for r in d["rows"]:
                out[r["module"]] = PALETTE[i % len(PALETTE)]
                i += 1
        return out

    def _quantized_row(self, name: str) -> tuple[str, int, int]:
        """A map entry's storage once quantized: ('int8 + float32', bytes, bytes unquantized)."""
        by_dtype: dict[str, int] = {}
        unquantized = 0
        prefix = name + "." if name else ""
        for tensor, (dtype, nbytes, unq) in (self._storage or {}).items():
            if tensor == name or tensor.startswith(prefix):
                by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
                unquantized += unq
        dtypes = " + ".join(d for d, _ in sorted(by_dtype.items(), key=lambda kv: -kv[1]))
        return dtypes, sum(by_dtype.values()), unquantized

    @property
    def quantized(self) -> bool:
        """True when the sizes shown are those of the model quantized (a quantization config applies)."""
        return self._storage is not None

    def _sizes(self) -> dict[str, int]:
        if self.plan is not None:
            return self.plan.sizes
        if self.model is not None:
            from ..big_model.planning.sizes import compute_module_sizes

            return compute_module_sizes(self.model, self.dtype)
        return {}

    def rows(self) -> list[dict[str, Any]]:
        """One row per map entry: module, device, size (bytes or None), class name."""
        sizes = self._sizes()
        classes = self.plan.classes if self.plan is not None else {}
        modules = dict(self.model.named_modules()) if self.model is not None else {}
        out = []
        for name, dev in self.device_map.items():
            cls = classes.get(name) or (type(modules[name]).__name__ if name in modules else "")
            row = {"module": name, "device": dev, "size": sizes.get(name) if sizes else None, "class": cls}
            if self.quantized:
                row["dtype"], row["size"], row["unquantized"] = self._quantized_row(name)
            out.append(row)
        return out

    def quantization_summary(self) -> str:
        """'bnb-nf4: 5.1 MiB, 21.3 MiB unquantized (4.2x smaller)', or '' for a view not quantized."""
        if not self.quantized:
            return ""
        rows = self.rows()
        total = sum(r["size"] or 0 for r in rows)
        unquantized = sum(r["unquantized"] for r in rows)
        ratio = f" ({unquantized / total:.1f}x smaller)" if total else ""
        method = self.quantization_config.method
        return f"{method}: {human_bytes(total)}, {human_bytes(unquantized)} unquantized{ratio}"

    def devices(self) -> list[dict[str, Any]]:
        """Per device: name, budget (or None), headroom, used, free, its rows."""
        rows = self.rows()
        devs = set(self._budgets) | {r["device"] for r in rows}
        headroom = self.plan.headroom if self.plan is not None else {}
        out = []
        for dev in sorted(devs, key=_order):
            mine = [r for r in rows if r["device"] == dev]
            used = sum(r["size"] or 0 for r in mine)
            budget = self._budgets.get(dev)
            if dev == "disk" and budget is not None and budget >= 2**60:
                budget = None
            room = headroom.get(dev, 0)
            out.append(
                {
                    "device": dev,
                    "name": _dev_name(dev),
                    "budget": budget,
                    "headroom": room,
                    "used": used,
                    "free": None if budget is None else budget - room - used,
                    "rows": mine,
                }
            )
        return out

    def moves(self) -> list[str]:
        """Why each block moved on to the next device, one sentence each."""
        if self.plan is None:
            return []
        return [f"{s.module}: {s.reason}" for s in self.plan.moved_on()]

    # -- text -----------------------------------------------------------------------------------
    def text_summary(self, width: int = 40) -> str:
        """Terminal-friendly summary: a bar per device, then the moves and the table."""
        rows = self.rows()
        total = sum(r["size"] or 0 for r in rows)
        lines = [f"Device map: {len(rows)} entries, {human_bytes(total)}"]
        if self.quantized:
            lines[0] = f"Device map: {len(rows)} entries, quantized {self.quantization_summary()}"
        if self.error:
            lines.append(f"ERROR: {self.error}")
        for d in self.devices():
            scale = _scale(d)
            filled = round(width * d["used"] / scale)
            reserved = round(width * d["headroom"] / scale)
            bar = "#" * filled + "." * max(width - filled - reserved, 0) + "/" * reserved
            budget = (
                f" of {self.format_bytes(d, d['budget'])}, {self.format_bytes(d, max(d['free'], 0))} free"
                if d["budget"] is not None
                else ""
            )
            head = f", headroom {self.format_bytes(d, d['headroom'])}" if d["headroom"] else ""
            scale_note = " (bar: contents)" if _scaled_to_contents(d) and d["budget"] is not None else ""
            lines.append(
                f"  {d['name']:>7s} [{bar[:width]}] {self.format_bytes(d, d['used'])} used{budget}{head}{scale_note}"
            )
        moves = self.moves()
        if moves:
            lines.append("Moved on:")
            lines += [f"  {m}" for m in moves]
        lines.append("Modules:")
        for r in rows:
            size = human_bytes(r["size"]) if r["size"] is not None else "?"
            line = f"  {r['module'] or '(model)':44s} {_dev_name(r['device']):>7s} {size:>10s}"
            if self.quantized:
                line += f"  {r['dtype']:<16s} (unquantized {human_bytes(r['unquantized'])})"
            lines.append(line.rstrip())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text_summary()

    def __repr__(self) -> str:
        devs = ", ".join(f"{d['name']}: {len(d['rows'])}" for d in self.devices())
        return f"<DeviceMapView {len(self.device_map)} entries ({devs})>"

    # -- HTML (notebook/device_map_html.py) -----------------------------------------------------
    def to_html(self, include_style: bool = True) -> str:
        """Static HTML: bars (modules coloured, headroom hatched, budget line), moves and the table."""
        return device_map_html(self, include_style)

    def format_bytes(self, d: dict[str, Any], nbytes: int) -> str:
        """Bytes in a device row: in its slider's unit once it has one, so slider and row agree."""
        unit = self._units.get(d["device"])
        if unit is None:
            return human_bytes(nbytes)
        return f"{nbytes / unit[0]:.1f} {unit[1]}" if unit[0] > 1 else f"{nbytes} B"

    def _repr_html_(self) -> str | None:
        if self._already_shown():
            return None
        return self.to_html()

    def _already_shown(self) -> bool:
        """True right after show_device_map displayed this view in the same cell."""
        return self._shown_in is not None and self._shown_in == _execution_count()

    # -- widget ---------------------------------------------------------------------------------
    def widget(self) -> Any:
        """The interactive view: one budget slider per device above the live HTML (ipywidgets)."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as w

        self._html_widget = w.HTML(self.to_html())
        sliders = []
        if self.model is not None and self._fixed_map is None:
            total = self._sizes().get("", 0)
            for dev, budget in self._budgets.items():
                if dev != "disk":
                    sliders.append(self._slider(w, dev, budget, total))
            self._html_widget.value = self.to_html()  # rows now written in the sliders' units
        self.sliders = sliders
        self._widget = w.VBox([*sliders, self._html_widget])
        self._widget.add_class("accel-nb-device-map-widget")
        return self._widget

    def _slider(self, w: Any, dev: Any, budget: int, total: int) -> Any:
        """A budget slider in the unit human_bytes uses for this budget; its device row keeps that unit."""
        unit, unit_name = self._units[dev] = _unit_of(budget or total)
        top = max(budget, 2 * total, unit) / unit
        slider = w.FloatSlider(
            value=budget / unit,
            min=0.0,
            max=top,
            step=max(round(top / 200, 1), 0.1),
            readout_format=".1f",
            description=f"{_dev_name(dev)} ({unit_name})",
            continuous_update=False,
            style={"description_width": "110px"},
            layout=w.Layout(width="520px"),
        )
        slider.add_class("accel-nb-budget-slider")
        slider.add_class(f"accel-nb-budget-slider-{str(dev).replace(':', '-')}")

        def on_change(change: Any) -> None:
            self.set_budget(dev, int(round(change["new"] * unit)))

        slider.observe(on_change, names="value")
        self._sliders_by_dev[dev] = slider
        return slider

    def _refresh(self) -> None:
        if self._html_widget is not None:
            self._html_widget.value = self.to_html()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self._already_shown():
            # show_device_map already displayed it in this very cell: do not draw it twice
            return {"text/plain": repr(self)}
        bundle = {"text/plain": self.text_summary(), "text/html": self.to_html()}
        if self._interactive:
            from .widget_compat import WIDGET_VIEW_MIME, view_bundle

            # ipywidgets 7 and 8 alike
            bundle[WIDGET_VIEW_MIME] = view_bundle(self.widget())[WIDGET_VIEW_MIME]
        return bundle

    _interactive = False


def _execution_count() -> int | None:
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "execution_count", None) if shell is not None else None


def show_device_map(
    model_or_map: Any,
    max_memory: Mapping[Any, Any] | None = None,
    interactive: bool | None = None,
    no_split_module_classes: Iterable[str | type] | None = None,
    dtype: Any = None,
    quantization_config: Any = None,
) -> DeviceMapView:
    """Draw where each module goes: bars per device, budgets, headroom, a module table.

        view = show_device_map(model, max_memory={0: "6GiB", "cpu": "30GiB"},
                               no_split_module_classes=["LlamaDecoderLayer"])
        device_map = view.device_map          # after moving the sliders
    ``model_or_map``: a model (empty/meta is best; its ``hf_device_map`` is shown if it was
    dispatched) or a plain ``{module: device}`` dict. ``interactive`` (default: in Jupyter with
    ipywidgets) adds one budget slider per device that recomputes the map live.
    ``quantization_config`` (a ``BnbQuantizationConfig`` or ``TorchAoQuantizationConfig``) plans and
    shows the model as ``load_and_quantize_model`` will load it: quantized sizes, the dtype per block
    and the unquantized size beside it (a model that loader quantized is shown so by itself).
    """
    from .display import widget_frontend_available

    if isinstance(model_or_map, Mapping):
        view = DeviceMapView(None, model_or_map, max_memory)
    elif getattr(model_or_map, "hf_device_map", None) is not None and max_memory is None:
        view = DeviceMapView(
            model_or_map,
            model_or_map.hf_device_map,
            None,
            no_split_module_classes,
            dtype,
            quantization_config,
        )
    else:
        view = DeviceMapView(
            model_or_map, None, max_memory, no_split_module_classes, dtype, quantization_config
        )
    frontend = widget_frontend_available()
    view._interactive = frontend if interactive is None else bool(interactive)
    if frontend:
        from IPython.display import display

        display(view)
        view._shown_in = _execution_count()
    else:  # a terminal: the text summary
        print(view.text_summary())
        view._shown_in = _execution_count()
    return view
