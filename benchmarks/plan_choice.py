"""The planner's choice against the best of its candidates measured exhaustively (issue 27's measurement).

For each case, `scaletrain plan ... --validate all`: every ranked candidate runs briefly on this machine (or the
testbed's hosts), interleaved over rounds, and is re-ranked by its time over the chosen one's in the same round
(docs/plan.md). Printed per case: whether the chosen one measured fastest, how far behind the measured best it
was and whether that lead is beyond the rounds' spread, the measured top 3's predicted ranks, Kendall's tau, and
the step-time and ratio errors with their signs. Then over the cases: how often the choice was the best, and
within 5% of it.

Cases: three models on one node of 2 ranks (LeNet-5, ResNet-20, the MLP: overhead-, compute- and
communication-heavy), every strategy the planner searches, batch 32/64, fp32/bf16, compression none/fp16; with
--testbed (root), ResNet-20 on 2 testbed hosts of one rank each at two link rates, batch 64, fp32. About 15-20 min
a case at 3 rounds (ResNet-20's the longest, 42 min).

Usage: .venv/bin/python benchmarks/plan_choice.py [--calibration runs/cal.json] [--only lenet5,...] [--testbed]
       [--rounds 3] [--out DIR]    (make bench-plan)
       .venv/bin/python benchmarks/plan_choice.py --from DIR    (compare an earlier run's cases again)
       .venv/bin/python benchmarks/plan_choice.py --from DIR --repredict --calibration C [--only ...]
           (the stored runs against today's model: each case planned again on C, nothing run)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOCAL = ["--nodes", "1", "--nproc", "2", "--dataset", "digits", "--batch-size", "32,64", "--precision", "fp32,bf16",
         "--workers", "0", "--checkpoint-activations", "none"]
CASES = {
    "lenet5": ["--model", "lenet5", *LOCAL],
    "resnet20": ["--model", "resnet20", *LOCAL],
    "mlp": ["--model", "mlp", *LOCAL],
}
TESTBED = ["--model", "resnet20", "--nproc", "1", "--testbed", "--dataset", "digits", "--batch-size", "64",
           "--precision", "fp32", "--workers", "0", "--checkpoint-activations", "none"]
RATES = ("1gbit", "20mbit")


def scaletrain(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "scaletrain", *args], capture_output=True, text=True)
    if check and proc.returncode:
        raise SystemExit(f"scaletrain {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_case(name: str, flags: list[str], cal: str | None, rounds: int, out: Path) -> dict:
    where = out / name
    t0 = time.monotonic()
    scaletrain("plan", *flags, *(["--calibration", cal] if cal else []), "--time-ops", "off", "--validate", "all",
               "--repeats", str(rounds), "--out", str(where))
    print(f"done: {name} in {time.monotonic() - t0:.0f} s", flush=True)
    return summarise(name, where)


def summarise(name: str, where: Path, predicted: dict | None = None) -> dict:
    """One case's row, its validation compared again from the runs on disk (the comparison as this code makes it);
    `predicted`: another plan of the same request (today's model) whose predictions the runs are held against."""
    from scaletrain.plan.agreement import compare
    from scaletrain.plan.measure import collected

    plan = json.loads((where / "plan.json").read_text())
    runs = collected(where, plan)
    ranked = (predicted or plan)["ranked"]
    top = [c for c in ranked if c["id"] in runs]
    v = {**plan["validation"], **compare(top, runs)}
    rows = {r["id"]: r for r in v["candidates"]}
    strategy = {c["id"]: c["config"]["strategy"] for c in ranked}
    signed: dict[str, list[float]] = {}
    for r in v["candidates"]:
        if r["runs"] and r["ratio_to_chosen"]["error"] is not None and r["id"] != v["candidates"][0]["id"]:
            signed.setdefault(strategy[r["id"]], []).append(r["ratio_to_chosen"]["error"])
    step_errors = [r["errors"]["step_time"] for r in v["candidates"] if r["runs"]]
    # per strategy and phase, the signed error of the phase itself (predicted / measured - 1): where a strategy's
    # own cost is wrong, beside the step's
    phased: dict[str, dict[str, list[float]]] = {}
    for r in v["candidates"]:
        if not r["runs"]:
            continue
        errors, measured = r["errors"]["phases"], r["measured"]["phases_s"]
        compute = measured.get("forward", 0.0) + measured.get("backward", 0.0)
        diff = sum((errors.get(k) or {}).get("difference_s") or 0.0 for k in ("forward", "backward"))
        each = {"forward+backward": diff / compute if compute else None,
                **{k: (errors.get(k) or {}).get("relative") for k in ("comm_exposed", "optimizer")}}
        for k, e in each.items():
            if e is not None:
                phased.setdefault(strategy[r["id"]], {}).setdefault(k, []).append(e)
    auto = after_auto(ranked, rows, v, plan["basis"])
    return {"case": name, "candidates": len(plan["ranked"]), "chosen": plan["chosen"], "best": v["best"], **auto,
            "chosen_is_best": v["chosen_is_best"], "behind": v["chosen_behind_best"],
            "beyond": v["best_by_beyond_spread"], "best_spread": rows[v["best"]]["ratio_to_chosen"]["spread"],
            "tau": v["kendall_tau"], "top3": v["top3_predicted_ranks"],
            "step_median": v["summary"]["median_abs_error"], "step_over": v["summary"]["over"],
            "step_under": v["summary"]["under"], "ratio_median": v["ratio_summary"]["median_abs_error"],
            "ratio_p90": v["ratio_summary"]["p90_abs_error"], "ratio_over": v["ratio_summary"]["over"],
            "ratio_under": v["ratio_summary"]["under"], "failed": len(v["failed"]),
            "step_errors": step_errors, "dir": str(where),
            "by_strategy": {k: {"median": statistics.median(e), "n": len(e)} for k, e in sorted(signed.items())},
            "by_phase": {k: {ph: statistics.median(e) for ph, e in v.items()} for k, v in sorted(phased.items())}}


def after_auto(ranked: list[dict], rows: dict[str, dict], v: dict, basis: str) -> dict:
    """What `plan --validate auto` would have run, from the same measurements: the candidates priced within the
    model's band of the chosen one (plan/certainty.py), the measured fastest of them where its lead over the chosen
    one exceeds the two's spread over rounds (else the chosen one, as train --plan decides: plan/chosen.py), and how
    far that one stands behind the measured best of all."""
    from scaletrain.plan.certainty import uncertain

    n = uncertain(ranked, basis)["count"]
    band = [rows[c["id"]] for c in ranked[:n] if c["id"] in rows and rows[c["id"]]["runs"]
            and rows[c["id"]]["ratio_to_chosen"]["measured"] is not None]
    best = rows.get(v["best"]) if v["best"] else None
    if not band or best is None or best["ratio_to_chosen"]["measured"] is None:
        return {"auto_k": n, "auto_pick": None, "auto_behind": None}
    pick = min(band, key=lambda r: r["ratio_to_chosen"]["measured"])
    lead, spread = 1 / pick["ratio_to_chosen"]["measured"] - 1, pick["ratio_to_chosen"]["spread"]
    if pick is not band[0] and band[0]["id"] == ranked[0]["id"] and (spread is None or lead <= spread):
        pick = band[0]  # a lead the rounds cannot tell from noise keeps the model's choice
    return {"auto_k": n, "auto_pick": pick["predicted_rank"],
            "auto_behind": pick["ratio_to_chosen"]["measured"] / best["ratio_to_chosen"]["measured"] - 1}


def repredict(name: str, where: Path, cal: str, out: Path) -> dict:
    """The case's stored runs against today's model: the same request planned again (no runs) into `out`."""
    old = json.loads((where / "plan.json").read_text())
    req = old["request"]
    flags = CASES.get(name)
    if flags is None:  # a testbed case: the testbed must be up at its rate (testbed up --rate ...)
        flags = TESTBED
    scaletrain("plan", *flags, "--calibration", cal, "--time-ops", "off", "--no-prune", "--out", str(out / name))
    new = json.loads((out / name / "plan.json").read_text())
    if {k: v for k, v in new["request"].items() if k != "priced_top"} != \
            {k: v for k, v in req.items() if k != "priced_top"}:
        raise SystemExit(f"{name}: the case's request changed since its runs ({req} -> {new['request']})")
    return summarise(name, where, new)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(results: list[dict]) -> None:
    print(f"\n{'case':18} {'cands':>5} {'chosen best':>11} {'behind best':>11} {'beyond spread':>13} "
          f"{'top3 (pred. #)':>15} {'tau':>6} {'step |err| med':>14} {'over/under':>10} {'ratio |err| med/p90':>20} "
          f"{'over/under':>10} {'failed':>6}")
    for r in results:
        print(f"{r['case']:18} {r['candidates']:>5} {str(r['chosen_is_best']):>11} {pct(r['behind']):>11} "
              f"{str(r['beyond']) + ' (' + pct(r['best_spread']) + ')':>13} {','.join(map(str, r['top3'])):>15} "
              f"{'-' if r['tau'] is None else format(r['tau'], '+.2f'):>6} {pct(r['step_median']):>14} {str(r['step_over']) + '/' + str(r['step_under']):>10} "
              f"{pct(r['ratio_median']) + ' / ' + pct(r['ratio_p90']):>20} "
              f"{str(r['ratio_over']) + '/' + str(r['ratio_under']):>10} "
              f"{r['failed']:>6}")
    print("\nsigned ratio errors to the chosen one, median per strategy (predicted / measured - 1; n):")
    for r in results:
        parts = [f"{k} {100 * v['median']:+.1f}% ({v['n']})" for k, v in r.get("by_strategy", {}).items()]
        print(f"  {r['case']:18} " + ", ".join(parts))
    print("\nsigned error of each phase, median per strategy (predicted / measured - 1):")
    for r in results:
        for k, phases in r.get("by_phase", {}).items():
            print(f"  {r['case']:18} {k:10} " + ", ".join(f"{ph} {100 * e:+.0f}%" for ph, e in phases.items()))
    print("\nwith --validate auto (the candidates priced within the model's band of the chosen one measured, the "
          "fastest run):")
    for r in results:
        print(f"  {r['case']:18} top {r['auto_k']} measured: runs #{r['auto_pick']}, "
              f"{pct(r['auto_behind'])} behind the measured best")
    auto_close = sum(1 for r in results if r["auto_behind"] is not None and r["auto_behind"] <= 0.05)
    print(f"  within 5% of the measured best in {auto_close} of {len(results)}")
    best = sum(1 for r in results if r["chosen_is_best"])
    close = sum(1 for r in results if r["chosen_is_best"] or (r["behind"] is not None and r["behind"] <= 0.05))
    print(f"\nthe chosen configuration measured fastest in {best} of {len(results)} cases, within 5% of the measured "
          f"best in {close} of {len(results)}; median chosen-behind-best "
          f"{pct(statistics.median([r['behind'] or 0.0 for r in results]))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", help="a calibration file of this machine (default: its cached one, which "
                                          "predict makes with --quick the first time)")
    ap.add_argument("--only", default=None, help="a comma list of cases (default: every local one)")
    ap.add_argument("--testbed", action="store_true", help="also the testbed cases (root; 2 hosts, two link rates)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every candidate (default 3)")
    ap.add_argument("--out", default=None, help="where the plans and their runs go (default: a temporary folder)")
    ap.add_argument("--from", dest="again", default=None, metavar="DIR",
                    help="run nothing: compare again the cases an earlier run left in DIR")
    ap.add_argument("--repredict", action="store_true",
                    help="with --from and --calibration (the one the runs were planned on): hold the stored runs "
                         "against today's model, each case planned again (a testbed case needs its testbed up)")
    args = ap.parse_args()
    if args.again:
        cases = sorted(p.parent for p in Path(args.again).glob("*/plan.json"))
        if args.only is not None:
            cases = [p for p in cases if p.name in args.only.split(",")]
        if args.repredict:
            if not args.calibration:
                raise SystemExit("--repredict needs --calibration: the calibration the stored runs were planned on")
            out = Path(args.out or tempfile.mkdtemp(prefix="plan-repredict-"))
            table([repredict(p.name, p, args.calibration, out) for p in cases])
            return 0
        table([summarise(p.name, p) for p in cases])
        return 0
    out = Path(args.out or tempfile.mkdtemp(prefix="plan-choice-"))
    out.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only is not None else list(CASES)
    results = [run_case(n, CASES[n], args.calibration, args.rounds, out) for n in names if n in CASES]
    if args.testbed:
        for rate in RATES:
            scaletrain("testbed", "up", "--hosts", "2", "--rate", rate)  # refused if one is up: not ours to touch
            try:
                results.append(run_case(f"testbed-{rate}", TESTBED, args.calibration, args.rounds, out))
            finally:
                scaletrain("testbed", "down", check=False)
    (out / "plan_choice.json").write_text(json.dumps(results, indent=1))
    table(results)
    print(f"\nplans and runs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
