"""`scaletrain slurm` against a real SLURM (slurmctld + slurmd + munged started here, as root): a job that
trains, `scontrol requeue` mid-run, the preemption warning (`scancel --signal=USR1 --batch`), a study as
one job per point, an unknown partition. Skipped with one line where the daemons cannot run.
Run with `make test-slurm`; every wait has a deadline, and every job is cancelled at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import scaletrain, summary, weights
from slurm_cluster import IFACE, SkipCluster, start_cluster, two_hosts, tx_bytes

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# long enough that an interruption after the first epoch lands mid-run (rank 0 sleeps 0.1 s per step)
TRAIN = ["--model", "lenet5", "--dataset", "digits", "--epochs", "3", "--seed", "3", "--inject", "slow-rank=0:0.1"]
JOB_DEADLINE_S = 420


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        c = start_cluster(tmp_path_factory.mktemp("slurm"))
    except SkipCluster as e:
        pytest.skip(str(e))
    try:
        yield c
    finally:
        c.cancel_all()
        c.stop()


def submit(cluster, *argv: str, cwd: Path | None = None) -> str:
    """`scaletrain slurm ARGV` as a user runs it; the job id it printed."""
    proc = scaletrain("slurm", *argv, env={"SLURM_CONF": str(cluster.conf)}, cwd=cwd, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.split("submitted job ", 1)[1].split(":", 1)[0]


def epochs(run: Path) -> list[dict]:
    path = run / "epochs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics-rank0.jsonl").read_text().splitlines()]


def all_completed(cluster, submitted: list[dict]) -> None:
    """Wait for every job of jobs.json to complete (each within JOB_DEADLINE_S); cancel them whatever happens."""
    try:
        for j in submitted:
            fields = cluster.wait_job(j["job_id"], deadline_s=JOB_DEADLINE_S)
            assert fields["JobState"] == "COMPLETED", fields
    finally:
        cluster.client(["scancel", *(j["job_id"] for j in submitted)], check=False)


def first_epoch_done(run: Path):
    """A stop condition for wait_job: the first epoch recorded and checkpointed."""
    return lambda fields: fields.get("JobState") == "RUNNING" and len(epochs(run)) >= 1 and \
        (run / "checkpoint.pt").is_file()


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """The reference: TRAIN as one job, never interrupted."""
    run = tmp_path_factory.mktemp("runs") / "straight"
    job = submit(cluster, "train", *TRAIN, "--out", str(run))
    fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S)
    return run, job, fields


def test_a_one_node_job_trains_and_writes_its_run_directory(uninterrupted):
    run, job, fields = uninterrupted
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0"
    s = summary(run)
    assert s["status"] == "completed" and s["epochs"] == 3 and s["world_size"] == 1
    assert [e["epoch"] for e in epochs(run)] == [0, 1, 2]
    out = (run / "slurm" / f"job-{job}.out").read_text()
    assert f"scaletrain: job {job}, start 1" in out and "train exited with 0" in out
    assert (run / "slurm" / "job.sbatch").is_file()
    recorded = json.loads((run / "slurm" / "jobs.json").read_text())
    assert [j["job_id"] for j in recorded] == [job]


def assert_restarted_once_and_completed(fields: dict, run: Path, reference: Path) -> None:
    """The job started twice and ended as the uninterrupted run did: every epoch and every step once,
    the same weights bit for bit."""
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", fields
    s = summary(run)
    assert s["status"] == "completed" and s["epochs"] == 3
    assert [e["epoch"] for e in epochs(run)] == [0, 1, 2]
    assert steps(run) == list(range(len(steps(reference))))  # every step once
    assert same_weights(run, reference)  # resumed bit-exactly


def test_scontrol_requeue_mid_run_resumes_with_nothing_lost(cluster, uninterrupted, tmp_path):
    reference = uninterrupted[0]
    run = tmp_path / "requeued"
    job = submit(cluster, "train", *TRAIN, "--out", str(run))
    try:
        fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S, stop_at=first_epoch_done(run))
        assert fields["JobState"] == "RUNNING", fields
        before = epochs(run)
        assert len(before) < 3  # mid-run: the requeue below really interrupts it
        cluster.client(["scontrol", "requeue", job])
        fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S)
    finally:
        cluster.client(["scancel", job], check=False)
    assert_restarted_once_and_completed(fields, run, reference)
    assert epochs(run)[:len(before)] == before  # the epochs done before the requeue were kept, not trained again
    out = (run / "slurm" / f"job-{job}.out").read_text()
    assert f"job {job}, start 1" in out and f"job {job}, start 2" in out


def test_the_preemption_warning_checkpoints_requeues_and_resumes(cluster, uninterrupted, tmp_path):
    reference = uninterrupted[0]
    run = tmp_path / "preempted"
    job = submit(cluster, "train", *TRAIN, "--checkpoint-every", "5", "--out", str(run))
    try:
        fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S, stop_at=first_epoch_done(run))
        assert fields["JobState"] == "RUNNING", fields
        cluster.client(["scancel", "--signal=USR1", "--batch", job])
        # the job requeues itself and waits (BeginTime) before it starts again: look at it then
        fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S, release=False,
                                  stop_at=lambda f: f.get("JobState") == "PENDING" and f.get("Restarts") == "1")
        assert fields["JobState"] == "PENDING", fields
        s = summary(run)
        assert s["status"] == "preempted" and (run / "checkpoint.pt").is_file()
        ckpt = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=True)
        assert 0 < ckpt["global_step"] < len(steps(reference))
        out = (run / "slurm" / f"job-{job}.out").read_text()
        assert "SIGUSR1" in out and "train exited with 75" in out and f"requeueing job {job}" in out
        fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S)
    finally:
        cluster.client(["scancel", job], check=False)
    assert_restarted_once_and_completed(fields, run, reference)
    assert not (run / "preempt").exists()


def test_a_study_runs_one_job_per_point_and_its_report_gathers_them(cluster, tmp_path):
    study = tmp_path / "study"
    proc = scaletrain("slurm", "study", "--nproc", "1,2", "--model", "lenet5", "--dataset", "digits", "--epochs",
                      "1", "--out", str(study), env={"SLURM_CONF": str(cluster.conf)}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    submitted = json.loads((study / "slurm" / "jobs.json").read_text())
    assert sorted(Path(j["run"]).relative_to(study).as_posix() for j in submitted) == \
        ["points/nproc1/r0", "points/nproc2/r0"]
    pending = json.loads((study / "study.json").read_text())
    assert [p["status"] for p in pending] == ["pending", "pending"]
    all_completed(cluster, submitted)
    entries = json.loads((study / "study.json").read_text())
    assert [e["id"] for e in entries] == ["nproc1", "nproc2"]
    assert [e["status"] for e in entries] == ["completed", "completed"]
    assert entries[1]["speedup"] is not None and entries[1]["ideal_speedup"] == 2
    assert summary(study / "points" / "nproc2" / "r0")["world_size"] == 2
    assert "train exited with 0" in (study / "points" / "nproc1" / "r0.log").read_text()
    report = scaletrain("report", str(study), timeout=300)
    assert report.returncode == 0, report.stderr
    assert (study / "report.html").is_file()
    # submitted again: everything is completed, nothing goes to the queue
    again = scaletrain("slurm", "study", "--nproc", "1,2", "--model", "lenet5", "--dataset", "digits", "--epochs",
                       "1", "--out", str(study), env={"SLURM_CONF": str(cluster.conf)}, timeout=300)
    assert again.returncode == 0 and "nothing to submit" in again.stdout
    assert len(json.loads((study / "slurm" / "jobs.json").read_text())) == 2


def test_an_unknown_partition_is_one_line_and_nothing_is_written(cluster, tmp_path):
    run = tmp_path / "never"
    proc = scaletrain("slurm", "train", "--partition", "nosuch", "--model", "lenet5", "--dataset", "digits",
                      "--out", str(run), env={"SLURM_CONF": str(cluster.conf)}, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: --partition nosuch is not a partition of this cluster (sinfo lists: "
                                   f"{cluster.partition}): pick one of them, or leave --partition out for the default")
    assert not run.exists()
    assert cluster.client(["squeue", "-h"]).stdout.strip() == ""


def test_a_job_spans_two_hosts_over_a_shaped_link(tmp_path_factory):
    """One slurmd per host (network namespaces joined by a 1 Gbit link): the job's two launch agents meet at
    the first node's address and train as one job, their gradients crossing the link."""
    try:
        with two_hosts() as hosts:
            cluster = start_cluster(tmp_path_factory.mktemp("slurm2"), hosts)
            try:
                _two_host_job(cluster, hosts, tmp_path_factory.mktemp("runs2") / "two")
            finally:
                cluster.cancel_all()
                cluster.stop()
    except SkipCluster as e:
        pytest.skip(str(e))


def _two_host_job(cluster, hosts, run: Path) -> None:
    env = {**os.environ, "SLURM_CONF": str(cluster.conf), "GLOO_SOCKET_IFNAME": IFACE}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        env.pop(var, None)
    sent_before = tx_bytes(hosts[1])
    proc = subprocess.run([*hosts[0].prefix, sys.executable, "-m", "scaletrain", "slurm", "train", "--nodes", "2",
                           "--model", "lenet5", "--dataset", "digits", "--epochs", "1", "--out", str(run)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = proc.stdout.split("submitted job ", 1)[1].split(":", 1)[0]
    fields = cluster.wait_job(job, deadline_s=JOB_DEADLINE_S)
    out = (run / "slurm" / f"job-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["NodeList"] == "h[0-1]", (fields, out)
    s = summary(run)
    assert s["status"] == "completed" and s["world_size"] == 2 and s["replicas_identical"]
    assert sorted(p.name for p in run.glob("metrics-rank*.jsonl")) == ["metrics-rank0.jsonl", "metrics-rank1.jsonl"]
    assert "node 1 of 2" in out and f"at {hosts[0].addr}:" in out  # the rendezvous at h0's address
    # h1's rank sent its share of every step's gradients over the link (lenet5: 61,706 parameters)
    assert tx_bytes(hosts[1]) - sent_before > 1_000_000


def test_a_plans_top_candidates_run_as_jobs_and_their_ends_compare_them(cluster, tmp_path):
    """`scaletrain slurm validate-plan`: the plan's top 2 as one job each (one round), run by SLURM as `train
    --plan DIR --plan-rank K`; the last job to end leaves plan.json's validation complete."""
    from predict_fixtures import fake_calibration
    from scaletrain.predict import calibration

    cal = calibration.save(fake_calibration(threads=(1,)), tmp_path / "cal.json")
    plan = tmp_path / "plan"
    made = scaletrain("plan", "--model", "lenet5", "--nodes", "1", "--nproc", "2", "--calibration", str(cal),
                      "--time-ops", "off", "--dataset", "digits", "--batch-size", "64", "--strategy", "allreduce,ring",
                      "--precision", "fp32", "--workers", "0", "--compress", "none", "--checkpoint-activations", "none",
                      "--out", str(plan), timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    proc = scaletrain("slurm", "validate-plan", str(plan), "--top", "2", "--repeats", "1", "--validate-steps", "8",
                      env={"SLURM_CONF": str(cluster.conf)}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    submitted = json.loads((plan / "slurm" / "jobs.json").read_text())
    assert [Path(j["run"]).relative_to(plan).as_posix() for j in submitted] == ["validation/c1/r0", "validation/c2/r0"]
    all_completed(cluster, submitted)
    v = json.loads((plan / "plan.json").read_text())["validation"]
    assert v["pending"] == 0 and v["failed"] == [] and len(v["measured_order"]) == 2
    assert summary(plan / "validation" / "c2" / "r0")["world_size"] == 2
    assert "train exited with 0" in (plan / "validation" / "c1" / "r0.log").read_text()
