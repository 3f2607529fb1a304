"""StepProfiler in one process: phases tile each step, profile off writes only step times, exports."""

import json
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from scaletrain.profiler import PHASES, StepProfiler
from scaletrain.profiler import commhook
from scaletrain.profiler.clock import HostClock


def _loop(prof, steps=6, data_s=0.004, forward_s=0.003):
    def slow_loader():
        for i in range(steps):
            time.sleep(data_s)
            yield torch.randn(4, 3), torch.randint(0, 2, (4,))

    model = torch.nn.Linear(3, 2)
    records = []
    for x, y in prof.data(slow_loader()):
        with prof.phase("h2d"):
            x = x.to("cpu")
        with prof.phase("forward"):
            time.sleep(forward_s)
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with prof.phase("backward"):
            loss.backward()
        with prof.phase("optimizer"):
            model.zero_grad()
        records += prof.step_end(loss=loss.detach(), samples=len(y), epoch=0)
    records += prof.flush()
    return records


def test_phases_tile_every_step_and_time_what_they_wrap(tmp_path):
    prof = StepProfiler(tmp_path)
    records = _loop(prof)
    prof.close()
    assert [r["step"] for r in records] == list(range(6))
    for r in records:
        assert set(r["phases_s"]) == set(PHASES)
        assert sum(r["phases_s"].values()) == pytest.approx(r["step_time_s"], rel=0.01)
        assert r["phases_s"]["data_wait"] >= 0.004  # the loader sleeps 4 ms per batch
        assert r["phases_s"]["forward"] >= 0.003
        assert r["overlap_ratio"] is None and r["bytes_sent"] == 0  # one process: nothing communicated
    lines = (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(6))


def test_profile_off_records_step_time_only(tmp_path):
    prof = StepProfiler(tmp_path, enabled=False)
    records = _loop(prof)
    prof.close()
    assert all("phases_s" not in r for r in records)
    assert all(r["step_time_s"] >= 0.007 for r in records)
    assert prof.phase("forward") is prof.phase("backward")  # one shared no-op: nothing allocated per step


class FakeClocks:
    """A wall clock (the profiler's HostClock) and a process CPU clock that move only when told."""

    lag = 0

    def __init__(self):
        self.wall = self.cpu = 0.0

    def mark(self):
        return self.wall

    def seconds(self, origin, mark):
        return mark - origin

    def wait(self, mark):
        pass

    def process_time(self):
        return self.cpu

    def spend(self, wall, cpu):
        self.wall += wall
        self.cpu += cpu


def _starved_loop(prof, clocks, steps=24):
    def loader():
        for _ in range(steps):
            clocks.spend(0.005, 0.0)  # waiting for data costs no CPU
            yield None

    for _ in prof.data(loader()):
        with prof.phase("forward"):
            clocks.spend(0.1, 0.03)  # 2 threads busy would be 0.2 s of CPU
        with prof.phase("backward"):
            clocks.spend(0.2, 0.08)
        with prof.phase("optimizer"):
            clocks.spend(0.01, 0.02)
        clocks.spend(0.001, 0.001)
        prof.step_end(samples=4)


def _input_bound_loop(prof, clocks, steps=12):
    def loader():
        for _ in range(steps):
            clocks.spend(0.02, 0.0)  # 20 ms waiting for each batch, no CPU spent
            yield None

    for _ in prof.data(loader()):
        with prof.phase("forward"):
            clocks.spend(0.001, 0.001)  # the compute phases keep their one thread busy
        with prof.phase("backward"):
            clocks.spend(0.002, 0.002)
        with prof.phase("optimizer"):
            clocks.spend(0.0005, 0.0005)
        prof.step_end(samples=4)


def test_finish_writes_summary_with_diagnosis_and_trace(tmp_path, monkeypatch):
    """On recorded times (the fake clocks), not on sleeps that a busy machine stretches."""
    clocks = FakeClocks()
    monkeypatch.setattr("scaletrain.profiler.step_profiler.time.process_time", clocks.process_time)
    prof = StepProfiler(tmp_path)
    prof.clock = clocks
    _input_bound_loop(prof, clocks)
    summary = prof.finish({"model": "linear"}, config={"workers": 0, "threads_per_rank": 1})
    assert summary["model"] == "linear" and summary["profile"] == "on"
    assert summary["phases_mean_s"]["data_wait"] == pytest.approx(0.02)
    assert [f["kind"] for f in summary["diagnosis"]] == ["input-bound"]
    assert "with 0 loader workers per rank" in summary["diagnosis"][0]["message"]
    assert json.loads((tmp_path / "summary.json").read_text())["diagnosis"] == summary["diagnosis"]
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert summary["peak_memory_bytes"] > 0 and summary["memory_kind"] == "rss"


def test_cpu_time_is_read_at_every_boundary_and_recorded_per_phase(tmp_path, monkeypatch):
    clocks = FakeClocks()
    monkeypatch.setattr("scaletrain.profiler.step_profiler.time.process_time", clocks.process_time)
    prof = StepProfiler(tmp_path)
    prof.clock = clocks
    _starved_loop(prof, clocks)
    summary = prof.finish(config={"threads_per_rank": 2})  # the profiler adds its device: cpu
    records = [json.loads(line) for line in (tmp_path / "metrics-rank0.jsonl").read_text().splitlines()]
    for r in records:
        assert r["phases_s"]["forward"] == pytest.approx(0.1) and r["phases_cpu_s"]["forward"] == pytest.approx(0.03)
        assert r["phases_cpu_s"]["backward"] == pytest.approx(0.08)
        assert r["phases_cpu_s"]["optimizer"] == pytest.approx(0.02)
        assert r["phases_cpu_s"]["data_wait"] == 0 and r["phases_cpu_s"]["other"] == pytest.approx(0.001)
        assert r["cpu_time_s"] == pytest.approx(0.131) == pytest.approx(sum(r["phases_cpu_s"].values()))
        assert r["threads"] == torch.get_num_threads()
    assert summary["cpu"]["utilisation"]["forward"] == pytest.approx(0.15)
    assert summary["diagnosis"][0]["kind"] == "cpu-oversubscribed"
    assert "forward+backward used 18% of their 2 threads' CPU time" in summary["diagnosis"][0]["message"]


def test_real_steps_record_cpu_time_that_tiles_like_the_phases(tmp_path):
    prof = StepProfiler(tmp_path)
    busy = []  # this thread's CPU seconds spent inside each step's forward (thread_time: load-independent)
    for _ in prof.data(range(5)):
        with prof.phase("forward"):
            start = time.thread_time()
            sum(i * i for i in range(20000))
            busy.append(time.thread_time() - start)
        prof.step_end(samples=1)
    records = prof.flush()
    prof.close()
    for r, spent in zip(records, busy):
        assert set(r["phases_cpu_s"]) == set(PHASES) and r["threads"] == torch.get_num_threads()
        assert sum(r["phases_cpu_s"].values()) == pytest.approx(r["cpu_time_s"], abs=1e-6)
        assert r["phases_cpu_s"]["forward"] >= spent - 1e-6  # the process's CPU includes this thread's
        assert min(r["phases_cpu_s"].values()) >= 0


def test_profile_off_never_reads_the_cpu_clock(tmp_path, monkeypatch):
    def forbidden():
        raise AssertionError("process_time read with the profiler off")

    monkeypatch.setattr("scaletrain.profiler.step_profiler.time.process_time", forbidden)
    prof = StepProfiler(tmp_path, enabled=False)
    records = _loop(prof)
    prof.close()
    assert all("cpu_time_s" not in r and "phases_cpu_s" not in r for r in records)


def test_torch_profile_window_saves_a_trace_per_rank(tmp_path):
    prof = StepProfiler(tmp_path, torch_profile=(2, 4))
    _loop(prof)
    prof.close()
    trace = json.loads((tmp_path / "torch-profile" / "rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "scaletrain.forward" in names and "scaletrain.backward" in names


def test_torch_profile_window_cut_short_is_still_saved(tmp_path):
    prof = StepProfiler(tmp_path, torch_profile=(4, 100))
    _loop(prof)
    prof.close()
    assert (tmp_path / "torch-profile" / "rank0.json").is_file()


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_timed_hook_records_every_bucket_and_keeps_the_reduction(one_rank_group):
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2)), bucket_cap_mb=0.01)
    recorder = commhook.CommRecorder(HostClock(), world_size=1, delay_s=0.01)
    commhook.attach(model, recorder)
    reference = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))
    reference.load_state_dict(model.module.state_dict())
    x = torch.randn(8, 64)
    model(x).sum().backward()
    reference(x).sum().backward()
    buckets = recorder.take()
    assert buckets  # (with one rank DDP keeps one bucket; the 2-rank tests see several)
    assert sum(b.nbytes for b in buckets) == 4 * sum(p.numel() for p in model.parameters())
    assert all(b.done - b.ready >= 0.01 for b in buckets)  # the injected delay holds completion back
    assert all(b.ready_cpu is not None for b in buckets)  # the CPU clock at ready splits backward's CPU time
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)  # timing changes nothing about the gradients


def _offsets(rank, world, fake_kernel):
    from multirank import group

    from scaletrain.profiler import step_profiler

    with group():
        if fake_kernel:  # as if each rank ran under its own kernel (another node)
            step_profiler._kernel_id = lambda: f"node-{rank}"
        return step_profiler._clock_offset(world)


def test_ranks_on_one_machine_share_its_clock_exactly(ranks):
    # a barrier-aligned reading would carry the barrier's exit skew (a pipeline timeline once showed stage 1
    # starting before the stage it waits for); one kernel is one clock
    assert ranks.run(_offsets, 2, False) == [0.0, 0.0]
    other = ranks.run(_offsets, 2, True)  # another node's: the median of a few readings, near zero here
    assert other[0] == 0.0 and abs(other[1]) < 0.05
