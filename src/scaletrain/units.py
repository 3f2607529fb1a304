"""Units as users write them on the command line: link rates in bits per second as tc writes them, and
times (the one parser of each: predict, split, testbed and doctor read theirs here)."""

from __future__ import annotations

import math
import re

from scaletrain.errors import UserError

RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}  # bits per second, tc's bit units
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def parse_rate(text: str, flag: str = "--link") -> float:
    """A link rate in bits per second as tc writes it (`100mbit`, `10gbit`), `/s` allowed (`10Gbit/s`) -> bytes
    per second: the one rate parser (split, testbed and doctor read theirs with it). tc's `bps` units are
    bytes per second, and most people mean bits by them: refused, saying so."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[-+]?[0-9]+)?)\s*([a-z]+)(?:/s)?\s*", (text or "").lower())
    try:
        value = float(m.group(1)) * RATE_UNITS[m.group(2)] / 8 if m else math.nan
    except (KeyError, ValueError):  # an unknown unit, or `1.2.3`
        value = math.nan
    if not 0 < value < math.inf:
        hint = " ('bps' is bytes per second to tc, bits to most: write bit)" if "bps" in (text or "").lower() else ""
        raise UserError(f"{flag} {text!r} is not a rate in bits per second{hint}: give a positive one such as "
                        "100mbit, 1gbit or 10Gbit/s")
    return value


def parse_latency(text: str | None) -> float:
    """`1ms`, `200us`, `0.5s` -> seconds; nothing -> 0."""
    if not text:
        return 0.0
    m = re.fullmatch(r"\s*([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)\s*(s|ms|us)\s*", text)
    try:
        value = float(m.group(1)) * TIME_UNITS[m.group(2)] if m else math.nan
    except ValueError:  # `1.2.3ms`
        value = math.nan
    if not 0 <= value < math.inf:
        raise UserError(f"--latency {text!r} is not a time: give 0 or more, such as 1ms, 200us or 0.5ms")
    return value
