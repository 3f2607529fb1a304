"""Numbers as people read them, one function per kind, for every command's console, report and page (the one
formatting module: it imports nothing but math, so every layer may use it); a missing value is "-", never 0."""

from __future__ import annotations

import math

DASH = "-"


def duration(seconds: float | None) -> str:
    """Milliseconds under a second (steps, phases), seconds above."""
    if seconds is None:
        return DASH
    return f"{seconds * 1000:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def ms(seconds: float | None, unit: bool = True) -> str:
    """Milliseconds with one decimal: a step's or a phase's time in a table (`12.3 ms`, or `12.3` in a column
    headed by its unit)."""
    if seconds is None:
        return DASH
    return f"{seconds * 1000:.1f}" + (" ms" if unit else "")


def ms_sig(seconds: float | None, unit: bool = True) -> str:
    """Milliseconds with three significant digits, for times that span many decades (one layer's forward:
    `0.0123 ms`, `1.23e-03 ms` under 0.01 ms)."""
    if seconds is None:
        return DASH
    value = seconds * 1e3
    text = f"{value:.3g}" if value >= 0.01 or value == 0 else f"{value:.1e}"
    return text + (" ms" if unit else "")


def span(seconds: float, sign: str = "") -> str:
    """A duration in the unit that shows it: `1.500 s`, `12.3 ms`, `42 us`; sign "+" writes the sign (an
    offset)."""
    if abs(seconds) >= 1:
        return f"{seconds:{sign}.3f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:{sign}.1f} ms"
    return f"{seconds * 1e6:{sign}.0f} us"


def hms(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def share(fraction: float | None, digits: int = 1) -> str:
    return DASH if fraction is None else f"{100 * fraction:.{digits}f}%"


def change(fraction: float | None, digits: int = 1) -> str:
    """A relative change with its sign: -0.42 -> '-42.0%'."""
    return DASH if fraction is None else f"{100 * fraction:+.{digits}f}%"


def size(n_bytes: float | None, up: bool = False) -> str:
    """`3.0 GiB`, one decimal; rounded up when `up` (a memory need shown is then itself enough)."""
    if n_bytes is None:
        return DASH
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            value = math.ceil(n_bytes / scale * 10) / 10 if up else n_bytes / scale
            return f"{value:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def message_size(n_bytes: int) -> str:
    """A message's size as `--sizes` writes it: `64K`, `1M`, `512B` (binary multiples)."""
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g}{unit}"
    return f"{n_bytes}B"


def number(x: float | None) -> str:
    """A count or a rate: whole with thousands separated from 100 up, three significant digits below, so a
    slow run's 0.43 samples/s is not shown as 0."""
    if x is None:
        return DASH
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def rate(per_s: float | None, unit: str = "") -> str:
    """`877/s`, `0.43/s`; with a unit `1,234 samples/s`."""
    if per_s is None:
        return DASH
    return f"{number(per_s)} {unit}/s" if unit else f"{number(per_s)}/s"


def factor(x: float | None) -> str:
    return DASH if x is None else f"{x:.2f}x"


def setting(x: object) -> str:
    """A configuration value as written in config.toml: `true`, `0.1`, `1, 2, 4`; unset is "not set"."""
    if x is None:
        return "not set"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, list):
        return ", ".join(setting(v) for v in x)
    return f"{x:g}" if isinstance(x, float) else str(x)


def value(kind: str, x: float | None) -> str:
    """Format by kind: 'time', 'rate', 'share', 'factor', 'seconds'."""
    if kind == "time":
        return duration(x)
    if kind == "seconds":
        return DASH if x is None else f"{x:.2f} s"
    if kind == "rate":
        return rate(x)
    if kind == "share":
        return share(x)
    if kind == "factor":
        return factor(x)
    raise ValueError(f"unknown kind {kind!r}")
