"""examples/profile_my_loop.py: a plain DDP script gets the same timeline, diagnosis and report as scaletrain's
own runs. In-process on 2 ranks (the script as torchrun would run it), and under torchrun itself (slow)."""

import contextlib
import io
import json
import runpy
import sys

import pytest

from conftest import ROOT, assert_ok, scaletrain
from scaletrain.analysis import load_records
from scaletrain.cli import main
from scaletrain.profiler import PHASES

SCRIPT = ROOT / "examples" / "profile_my_loop.py"


def _check_run(out, printed: str) -> dict:
    records = load_records(out)
    assert sorted(records) == [0, 1] and len(records[0]) == 28  # 1797 digits / (2 ranks x 32)
    for r in records[1]:
        assert set(r["phases_s"]) == set(PHASES)
        assert abs(sum(r["phases_s"].values()) - r["step_time_s"]) <= 0.01 * r["step_time_s"]
        assert r["bytes_sent"] > 0  # DDP's all-reduce was timed through the comm hook
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "mlp (example)" and summary["diagnosis"]
    assert summary["diagnosis"][0]["kind"] in printed  # the script prints the findings
    assert (out / "trace.json").is_file()
    return summary


def _run_script(rank, world, out):
    """The script's main in this rank, as torchrun runs it (RANK, WORLD_SIZE, MASTER_* are set); its stdout."""
    argv, sys.argv = sys.argv, [str(SCRIPT), "--out", out, "--epochs", "1"]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = argv
    return printed.getvalue()


def test_plain_ddp_script_with_step_profiler_in_process(tmp_path, ranks, capsys):
    out = tmp_path / "loop"
    printed = ranks.run(_run_script, 2, str(out))
    summary = _check_run(out, printed[0])
    assert printed[1] == ""  # rank 1 leaves the findings to rank 0
    assert main(["report", str(out)]) == 0  # the same report as for scaletrain's own runs
    assert (out / "report.html").is_file() and summary["diagnosis"][0]["kind"] in capsys.readouterr().out


@pytest.mark.slow  # torchrun and two workers: in-process above
def test_plain_ddp_script_with_step_profiler(tmp_path):
    out = tmp_path / "loop"
    proc = scaletrain("--standalone", "--nproc-per-node", "2", str(SCRIPT),
                      "--out", str(out), "--epochs", "1", module="torch.distributed.run")
    assert_ok(proc)
    summary = _check_run(out, proc.stdout)
    report = scaletrain("report", str(out))  # the same report as for scaletrain's own runs
    assert_ok(report)
    assert (out / "report.html").is_file() and summary["diagnosis"][0]["kind"] in report.stdout
