"""`scaletrain watch`: a real run watched while it trains and after it ends; partial lines, replaced files,
stalled and failed runs, the HTML page, bad input."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console

from scaletrain.cli import main
from scaletrain.errors import UserError
from scaletrain.watch.html import write_page
from scaletrain.watch.reader import RunReader, open_run
from scaletrain.watch.state import stale_after
from scaletrain.watch.terminal import frame

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 3
# two ranks, rank 1 sleeping 50 ms in each forward: a straggler, and epochs long enough to be seen running
TRAIN = ("--model", "lenet5", "--dataset", "digits", "--epochs", str(EPOCHS), "--nproc", "2", "--threads", "1",
         "--inject", "slow-rank=1:0.05", "--tensorboard", "off", "--no-progress")


def text(snap, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width)
    console.print(frame(snap))
    return console.file.getvalue()


def watch_once(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["watch", *map(str, args), "--once"])
    return code, out.getvalue(), err.getvalue()


@dataclass
class Watched:
    out: Path
    waiting: list = field(default_factory=list)  # snapshots taken before the first step was written
    waiting_cli: str = ""  # `scaletrain watch --once` then
    first_epoch: object = None  # the first snapshot with steps (the steps per epoch not known yet)
    running: object = None  # the first snapshot after the first epoch, while the run trained
    running_cli: str = ""  # `scaletrain watch --once --html` at that moment
    running_html: str = ""
    final: object = None  # once the training process has exited


@pytest.fixture(scope="module")
def watched(tmp_path_factory) -> Watched:
    """Start a real training, watch it from its run directory until it ends (at most 120 s)."""
    w = Watched(tmp_path_factory.mktemp("watch") / "run")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS")}
    proc = subprocess.Popen([sys.executable, "-m", "scaletrain", "train", *TRAIN, "--out", str(w.out)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    try:
        reader = None
        while proc.poll() is None and time.monotonic() < deadline:
            if reader is None and (w.out / "config.toml").is_file():
                reader = RunReader(open_run(w.out))
            if reader is not None:
                snap = reader.snapshot()
                if snap.progress is None:
                    w.waiting.append(snap)
                    if not w.waiting_cli:  # (this also imports what the command needs, before the race below)
                        w.waiting_cli = watch_once(w.out)[1]
                elif w.first_epoch is None and snap.progress.epoch == 1:
                    w.first_epoch = snap
                elif w.running is None and not snap.ended and snap.progress.epoch >= 2:
                    w.running = snap
                    html = w.out.parent / "watch.html"
                    w.running_cli = watch_once(w.out, "--html", html)[1]
                    w.running_html = html.read_text()
            time.sleep(0.05)
        output = proc.communicate(timeout=max(1, deadline - time.monotonic()))[0]
    finally:
        if proc.poll() is None:
            proc.kill()  # only the training this fixture started, by its PID
            proc.wait()
    assert proc.returncode == 0, output
    w.final = RunReader(open_run(w.out)).snapshot()
    return w


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_run_in_progress_is_shown_running(watched):
    snap = watched.running
    assert snap is not None, "the run was never seen between its first steps and its end"
    assert snap.status == "running" and not snap.ended
    p = snap.progress
    assert p.steps_done > 0 and p.epochs == EPOCHS
    assert p.steps_per_epoch and p.steps_total == EPOCHS * p.steps_per_epoch
    assert 0 < p.fraction < 1 and p.eta_s is not None and p.eta_s > 0
    assert snap.samples_per_s_recent > 0
    assert "running" in watched.running_cli and "completed" not in watched.running_cli
    assert re.search(rf"epoch \d/{EPOCHS}  step \d+/{p.steps_total}  \d+\.\d%  ETA \d+ s", watched.running_cli)


def test_in_the_first_epoch_the_total_is_known_from_the_records(watched):
    snap = watched.first_epoch
    assert snap is not None and snap.status == "running"
    p = snap.progress
    assert p.steps_done > 0 and p.steps_per_epoch and p.steps_total == EPOCHS * p.steps_per_epoch
    assert 0 < p.fraction <= 1 / EPOCHS


def test_records_without_steps_per_epoch_leave_the_total_unknown_in_the_first_epoch():
    from scaletrain.watch.state import Step, steps_per_epoch

    old = [Step(step=i, epoch=0, step_in_epoch=i, samples=16, step_time_s=0.01, samples_per_s=None, t_start_s=None)
           for i in range(5)]
    assert steps_per_epoch(old, None) is None
    later = old + [Step(step=5 + i, epoch=1, step_in_epoch=i, samples=16, step_time_s=0.01, samples_per_s=None,
                        t_start_s=None) for i in range(2)]
    assert steps_per_epoch(later, None) == 5


def test_before_the_first_step_it_says_waiting(watched):
    assert watched.waiting, "no snapshot was taken between config.toml and the first steps"
    snap = watched.waiting[0]
    assert snap.status == "waiting" and snap.progress is None
    assert "waiting for the first step" in text(snap)
    assert "waiting for the first step" in watched.waiting_cli


def test_a_finished_run_says_completed_with_its_own_numbers(watched):
    snap, s = watched.final, summary(watched.out)
    assert snap.status == "completed" and snap.ended and snap.progress.eta_s is None
    assert snap.progress.fraction == 1.0 and snap.progress.steps_done == s["steps"]
    assert snap.samples_per_s_mean == s["samples_per_s"] and snap.mean_source == "summary.json"
    assert "completed" in text(snap)


def test_phases_stragglers_and_diagnosis_are_the_runs_analysis(watched):
    """With every step in the window, the analysis of the steps read equals the one the run wrote."""
    snap, s = watched.final, summary(watched.out)
    assert not snap.window_full
    assert snap.phases == tuple(s["phases_mean_s"])
    assert snap.run_phases == pytest.approx(s["phases_mean_s"])
    assert [r["rank"] for r in snap.ranks] == [0, 1]
    assert [f["kind"] for f in snap.diagnosis] == [f["kind"] for f in s["diagnosis"]]
    assert [r["rank"] for r in snap.stragglers["repeated"]] == [1]  # the injected slow rank
    shown = text(snap)
    assert "rank 1 is repeatedly the slowest" in shown and "straggler" in shown


def test_the_html_page_reloads_itself_and_holds_the_frame(watched, tmp_path):
    page = watched.running_html  # written by `watch --once --html` while the run trained
    assert page.startswith("<!DOCTYPE html>") and '<meta http-equiv="refresh" content="2">' in page
    assert "running" in page and "comm_exposed" in page
    assert re.search(rf"step \d+/{watched.running.progress.steps_total} ", page)
    assert not list(watched.out.parent.glob(".watch.html.*"))  # the atomic rewrite left no temp file
    snap = watched.final
    write_page(tmp_path / "w.html", frame(snap), 5, "title")
    page = (tmp_path / "w.html").read_text()
    assert '<meta http-equiv="refresh" content="5">' in page and "completed" in page
    for rank in snap.ranks:  # the table's values, as the terminal shows them
        assert f"{rank['phases_mean_s']['forward'] * 1000:.1f}" in page
        assert f"{rank['step_time_p90_s'] * 1000:.1f}" in page


def copy_run(src: Path, dst: Path, keep_summary: bool = False) -> Path:
    dst.mkdir()
    for name in ("config.toml", "epochs.jsonl", "metrics-rank0.jsonl", "metrics-rank1.jsonl") + \
            (("summary.json",) if keep_summary else ()):
        shutil.copy(src / name, dst / name)
    return dst


def test_a_partial_last_line_waits_for_the_rest(watched, tmp_path):
    run = copy_run(watched.out, tmp_path / "run")
    lines = (run / "metrics-rank0.jsonl").read_bytes().splitlines(keepends=True)
    half = len(lines[10]) // 2
    (run / "metrics-rank0.jsonl").write_bytes(b"".join(lines[:10]) + lines[10][:half])
    reader = RunReader(open_run(run))
    snap = reader.snapshot()
    assert snap.status == "running" and snap.progress.steps_done == 10 and not snap.notes
    with open(run / "metrics-rank0.jsonl", "ab") as f:
        f.write(lines[10][half:] + lines[11])
    assert reader.snapshot().progress.steps_done == 12  # the rest of the line, and one more, read


def test_a_replaced_metrics_file_is_read_again(watched, tmp_path):
    """A resume rewrites the metrics files without the epoch it redoes: the view follows."""
    run = copy_run(watched.out, tmp_path / "run")
    reader = RunReader(open_run(run))
    total = reader.snapshot().progress.steps_done
    for rank in (0, 1):
        path = run / f"metrics-rank{rank}.jsonl"
        keep = path.read_text().splitlines(keepends=True)[:5]
        path.with_suffix(".new").write_text("".join(keep))
        os.replace(path.with_suffix(".new"), path)
    snap = reader.snapshot()
    assert total > 5 and snap.progress.steps_done == 5 and all(r["steps"] <= 5 for r in snap.ranks)


def test_a_window_keeps_each_ranks_last_steps(watched, tmp_path):
    reader = RunReader(open_run(watched.out), window=5)
    obs = reader.observe()
    last = obs.steps[-1].step
    assert obs.window_full
    for rank in (0, 1):
        assert [r["step"] for r in obs.windows[rank]] == list(range(last - 4, last + 1))
    assert len(obs.steps) == last + 1  # progress still counts every step of the primary rank


def test_a_silent_run_is_called_stalled(watched, tmp_path):
    """Stalled: no new step for 3x the longest pause between two steps (evaluations), 100 steps or 120 s."""
    run = copy_run(watched.out, tmp_path / "run")
    reader = RunReader(open_run(run))
    obs = reader.observe()
    assert obs.longest_pause_s > 0  # the evaluation after each epoch
    limit = stale_after(obs, reader.snapshot().step_time_recent_s)
    assert limit == max(120, 3 * obs.longest_pause_s, 100 * reader.snapshot().step_time_recent_s)
    assert reader.snapshot(now=obs.last_write + limit - 1).status == "running"
    snap = reader.snapshot(now=obs.last_write + 3600)
    assert snap.status == "stalled" and not snap.ended and "no new step for 1 h" in snap.detail
    assert reader.snapshot(now=obs.last_write + 60, stale_s=30).status == "stalled"


def test_failed_and_restarted_runs_say_so(watched, tmp_path):
    run = copy_run(watched.out, tmp_path / "run", keep_summary=True)
    s = summary(run) | {"status": "failed", "error": "rank 1 killed by SIGKILL", "restarts": [{}, {}]}
    os.utime(run / "metrics-rank0.jsonl", (time.time() - 10,) * 2)  # written before the summary
    os.utime(run / "metrics-rank1.jsonl", (time.time() - 10,) * 2)
    (run / "summary.json").write_text(json.dumps(s))
    snap = RunReader(open_run(run)).snapshot()
    assert snap.status == "failed" and snap.ended and snap.restarts == 2
    shown = text(snap)
    assert "failed" in shown and "rank 1 killed by SIGKILL" in shown and "restarts" in shown


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    for path in (tmp_path / "missing", tmp_path / "other", tmp_path / "other" / "notes.txt"):
        code, out, err = watch_once(path)
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (path, err)
    with pytest.raises(UserError, match="not a scaletrain run directory"):
        open_run(tmp_path / "other")
    code, _, err = watch_once(tmp_path / "other", "--interval", "0")
    assert code == 2 and "--interval" in err


def test_the_mean_so_far_is_the_summarys_definition(watched, tmp_path):
    """Before summary.json exists, the mean is steady-state samples/s over the steps read, as the run defines it."""
    from scaletrain.analysis import load_records
    from scaletrain.analysis.throughput import settled_step, steady_samples_per_s

    run = copy_run(watched.out, tmp_path / "run")
    snap = RunReader(open_run(run)).snapshot()
    records = load_records(run)
    spe = snap.progress.steps_per_epoch
    assert snap.mean_source == "steady steps so far"
    # past each epoch's warm-up and the step every rank's heap had settled at
    assert snap.samples_per_s_mean == pytest.approx(steady_samples_per_s(records[0], 2, spe, settled_step(records)))
    assert snap.samples_per_s_mean == pytest.approx(summary(watched.out)["samples_per_s"])


def test_an_unprofiled_run_shows_step_times_only(watched, tmp_path):
    """--profile off records step time and loss alone: no phases and no diagnosis, said so, never zeros."""
    run = copy_run(watched.out, tmp_path / "run")
    keys = ("step", "epoch", "step_in_epoch", "lr", "loss", "samples", "step_time_s")
    for rank in (0, 1):
        path = run / f"metrics-rank{rank}.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({k: r[k] for k in keys}) + "\n" for r in lines))
    snap = RunReader(open_run(run)).snapshot()
    assert snap.phases == () and snap.diagnosis == [] and snap.run_phases is None
    recent = [json.loads(line) for line in (run / "metrics-rank0.jsonl").read_text().splitlines()][-50:]
    # 2 ranks read different data, as config.toml says
    expected = sum(r["samples"] for r in recent) * 2 / sum(r["step_time_s"] for r in recent)
    assert snap.samples_per_s_recent == pytest.approx(expected)
    assert "not profiled" in text(snap)


def test_the_live_view_follows_the_run_until_it_ends(watched, tmp_path):
    """Without --once: frames every --interval until summary.json appears, the HTML page rewritten each time."""
    run = copy_run(watched.out, tmp_path / "run")
    page = tmp_path / "live.html"

    result = {}

    def finish():  # once the first frame's page is written (however long a busy machine takes), end the run
        deadline = time.monotonic() + 30
        while not page.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a few more frames
        result["before"] = page.read_text() if page.exists() else ""
        shutil.copy(watched.out / "summary.json", run / "summary.json")

    threading.Thread(target=finish, daemon=True).start()

    def watch():
        result["code"] = main(["watch", str(run), "--interval", "0.1", "--html", str(page)])

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        watcher.join(timeout=60)  # a loop that missed the end would otherwise hang the suite
    assert not watcher.is_alive(), "watch did not stop when summary.json appeared"
    assert result["code"] == 0, err.getvalue()
    assert "running" in result["before"]  # the page while the run was going
    assert "completed" in out.getvalue() and "completed" in page.read_text()


def test_restarts_of_a_running_job_are_counted_from_restarts_jsonl(watched, tmp_path):
    run = copy_run(watched.out, tmp_path / "run")
    assert RunReader(open_run(run)).snapshot().restarts is None  # no restart: not shown
    failure = {"event": "failure", "attempt": 0, "time": time.time(), "node": 0, "rank": 1, "cause": "SIGKILL",
               "reached_step": 7}
    (run / "restarts.jsonl").write_text(json.dumps(failure) + "\n" + json.dumps({"event": "resumed", "attempt": 1,
                                                                                  "time": time.time(), "step": 5})
                                        + "\n" + '{"event": "fail')  # a line being written
    snap = RunReader(open_run(run)).snapshot()
    assert snap.status == "running" and snap.restarts == 1
    assert re.search(r"restarts\s+1", text(snap))


def test_a_long_file_is_read_a_chunk_at_a_time(watched, tmp_path, monkeypatch):
    """Chunks of 300 bytes cut lines anywhere: every record still arrives once, in order."""
    from scaletrain.watch import tail

    monkeypatch.setattr(tail, "CHUNK", 300)
    reader = RunReader(open_run(watched.out), window=0)
    obs = reader.observe()
    expected = [json.loads(line)["step"] for line in (watched.out / "metrics-rank1.jsonl").read_text().splitlines()]
    assert [r["step"] for r in obs.windows[1]] == expected
    assert [s.step for s in obs.steps] == list(range(len(expected)))


@pytest.mark.parametrize("config, replicas, world", [
    ({"nproc": 4}, 4, 4),
    ({"nproc": 5, "strategy": "ps-sync", "ps_servers": 2}, 3, 5),
    ({"nproc": 6, "strategy": "pipeline", "stages": 2}, 3, 6),
    ({"nproc": 4, "strategy": "pipeline"}, 1, 4),
    ({"nproc": "four"}, 1, "unknown"),  # a damaged config.toml: no layout (the reader names the value)
])
def test_before_a_steps_rate_watch_counts_replicas_by_the_runs_layout(config, replicas, world):
    from scaletrain.watch.state import replicas as replicas_of, title

    assert replicas_of([], config) == replicas
    obs = type("Obs", (), {"config": {"model": "m", "dataset": "d", **config}, "summary": None})()
    assert title(obs).endswith(f"{world} ranks" if world != "unknown" else "ranks unknown")
