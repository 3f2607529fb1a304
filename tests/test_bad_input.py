"""Bad input from the command line: one line naming the problem and the fix, a non-zero exit, no traceback,
nothing lost. Each launches `scaletrain train` (slow); the same cases run in-process in
test_bad_input_inprocess.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from conftest import assert_ok, scaletrain, summary
from test_bad_input_inprocess import CASES, earlier_run, fingerprint, folders  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # a process per case: make test-slow


def expect_error(proc, *needles: str) -> str:
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_loses_nothing(case, earlier_run, folders):
    args, needles = CASES[case]
    args = [a.format(base=folders["base"]) for a in args]
    before = fingerprint(earlier_run)
    if "--out" not in args:
        args += ["--out", str(folders["base"] / f"out-{case.replace(' ', '_')}")]
    expect_error(scaletrain("train", "--no-progress", *args), *needles)
    assert fingerprint(earlier_run) == before
    if case != "output dir is a file":
        assert not Path(args[args.index("--out") + 1]).exists(), "a refused run must not create its directory"


def test_existing_run_is_not_overwritten_without_resume(earlier_run):
    before = fingerprint(earlier_run)
    expect_error(scaletrain("train", "--model", "mlp", "--out", str(earlier_run)), "already holds a run", "--resume")
    assert fingerprint(earlier_run) == before


def test_resume_from_a_checkpoint_of_another_model(earlier_run):
    before = fingerprint(earlier_run)
    expect_error(scaletrain("train", "--resume", "--model", "lenet5", "--out", str(earlier_run)),
                 "--resume cannot change --model lenet5 (the run has mlp)")
    assert fingerprint(earlier_run) == before


def test_master_port_already_in_use(earlier_run, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        expect_error(scaletrain("train", "--nproc", "2", "--master-port", str(port), "--out", str(tmp_path / "r")),
                     f"port {port}", "--master-port")


def test_corrupt_jpeg_stops_the_run_naming_it(folders, tmp_path):
    proc = scaletrain("train", "--dataset", f"imagefolder:{folders['base']}/corrupt", "--image-size", "16",
                      "--model", "lenet5", "--epochs", "1", "--no-progress", "--out", str(tmp_path / "r"))
    line = expect_error(proc, "unreadable image", "--bad-images skip")
    assert "garbage.jpg" in line or folders["victim"].name in line
    assert summary(tmp_path / "r")["status"] == "failed"


def test_bad_images_skip_finishes_and_counts_them(folders, tmp_path):
    out = tmp_path / "r"
    proc = scaletrain("train", "--dataset", f"imagefolder:{folders['base']}/corrupt", "--image-size", "16",
                      "--model", "lenet5", "--epochs", "1", "--batch-size", "128", "--nproc", "2",
                      "--bad-images", "skip", "--no-progress", "--out", str(out))
    assert_ok(proc)
    s = summary(out)
    assert s["status"] == "completed"
    # one epoch with drop_last may leave a bad file in the dropped tail: at least one, at most both
    assert 1 <= s["bad_images_skipped"] <= 2
    assert {Path(p).name for p in s["bad_images"]} <= {"garbage.jpg", folders["victim"].name}
