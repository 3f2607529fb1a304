"""`scaletrain slurm` without a cluster: SLURM's time formats, bad input (one line, exit 2, nothing written),
the batch script (--dry-run) and what it does when bash runs it with stand-ins for srun and scontrol
(the warning signal, exit 75, the requeue, --resume), submission and study.json through a stand-in sbatch.
The same against a real SLURM: test_slurm_cluster.py (make test-slurm)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from scaletrain.cli import main
from scaletrain.errors import UserError
from scaletrain.slurm.options import SlurmOptions, time_limit_s
from scaletrain.slurm.script import BatchJob, render

TRAIN = ["--model", "lenet5", "--dataset", "digits", "--epochs", "2", "--lr", "0.05"]


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("90", 5400), ("5:30", 330), ("2:00:00", 7200),
                                           ("1-12", 129600), ("1-0:30", 88200), ("2-03:04:05", 183845),
                                           ("UNLIMITED", None), ("infinite", None)])
def test_slurm_time_formats(text, seconds):
    assert time_limit_s(text) == seconds


@pytest.mark.parametrize("text", ["1h", "1:2:3:4", "-5", "1-25", "1:60:00", "10:75", "1.5", "", "0", "0:00:00"])
def test_a_time_that_is_none_of_slurms_formats_is_refused(text):
    with pytest.raises(UserError, match="--time"):
        time_limit_s(text)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch, sinfo and squeue stand-ins first on PATH: sbatch prints job ids 101, 102, ... and logs each
    script it gets (or refuses with $FAKE_SBATCH_REFUSES); sinfo lists partitions debug (default) and gpu; squeue prints $dir/queue."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sbatch": '#!/bin/bash\nif [ -n "${FAKE_SBATCH_REFUSES:-}" ]; then echo "sbatch: error: $FAKE_SBATCH_REFUSES" >&2; '
                  'exit 1; fi\nn=$(( $(wc -l < "$D/submitted" 2>/dev/null || echo 0) + 101 ))\n'
                  'echo "$n ${@: -1}" >> "$D/submitted"\necho "$n"\n',
        "sinfo": '#!/bin/bash\nprintf "debug*\\ngpu\\n"\n',
        "squeue": '#!/bin/bash\ncat "$D/queue" 2>/dev/null\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text.replace("$D", str(tmp_path)))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path


def submitted(base: Path) -> list[list[str]]:
    path = base / "submitted"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def pairs(flags: list[str]) -> set[str]:
    """Flags with their values, order aside: ["--a", "1", "--b"] -> {"--a 1", "--b"}."""
    out: list[str] = []
    for word in flags:
        if out and not word.startswith("--"):
            out[-1] += " " + word
        else:
            out.append(word)
    return set(out)


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_no_sbatch_on_path_is_one_line_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    err = one_line_error(capsys, ["slurm", "train", *TRAIN, "--out", str(tmp_path / "run")])
    assert "`sbatch` is not on PATH" in err and "--dry-run" in err
    assert not (tmp_path / "run").exists()


def test_an_unknown_partition_is_refused_before_anything_is_submitted(fake_slurm, capsys):
    err = one_line_error(capsys, ["slurm", "train", "--partition", "nosuch", *TRAIN, "--out", str(fake_slurm / "run")])
    assert err == ("error: --partition nosuch is not a partition of this cluster (sinfo lists: debug, gpu): pick "
                   "one of them, or leave --partition out for the default\n")
    assert submitted(fake_slurm) == [] and not (fake_slurm / "run").exists()


@pytest.mark.parametrize("flags, words", [
    (["--time", "1h"], "--time '1h' is not a SLURM time"),
    (["--time", "1-30"], "hours after a day count go up to 23"),
    (["--nodes", "0"], "--nodes must be at least 1 (got 0)"),
    (["--nodes", "-2"], "--nodes must be at least 1 (got -2)"),
    (["--cpus-per-task", "0"], "--cpus-per-task must be at least 1"),
    (["--nnodes", "2"], "--nnodes is set by the batch script"),
    (["--master-port", "29500"], "--master-port is set by the batch script"),
    (["--gpus-per-node", "2", "--nproc", "4"], "--nproc 4 is more processes than --gpus-per-node 2"),
    (["--max-restarts", "-1"], "--max-restarts must be 0"),
])
def test_bad_slurm_input_is_one_line_and_nothing_is_written(fake_slurm, capsys, flags, words):
    err = one_line_error(capsys, ["slurm", "train", *flags, *TRAIN, "--out", str(fake_slurm / "run")])
    assert words in err
    assert submitted(fake_slurm) == [] and not (fake_slurm / "run").exists()


def test_a_job_sbatch_refuses_is_one_line_and_leaves_nothing(fake_slurm, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_SBATCH_REFUSES", "Batch job submission failed: Invalid account or account/partition")
    err = one_line_error(capsys, ["slurm", "train", "--account", "nobody", *TRAIN, "--out", str(fake_slurm / "run")])
    assert "sbatch --parsable` failed while submitting" in err and "Invalid account" in err
    assert not (fake_slurm / "run").exists()


def test_dry_run_prints_the_script_and_writes_nothing(fake_slurm, capsys, tmp_path):
    run = tmp_path / "run"
    assert main(["slurm", "train", "--dry-run", "--nodes", "2", "--partition", "gpu", "--time", "1:00:00",
                 "--cpus-per-task", "4", "--exclusive", "--account", "proj", "--qos", "high", *TRAIN, "--nproc", "2",
                 "--out", str(run)]) == 0
    script = capsys.readouterr().out
    assert not run.exists() and submitted(fake_slurm) == []
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=4",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --qos=high", "#SBATCH --time=1:00:00",
                 "#SBATCH --exclusive", "#SBATCH --signal=B:USR1@90", "#SBATCH --requeue",
                 f"#SBATCH --output={run}/slurm/job-%j.out", "#SBATCH --open-mode=append",
                 f"#SBATCH --chdir={Path.cwd()}", "#SBATCH --job-name=scaletrain-run"]:
        assert line in script.splitlines(), line
    # one launch agent per node, the rendezvous on the allocation's first node, the same train flags
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=4" in script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script
    srun = next(line for line in script.replace(" \\\n    ", " ").splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    flags = words[words.index("train") + 1:words.index("--out")]
    assert pairs(flags) == pairs([*TRAIN, "--nproc", "2"])  # the same train flags (progress: lines in the log)
    assert ('--out "$RUN" --nnodes "$SLURM_NNODES" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" '
            '$RESUME &') in script
    assert """bash -c 'exec "$@" --node-rank "$SLURM_NODEID"'""" in script
    assert f"RUN={run}" in script and 'if [ -f "$RUN/checkpoint.pt" ]; then RESUME="--resume"; fi' in script
    assert 'scontrol requeue "$SLURM_JOB_ID"' in script and "trap " in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_gpus_per_node_sets_nproc_and_the_gpus(fake_slurm, capsys, tmp_path):
    assert main(["slurm", "train", "--dry-run", "--gpus-per-node", "4", "--device", "cuda", *TRAIN,
                 "--out", str(tmp_path / "run")]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --gpus-per-node=4" in script and "--nproc 4" in script and "--device cuda" in script


def test_a_submission_writes_the_script_and_prints_how_to_follow_the_job(fake_slurm, capsys, tmp_path):
    run = tmp_path / "run"
    assert main(["slurm", "train", *TRAIN, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    script = run / "slurm" / "job.sbatch"
    assert submitted(fake_slurm) == [["101", str(script)]]
    assert "submitted job 101" in out and "squeue -j 101" in out and "scaletrain watch" in out
    assert f"output   {run / 'slurm' / 'job-101.out'}" in out and f"tail -f {run / 'slurm' / 'job-101.out'}" in out
    assert "--model lenet5" in script.read_text()
    assert (run / "config.toml").is_file()  # a run directory train accepts (it holds no other files yet)
    jobs = json.loads((run / "slurm" / "jobs.json").read_text())
    assert [(j["job_id"], j["output"]) for j in jobs] == [("101", str(run / "slurm" / "job-101.out"))]
    # while that job is still queued, a second submission of the same run is refused
    (fake_slurm / "queue").write_text("101 PENDING\n")
    err = one_line_error(capsys, ["slurm", "train", *TRAIN, "--out", str(run)])
    assert "101 (PENDING)" in err and "scancel 101" in err
    (fake_slurm / "queue").write_text("")
    assert main(["slurm", "train", *TRAIN, "--out", str(run)]) == 0  # it ended without a checkpoint: again
    assert [j["job_id"] for j in json.loads((run / "slurm" / "jobs.json").read_text())] == ["101", "102"]


def test_a_study_is_one_job_per_point_and_gather_writes_study_json(fake_slurm, capsys, tmp_path):
    study = tmp_path / "study"
    argv = ["slurm", "study", "--time", "30", "--nproc", "1,2", *TRAIN, "--out", str(study)]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "nproc1" in out and "nproc2" in out and "#SBATCH --time=30" in out and "nothing written" in out
    assert "threads per rank: each node's cores / 2 processes, the grid's largest" in out
    assert not study.exists() and submitted(fake_slurm) == []
    assert main(argv) == 0
    capsys.readouterr()
    scripts = {Path(s).name: Path(s).read_text() for _, s in submitted(fake_slurm)}
    assert sorted(scripts) == ["nproc1-r0.sbatch", "nproc2-r0.sbatch"]
    text = scripts["nproc2-r0.sbatch"]
    assert f"#SBATCH --output={study}/points/nproc2/r0.log" in text and f"RUN={study}/points/nproc2/r0" in text
    assert "--nproc 2" in text and "slurm gather" in text and "--no-progress" not in text  # lines in its log
    # the same threads for every point, as `scaletrain study` gives them: the node's cores / the largest nproc
    assert all("nproc) / 2 ))" in t and "--threads $(( T > 1 ? T : 1 ))" in t for t in scripts.values())
    assert [e["status"] for e in json.loads((study / "study.json").read_text())] == ["pending", "pending"]
    # a job's end: its run's summary, then the gather its script runs
    run = study / "points" / "nproc1" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"status": "completed", "epoch_times_s": [2.0, 2.0],
                                                  "samples_per_s": 700.0, "top1": 0.9}))
    assert main(["slurm", "gather", str(study)]) == 0
    assert "1 completed, 0 failed, 1 pending" in capsys.readouterr().out
    entries = json.loads((study / "study.json").read_text())
    assert [e["status"] for e in entries] == ["completed", "pending"] and entries[0]["epoch_time_s"] == 2.0
    # submitted again: the completed point is not; the other one's job is still queued, so it is refused
    (fake_slurm / "queue").write_text("102 RUNNING\n")
    err = one_line_error(capsys, argv)
    assert "102 (RUNNING)" in err
    (fake_slurm / "queue").write_text("")
    assert main(argv) == 0
    assert [Path(s).name for _, s in submitted(fake_slurm)][2:] == ["nproc2-r0.sbatch"]


# -- the script itself, run by bash with srun and scontrol stand-ins -------------------------------------------

FAKE_TRAIN = r"""#!/bin/bash
# stands in for `scaletrain train`: records its arguments, waits for RUN/preempt, exits 75 on it
run=""; prev=""
for a in "$@"; do [ "$prev" = "--out" ] && run="$a"; prev="$a"; done
{ echo "args: $*"; echo "procid=${SLURM_PROCID-unset} ntasks=${SLURM_NTASKS-unset}"; } > "$run/train.log"
[ -f "$run/preempt" ] && echo "stale preempt seen" >> "$run/train.log"
touch "$run/started"
for i in $(seq 1 ${FAKE_WAIT_STEPS:-0}); do
    [ -f "$run/preempt" ] && exit 75
    sleep 0.05
done
exit 0
"""


@pytest.fixture
def bash_job(tmp_path):
    """Runs the rendered script under bash as SLURM would start it, with srun/scontrol stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text(
        '#!/bin/bash\ncase "$1 $2" in\n'
        '  "show hostnames") echo node7; echo node8 ;;\n'
        '  "show node") echo "NodeName=$3 Arch=x86_64"; echo "   NodeAddr=10.0.0.7 NodeHostName=$3" ;;\n'
        f'  "requeue "*) echo "requeue $2" >> {tmp_path}/requeued ;;\nesac\n')
    (bin_dir / "fake-train").write_text(FAKE_TRAIN)
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    run = tmp_path / "run"
    run.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(render(BatchJob(options=SlurmOptions(nodes=1), job_name="t", run=run,
                                      train=[str(bin_dir / "fake-train"), "--model", "lenet5"],
                                      output=str(tmp_path / "out"), workdir=tmp_path)))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "1234", "SLURM_NNODES": "1",
           "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "node[7-8]", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}

    def start(**extra: str) -> subprocess.Popen:
        return subprocess.Popen(["bash", str(script)], env={**env, **extra}, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    return run, start


def _wait_for(path: Path, deadline_s: float = 20) -> None:
    end = time.monotonic() + deadline_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_the_warning_signal_checkpoints_and_the_job_requeues_itself(bash_job):
    run, start = bash_job
    proc = start(FAKE_WAIT_STEPS="400")
    try:
        _wait_for(run / "started")
        proc.send_signal(signal.SIGUSR1)  # what `scancel --signal=USR1 --batch` delivers to the batch shell
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 75, out
    assert "SIGUSR1" in out and "train exited with 75" in out
    assert (run.parent / "requeued").read_text() == "requeue 1234\n"
    log = (run / "train.log").read_text()
    # the node agent: its node rank from its own task, the rendezvous at the first node's address
    assert (f"--model lenet5 --out {run} --nnodes 1 --master-addr 10.0.0.7 --master-port 32340 --node-rank 0"
            in log), log
    assert "--resume" not in log  # no checkpoint yet: a fresh start
    assert "procid=unset ntasks=unset" in log  # or train would join as one worker instead of launching


def test_a_start_that_finds_a_checkpoint_resumes_and_drops_a_stale_request(bash_job):
    run, start = bash_job
    (run / "checkpoint.pt").write_bytes(b"")
    (run / "preempt").touch()  # the request an earlier start answered
    proc = start(SLURM_RESTART_COUNT="2")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    log = (run / "train.log").read_text()
    assert "--master-port 32342 --resume --node-rank 0" in log  # another port on each start
    assert "stale preempt" not in log and not (run.parent / "requeued").exists()
    assert "start 3" in out


def test_a_study_job_gives_every_point_the_node_cores_over_the_largest_nproc(bash_job, tmp_path):
    run, start = bash_job
    bin_dir = tmp_path / "bin"
    (bin_dir / "nproc").write_text("#!/bin/bash\necho 8\n")  # this node's cores
    (bin_dir / "nproc").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(render(BatchJob(
        options=SlurmOptions(nodes=1), job_name="t", run=run, train=[str(bin_dir / "fake-train"), "--nproc", "1"],
        output=str(tmp_path / "out"), workdir=tmp_path, threads_from_cores=3)))
    proc = start()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "--node-rank 0 --threads 2" in (run / "train.log").read_text()  # 8 cores // 3


def test_a_failed_step_is_not_requeued(bash_job, tmp_path):
    run, start = bash_job
    (tmp_path / "bin" / "fake-train").write_text("#!/bin/bash\nexit 1\n")
    proc = start()
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "train exited with 1" in out
    assert not (run.parent / "requeued").exists()


def test_the_command_line_names_the_slurm_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["slurm", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "train" in out and "study" in out and "gather" in out and "validate-plan" in out


# -- a plan's validation as jobs -----------------------------------------------------------------------------

PLAN = ["plan", "--model", "lenet5", "--nodes", "1", "--nproc", "2", "--dataset", "digits", "--batch-size", "64",
        "--strategy", "allreduce,ring", "--precision", "fp32", "--workers", "0", "--compress", "none",
        "--checkpoint-activations", "none", "--time-ops", "off"]


@pytest.fixture
def cpu_plan(tmp_path, capsys):
    """A plan of one node of 2 CPU ranks on a stand-in calibration (predict_fixtures)."""
    from predict_fixtures import fake_calibration
    from scaletrain.predict import calibration

    cal = calibration.save(fake_calibration(threads=(1,)), tmp_path / "cal.json")
    assert main([*PLAN, "--calibration", str(cal), "--out", str(tmp_path / "plan")]) == 0
    capsys.readouterr()
    return tmp_path / "plan"


def test_a_plans_candidates_are_one_job_per_round_and_gather_compares_what_ended(fake_slurm, cpu_plan, capsys):
    argv = ["slurm", "validate-plan", str(cpu_plan), "--top", "2", "--repeats", "2", "--validate-steps", "8"]
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 brief runs to submit (dry run)" in out and "nothing written" in out
    assert f"--plan {cpu_plan}" in out and "--plan-rank 1" in out and not (cpu_plan / "slurm").exists()
    assert main(argv) == 0
    assert "4 jobs submitted" in capsys.readouterr().out
    # round by round, the predicted order within each
    assert [Path(s).name for _, s in submitted(fake_slurm)] == ["c1-r0.sbatch", "c2-r0.sbatch", "c1-r1.sbatch",
                                                              "c2-r1.sbatch"]
    text = (cpu_plan / "slurm" / "c2-r1.sbatch").read_text()
    assert f"RUN={cpu_plan}/validation/c2/r1" in text and f"--output={cpu_plan}/validation/c2/r1.log" in text
    assert "--plan-rank 2" in text and f"slurm gather {cpu_plan}" in text
    plan = json.loads((cpu_plan / "plan.json").read_text())
    assert plan["validation_jobs"] == {"executor": "slurm", "top": 2, "repeats": 2, "steps": 8}
    # two jobs ended: one run completed (a recorded 2-rank LeNet-5 run), one refused before it wrote a summary
    import shutil

    shutil.copytree(Path(__file__).parent / "data" / "recorded-lenet5-2rank", cpu_plan / "validation" / "c1" / "r0")
    (cpu_plan / "validation" / "c2" / "r0").mkdir(parents=True)
    (cpu_plan / "validation" / "c2" / "r0.log").write_text("error: --plan-rank 2: no such candidate\n"
                                                          "scaletrain: train exited with 2 at now\n")
    assert main(["slurm", "gather", str(cpu_plan)]) == 0
    assert "1 completed, 1 failed, 2 pending" in capsys.readouterr().out
    v = json.loads((cpu_plan / "plan.json").read_text())["validation"]
    assert v["pending"] == 2 and v["measured_order"] == [plan["ranked"][0]["id"]]
    assert v["failed"] == ["#2 round 1: --plan-rank 2: no such candidate (log validation/c2/r0.log)"]
    assert "validation" in (cpu_plan / "report.html").read_text()
    # the plan's own nodes and devices, and a validation submitted once
    assert "--nodes 2: the plan is of 1 node(s)" in one_line_error(capsys, [*argv, "--nodes", "2"])
    assert "validation/c1/r0 exists" in one_line_error(capsys, argv)
    assert "holds no plan.json" in one_line_error(capsys, ["slurm", "validate-plan", str(fake_slurm)])


def test_a_gpu_plan_asks_for_its_gpus(fake_slurm, tmp_path, capsys):
    assert main(["plan", "--model", "lenet5", "--nodes", "1", "--nproc", "4", "--hardware", "dgx-a100-80gb",
                 "--dataset", "digits", "--batch-size", "64", "--strategy", "allreduce", "--precision", "fp32",
                 "--workers", "0", "--compress", "none", "--checkpoint-activations", "none",
                 "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    argv = ["slurm", "validate-plan", str(tmp_path / "p"), "--dry-run"]
    assert "give --gpus-per-node 4" in one_line_error(capsys, argv)
    assert "--gpus-per-node 2: the plan runs 4 processes" in one_line_error(capsys, [*argv, "--gpus-per-node", "2"])
    assert main([*argv, "--gpus-per-node", "4", "--top", "1", "--repeats", "1"]) == 0
    assert "#SBATCH --gpus-per-node=4" in capsys.readouterr().out


def test_top_auto_submits_the_candidates_the_model_cannot_tell_apart(fake_slurm, cpu_plan, capsys):
    plan = json.loads((cpu_plan / "plan.json").read_text())
    n = plan["uncertain"]["count"]
    assert main(["slurm", "validate-plan", str(cpu_plan), "--top", "auto", "--repeats", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{n} brief runs to submit (dry run)" in out and f"the top {n} candidates" in out
    assert "about 2 s of steps (at least 30)" in out  # no --validate-steps: each candidate's own
