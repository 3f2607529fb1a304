"""examples/profile_my_loop.py: a plain DDP script under torchrun gets the same timeline and diagnosis."""

import json

from conftest import ROOT, assert_ok, scaletrain
from scaletrain.analysis import load_records
from scaletrain.profiler import PHASES


def test_plain_ddp_script_with_step_profiler(tmp_path):
    out = tmp_path / "loop"
    proc = scaletrain("--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "profile_my_loop.py"),
                      "--out", str(out), "--epochs", "1", module="torch.distributed.run")
    assert_ok(proc)
    records = load_records(out)
    assert sorted(records) == [0, 1] and len(records[0]) == 28  # 1797 digits / (2 ranks x 32)
    for r in records[1]:
        assert set(r["phases_s"]) == set(PHASES)
        assert abs(sum(r["phases_s"].values()) - r["step_time_s"]) <= 0.01 * r["step_time_s"]
        assert r["bytes_sent"] > 0  # DDP's all-reduce was timed through the comm hook
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "mlp (example)" and summary["diagnosis"]
    assert summary["diagnosis"][0]["kind"] in proc.stdout  # the script prints the findings
    assert (out / "trace.json").is_file()
    report = scaletrain("report", str(out))  # the same report as for scaletrain's own runs
    assert_ok(report)
    assert (out / "report.html").is_file() and summary["diagnosis"][0]["kind"] in report.stdout
