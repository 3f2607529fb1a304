"""Do two versions of scaletrain give the same files? Runs the same commands with each source tree (a run per
strategy, a study, a data-sheet prediction, a report) and compares what they wrote, timings apart.

    python tools/same_results.py OLD_SRC NEW_SRC OUT     # e.g. a `git worktree` of the previous commit's src/

Each command runs once per tree, the two interleaved (old, new, old, new, ...), one at a time. Compared:
config.toml and study.toml whole; summary.json, epochs.jsonl, study.json and prediction.json key by key,
every value but the measured ones (times, rates, memory, dates, hosts: TIMING below); and the names of the
files each wrote. A strategy whose workers step at their own pace (ps-async) trains differently each run:
its losses are listed, not failed. Prints one line per command and every difference; exit 1 on any."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

TRAIN = ["train", "--model", "lenet5", "--dataset", "digits", "--epochs", "1", "--batch-size", "32",
         "--tensorboard", "off", "--no-progress"]
COMMANDS = {
    **{f"train-{s}": [*TRAIN, "--strategy", s, "--nproc", "3" if s.startswith("ps-") else "2"]
       for s in ("allreduce", "ring", "ps-sync", "ps-async", "pipeline", "fsdp")},
    "study": ["study", "--model", "lenet5", "--dataset", "digits", "--epochs", "1", "--nproc", "1,2",
              "--batch-size", "32,64", "--tensorboard", "off"],
    "predict": ["predict", "--hardware", "dgx-a100-80gb", "--model", "resnet50", "--image-size", "224",
                "--nproc", "8", "--nnodes", "1,2,4", "--strategy", "allreduce,fsdp"],
    "report": [],  # scaletrain report of train-allreduce's run (run())
}
NONDETERMINISTIC = {"train-ps-async"}
TIMING = re.compile(r"(^|_)(s|ms|time|times|seconds|rate|per_s|bytes_per_s|rss|peak|memory|mem|started|ended|"
                    r"date|made|at|host|hostname|pid|elapsed|wall|clock|offset|utilization|utilisation|cpu|"
                    r"load|throughput|overlap|efficiency|speedup|share|ratio|eta|version|python|torch|"
                    r"stragglers|diagnosis|out|dir|log)($|_)")
"""Keys of measured values (times, rates, memory, CPU use, stragglers and the diagnosis made of them) and of
where and when a run ran (its --out, dates, hosts, versions): not compared."""
LOSSY = re.compile(r"^(loss|losses|train_loss|val_loss|top1|top5|best_top1|digest|param_digests|staleness|grad_norm)$")
"""What a run whose workers step at their own pace (ps-async) computes differently each time."""


def run(src: Path, name: str, out: Path) -> tuple[int, str]:
    """`scaletrain` of `src` running command `name` into `out` (a report: of the allreduce run beside `out`,
    into a copy of it); (exit code, its last line)."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    if name == "report":
        shutil.copytree(out.parent / "train-allreduce", out)
        argv = [sys.executable, "-m", "scaletrain", "report", str(out)]
    else:
        argv = [sys.executable, "-m", "scaletrain", *COMMANDS[name], "--out", str(out)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def timing(key: str) -> bool:
    return bool(TIMING.search(key.lower()))


def compare(a, b, where: str, nondeterministic: bool, out: list[str]) -> None:
    """Every difference of `b` from `a` into `out`, but under a timing key (or a loss, a run that differs
    each time)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'new' if k in b else 'old'}")
            elif not timing(str(k)) and not (nondeterministic and LOSSY.match(str(k))):
                compare(a[k], b[k], f"{where}.{k}", nondeterministic, out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{where}[{i}]", nondeterministic, out)
        return
    if isinstance(a, float) and isinstance(b, float) and (math.isclose(a, b, rel_tol=1e-12) or
                                                          (math.isnan(a) and math.isnan(b))):
        return
    if a != b:
        out.append(f"{where}: {str(a)[:80]} before, {str(b)[:80]} now")


def read(path: Path):
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".toml":
        return tomllib.loads(path.read_text())
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return None


COMPARED = ("config.toml", "summary.json", "epochs.jsonl", "study.toml", "study.json", "prediction.json")


def differences(old: Path, new: Path, nondeterministic: bool) -> list[str]:
    out: list[str] = []
    names = lambda root: {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}  # noqa: E731
    files_old, files_new = names(old), names(new)
    strip = lambda s: {re.sub(r"metrics-rank\d+|r\d+\.log|\.[^/]*\.tmp$", "", f) for f in s}  # noqa: E731
    if strip(files_old) != strip(files_new):
        out.append(f"files: only before {sorted(files_old - files_new)[:5]}, "
                   f"only now {sorted(files_new - files_old)[:5]}")
    for rel in sorted(files_old & files_new):
        if Path(rel).name in COMPARED:
            compare(read(old / rel), read(new / rel), rel, nondeterministic, out)
    return out


def main(old_src: str, new_src: str, out: str) -> int:
    root = Path(out)
    failed = 0
    for name in COMMANDS:
        results = {}
        for tag, src in (("old", Path(old_src)), ("new", Path(new_src))):
            if (root / tag / name).exists():  # from an earlier call: compared again as it is
                results[tag] = 0
                continue
            code, last = run(src, name, root / tag / name)
            results[tag] = code
            if code:
                print(f"{name} ({tag}): exit {code}: {last}")
        if results["old"] or results["new"]:
            failed += results["old"] != results["new"]
            continue
        diffs = differences(root / "old" / name, root / "new" / name, name in NONDETERMINISTIC)
        print(f"{name}: {'same files, timings apart' if not diffs else f'{len(diffs)} differences'}"
              + (" (losses not compared: its workers step at their own pace)" if name in NONDETERMINISTIC else ""))
        for d in diffs[:20]:
            print(f"  {d}")
        failed += bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    sys.exit(main(*sys.argv[1:]))
