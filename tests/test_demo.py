"""The main job of `make demo` does what the README promises."""

from __future__ import annotations

import pytest

from conftest import ROOT, assert_ok, scaletrain, summary


@pytest.mark.slow  # the full demo run (about a minute): make test-slow
def test_demo_configuration_reaches_097_top1(tmp_path):
    out = tmp_path / "demo"
    proc = scaletrain("train", "--config", str(ROOT / "configs" / "demo.toml"), "--out", str(out))
    assert_ok(proc)
    s = summary(out)
    assert s["status"] == "completed" and s["world_size"] == 2 and s["model"] == "resnet20"
    assert s["top1"] >= 0.97, s
    assert str(out) in proc.stdout and "completed" in proc.stdout  # the summary table and where the run is
