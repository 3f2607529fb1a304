"""A launch written at the top level of a script, without `if __name__ == "__main__":`, named in one line.

The elastic agent starts its workers with multiprocessing's spawn method, and a spawned process first runs
the main script again (as `__mp_main__`, so that what the script defines can be found) before the worker's
own function. A launch at the script's top level therefore starts once more inside every worker; torch
then fails with a page of multiprocessing traceback and the launcher sees a rank exit without a message.
Every entry that launches (cli.main, scaletrain.api) calls `refuse_in_spawned_import` first: in such a
worker it leaves the one line for the launcher, as a rank's bad input, and ends the worker before it does
anything else. Notebooks and `python -c` have no script to run again, and never get here.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Iterator

from scaletrain.errors import UserError

LAUNCH_ERRORS = "SCALETRAIN_LAUNCH_ERRORS"
"""The launcher's folder of rank error records (distributed/failure.py), for a worker that has no rank yet."""


def errors_to(err_dir: str, **more: str) -> contextlib.AbstractContextManager:
    """While the agent starts workers: they inherit where a failure before their start is recorded (and the
    environment variables `more`)."""
    return inherited({LAUNCH_ERRORS: err_dir, **more})


@contextlib.contextmanager
def inherited(variables: dict[str, str]) -> Iterator[None]:
    """These environment variables set while the agent starts workers (which inherit them), as before after."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def importing_main_in_worker() -> bool:
    """True while a spawned process runs the main script again, before its own function starts.
    (`_inheriting` is what multiprocessing's own check of this reads: spawn._check_not_importing_main.)"""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def refuse_in_spawned_import(call: str) -> None:
    """Nothing outside a spawned worker's import of the script; there, `call` (`scaletrain.api.train()`)
    is refused in one line: recorded for the launcher and the worker ended (exit 2), or raised when no
    scaletrain launcher started this process."""
    if not importing_main_in_worker():
        return
    script = getattr(sys.modules.get("__mp_main__"), "__file__", None) or "the main script"
    error = UserError(f"{call} ran again in a worker process, which re-runs the top level of {script} (the "
                      "workers start with multiprocessing's spawn method): put the call under "
                      '`if __name__ == "__main__":`')
    err_dir = os.environ.get(LAUNCH_ERRORS)
    if err_dir is None:
        raise error
    from scaletrain.distributed import failure  # (imports torch: only on this rare path)

    failure.record_error(err_dir, None, 0, error, user_error=True)  # its rank is not known yet: 0 speaks for all
    raise SystemExit(2)
