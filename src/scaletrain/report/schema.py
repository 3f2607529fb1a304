"""The types the report expects of each file it reads, and the one check that names a file, key and type.

A value of the wrong type (`"world_size": "two"`) would otherwise surface as a traceback deep in a table
or a plot; `check` turns it into one line naming the file, the key and the type expected. Keys that are
absent are fine (the report says what it cannot show); keys not listed here are not looked at.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from scaletrain.errors import UserError


@dataclass(frozen=True)
class Kind:
    """A JSON scalar type (or "object"/"list" of anything), described as in an error message."""

    name: str
    words: str


@dataclass(frozen=True)
class Opt:
    """`inner`, or null."""

    inner: Any


@dataclass(frozen=True)
class AnyOf:
    """One of `options`; `words` describes them all at once."""

    options: tuple[Any, ...]
    words: str


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    """An object with any keys whose values are all `value`."""

    value: Any


@dataclass(frozen=True)
class Record:
    """An object whose listed keys, when present, have the given types; `required` keys must be present."""

    keys: dict[str, Any]
    required: tuple[str, ...] = field(default=())


INT = Kind("int", "an integer")
NUM = Kind("number", "a number")
STR = Kind("str", "a string")
BOOL = Kind("bool", "true or false")
OBJECT = Kind("object", "an object")
SCALAR = AnyOf((NUM, STR, BOOL), "a number, string or true/false")


def describe(spec: Any) -> str:
    """The expected type in words: "an integer", "a list of numbers", "a number or null"."""
    if isinstance(spec, (Kind, AnyOf)):
        return spec.words
    if isinstance(spec, Opt):
        return f"{describe(spec.inner)} (or null)"
    if isinstance(spec, ListOf):
        return f"a list of {_plural(describe(spec.item))}"
    if isinstance(spec, MapOf):
        return f"an object of {_plural(describe(spec.value))}"
    return "an object"


def _plural(words: str) -> str:
    if words == SCALAR.words:
        return "numbers, strings or true/false"
    for one, many in (("an integer", "integers"), ("a number", "numbers"), ("a string", "strings"),
                      ("an object", "objects"), ("a list", "lists")):
        if words.startswith(one):
            return many + words[len(one):]
    return words


def json_type(value: Any) -> str:
    """What a JSON value is, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


_ABSENT = object()  # a required key's "value" when it is missing


class Mismatch(Exception):
    def __init__(self, key: str, value: Any, expected: str) -> None:
        super().__init__(key)
        self.key, self.value, self.expected = key, value, expected


def find_mismatch(value: Any, spec: Any, key: str = "") -> Mismatch | None:
    """The first value (depth first, in the spec's key order) that is not of its type; None when all are."""
    try:
        _check(value, spec, key)
    except Mismatch as m:
        return m
    return None


def _matches(value: Any, kind: Kind) -> bool:
    if kind.name == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # true is not 1 here
        return False
    return {"int": isinstance(value, int), "number": isinstance(value, (int, float)),
            "str": isinstance(value, str), "object": isinstance(value, dict)}[kind.name]


def _check(value: Any, spec: Any, key: str) -> None:
    if isinstance(spec, Opt):
        if value is not None:
            try:
                _check(value, spec.inner, key)
            except Mismatch as m:  # the value itself (not an item within it): null was fine too
                raise (Mismatch(key, value, describe(spec)) if m.key == key else m) from None
    elif isinstance(spec, AnyOf):
        if not any(find_mismatch(value, o, key) is None for o in spec.options):
            raise Mismatch(key, value, describe(spec))
    elif isinstance(spec, Kind):
        if not _matches(value, spec):
            raise Mismatch(key, value, describe(spec))
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            raise Mismatch(key, value, describe(spec))
        for i, item in enumerate(value):
            _check(item, spec.item, f"{key}[{i}]")
    elif isinstance(spec, MapOf):
        if not isinstance(value, dict):
            raise Mismatch(key, value, describe(spec))
        for k, v in value.items():
            _check(v, spec.value, f"{key}.{k}" if key else k)
    else:
        if not isinstance(value, dict):
            raise Mismatch(key, value, describe(spec))
        missing = [k for k in spec.required if k not in value]
        if missing:
            raise Mismatch(f"{key}.{missing[0]}" if key else missing[0], _ABSENT, describe(spec.keys[missing[0]]))
        for k, sub in spec.keys.items():
            if k in value:
                _check(value[k], sub, f"{key}.{k}" if key else k)


def check(value: Any, spec: Any, where: str, fix: str) -> None:
    """UserError `WHERE: "KEY" is VALUE (TYPE), expected TYPE: FIX` for the first value of the wrong type."""
    m = find_mismatch(value, spec)
    if m is None:
        return
    if m.value is _ABSENT:
        raise UserError(f'{where}: "{m.key}" is missing, expected {m.expected}: {fix}')
    shown = json.dumps(m.value, default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    if not m.key:
        raise UserError(f"{where} holds {json_type(m.value)} where {m.expected} is expected: {fix}")
    raise UserError(f'{where}: "{m.key}" is {shown} ({json_type(m.value)}), expected {m.expected}: {fix}')


# ---- what each file holds (docs/run-directory.md), as far as the report reads it ----

FINDING = Record({"kind": STR, "share": Opt(NUM), "message": STR, "lever": Opt(STR)}, required=("kind", "message"))
RANK_STATS = Record({"rank": INT, "phases_mean_s": Opt(MapOf(NUM)), "step_time_mean_s": Opt(NUM),
                     "step_time_p50_s": Opt(NUM), "step_time_p90_s": Opt(NUM), "step_time_max_s": Opt(NUM),
                     "slowest_share": Opt(NUM), "peak_memory_bytes": Opt(NUM)}, required=("rank",))
STRAGGLERS = Record({"steps_compared": Opt(INT), "spread_mean_s": Opt(NUM), "slowest_counts": Opt(MapOf(INT)),
                     "repeated": Opt(ListOf(Record({"rank": INT, "share": NUM, "lag_mean_s": NUM},
                                                   required=("rank", "share", "lag_mean_s"))))})

SUMMARY = Record({
    "status": STR, "error": Opt(STR), "model": Opt(STR), "dataset": Opt(STR), "world_size": Opt(INT),
    "global_batch": Opt(INT), "epochs": Opt(INT), "epochs_planned": Opt(INT), "top1": Opt(NUM), "top5": Opt(NUM),
    "samples_per_s": Opt(NUM), "epoch_times_s": Opt(ListOf(NUM)), "precision": Opt(STR), "device": Opt(STR),
    "backend": Opt(STR), "threads_per_rank": Opt(INT), "cpu_cores": Opt(INT), "local_world_size": Opt(INT),
    "phases_mean_s": Opt(MapOf(NUM)), "step_time_mean_s": Opt(NUM), "overlap_ratio": Opt(NUM),
    "comm_total_mean_s": Opt(NUM), "comm_hidden_mean_s": Opt(NUM), "bytes_sent_per_step": Opt(NUM),
    "ranks": Opt(ListOf(RANK_STATS)), "stragglers": Opt(STRAGGLERS), "peak_memory_bytes": Opt(NUM),
    "memory_kind": Opt(STR), "diagnosis": Opt(ListOf(FINDING)), "testbed": Opt(BOOL), "gradient_bytes": Opt(INT),
    "gradient_buckets": Opt(BOOL), "compressible": Opt(BOOL), "exchange_settings": Opt(ListOf(STR)),
    "lockstep": Opt(BOOL),
})

# config.toml (TOML has no null) and a study point's "config" (JSON: unset settings may be null)
CONFIG_KEYS = {"model": STR, "dataset": STR, "nproc": INT, "nnodes": INT, "batch_size": INT, "epochs": INT,
               "workers": INT, "threads": INT, "precision": STR, "device": STR, "strategy": STR,
               "ps_servers": INT, "bucket_cap_mb": NUM, "diag_input": NUM, "diag_comm": NUM,
               "diag_straggler": NUM}
CONFIG = Record(CONFIG_KEYS)
POINT_CONFIG = Record({k: Opt(v) for k, v in CONFIG_KEYS.items()})

STEP_RECORD = Record({
    "step": INT, "epoch": INT, "step_in_epoch": INT, "loss": Opt(NUM), "lr": Opt(NUM), "samples": Opt(INT),
    "step_time_s": NUM, "phases_s": Opt(MapOf(NUM)), "comm_total_s": Opt(NUM), "comm_hidden_s": Opt(NUM),
    "overlap_ratio": Opt(NUM), "bytes_sent": Opt(NUM), "bytes_uncompressed": Opt(NUM),
}, required=("step", "step_time_s"))

EPOCH_RECORD = Record({"epoch": INT, "epoch_time_s": Opt(NUM), "train_loss": Opt(NUM), "lr": Opt(NUM),
                       "top1": Opt(NUM), "top5": Opt(NUM), "val_loss": Opt(NUM)}, required=("epoch",))

STUDY_POINT = Record({
    "id": STR, "axes": MapOf(SCALAR), "config": POINT_CONFIG, "runs": ListOf(STR), "status": STR,
    "epoch_time_s": Opt(NUM), "epoch_time_std_s": Opt(NUM), "samples_per_s": Opt(NUM), "speedup": Opt(NUM),
    "ideal_speedup": Opt(NUM), "efficiency": Opt(NUM), "baseline": Opt(STR), "phases_mean_s": Opt(MapOf(NUM)),
    "overlap_ratio": Opt(NUM), "diagnosis": Opt(ListOf(FINDING)), "top1": Opt(NUM), "repeats": Opt(INT),
    "error": Opt(STR), "threads_per_rank": Opt(INT), "cpu_cores": Opt(INT), "device": Opt(STR),
}, required=("id",))
STUDY_POINTS = ListOf(STUDY_POINT)

AXIS_VALUES = AnyOf((SCALAR, ListOf(SCALAR)), "a list of numbers, strings or true/false")
STUDY_TOML = Record({"axes": MapOf(AXIS_VALUES), "train": OBJECT, "repeats": INT})
