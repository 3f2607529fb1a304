"""The plan search's cost against an earlier revision's, side by side: the same `scaletrain plan` request run by this
checkout and by REV (a git worktree made for the run), alternated round by round so that a shared machine's drift
hits both alike. Printed per request: each side's `search_s` (pricing only, as plan.json records it) by round, the
median of the rounds' ratios (REV / this) with their spread, and whether the two plans agree: the same first five,
and every candidate both priced with the same times, phases and memory (a cut of the search must change nothing it
finds; a bound may leave unpriced what cannot reach the top). A measurement, not a test:
exits 0 whatever the times (1 if a run fails or the plans differ).

    .venv/bin/python benchmarks/plan_search.py --base REV [--nodes 1,4] [--rounds 3]   (make bench-plan-search)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
REQUEST = ["--model", "resnet50", "--image-size", "224", "--nproc", "8", "--hardware", "dgx-a100-80gb"]
SAME = ("time_to_train_s", "step_time_s", "phases_s", "peak_memory_bytes", "memory_bytes", "limit")

console = Console(highlight=False)


def plan(src: Path, nodes: int, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "scaletrain", "plan", *REQUEST, "--nodes", str(nodes), "--out",
                           str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"})
    if proc.returncode:
        raise SystemExit(f"plan at {src} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out / "plan.json").read_text())


def differences(a: dict, b: dict, top: int = 5) -> int:
    """Candidates the two plans disagree on: ranked by both with any figure in SAME apart, ranked by one and neither
    ranked nor pruned by the other, and one more if their first `top` are not the same ids (a plan prunes what its
    bound says cannot reach its top: one plan may price what the other pruned)."""
    ra, rb = ({c["id"]: c for c in p["ranked"]} for p in (a, b))
    apart = sum(any(ra[k].get(f) != rb[k].get(f) for f in SAME) for k in ra.keys() & rb.keys())
    lost = len((ra.keys() - rb.keys() - set(b["pruned"])) | (rb.keys() - ra.keys() - set(a["pruned"])))
    return apart + lost + ([c["id"] for c in a["ranked"][:top]] != [c["id"] for c in b["ranked"][:top]])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the revision to compare with (a commit, tag or branch)")
    ap.add_argument("--nodes", default="1,4", help="comma list of node counts, 8 A100s each (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each side, alternated (default: %(default)s)")
    args = ap.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(base), args.base], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for nodes in (int(n) for n in args.nodes.split(",")):
                times: dict[str, list[float]] = {"base": [], "this": []}
                plans = {}
                for r in range(args.rounds):
                    sides = [("base", base / "src"), ("this", ROOT / "src")]
                    for name, src in sides if r % 2 == 0 else sides[::-1]:
                        plans[name] = plan(src, nodes, Path(tmp) / f"{name}-{nodes}-{r}")
                        times[name].append(plans[name]["search_s"])
                        console.print(f"{nodes} node(s), round {r + 1}: {name} {times[name][-1]:.1f} s")
                ratios = [b / t for b, t in zip(times["base"], times["this"])]
                diff = differences(plans["base"], plans["this"])
                failed |= diff > 0
                table = Table(title=f"ResNet-50 at 224 px, {nodes} node(s) x 8 A100s: "
                                    f"{plans['this']['candidates']:,} candidates, {plans['this']['priced']:,} priced")
                for col in ("side", "search_s by round", "median"):
                    table.add_column(col)
                for name, label in (("base", args.base), ("this", "this checkout")):
                    table.add_row(label, ", ".join(f"{t:.1f}" for t in times[name]),
                                  f"{statistics.median(times[name]):.1f} s")
                console.print(table)
                spread = (max(ratios) - min(ratios)) / statistics.median(ratios)
                console.print(f"{args.base} / this: median {statistics.median(ratios):.2f}x over {len(ratios)} rounds "
                              f"({', '.join(f'{x:.2f}' for x in ratios)}; spread {spread:.0%}); "
                              f"candidates that differ: {diff}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
