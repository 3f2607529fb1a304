"""benchmarks/pipeline_split.py's comparison with the measured best: the best picked on the other rounds, so a
split whose rounds ran lucky does not pass for the best (the winner's curse of a max over noisy medians)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_path = Path(__file__).resolve().parents[1] / "benchmarks" / "pipeline_split.py"
_spec = importlib.util.spec_from_file_location("pipeline_split", _path)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _row(rates):
    return {"rates": rates, "median": sorted(rates)[len(rates) // 2]}


def test_a_split_that_ran_lucky_in_some_rounds_is_not_taken_for_the_best():
    auto = _row([100.0] * 5)
    lucky = _row([104.0, 104.0, 90.0, 90.0, 104.0])  # the highest median (104), by two rounds' luck
    assert auto["median"] / max(auto["median"], lucky["median"]) == pytest.approx(100 / 104)
    assert bench._held_out_best([auto, lucky], auto) == pytest.approx(1.0)


def test_a_split_faster_in_every_round_stays_the_best():
    auto, faster = _row([100.0, 95.0, 105.0, 100.0, 98.0]), _row([110.0, 104.5, 115.5, 110.0, 107.8])
    assert bench._held_out_best([auto, faster], auto) == pytest.approx(1 / 1.1)


def test_one_round_has_nothing_to_hold_out():
    auto, other = _row([100.0]), _row([120.0])
    assert bench._held_out_best([auto, other], auto) == pytest.approx(100 / 120)
