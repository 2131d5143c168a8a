"""``config_wizard()``: a widget that shows this machine, proposes launch settings and saves them.

Every change is validated at once (an error line names the key; Save is disabled while a value is
invalid); the equivalent ``%%accelerate`` line, ``notebook_launcher(...)`` call and
``accel-nb launch`` command follow the settings live. Save writes the YAML atomically.

    from accel_nb import config_wizard
    wizard = config_wizard()        # display it: the last expression of a cell
    wizard.set_values(num_processes=2, mixed_precision="no")
    wizard.save()                   # what the Save button does; returns the path, None if invalid
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from ..config import (
    ConfigError,
    LaunchConfig,
    default_config,
    default_config_path,
    derive_distributed_type,
    load_config,
    save_config,
)
from ..config.questions import ENGINES, QUESTIONS, Question, question
from ..hardware import HardwareInfo, detect
from ..parallel.config import LAYOUT_CHOICES, LayoutError, layout_settings, proposed_tp_size
from .wizard_text import commands_html, engine_settings, hardware_summary, launches_text, layout_summary

# the controls that are the config's own fields (the others make a section: an engine's mapping, parallelism_config)
_FIELDS = tuple(
    q.key for q in QUESTIONS if q.wizard and q.key in {f.name for f in dataclasses.fields(LaunchConfig)}
)
_TEXT_KEYS = tuple(q.key for q in QUESTIONS if q.kind == "text")  # set_values takes None for ""


class ConfigWizard:
    """The widget and its API: ``controls`` (by config key), ``config``, ``error``, ``status``, ``save()``."""

    def __init__(self, path: str | None = None, hw: HardwareInfo | None = None) -> None:
        try:
            import ipywidgets  # noqa: F401
        except ImportError:
            raise ImportError(
                "config_wizard() needs ipywidgets: pip install 'accel_nb[notebook]'. "
                "In a terminal, `accel-nb config` asks the same questions."
            ) from None

        self.path = path or default_config_path()
        self.hw = hw or detect()
        self.error: ConfigError | None = None
        self.notes: list[str] = []
        self._status = ""
        self._config: LaunchConfig | None = None
        self._base, loaded_note = self._load_base(path)
        self.proposed = default_config(self.hw)
        self.controls = self._make_controls(self._base)
        self.widget = self._make_layout()
        self._updating = False
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        self.controls["compute"].observe(self._on_compute, names="value")
        self.controls["use_parallelism_config"].observe(self._on_layout, names="value")
        self._set_status(loaded_note or f"Proposed for this machine; Save writes {self.path}.")
        self._refresh()

    def _load_base(self, path: str | None) -> tuple[LaunchConfig, str]:
        """The config the controls start from (the saved one, else this machine's proposal) and a note."""
        try:
            base = load_config(path) if path is None or _exists(path) else None
        except ConfigError as exc:
            return default_config(
                self.hw
            ), f"The saved config cannot be used ({exc}); showing this machine's proposal."
        if base is None:
            return default_config(self.hw), ""
        return base, f"Loaded {base.source}."

    def _compute_choice(self, b: LaunchConfig) -> tuple[list[tuple[str, str]], str]:
        """The "Compute on" options this machine offers, and the one ``b`` uses."""
        options = [("CPU processes", "cpu")]
        if self.hw.num_gpus:
            options.append((f"GPUs ({self.hw.num_gpus})", "gpu"))
        if self.hw.xla_available or b.distributed_type == "XLA":
            options.append(("TPU / XLA", "xla"))
        compute = {"XLA": "xla", "MULTI_GPU": "gpu", "MULTI_CPU": "cpu"}.get(b.distributed_type)
        if compute is None:
            compute = "cpu" if b.use_cpu or not self.hw.num_gpus else "gpu"
        if compute not in [v for _, v in options]:
            compute = options[-1][1] if self.hw.num_gpus else "cpu"
        return options, compute

    def _make_controls(self, b: LaunchConfig) -> dict[str, Any]:
        """One widget per question of the table that the wizard renders (``config.questions``), showing ``b``."""
        import ipywidgets as w

        options, compute = self._compute_choice(b)
        # each engine's saved mapping (deepspeed_config, megatron_lm_config), where the file trains with it
        saved = {
            e.section: e.distributed_type == b.distributed_type and b.extras.get(e.config_key)
            for e in ENGINES
        }
        saved = {section: dict(mapping or {}) for section, mapping in saved.items()}
        # a saved layout is kept with FSDP, or with plain data parallel where the file has one (any type may)
        kinds = ("FSDP", "MULTI_CPU", "MULTI_GPU")
        layout = dict(b.extras.get("parallelism_config") or {}) if b.distributed_type in kinds else {}
        self._saved_layout_without_fsdp = bool(layout) and b.distributed_type != "FSDP"
        values: dict[str, Any] = {
            "compute": compute,
            "num_processes": b.num_processes or max(self.hw.num_gpus, 1),
            "gradient_accumulation_steps": min(b.gradient_accumulation_steps, 64),
            "main_process_ip": b.main_process_ip or "",
            "main_process_port": str(b.main_process_port or ""),
            # empty: the settings below
            "deepspeed_config_file": str(saved["deepspeed"].get("deepspeed_config_file") or ""),
            **{e.switch: b.distributed_type == e.distributed_type for e in ENGINES},
            "use_fsdp": b.distributed_type == "FSDP",
            "use_parallelism_config": bool(layout),
            "tp_size": int(layout.get("parallelism_config_tp_size", proposed_tp_size(b.num_processes))),
        }
        choices = {
            "compute": options,
            "dynamo_backend": [*question("dynamo_backend").options(), b.dynamo_backend],
        }
        c: dict[str, Any] = {}
        for q in (q for q in QUESTIONS if q.wizard):
            if q.key in values:
                value = values[q.key]
            elif q.section in saved:
                value = saved[q.section].get(q.key, q.default)
            elif q.section == "layout":
                value = layout.get(f"parallelism_config_{q.key}", q.default)
            else:
                value = getattr(b, q.key)
            c[q.key] = _control(w, q, value, choices.get(q.key))
        for control in c.values():
            control.style = {"description_width": "170px"}
            # one layout each (hiding gpu_ids must not hide the rest); as wide as the cell allows, up to 480 px:
            # a fixed width overflowed a narrow cell and cut the slider's value off
            # 8 px: the widget's margins
            control.layout = w.Layout(width="calc(100% - 8px)", max_width="480px")
        return c

    def _make_layout(self) -> Any:
        """The labels, buttons and the box that holds them with the controls."""
        import ipywidgets as w

        c = self.controls
        self.hardware_box = w.HTML(
            f"<pre style='margin:0;white-space:pre-wrap;overflow-wrap:normal;word-break:normal'>{html.escape(hardware_summary(self.hw))}</pre>"
        )
        self.error_label = w.HTML("")
        self.notes_label = w.HTML("")
        self.commands = w.HTML("")
        self.commands_text = ""  # the same commands as plain text (one per line)
        self.save_button = w.Button(description="Save", button_style="primary", icon="save")
        # width "auto": the default button width cuts this label off
        self.reset_button = w.Button(description="Proposed for this machine", layout=w.Layout(width="auto"))
        self.status_label = w.HTML("")
        self.save_button.on_click(lambda _b: self.save())
        self.reset_button.on_click(lambda _b: self.reset())
        self._multi = w.VBox(
            [c["machine_rank"], c["main_process_ip"], c["main_process_port"], c["rdzv_backend"]]
        )
        self._engine_boxes = {e.section: w.VBox([c[k] for k in e.keys()]) for e in ENGINES}  # its settings
        self.layout_label = w.HTML("")  # "FSDP shards over 2 processes: dp_replicate=1 × dp_shard=2 × ..."
        self._sizes_box = w.VBox([*(c[k] for k in LAYOUT_CHOICES), self.layout_label])
        self._layout_box = w.VBox([c["use_parallelism_config"], self._sizes_box])
        return w.VBox(
            [
                w.HTML("<b>accel_nb launch config</b> &mdash; this machine:"),
                self.hardware_box,
                c["compute"],
                c["num_processes"],
                c["gpu_ids"],
                c["mixed_precision"],
                c["gradient_accumulation_steps"],
                c["start_method"],
                *(x for e in ENGINES for x in (c[e.switch], self._engine_boxes[e.section])),
                c["use_fsdp"],
                self._layout_box,
                c["dynamo_backend"],
                c["num_machines"],
                self._multi,
                self.error_label,
                self.notes_label,
                w.HBox([self.save_button, self.reset_button], layout=w.Layout(flex_flow="row wrap")),
                self.status_label,
                w.HTML("<b>Equivalent launches</b>"),
                self.commands,
            ]
        )

    # ------------------------------------------------------------------ public API

    @property
    def config(self) -> LaunchConfig | None:
        """The config the controls describe, validated; ``None`` while a value is invalid."""
        return self._config

    @property
    def valid(self) -> bool:
        return self._config is not None

    @property
    def status(self) -> str:
        """The status line as plain text (e.g. "Saved to ...", or the error)."""
        return self._status

    def set_values(self, **values: Any) -> LaunchConfig | None:
        """Set controls by config key (as a user would), e.g. ``set_values(num_processes=2)``; returns ``config``."""
        unknown = [k for k in values if k not in self.controls]
        if unknown:
            raise KeyError(
                f"config_wizard has no control {unknown[0]!r}; controls: {', '.join(self.controls)}"
            )
        self._updating = True
        try:
            if "compute" in values:
                self.controls["compute"].value = values.pop("compute")
            for key, value in values.items():
                control = self.controls[key]
                if key in _TEXT_KEYS:
                    value = "" if value is None else str(value)
                control.value = value
        finally:
            self._updating = False
        self._refresh()
        return self._config

    def save(self) -> str | None:
        """Validate and write the YAML (atomically): what the Save button does. Returns the path, or None."""
        self._refresh()
        if self._config is None:
            self._set_status(f"Not saved: {self.error}")
            return None
        try:
            written = save_config(self._config, self.path)
        except (ConfigError, OSError) as exc:
            self._set_status(f"Not saved: {exc}")
            return None
        self._set_status(f"Saved to {written}")
        return written

    def reset(self) -> None:
        """Put the proposal for this machine back into the controls."""
        p = self.proposed
        compute = {"XLA": "xla", "MULTI_GPU": "gpu"}.get(
            p.distributed_type, "gpu" if self.hw.num_gpus else "cpu"
        )
        self.set_values(
            compute=compute,
            num_processes=p.num_processes or 1,
            mixed_precision=p.mixed_precision,
            gradient_accumulation_steps=1,
            gpu_ids="all",
            start_method="auto",
            num_machines=1,
            machine_rank=0,
            main_process_ip="",
            main_process_port="",
            dynamo_backend="no",
            use_fsdp=False,
            use_parallelism_config=False,
            **{e.switch: False for e in ENGINES},
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        from .widget_compat import view_bundle

        return view_bundle(self.widget, repr(self))  # ipywidgets 7 and 8 alike

    def __repr__(self) -> str:
        return f"<ConfigWizard path={self.path!r} valid={self.valid} status={self._status!r}>"

    # ------------------------------------------------------------------ internals

    def _on_compute(self, change: dict[str, Any]) -> None:
        if self._updating:
            return
        self._updating = True
        try:
            if change["new"] == "gpu":
                self.controls["num_processes"].value = (
                    max(self.hw.num_gpus, 1) * self.controls["num_machines"].value
                )
                if self.proposed.mixed_precision != "no":
                    self.controls["mixed_precision"].value = self.proposed.mixed_precision
            elif change["new"] == "xla" and self.hw.xla_runtime is not None:
                self.controls["num_processes"].value = self.hw.xla_runtime.num_devices
            elif change["new"] == "cpu" and self.controls["mixed_precision"].value == "fp16":
                self.controls["mixed_precision"].value = "no"
        finally:
            self._updating = False
        self._refresh()

    def _on_layout(self, change: dict[str, Any]) -> None:
        """Turning the layout on (a click) with every size 1 proposes tensor parallel over 2, as `accel-nb config` does."""
        c = self.controls
        if self._updating or not change["new"] or any(c[k].value != 1 for k in LAYOUT_CHOICES):
            return
        if proposed_tp_size(c["num_processes"].value) != 1:
            self.set_values(tp_size=proposed_tp_size(c["num_processes"].value))

    def _on_change(self, _change: dict[str, Any]) -> None:
        if not self._updating:
            self._refresh()

    def _read(self) -> LaunchConfig:
        c = self.controls
        compute = c["compute"].value
        values = {key: c[key].value for key in _FIELDS}
        values["main_process_ip"] = values["main_process_ip"].strip() or None
        values["main_process_port"] = values["main_process_port"].strip() or None
        cfg = dataclasses.replace(self._base, use_cpu=compute == "cpu", **values)
        cfg.extras = dict(self._base.extras)
        cfg.source = None  # errors name the key, not a file the value is not in yet
        for e in ENGINES:
            cfg.extras.pop(e.config_key, None)
            if cfg.distributed_type == e.distributed_type:
                cfg.distributed_type = "NO"  # derived again below
        answers = self._answers()
        engine = next((e for e in ENGINES if answers[e.switch] and compute != "xla"), None)
        if engine is not None:  # DeepSpeed or Megatron-LM, as `accel-nb config` writes it
            cfg.distributed_type = engine.distributed_type
            cfg.dynamo_backend = "no"  # accel_nb does not compile their engines
            cfg.extras.pop("fsdp_config", None)
            cfg.extras[engine.config_key] = engine_settings(engine, {k: c[k].value for k in engine.keys()})
        elif c["use_fsdp"].value and compute != "xla":
            cfg.distributed_type = "FSDP"  # kept while there are several processes (derived below)
        else:
            if cfg.distributed_type == "FSDP":
                cfg.distributed_type = "NO"  # derived again below
            cfg.extras.pop("fsdp_config", None)
        cfg.extras.pop("parallelism_config", None)
        try:
            cfg.distributed_type = derive_distributed_type(cfg, compute)
        except (TypeError, ValueError):
            pass  # an invalid number of processes or machines: validate() names the key
        fsdp = cfg.distributed_type == "FSDP"
        plain = self._saved_layout_without_fsdp and cfg.distributed_type in ("MULTI_CPU", "MULTI_GPU")
        if c["use_parallelism_config"].value and (fsdp or plain):
            try:
                cfg.extras["parallelism_config"] = layout_settings(
                    cfg.num_processes, **{k: c[k].value for k in LAYOUT_CHOICES}, fsdp=fsdp
                )
            except LayoutError as exc:  # the sizes do not fit the processes: the error line says so
                raise ConfigError(exc.key, exc.value, exc.allowed, None, exc.reason) from None
        return cfg

    def _refresh(self) -> None:
        c = self.controls
        answers = self._answers()
        c["gpu_ids"].layout.display = None if question("gpu_ids").asked(answers) else "none"
        self._multi.layout.display = None if question("machine_rank").asked(answers) else "none"
        self._show_engine_controls()
        self._show_layout_controls()
        try:
            cfg = self._read().validate()
            self.notes = cfg.check_hardware(self.hw)
            self._config, self.error = cfg, None
        except ConfigError as exc:
            self._config, self.error, self.notes = None, exc, []
        self.save_button.disabled = self._config is None
        if self.error is not None:
            self.error_label.value = (
                f"<span style='color:#b00020'>&#9888; <b>{html.escape(str(self.error.key))}</b>: "
                f"{html.escape(str(self.error))}</span>"
            )
        else:
            self.error_label.value = ""
        layout = (self._config.extras.get("parallelism_config") if self._config is not None else None) or {}
        self.layout_label.value = (
            f"<div style='color:#444;padding-left:8px'>{html.escape(layout_summary(layout))}</div>"
            if layout
            else ""
        )
        self.notes_label.value = "".join(
            f"<div style='color:#8a6d00'>note: {html.escape(n)}</div>" for n in self.notes
        )
        if self._config is not None:
            text = launches_text(self._config)
            self.commands_text = text
            self.commands.value = commands_html(text)
        else:
            self.commands_text = ""
            self.commands.value = (
                "<pre style='margin:0;color:#777'>(fix the value above to see the commands)</pre>"
            )
        if self._status.startswith(("Saved to", "Changed since")):
            fix = "" if self._config is not None else "; fix the value above to save again"
            self._set_status(f"Changed since the last save{fix}.")

    def _answers(self) -> dict[str, Any]:
        """The controls' values by question key, as the table's rules read them (a hidden control is no answer)."""
        answers = {key: control.value for key, control in self.controls.items()}
        answers["saved_layout"] = self._saved_layout_without_fsdp
        self._engines_offered(answers)
        return answers

    def _engines_offered(self, answers: dict[str, Any]) -> dict[str, bool]:
        """Whether each engine's switch shows, by its switch key; ``answers`` gets the switches that count.

        The table's rule (installed, the compute, no engine above it on); the saved config's engine shows while it
        is ticked (not on XLA, none above it on), to be turned off.
        """
        offered, above = {}, False
        for e in ENGINES:
            saved = self._base.distributed_type == e.distributed_type and answers["compute"] != "xla"
            offered[e.switch] = question(e.switch).asked(answers) or (
                saved and answers[e.switch] and not above
            )
            answers[e.switch] = offered[e.switch] and bool(answers[e.switch])
            above = above or answers[e.switch]
        return offered

    def _show(self, keys: Any, answers: dict[str, Any]) -> None:
        for key in keys:
            self.controls[key].layout.display = None if question(key).asked(answers) else "none"

    def _show_engine_controls(self) -> None:
        """Each engine where the table offers it, its box while on; each setting only where its rule holds."""
        c, answers = self.controls, {key: control.value for key, control in self.controls.items()}
        offered = self._engines_offered(answers)
        for e in ENGINES:
            c[e.switch].layout.display = None if offered[e.switch] else "none"
            self._engine_boxes[e.section].layout.display = None if answers[e.switch] else "none"
            self._show(e.keys(), {**answers, e.switch: True})  # inside the box: shown with it
        self._show(["dynamo_backend"], answers)

    def _show_layout_controls(self) -> None:
        """FSDP where the table offers it (several processes, not XLA, not DeepSpeed); the layout with FSDP."""
        answers = self._answers()
        self._show(["use_fsdp"], answers)
        offered = question("use_fsdp").asked(answers) and question("use_parallelism_config").asked(answers)
        self._layout_box.layout.display = None if offered else "none"
        self._sizes_box.layout.display = None if question("tp_size").asked(answers) else "none"

    def _set_status(self, text: str) -> None:
        self._status = text
        color = (
            "#b00020" if text.startswith("Not saved") else "#1b5e20" if text.startswith("Saved") else "#444"
        )
        # a long path wraps inside the cell (a narrow window cut it off)
        style = f"color:{color};line-height:1.4;overflow-wrap:anywhere"
        self.status_label.value = f"<div style='{style}'>{html.escape(text)}</div>"


def _control(w: Any, q: Question, value: Any, options: Any = None) -> Any:
    """The widget for the question ``q`` (by its kind), showing ``value``."""
    text = {"continuous_update": True}
    if q.kind == "choice":
        options = list(dict.fromkeys(options if options is not None else q.options()))
        kind = type(options[0]) if not isinstance(options[0], tuple) else None
        return w.Dropdown(options=options, value=kind(value) if kind else value, description=q.label)
    if q.kind == "bool":
        return w.Checkbox(value=_as_bool(value), description=q.label, indent=True)
    if q.kind == "float":
        return w.BoundedFloatText(value=float(value), min=0.0, max=1e9, description=q.label)
    if q.kind == "int" and q.slider:
        return w.IntSlider(value=value, min=q.slider[0], max=q.slider[1], description=q.label)
    if q.kind == "int":
        return w.IntText(value=int(value), description=q.label, **text)
    return w.Text(value=str(value or ""), description=q.label, placeholder=q.placeholder, **text)


def _as_bool(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")


def _exists(path: str) -> bool:
    import os

    return os.path.exists(os.path.expanduser(path))


def config_wizard(path: str | None = None) -> ConfigWizard:
    """Show this machine, propose launch settings, validate edits live and save them to the config file.

    wizard = config_wizard()      # last line of a cell: the widget appears
    """
    return ConfigWizard(path)
