"""report.schema: the first value of the wrong type, named by its key path, on small hand-made values."""

from __future__ import annotations

import pytest

from scaletrain.errors import UserError
from scaletrain.report import schema
from scaletrain.report.schema import INT, NUM, STR, ListOf, MapOf, Opt, Record, describe, find_mismatch

SPEC = Record({"n": INT, "x": Opt(NUM), "names": ListOf(STR), "by": MapOf(NUM),
               "inner": Record({"k": INT}, required=("k",))}, required=("n",))


def test_good_values_and_absent_optional_keys_pass():
    assert find_mismatch({"n": 1, "x": None, "names": ["a"], "by": {"a": 1, "b": 2.5}, "inner": {"k": 3}}, SPEC) is None
    assert find_mismatch({"n": 1, "unknown": object()}, SPEC) is None  # keys the report does not read are not looked at


@pytest.mark.parametrize("value, key, expected", [
    ({"n": "1"}, "n", "an integer"),
    ({"n": True}, "n", "an integer"),  # true is not 1
    ({"n": 1.0}, "n", "an integer"),
    ({"n": 1, "x": "nan"}, "x", "a number (or null)"),
    ({"n": 1, "names": ["a", 2]}, "names[1]", "a string"),
    ({"n": 1, "by": {"a": None}}, "by.a", "a number"),
    ({"n": 1, "inner": {}}, "inner.k", "an integer"),
    ({}, "n", "an integer"),
    ([], "", "an object"),
])
def test_the_first_mismatch_names_its_key_path(value, key, expected):
    m = find_mismatch(value, SPEC)
    assert m is not None and (m.key, m.expected) == (key, expected)


def test_an_integer_is_a_number():
    assert find_mismatch({"n": 1, "x": 3}, SPEC) is None


def test_descriptions():
    assert describe(ListOf(Opt(NUM))) == "a list of numbers (or null)"
    assert describe(MapOf(schema.SCALAR)) == "an object of numbers, strings or true/false"
    assert describe(schema.AXIS_VALUES) == "a list of numbers, strings or true/false"


def test_check_is_one_line_naming_where_what_and_the_fix():
    with pytest.raises(UserError) as e:
        schema.check({"n": "a very long value that goes on and on and on and on"}, SPEC, "f.json", "fix it")
    assert str(e.value) == ('f.json: "n" is "a very long value that goes on and o... (a string), expected an '
                            "integer: fix it")
    with pytest.raises(UserError, match="^f.json holds null where an object is expected: fix it$"):
        schema.check(None, SPEC, "f.json", "fix it")


def test_the_recorded_fixtures_match_their_schemas():
    import json
    from pathlib import Path

    data = Path(__file__).parent / "data"
    for run in ("run-a", "run-b", "run-noprofile", "recorded-lenet5-2rank"):
        assert find_mismatch(json.loads((data / run / "summary.json").read_text()), schema.SUMMARY) is None, run
        for name, spec in (("metrics-rank0.jsonl", schema.STEP_RECORD), ("epochs.jsonl", schema.EPOCH_RECORD)):
            for line in (data / run / name).read_text().splitlines():
                assert find_mismatch(json.loads(line), spec) is None, (run, name)
    for study in ("study-a", "study-b"):
        assert find_mismatch(json.loads((data / study / "study.json").read_text()), schema.STUDY_POINTS) is None
