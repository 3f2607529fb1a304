"""StepProfiler: the per-step phase timeline of one rank, for scaletrain's trainer and for any DDP loop.

    prof = StepProfiler(out="runs/mine", model=ddp_model)      # on every rank, after init_process_group
    for x, y in prof.data(loader):                             # time blocked on the loader = data_wait
        with prof.phase("h2d"):       x, y = x.to(dev), y.to(dev)
        with prof.phase("forward"):   loss = loss_fn(ddp_model(x), y)
        with prof.phase("backward"):  loss.backward()          # split into compute + exposed comm
        with prof.phase("optimizer"): opt.step(); opt.zero_grad()
        prof.step_end(loss=loss, samples=len(y))
    prof.finish()                                              # summary.json with diagnosis, trace.json

Anything outside a phase counts as `other`, so the phases add up to the step time exactly. Beside each
wall-time boundary the process's CPU clock is read (time.process_time: every thread of the process,
intra-op threads included), giving each step's and each phase's CPU time.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from scaletrain.distributed.group import current_rank, current_world_size, gather_objects
from scaletrain.profiler.steplog import StepLog
from scaletrain.perf.timing import minor_faults
from scaletrain.perf.wire import allreduce_bytes
from scaletrain.profiler import commhook
from scaletrain.profiler.clock import clock_for
from scaletrain.profiler.resources import peak_memory
from scaletrain.analysis.timeline import phase_names, step_cpu, step_phases
from scaletrain.profiler.torch_window import TorchProfileWindow
from scaletrain.rundir import RunDir, write_json_atomic

_NULL = contextlib.nullcontext()
_ROUND = 7  # seconds to 100 ns: far below anything a step can resolve


class StepProfiler:
    """Times every step's phases on this rank and writes them to metrics-rank{r}.jsonl in `out`."""

    def __init__(self, out: str | Path, model: torch.nn.Module | None = None, *, enabled: bool = True,
                 device: torch.device | None = None, first_step: int = 0, comm_hook: Callable | None = None,
                 comm_state: Any = None, inject_comm_s: float = 0.0, torch_profile: tuple[int, int] | None = None,
                 sinks: Iterable[Callable[[dict], None]] = (), rank: int | None = None,
                 world_size: int | None = None, replicas: int | None = None, keep_spans: bool = False) -> None:
        self.run_dir = RunDir(Path(out))
        self.run_dir.root.mkdir(parents=True, exist_ok=True)
        self.enabled = enabled
        # rank/world_size: given when the ranks share no process group (ps-async workers)
        self.rank = rank if rank is not None else current_rank()
        self.world_size = world_size if world_size is not None else current_world_size()
        # data-parallel replicas sharing the global batch (the ranks of one pipeline read the same samples)
        self.replicas = replicas if replicas is not None else self.world_size
        self.keep_spans = keep_spans  # each step's record gets its spans (`spans_s`), in order
        self.device = device or _device_of(model)
        self.step = first_step
        self.log = StepLog(self.run_dir.metrics(self.rank))
        self.sinks = list(sinks)
        self.clock = clock_for(self.device)
        self.recorder = commhook.CommRecorder(self.clock, self.world_size, delay_s=inject_comm_s)
        if enabled and model is not None and self.world_size > 1:
            commhook.attach(model, self.recorder, comm_hook, comm_state)
        self.window = TorchProfileWindow(*torch_profile, self.run_dir.root, self.rank, self.device) \
            if torch_profile else None
        self._clock_offset = _clock_offset(self.world_size)
        self._pending: deque[dict] = deque()
        self._spans: list[tuple[str, Any, Any, float, float]] = []  # (phase, mark, mark, cpu, cpu)
        self._start: Any = None
        self._last: Any = None
        self._start_cpu = self._last_cpu = 0.0  # process CPU seconds at _start and _last
        self._host_start = 0.0
        self._faults = 0  # the process's minor page faults at the step's start (fresh pages: analysis/throughput.py)
        self._closed = False
        self._current: str | None = None  # the phase being timed (carve's enclosing phase)
        self._epoch, self._in_epoch = -1, 0  # each pass through data() is an epoch

    # ------------------------------------------------------------ the loop
    def data(self, iterable: Iterable) -> Iterator:
        """Iterate a loader; the time blocked in it is each step's data_wait."""
        self._begin_step()
        if not self.enabled:
            yield from iterable
            return
        iterator = iter(iterable)
        while True:
            self._mark("other")
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._mark("data_wait")
            yield batch

    def mark(self, name: str) -> None:
        """The time since the last mark was spent in phase `name` (for phases a strategy times from
        inside a schedule it does not own: a pipeline's bubble and point-to-point waits)."""
        if self.enabled:
            self._mark(name)

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        """`with prof.phase("forward"): ...` — one of h2d, forward, backward, optimizer (or data_wait, other)."""
        if not self.enabled:
            return _NULL
        return self._phase(name)

    def after_mark(self, name: str) -> contextlib.AbstractContextManager:
        """`prof.mark(...)` then `with prof.after_mark("forward"): ...`: phase() for a strategy that marks the time
        before it itself (a pipeline's chunks, between its waits): nothing more is marked at the start."""
        if not self.enabled:
            return _NULL
        return self._phase(name, before=False)

    @contextlib.contextmanager
    def _phase(self, name: str, before: bool = True) -> Iterator[None]:
        if before:
            self._mark("other")
        outer, self._current = self._current, name
        try:
            if self.window is not None and self.window.active:
                with torch.profiler.record_function(f"scaletrain.{name}"):
                    yield
            else:
                yield
        finally:
            self._current = outer
        self._mark(name)

    def carve(self, name: str) -> contextlib.AbstractContextManager:
        """`with prof.carve("halo"): ...` inside a phase: the time inside is phase `name`, the time before it the
        enclosing phase's (what a strategy's layers spend exchanging within forward and backward: spatial tiles'
        halos and gather)."""
        if not self.enabled:
            return _NULL
        return self._carve(name)

    @contextlib.contextmanager
    def _carve(self, name: str) -> Iterator[None]:
        self._mark(self._current or "other")
        yield
        self._mark(name)

    def comm(self, wire: int, raw: int | None = None) -> contextlib.AbstractContextManager:
        """`with prof.comm(bytes_sent): ...` — communication outside DDP's hook (a parameter server's push
        and pull): all of it exposed, counted in comm_total_s and bytes_sent (raw: before compression).
        The context yields the exchange's record: set its `wire` (and `raw_wire`) inside if the bytes
        are only known once sent."""
        return self._comm(wire, wire if raw is None else raw)

    @contextlib.contextmanager
    def _comm(self, wire: int, raw: int) -> Iterator[commhook.BucketTiming]:
        if not self.enabled:
            yield commhook.BucketTiming(ready=None, nbytes=raw, wire=wire, raw_wire=raw)  # not recorded
            return
        self._mark("other")
        timing = commhook.BucketTiming(ready=self._last, nbytes=raw, wire=wire, raw_wire=raw,
                                       ready_cpu=self._last_cpu)
        yield timing
        self._mark("comm_exposed")
        timing.done = self._last
        self.recorder.buckets.append(timing)

    def step_end(self, loss: torch.Tensor | float | None = None, samples: int = 0, **fields: Any) -> list[dict]:
        """Close the step; returns the records resolved now (on CUDA, the previous step's, one late).

        `epoch` and `step_in_epoch` default to the count of data() passes and the step within the pass."""
        fields = {"epoch": max(self._epoch, 0), "step_in_epoch": self._in_epoch, **fields}
        self._in_epoch += 1
        faults = minor_faults()  # a syscall, about 1 us
        fresh, self._faults = faults - self._faults, faults
        if not self.enabled:
            loss_value = _to_float(loss)  # note: on CUDA a sync point, once per step (profile off)
            now = time.perf_counter()
            step_time, self._host_start = now - self._host_start, now
            record = {"step": self.step, **fields, "loss": loss_value, "samples": samples, "step_time_s": step_time,
                      "fresh_pages": fresh}
            self._advance()
            return self._emit([record])
        self._mark("other")
        raw = {"step": self.step, "fields": fields, "loss": loss, "samples": samples, "spans": self._spans,
               "start": self._start, "end": self._last, "host_start": self._host_start,
               "cpu_start": self._start_cpu, "cpu_end": self._last_cpu, "buckets": self.recorder.take(),
               "fresh_pages": fresh}
        self._pending.append(raw)
        self._spans, self._start, self._host_start = [], self._last, time.perf_counter()
        self._start_cpu = self._last_cpu
        self._advance()
        resolved = []
        while len(self._pending) > self.clock.lag:
            resolved.append(self._resolve(self._pending.popleft()))
        return self._emit(resolved)

    def flush(self) -> list[dict]:
        """Resolve every pending step (waits for the GPU) and flush the metrics file; e.g. at epoch end."""
        resolved = self._emit([self._resolve(raw) for raw in self._pending])
        self._pending.clear()
        self.log.flush()
        return resolved

    # ------------------------------------------------------------ the end
    def finish(self, summary: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
               thresholds: dict[str, float] | None = None) -> dict[str, Any] | None:
        """Collective: `finish_analysis`, then rank 0 writes summary.json (`summary` with the analysis
        merged in). For loops of your own; scaletrain's trainer writes its summary itself (train/summary.py).
        Returns the summary on rank 0."""
        analysis = self.finish_analysis(config, thresholds)
        if analysis is None:
            return None
        result = {**(summary or {}), **analysis}
        write_json_atomic(self.run_dir.summary, result)
        return result

    def finish_analysis(self, config: dict[str, Any] | None = None,
                        thresholds: dict[str, float] | None = None) -> dict[str, Any] | None:
        """Collective: close files, gather peak memory; rank 0 analyses all ranks' files, writes trace.json
        and returns the profiler's entries of summary.json (None on other ranks).

        `config` feeds the diagnosis (see analysis.analyze_run for its keys: e.g. workers, batch_size,
        and for the CPU checks local_world_size, threads_per_rank, cpu_cores); `device` defaults to
        this profiler's."""
        from scaletrain.analysis import analyze_run, load_records
        from scaletrain.export.trace import write_trace

        self.close()
        memory = gather_objects((self.rank, *peak_memory(self.device)))
        if dist.is_initialized():
            dist.barrier()  # every rank's metrics file is complete before rank 0 reads them
        if self.rank != 0:
            return None
        notes: list[str] = []  # a worker that died (ps-async) may have left half a last line
        records = load_records(self.run_dir.root, self.world_size, notes)
        # the device decides which measures apply (CPU time says nothing of a GPU's work)
        analysis = analyze_run(records, {"device": self.device.type, **(config or {})}, thresholds, memory=memory)
        result = {"profile": "on" if self.enabled else "off", **analysis}
        if notes:
            result["notes"] = notes
        if self.enabled:
            write_trace(records, self.run_dir.root / "trace.json")
        return result

    def close(self) -> None:
        """Resolve what is pending, save a torch.profiler window cut short, close the file (idempotent)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        if self.window is not None:
            self.window.close()
        self.log.close()

    # ------------------------------------------------------------ internals
    def _begin_step(self) -> None:
        self._epoch, self._in_epoch = self._epoch + 1, 0
        self._host_start, self._faults = time.perf_counter(), minor_faults()
        if self.enabled:
            self._start = self._last = self.clock.mark()
            self._start_cpu = self._last_cpu = time.process_time()
            self._spans = []
            self.recorder.take()  # nothing from between epochs belongs to the first step
        if self.window is not None:
            self.window.step_begins(self.step)

    def _advance(self) -> None:
        if self.window is not None:
            self.window.step_ended(self.step)
        self.step += 1
        if self.window is not None:
            self.window.step_begins(self.step)

    def _mark(self, name: str) -> None:
        now, cpu = self.clock.mark(), time.process_time()  # a syscall: about 1 us, a few per step
        self._spans.append((name, self._last, now, self._last_cpu, cpu))
        self._last, self._last_cpu = now, cpu

    def _resolve(self, raw: dict) -> dict:
        clock, origin = self.clock, raw["start"]
        clock.wait(raw["end"])
        spans = [(name, clock.seconds(origin, a), clock.seconds(origin, b), ca, cb)
                 for name, a, b, ca, cb in raw["spans"]]
        buckets, readies = [], []
        for b in raw["buckets"]:
            if b.done is not None:
                clock.wait(b.done)  # on CUDA: recorded on the reduction's stream, normally long complete
                buckets.append((clock.seconds(origin, b.ready), clock.seconds(origin, b.done)))
                readies.append((buckets[-1][0], b.ready_cpu))
        step_time = clock.seconds(origin, raw["end"])
        timing = step_phases([span[:3] for span in spans], buckets)
        # on CUDA the CPU time is the host's (launching kernels, waiting), not the GPU's work
        cpu = step_cpu(spans, readies)
        samples = raw["samples"]
        return {
            "step": raw["step"], **raw["fields"], "loss": _to_float(raw["loss"]), "samples": samples,
            "step_time_s": round(step_time, _ROUND),
            "samples_per_s": round(samples * self.replicas / step_time, 3) if step_time > 0 else None,
            "t_start_s": round(time.time() - time.perf_counter() + raw["host_start"] + self._clock_offset, 6),
            "phases_s": {k: round(timing["phases_s"].get(k, 0.0), _ROUND) for k in phase_names(timing["phases_s"])},
            "cpu_time_s": round(raw["cpu_end"] - raw["cpu_start"], _ROUND),
            "fresh_pages": raw["fresh_pages"],
            "phases_cpu_s": {k: round(cpu.get(k, 0.0), _ROUND) for k in phase_names(timing["phases_s"])},
            "threads": torch.get_num_threads(),
            "comm_total_s": round(timing["comm_total_s"], _ROUND),
            "comm_hidden_s": round(timing["comm_hidden_s"], _ROUND),
            "overlap_ratio": None if timing["overlap_ratio"] is None else round(timing["overlap_ratio"], 4),
            "bytes_sent": sum(b.wire for b in raw["buckets"]),
            "bytes_uncompressed": sum(b.raw_wire if b.raw_wire is not None else
                                      allreduce_bytes(b.nbytes, self.world_size) for b in raw["buckets"]),
            "comm_intervals_s": [[round(a, _ROUND), round(b, _ROUND)] for a, b in buckets],
            **({"spans_s": _merged_spans(spans)} if self.keep_spans else {}),
        }

    def _emit(self, records: list[dict]) -> list[dict]:
        for record in records:
            self.log.write(record)
            for sink in self.sinks:
                sink(record)
        return records


def _to_float(loss: torch.Tensor | float | None) -> float | None:
    if loss is None:
        return None
    return loss.item() if isinstance(loss, torch.Tensor) else float(loss)


def _device_of(model: torch.nn.Module | None) -> torch.device:
    if model is not None:
        for p in model.parameters():
            return p.device
    return torch.device("cpu")


def _clock_offset(world_size: int) -> float:
    """Seconds to add to this host's clock to get rank 0's. Ranks under one kernel (one machine, its
    network namespaces too) share one clock: zero, exactly. Others: the median over a few barrier-aligned
    readings (a single reading carries the barrier's exit skew, a millisecond or more on busy cores)."""
    if world_size == 1 or not dist.is_initialized():
        return 0.0
    readings = []
    for _ in range(_CLOCK_READINGS):
        dist.barrier()  # everyone reads its clock at (nearly) the same moment
        readings.append(gather_objects((_kernel_id(), time.time())))
    rank = current_rank()
    if readings[0][rank][0] is not None and readings[0][rank][0] == readings[0][0][0]:
        return 0.0
    return statistics.median(r[0][1] - r[rank][1] for r in readings)


_CLOCK_READINGS = 5


def _kernel_id() -> str | None:
    """This kernel's boot id: processes that share it read one clock."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _merged_spans(spans: list[tuple]) -> list[list]:
    """[phase, begin s, end s] of a step in order, empty spans dropped and neighbours of one phase joined."""
    out: list[list] = []
    for name, a, b, _ca, _cb in spans:
        if b <= a:
            continue
        if out and out[-1][0] == name and abs(out[-1][2] - round(a, _ROUND)) < 1e-9:
            out[-1][2] = round(b, _ROUND)
        else:
            out.append([name, round(a, _ROUND), round(b, _ROUND)])
    return out
