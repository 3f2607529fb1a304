"""A long phase's lines in a log (console/phase.py): start, paced progress, end; a bar on a terminal."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from scaletrain.console.pace import Pace
from scaletrain.console.phase import PhaseLines, phase

from test_console_pace import Clock


def test_a_phase_says_it_starts_goes_on_and_ends():
    clock, out = Clock(), []
    lines = PhaseLines("measuring 4 blocks' costs", write=out.append, clock=clock,
                       pace=Pace(every=2, least_s=5, most_s=30, clock=clock))
    lines.update("", 0, 4)  # nothing done yet: no line
    assert out == ["measuring 4 blocks' costs ..."]
    for done, block in enumerate(["stem", "layer1", "layer2", "head"], 1):
        clock.t += 10
        lines.update(block, done, 4)
    clock.t += 3
    lines.end()
    assert out[1:] == ["measuring 4 blocks' costs: 1/4 (stem), 0:00:10 elapsed, ETA 0:00:30",
                       "measuring 4 blocks' costs: 3/4 (layer2), 0:00:30 elapsed, ETA 0:00:10",
                       "measuring 4 blocks' costs: done in 0:00:43"]


def test_units_of_unequal_cost_get_no_eta_and_an_unknown_total_none_either():
    clock, out = Clock(), []
    lines = PhaseLines("calibrate", eta=False, write=out.append, clock=clock)
    clock.t += 61
    lines.update("layers fp32 1t conv2d", 1, 300)
    other = PhaseLines("tracing", write=out.append, clock=clock)
    other.update("", 1, None)
    assert out[1] == "calibrate: 1/300 (layers fp32 1t conv2d), 0:01:01 elapsed" and out[3] == "tracing: 1, 0:00:00 elapsed"


def test_phase_writes_lines_in_a_log(capsys):
    with phase("calibrate (cpu)", console=Console(file=io.StringIO(), force_terminal=False)) as update:
        update("layers fp32 1t linear", 1, 10)
    start, going, end = capsys.readouterr().out.splitlines()
    assert start == "calibrate (cpu) ..." and going.startswith("calibrate (cpu): 1/10 (layers fp32 1t linear), ")
    assert end.startswith("calibrate (cpu): done in ")


def test_phase_shows_a_bar_on_a_terminal_and_no_done_line_after_an_error(capsys):
    screen = io.StringIO()
    with pytest.raises(ValueError):
        with phase("tracing [model]", console=Console(file=screen, force_terminal=True, width=100)) as update:
            update("a [b] label", 1, 2)
            raise ValueError("the work failed")
    assert capsys.readouterr().out == ""  # nothing but the bar, which rich draws and clears on the terminal
    assert "tracing [model]" in screen.getvalue()
