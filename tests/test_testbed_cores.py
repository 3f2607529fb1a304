"""Sharing the machine's cores among testbed hosts: the choice, the line that says it, what hosts are told."""

import argparse
import os
import subprocess
import sys

import pytest

from scaletrain.distributed.device import machine_cores
from scaletrain.errors import UserError
from scaletrain.testbed.cli import add_testbed_args
from scaletrain.testbed.cores import cpu_list, share_cores
from scaletrain.testbed.plan import make_testbed
from scaletrain.testbed.run import _pin, host_env


def test_two_hosts_on_two_cores_get_one_each_pinned_apart():
    share = share_cores([0, 1], hosts=2)
    assert share.per_host == 1 and share.cpus == ((0,), (1,))
    assert share.describe() == ("testbed: 2 hosts share 2 cores: 1 core per host (cpus 0 / 1); "
                                "--cores-per-host to change")


def test_cores_are_split_evenly_and_the_rest_left_unused():
    share = share_cores(range(8), hosts=3)
    assert share.per_host == 2 and share.cpus == ((0, 1), (2, 3), (4, 5))
    assert "2 cores per host (cpus 0-1 / 2-3 / 4-5)" in share.describe()


def test_more_hosts_than_cores_get_one_core_each_unpinned():
    share = share_cores([0], hosts=2)
    assert share.per_host == 1 and share.cpus is None
    assert "1 core per host (not pinned: 2 x 1 > 1, so hosts share cores)" in share.describe()


def test_cores_per_host_overrides_and_is_pinned_only_where_it_fits():
    assert share_cores(range(8), hosts=2, per_host=3).cpus == ((0, 1, 2), (3, 4, 5))
    crowded = share_cores([0, 1], hosts=2, per_host=2)
    assert crowded.per_host == 2 and crowded.cpus is None
    with pytest.raises(UserError, match="--cores-per-host must be at least 1"):
        share_cores([0, 1], hosts=2, per_host=0)


def test_cpu_lists_are_written_as_ranges():
    assert cpu_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_each_host_is_told_its_cores_as_the_trainer_reads_them():
    tb = make_testbed(2, "1gbit", "0ms")
    env = host_env(tb, 1, share_cores([0, 1, 2, 3], hosts=2))
    assert env["SCALETRAIN_CORES"] == "2" and machine_cores(env) == 2


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_a_host_process_is_pinned_to_its_cpus():
    first = min(os.sched_getaffinity(0))
    out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                         preexec_fn=_pin((first,)), capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[{first}]"


def test_run_takes_cores_per_host():
    parser = argparse.ArgumentParser()
    add_testbed_args(parser)
    args = parser.parse_args(["run", "--hosts", "2", "--cores-per-host", "3", "--", "true"])
    assert args.cores_per_host == 3 and args.argv == ["--", "true"]
