"""report.plots: every plot is a valid PNG at the path it returns."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from scaletrain.report import plots
from scaletrain.report.series import Line


def valid_png(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert im.format == "PNG"
        lo, hi = im.convert("L").getextrema()
        assert hi - lo > 100  # something was drawn
        return im.size


def test_phase_bars(tmp_path):
    bars = {"rank 0": {"forward": 0.01, "backward": 0.03}, "rank 1": {"forward": 0.012, "backward": 0.028,
                                                                        "new_phase": 0.001}}
    path = plots.phase_bars(bars, tmp_path / "sub" / "bars.png", "phases")
    assert path == tmp_path / "sub" / "bars.png"
    w, h = valid_png(path)
    assert w > 300 and h > 200
    many = {f"nproc{n}-workers{w}": {"forward": 0.01} for n in (1, 2, 4, 8) for w in (0, 2)}
    valid_png(plots.phase_bars(many, tmp_path / "many.png", "phases"))  # rotated labels


def test_step_time_and_shares(tmp_path):
    lines = {0: Line("rank 0", [0, 1, 2], [0.1, 0.07, 0.07]), 1: Line("rank 1", [0, 1, 2], [0.1, 0.08, 0.07])}
    valid_png(plots.step_time_lines(lines, tmp_path / "steps.png"))
    shares = {"forward": [0.3, 0.4], "backward": [0.7, 0.6]}
    valid_png(plots.phase_share_area([0, 1], shares, tmp_path / "shares.png"))
    valid_png(plots.phase_share_area([5], {"forward": [1.0]}, tmp_path / "one.png"))  # a single step


def test_line_plot_with_reference(tmp_path):
    lines = [Line("workers=0", [1, 2, 4], [1.0, 1.8, 3.1]), Line("workers=2", [1, 2], [1.0, 1.9])]
    ideal = [Line("ideal", [1, 2, 4], [1.0, 2.0, 4.0])]
    valid_png(plots.line_plot(lines, tmp_path / "speedup.png", "speedup", "nproc", "x", reference=ideal))
