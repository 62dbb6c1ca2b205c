#!/usr/bin/env python3
"""scripts/compare_runs.py: train_gpt's runs by this tree ("gpu") beside a baseline build's, from the
JSON files that `scripts/gpu_check.sh baseline` writes into DIR: preset_{tree}_{k}.json (the
gpt2-medium-ish preset's step) and dropout_{tree}_{k}.json (bf16 with --dropout 0.1), k = 1, 2, 3.

Prints, as markdown, per policy: each tree's median step (ms; the median of its runs' medians) and
their ratio, the peak allocated bytes, the saved activation bytes and what of them the dropout op
holds (a mask would show there), and the largest difference between the two trees' loss curves,
run k against run k, beside each tree's own between its runs (what the GPU's nondeterminism alone
gives; n/a with one run). Both trees must have the same number of runs.

  scripts/compare_runs.py DIR
"""
import json
import statistics
import sys
from pathlib import Path


def load(directory, kind, tree):
    runs = []
    for path in sorted(directory.glob(f"{kind}_{tree}_*.json")):
        runs.append({r["policy"]: r for r in json.loads(path.read_text())["runs"]})
    return runs


def curve_gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def within(runs):
    gaps = [curve_gap(runs[0]["losses"], r["losses"]) for r in runs[1:]]
    return f"{max(gaps):.3g}" if gaps else "n/a"


def table(directory, kind):
    base, ours = load(directory, kind, "baseline"), load(directory, kind, "gpu")
    if not base or not ours:
        return f"{kind}: no runs of both trees in {directory}\n"
    if len(base) != len(ours):
        sys.exit(f"compare_runs: {kind}: {len(base)} baseline runs against {len(ours)} of this tree")
    lines = [f"### {kind}: {len(ours)} runs of each tree, alternated", "",
             "| policy | step ms baseline | step ms this tree | ratio | peak MiB baseline | peak MiB this tree "
             "| saved MiB baseline | saved MiB this tree | dropout's saved bytes | loss gap between trees "
             "| loss gap within baseline | within this tree |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for policy in ours[0]:
        b = [run[policy] for run in base]
        o = [run[policy] for run in ours]
        step_b = statistics.median(r["step_ms_median"] for r in b)
        step_o = statistics.median(r["step_ms_median"] for r in o)
        mib = lambda runs, key: max(r[key] for r in runs) / 2**20  # noqa: E731
        dropout = max(sum(bytes for op, bytes in r["saved_tensors_report"]["bytes_by_op"].items()
                          if "dropout" in op.lower()) for r in b + o)
        between = max(curve_gap(x["losses"], y["losses"]) for x, y in zip(b, o))
        lines.append(f"| {policy} | {step_b:.2f} | {step_o:.2f} | {step_o / step_b:.3f} "
                     f"| {mib(b, 'peak_allocated_bytes'):.1f} | {mib(o, 'peak_allocated_bytes'):.1f} "
                     f"| {mib(b, 'saved_activation_bytes'):.1f} | {mib(o, 'saved_activation_bytes'):.1f} "
                     f"| {dropout} | {between:.3g} | {within(b)} | {within(o)} |")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    directory = Path(sys.argv[1])
    print(table(directory, "preset"))
    print(table(directory, "dropout"))


if __name__ == "__main__":
    main()
