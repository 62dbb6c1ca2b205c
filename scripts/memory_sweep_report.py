#!/usr/bin/env python3
"""The planner against the sweep: train_gpt --memory-sweep's JSON, read for several budgets.

  python3 scripts/memory_sweep_report.py sweep.json [--budgets 2,4,8,16]   (GiB)

For each budget: the planner's pick, by plan_memory's rule (nn/memory/memory_budget.h: the least
predicted step time among the settings whose predicted peak fits, ties to the smaller predicted
peak), with its measured peak and step time; and the fastest setting whose measured peak fits, as
the sweep timed it. Then predict_peak over the grid: the settings measured, the worst ratio of
predicted to measured peak, and any measured peak above its prediction. Markdown on stdout; exit
status 1 when a pick's measured peak exceeds its budget or a measured peak its prediction.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", help="train_gpt --memory-sweep --json output")
    parser.add_argument("--budgets", default="2,4,8,16", help="budgets in GiB, comma-separated (default 2,4,8,16)")
    args = parser.parse_args()
    data = json.load(open(args.sweep))
    rows = data["sweep"]
    gib = 2**30
    failed = False
    print("| budget | planner's pick | its peak (GiB) | its step ms | fastest that fits (sweep) | its step ms | pick / fastest |")
    print("|---|---|---|---|---|---|---|")
    for text in args.budgets.split(","):
        budget = float(text) * gib
        fits = [r for r in rows if r["predicted_peak_bytes"] <= budget]
        measured = [r for r in rows if r["peak_allocated_bytes"] <= budget]
        if not fits:
            least = min(r["predicted_peak_bytes"] for r in rows)
            print(f"| {text} GiB | nothing fits (least predicted peak {least / gib:.2f} GiB) | | | "
                  f"{'nothing' if not measured else min(measured, key=lambda r: r['step_ms'])['label']} | | |")
            continue
        pick = min(fits, key=lambda r: (r["predicted_step_ms"], r["predicted_peak_bytes"]))
        best = min(measured, key=lambda r: r["step_ms"])
        over = pick["peak_allocated_bytes"] > budget
        failed |= over
        print(f"| {text} GiB | {pick['label']} | {pick['peak_allocated_bytes'] / gib:.3f}{' OVER' if over else ''} | "
              f"{pick['step_ms']:.1f} | {best['label']} | {best['step_ms']:.1f} | {pick['step_ms'] / best['step_ms']:.3f} |")
    ratios = [r["predicted_peak_bytes"] / r["peak_allocated_bytes"] for r in rows]
    under = [r for r in rows if r["peak_allocated_bytes"] > r["predicted_peak_bytes"]]
    failed |= bool(under)
    print(f"\npredict_peak over {len(rows)} settings: predicted / measured from {min(ratios):.4f} to {max(ratios):.4f}; "
          f"{len(under)} measured above the prediction" + "".join(f"\n  {r['label']}" for r in under))
    for ref in data.get("references", []):
        print(f"{ref['label']}: step {ref['step_ms']:.1f} ms, peak {ref['peak_allocated_bytes'] / gib:.3f} GiB")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
