"""How progress and metrics read as text: durations, rates, metric values, one-line bars.

The one home of these rules: the rank's text bar, the parent's widget and text reporters all
format through here. Pure functions; imports nothing.

    format_progress_line(45, 100, rate=12.0, metrics={"loss": 0.3}, desc="train")
    # 'train:  45%|#########           | 45/100 [12.0 it/s, ETA 0:05] loss=0.3'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def plain_value(value: Any) -> Any:
    """Tensors / numpy scalars -> Python numbers, so events pickle small and print well."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "ndim", 0) == 0:
        try:
            return item()
        except Exception:  # noqa: BLE001 - keep the value as it is
            return value
    return value


def format_duration(seconds: float | None) -> str:
    """``75.2`` -> ``"1:15"``, ``3725`` -> ``"1:02:05"``; ``None`` or negative -> ``"?"``."""
    if seconds is None or seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_rate(rate: float | None, unit: str = "it") -> str:
    """Steps per second, readable: ``1234.5`` -> ``"1234 it/s"``, ``0.2`` -> ``"5.00 s/it"``."""
    if not rate or rate <= 0:
        return f"? {unit}/s"
    if rate >= 100:
        return f"{rate:.0f} {unit}/s"
    if rate >= 1:
        return f"{rate:.1f} {unit}/s"
    return f"{1.0 / rate:.2f} s/{unit}"


def format_value(value: Any) -> str:
    """A metric value, short: floats with 4 significant digits, anything else with ``str``."""
    value = plain_value(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_metrics(metrics: Mapping[str, Any] | None) -> str:
    """``{"loss": 0.123456, "lr": 1e-3}`` -> ``"loss=0.1235 lr=0.001"``."""
    if not metrics:
        return ""
    return " ".join(f"{k}={format_value(v)}" for k, v in metrics.items())


def eta_seconds(n: int, total: int | None, rate: float | None) -> float | None:
    """Seconds left at ``rate`` steps/s, or ``None`` when it cannot be known."""
    if total is None or not rate or rate <= 0:
        return None
    return max(total - n, 0) / rate


def format_progress_line(
    n: int,
    total: int | None,
    rate: float | None = None,
    metrics: Mapping[str, Any] | None = None,
    desc: str | None = None,
    width: int = 20,
    elapsed: float | None = None,
) -> str:
    """One line of text for a loop: ``"train  45%|#########           | 45/100 [12.0 it/s, ETA 0:04] loss=0.3"``."""
    parts = []
    if desc:
        parts.append(f"{desc}:")
    if total:
        frac = min(max(n / total, 0.0), 1.0)
        filled = int(frac * width)
        parts.append(f"{frac * 100:3.0f}%|{'#' * filled}{' ' * (width - filled)}| {n}/{total}")
    else:
        parts.append(f"{n} it")
    stats = [format_rate(rate)]
    if elapsed is not None:
        stats.insert(0, format_duration(elapsed))
    if total and n < total:
        stats.append(f"ETA {format_duration(eta_seconds(n, total, rate))}")
    parts.append(f"[{', '.join(stats)}]")
    text = format_metrics(metrics)
    if text:
        parts.append(text)
    return " ".join(parts)


def one_line(text: Any, limit: int = 200) -> str:
    """The first line of a (maybe multi-line) message, cut to ``limit`` characters, for summary rows.

    one_line("boom\nmore detail")   # 'boom ...'
    """
    text = str(text or "").strip()
    first, _, rest = text.partition("\n")
    first = first.rstrip()
    cut = len(first) > limit
    if cut:  # at a word's end: a summary cut mid-word ("on the same wo ...") reads as a typo
        head = first[: limit - 1]
        space = head.rfind(" ")
        first = (head[:space] if space > limit // 2 else head).rstrip(" ,;:")
    return first + (" ..." if cut or rest.strip() else "")


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``plural(1, "process")`` -> ``"1 process"``, ``plural(2, "process")`` -> ``"2 processes"``, ``"1,200 lines"``."""
    if count == 1:
        return f"1 {noun}"
    if plural_form is None:
        plural_form = noun + ("es" if noun.endswith(("s", "x", "sh", "ch")) else "s")
    return f"{count:,} {plural_form}"
