"""The HTML report as a browser shows it: headless Chromium renders a fixture's report.html from the file
system; the tables must be in the DOM and the embedded plots must decode. Skipped without Chromium
(`make report-check` runs only this file)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scaletrain.report import write_run_report, write_study_report

DATA = Path(__file__).parent / "data"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def browser() -> str:
    found = next((path for name in BROWSERS if (path := shutil.which(name))), None)
    if found is None:
        pytest.skip(f"no headless browser found (looked for {', '.join(BROWSERS)})")
    return found


def chromium(browser: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    # a fresh profile in tmp_path: never read or write the user's own browser profile
    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
           "--hide-scrollbars", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)


def saturated_pixels(png: Path) -> int:
    """Pixels of strong colour: the page's own CSS is grey, so these can only come from decoded plots."""
    with Image.open(png) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.int16)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 80).sum())


def render(browser: str, tmp_path: Path, page: Path, images: int) -> tuple[str, Path]:
    """The DOM as text (entities decoded) and a screenshot of the whole page."""
    dom = chromium(browser, tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert len(re.findall(r'<img src="data:image/png;base64,', dom.stdout)) == images
    shot = tmp_path / "shot.png"
    proc = chromium(browser, tmp_path, f"--screenshot={shot}", "--window-size=1200,4000", page.as_uri())
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    return html.unescape(dom.stdout).replace("\xa0", " "), shot


def test_run_report_renders(browser, tmp_path):
    run_dir = Path(shutil.copytree(DATA / "run-a", tmp_path / "run-a"))
    dom, shot = render(browser, tmp_path, write_run_report(run_dir), images=7)  # 3 of time, 4 training curves
    for words in ("where a step's time goes", "41.2 ms (56%)", "2 x 32 = 64", "compute-bound", "10/10 steps"):
        assert words in dom, words
    with Image.open(shot) as im:
        lo, hi = im.convert("L").getextrema()
    assert hi - lo > 200  # not a blank page
    assert saturated_pixels(shot) > 20_000  # plots of coloured bars, areas and lines were drawn


def test_study_report_renders(browser, tmp_path):
    study_dir = Path(shutil.copytree(DATA / "study-a", tmp_path / "study-a"))
    dom, shot = render(browser, tmp_path, write_study_report(study_dir), images=4)
    for words in ("0:00:40", "1.82x", "nproc4-workers2 failed: rank 3 exited with code 1"):
        assert words in dom, words
    assert saturated_pixels(shot) > 20_000
