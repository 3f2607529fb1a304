"""Under torchrun or srun this process is one worker: join the job instead of launching one."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from scaletrain.config import TrainConfig, save_toml
from scaletrain.distributed import failure
from scaletrain.distributed.launch.local import PREEMPTED
from scaletrain.distributed.launch.outcome import print_summary, rank_namer
from scaletrain.distributed.launch.preflight import preflight
from scaletrain.distributed.rank import RankInfo, slurm_rendezvous
from scaletrain.errors import UserError
from scaletrain.rundir import create


def join_external_launch(cfg: TrainConfig) -> int:
    """Under torchrun or srun, this process is one worker: join the job instead of launching one."""
    from scaletrain.train.worker import request_preemption_on, run as run_worker

    code = 0
    try:
        os.environ.update(slurm_rendezvous(dict(os.environ)) if "RANK" not in os.environ else {})
        if cfg.faults.max_restarts:
            raise UserError("--max-restarts is for the launcher that starts the workers, and this process was "
                            "started by another (torchrun or srun): use torchrun --max-restarts N (the workers "
                            "then resume from the latest checkpoint), or launch with scaletrain train itself")
        rank = RankInfo.from_env()
        run, cfg = preflight(cfg)
        if rank.is_main:
            create(run)
            save_toml(cfg, run.config)
        else:
            run.root.mkdir(parents=True, exist_ok=True)
        request_preemption_on(run)
        result = run_worker(cfg, rank)
        if rank.is_main:
            print_summary(run, cfg)
        if (result or {}).get("status") == "preempted" or run.preempt.exists():
            code = PREEMPTED
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except Exception as e:  # keep the cause: one line here, the traceback in RUN/errors/rank{r}.txt
        rank_id = RankInfo.from_env().rank
        with tempfile.TemporaryDirectory() as tmp:
            failure.record_error(tmp, cfg.launch.out, rank_id, e, user_error=False)
            record = json.loads(Path(tmp, f"rank{rank_id}.json").read_text())
        where = f" [traceback: {record['traceback']}]" if record["traceback"] else ""
        print(f"error: {rank_namer(cfg)(rank_id)} failed: {record['line']}{where}", file=sys.stderr)
        code = 1
    finally:
        # Leave without C++ static destructors, as multiprocessing workers do: after set_num_threads and
        # a gloo process group, PyTorch 2.13 sometimes aborts in them ("terminate called without an
        # active exception", seen in about 1 of 8 torchrun launches here), failing a finished job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
