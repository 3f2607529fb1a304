"""scaletrain commbench: rows for each strategy and size, bytes per rank (one real launch: the command's smoke
test), bad input refused in one line before anything starts (in-process through main())."""

import json

import pytest
from conftest import assert_ok, scaletrain

from scaletrain.cli import main


def test_commbench_measures_both_strategies(tmp_path, capsys):
    """The command's smoke test: `scaletrain commbench` in this process, its ranks launched as a user's are."""
    assert main(["commbench", "--nproc", "2", "--strategies", "allreduce,ring,halo,fp16", "--sizes", "1K,256K",
                 "--seconds", "0.05", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "commbench.json").read_text())
    rows = {(r["strategy"], r["size"]): r for r in data["rows"]}
    assert set(rows) == {(s, n) for s in ("allreduce", "ring", "halo", "fp16") for n in (1024, 256 * 1024)}
    assert rows[("ring", 262144)]["bytes_per_rank"] == 262144  # 2 (P-1)/P x S with P = 2
    assert rows[("fp16", 262144)]["bytes_per_rank"] == 131072  # the fp32 bucket's half-size payload
    assert rows[("halo", 262144)]["bytes_per_rank"] == 262144  # to the one neighbour
    assert rows[("halo", 1024)]["compute_s"] > 0 and rows[("halo", 1024)]["iters"] >= 3
    assert all(r["time_s"] > 0 and r["busbw"] == r["algbw"] for r in data["rows"])  # P = 2: factor 1
    assert set(data["fits"]) == {"allreduce", "ring", "halo", "fp16"} and "alpha" in printed
    # on CPU each collective's CPU seconds (the engine's threads, the ring's worker), fitted beside its time
    assert all(rows[(s, n)]["cpu_s"] > 0 for s in ("allreduce", "ring") for n in (1024, 256 * 1024))
    assert all("cpu_beta_s_per_byte" in data["fits"][s] for s in ("allreduce", "ring"))
    assert "cpu_alpha_s" not in data["fits"]["halo"]  # its rows time the swap alone, not the process's CPU


BAD_REQUESTS = [(("--strategies", "tree"), "unknown tree"), (("--nproc", "1"), "at least 2 ranks"),
                (("--sizes", "big"), "--sizes")]


@pytest.mark.slow  # a process per request: the same in-process below
def test_bad_requests_are_one_line(tmp_path):
    for args, msg in BAD_REQUESTS:
        proc = scaletrain("commbench", *args, "--out", str(tmp_path))
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr


def test_bad_requests_are_one_line_in_process(tmp_path, capsys):
    for args, msg in BAD_REQUESTS:
        assert main(["commbench", *args, "--out", str(tmp_path / "bench")]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("args, message", [
    (("--sizes", "0"), "--sizes: '0' is less than 4 bytes: a message holds whole float32 elements (4 bytes each); "
                       "give sizes such as 4,1K,64M"),
    (("--sizes", "1K,3"), "--sizes: '3' is less than 4 bytes"),
    (("--sizes=-1K",), "--sizes: '-1K' is less than 4 bytes"),
    (("--sizes", "1K,64K,1K"), "--sizes 1K,64K,1K lists '1K' twice: give each once"),
    (("--sizes", "4,5"), "--sizes 4,5 lists '4' and '5', both 4 bytes (sizes round down to whole 4-byte float32 "
                         "elements): give each once"),
    (("--sizes", "1024,1K"), "--sizes 1024,1K lists '1024' and '1K', both 1024 bytes"),
    (("--sizes", "1K,,4K"), "--sizes '1K,,4K' has an empty item"),
    (("--sizes", "inf"), "--sizes inf: 'inf' is not a size"),
    (("--sizes", "1000000G"), "--sizes: 1073741824000000 bytes is more than this machine's memory"),
    (("--seconds", "0"), "--seconds 0.0: give the time per measurement in seconds, more than 0"),
    (("--seconds=-0.5",), "--seconds -0.5: give the time per measurement in seconds, more than 0"),
    (("--seconds", "nan"), "--seconds nan: give the time per measurement"),
    (("--seconds", "inf"), "--seconds inf: give the time per measurement"),
    (("--nproc", "2,2"), "--nproc 2,2 lists '2' twice: give each once"),
    (("--nproc", "2,x"), "--nproc 2,x: 'x' is not a whole number"),
    (("--nproc", "0"), "a collective needs at least 2 ranks"),
    (("--strategies", "ring,ring"), "--strategies ring,ring lists 'ring' twice: give each once"),
    (("--nnodes", "0"), "--nnodes 0: give at least 1"),
    (("--node-rank", "1"), "--node-rank 1: with --nnodes 1 the only node is 0"),
    (("--nnodes", "2", "--nproc", "1", "--master-port", "29500", "--node-rank", "2"),
     "--node-rank 2: with --nnodes 2 nodes are 0 to 1"),
    (("--master-port", "70000"), "--master-port 70000: give a port from 1 to 65535"),
])
def test_impossible_flag_values_are_refused_before_anything_starts(tmp_path, capsys, args, message):
    out = tmp_path / "bench"
    assert main(["commbench", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert not out.exists()  # nothing created, nothing spawned


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
    blocker = tmp_path / "results.txt"
    blocker.write_text("keep me")
    for out, message in ((blocker, f"--out {blocker} is a file, not a directory"),
                         (blocker / "sub", f"--out {blocker / 'sub'}: cannot create it (Not a directory)")):
        assert main(["commbench", "--sizes", "1K", "--seconds", "0.01", "--out", str(out)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {message}"), err
    assert blocker.read_text() == "keep me"


def test_a_worker_that_dies_is_one_line_naming_the_rank(tmp_path, capsys, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.launcher import api

    def launch(config, entrypoint):
        def run(*args):
            died = ProcessFailure(local_rank=1, pid=1, exitcode=-9, error_file=str(tmp_path / "none"))
            raise ChildFailedError("worker_main", {1: died})
        return run

    monkeypatch.setattr(api, "elastic_launch", launch)
    assert main(["commbench", "--nproc", "2", "--sizes", "1K", "--out", str(tmp_path / "bench")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: commbench: rank 1 was killed by SIGKILL (out of memory? see `dmesg`); the other ranks "
                   "ended with it"]
