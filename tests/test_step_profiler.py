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


def test_finish_writes_summary_with_diagnosis_and_trace(tmp_path):
    prof = StepProfiler(tmp_path)
    _loop(prof, steps=12, data_s=0.02, forward_s=0.001)
    summary = prof.finish({"model": "linear"}, config={"workers": 0})
    assert summary["model"] == "linear" and summary["profile"] == "on"
    assert summary["diagnosis"][0]["kind"] == "input-bound"
    assert json.loads((tmp_path / "summary.json").read_text())["diagnosis"] == summary["diagnosis"]
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert summary["peak_memory_bytes"] > 0 and summary["memory_kind"] == "rss"


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
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)  # timing changes nothing about the gradients


def test_wire_bytes_follow_the_all_reduce_bound():
    assert commhook.wire_bytes(1000, 1) == 0
    assert commhook.wire_bytes(1000, 2) == 1000
    assert commhook.wire_bytes(1000, 4) == 1500
