"""One elastic agent per rank on this machine, for ps-async: a rank that dies takes only its own agent.

torch's elastic agent stops every worker of its node as soon as one fails. Downpour SGD must go on when
a worker dies, so `scaletrain train --strategy ps-async --nproc N` on one node starts N agents, one rank
each, meeting like N nodes would (static rendezvous on 127.0.0.1). Agent 0 shows the progress and the
summary; the others write to agents/node{i}.log in the run directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from scaletrain.config import TrainConfig
from scaletrain.distributed.device import cpu_threads_per_rank
from scaletrain.rundir import RunDir

# set in the agents that an isolated launch starts: the parent already checked and created the run
AGENT_OF_ISOLATED = "SCALETRAIN_ISOLATED_AGENT"


def launch_isolated(cfg: TrainConfig, run: RunDir, port: int) -> int:
    n = cfg.launch.nproc
    logs = run.root / "agents"
    logs.mkdir(exist_ok=True)
    threads = cfg.launch.threads or cpu_threads_per_rank(n)  # the ranks share this machine's cores
    command = [sys.executable, "-m", "scaletrain", "train", "--config", str(run.config), "--nproc", "1",
               "--nnodes", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "--threads", str(threads), "--out", str(run.root)]
    # config.toml holds the run's settings; what only this invocation asks for goes on the command line
    if cfg.launch.resume:
        command.append("--resume")
    if cfg.launch.stop_after is not None:
        command += ["--stop-after", str(cfg.launch.stop_after)]
    env = {**os.environ, AGENT_OF_ISOLATED: "1"}
    procs, files = [], []
    try:
        for i in range(n):
            out = open(logs / f"node{i}.log", "w") if i else None
            files.append(out)
            procs.append(subprocess.Popen(command + ["--node-rank", str(i)], env=env, stdout=out,
                                          stderr=subprocess.STDOUT if out else None))
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:  # only the agents started here, by their PID
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        return 130
    finally:
        for f in files:
            if f is not None:
                f.close()
    return _outcome(codes, cfg.layout.trainers, logs)


def _outcome(codes: list[int], workers: int, logs) -> int:
    """Agent 0's exit code decides; a server's failure is an error, a worker's a note (Downpour goes on)."""
    if codes[0] != 0:
        return codes[0]
    for i, code in enumerate(codes[1:], 1):
        if code == 0:
            continue
        last = _last_line(logs / f"node{i}.log")
        if i >= workers:
            print(f"error: parameter server rank {i} failed: {last}", file=sys.stderr)
            return 1
        print(f"note: worker rank {i} stopped ({last}); ps-async went on without it "
              "(summary.json: ps.dead_workers)", file=sys.stderr)
    return 0


def _last_line(path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"
