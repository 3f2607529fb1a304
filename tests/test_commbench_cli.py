"""scaletrain commbench through the CLI: rows for each strategy and size, bytes per rank, bad input."""

import json

from conftest import assert_ok, scaletrain


def test_commbench_measures_both_strategies(tmp_path):
    proc = scaletrain("commbench", "--nproc", "2", "--sizes", "1K,256K", "--seconds", "0.05", "--out", str(tmp_path))
    assert_ok(proc)
    data = json.loads((tmp_path / "commbench.json").read_text())
    rows = {(r["strategy"], r["size"]): r for r in data["rows"]}
    assert set(rows) == {(s, n) for s in ("allreduce", "ring") for n in (1024, 256 * 1024)}
    assert rows[("ring", 262144)]["bytes_per_rank"] == 262144  # 2 (P-1)/P x S with P = 2
    assert all(r["time_s"] > 0 and r["busbw"] == r["algbw"] for r in data["rows"])  # P = 2: factor 1
    assert set(data["fits"]) == {"allreduce", "ring"} and "alpha" in proc.stdout


def test_bad_requests_are_one_line(tmp_path):
    for args, msg in [(("--strategies", "tree"), "unknown tree"), (("--nproc", "1"), "at least 2 ranks"),
                      (("--sizes", "big"), "--sizes")]:
        proc = scaletrain("commbench", *args, "--out", str(tmp_path))
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr
