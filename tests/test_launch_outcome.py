"""How a launch's end is told (distributed/launch/outcome.py): ranks named by role, the resume command, a summary
read back whatever state it is in."""

import json

import pytest

from scaletrain.config import build_config
from scaletrain.distributed.launch.outcome import print_resume_hint, rank_namer
from scaletrain.errors import UserError
from scaletrain.rundir import RunDir, read_summary


def test_ranks_of_an_all_reduce_run_are_plain_ranks():
    name = rank_namer(build_config({}, {"nproc": 3}))
    assert [name(r) for r in range(3)] == ["rank 0", "rank 1", "rank 2"]


def test_a_parameter_server_job_names_its_workers_and_its_servers():
    name = rank_namer(build_config({}, {"strategy": "ps-sync", "nproc": 5, "ps_servers": 2}))
    assert [name(r) for r in range(5)] == ["worker rank 0", "worker rank 1", "worker rank 2",
                                           "parameter server 0 (rank 3)", "parameter server 1 (rank 4)"]


def test_the_servers_are_the_last_ranks_of_the_whole_job_across_nodes():
    cfg = build_config({}, {"strategy": "ps-async", "nproc": 2, "nnodes": 2, "master_port": 29500,
                            "master_addr": "127.0.0.1", "ps_servers": 1})
    name = rank_namer(cfg)
    assert name(2) == "worker rank 2" and name(3) == "parameter server 0 (rank 3)"


@pytest.mark.parametrize("stopped, why", [(None, "the run can continue from its last checkpoint"),
                                          ("stopped", "stopped as asked (--stop-after)"),
                                          ("preempted", "preempted: checkpointed at the step it had reached (exit 75)")])
def test_an_ending_with_a_checkpoint_says_how_to_continue(tmp_path, capsys, stopped, why):
    run = RunDir(tmp_path)
    run.checkpoint.write_bytes(b"x")
    print_resume_hint(run, build_config({}, {"out": str(tmp_path)}), stopped=stopped)
    assert capsys.readouterr().err == f"{why}: scaletrain train --resume --out {tmp_path}\n"


def test_no_hint_without_a_checkpoint_or_on_another_node(tmp_path, capsys):
    run = RunDir(tmp_path)
    print_resume_hint(run, build_config({}, {}))
    run.checkpoint.write_bytes(b"x")
    print_resume_hint(run, build_config({}, {"nnodes": 2, "node_rank": 1, "master_port": 29500,
                                             "master_addr": "127.0.0.1"}))
    assert capsys.readouterr().err == ""


def test_a_polling_reader_gets_none_for_what_is_not_a_summary_and_a_strict_one_a_line(tmp_path):
    """rundir.read_summary, the one reader of summary.json: a launcher or a study polling a run that may be
    mid-write reads it leniently; report and validate strictly, with one line naming the damaged file."""
    run = RunDir(tmp_path)
    assert read_summary(run.root, strict=False) is None and read_summary(run.root) is None  # missing
    run.summary.write_text('{"status": "stop')
    assert read_summary(run.root, strict=False) is None  # cut off
    with pytest.raises(UserError, match=r"summary.json is not valid JSON \(.*line 1\): the file is damaged; fix"):
        read_summary(run.root)
    run.summary.write_text("[1, 2]")
    assert read_summary(run.root, strict=False) is None  # not an object
    run.summary.write_text(json.dumps({"status": "stopped"}))
    assert read_summary(run.root, strict=False) == read_summary(run.root) == {"status": "stopped"}
