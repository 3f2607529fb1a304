"""Units as users write them on the command line: link rates in bits per second as tc writes them, sizes in
bytes, and times (the one parser of each: predict, split, commbench, testbed and doctor read theirs here)."""

from __future__ import annotations

import math
import re

from scaletrain.errors import UserError

RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}  # bits per second, tc's bit units
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
# bytes: K, M, G, T alone and KiB... are binary, KB, MB... decimal (a trailing B alone is bytes)
SIZE_UNITS = {"": 1, "b": 1, **{p.lower(): 2 ** (10 * i) for i, p in enumerate("KMGT", 1)},
              **{f"{p.lower()}ib": 2 ** (10 * i) for i, p in enumerate("KMGT", 1)},
              **{f"{p.lower()}b": 10 ** (3 * i) for i, p in enumerate("KMGT", 1)}}


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


def parse_size(text: str) -> int:
    """`4096`, `1K`, `64M`, `512MiB`, `2GB`, `1.5G` -> bytes (K/M/G/T alone and KiB.. binary, KB.. decimal),
    whatever its sign: the caller says what it accepts. ValueError (OverflowError for `inf`) for what is not a
    size; `size_flag` turns that into the one line a user reads."""
    m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?|[-+]?inf)\s*([a-z]*)\s*", (text or "").lower())
    if not m or m.group(2) not in SIZE_UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2)])


def size_flag(text: str, flag: str) -> int:
    """A flag's positive size in bytes, or one line naming the flag and what to write."""
    try:
        value = parse_size(text)
    except (ValueError, OverflowError):
        value = 0
    if value <= 0:
        raise UserError(f"{flag} {text!r}: give a positive size such as 512MiB, 2GiB or 1500000000")
    return value
