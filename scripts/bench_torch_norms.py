#!/usr/bin/env python3
"""PyTorch's F.layer_norm and F.rms_norm on the shapes of examples/bench/bench_norms.cpp, timed the same
way (CUDA events, 3 warm-ups, then the median of 20 runs queued back to back, each between its own
pair of events, so that Python's launch overhead is not counted), printed beside normtape's figures from the same run.

  python3 scripts/bench_torch_norms.py --ours bench.json [--out compare.json] [--markdown table.md] [--quick]

Forward: y = F.layer_norm(x, [N], weight, bias, 1e-5) (RMSNorm: F.rms_norm(x, [N], weight, 1e-5)).
Backward: torch.autograd.grad(y, (x, weight[, bias]), dy) through the graph of one forward:
dx, dweight and dbias, as normtape's backward. Bytes moved are counted as normtape counts them
(forward 2 M N, backward 3 M N elements), so the ratio ours/theirs is a ratio of times.
PyTorch saves its input, so its one backward stands beside both of normtape's policies.
--markdown writes the table of docs/PERFORMANCE.md: one row per dtype, norm and N.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from torch_timing import time_ms

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def torch_rows(total, cases):
    rows = []
    for dname, dtype in DTYPES.items():
        for N in sorted(n for d, n in cases if d == dname):
            M = total // N
            x = torch.randn(M, N, device="cuda", dtype=dtype, requires_grad=True)
            dy = torch.randn(M, N, device="cuda", dtype=dtype)
            w = (1 + 0.1 * torch.randn(N, device="cuda", dtype=dtype)).requires_grad_()
            b = (0.1 * torch.randn(N, device="cuda", dtype=dtype)).requires_grad_()
            size = M * N * x.element_size()
            for norm in ("layer", "rms"):
                if norm == "layer":
                    fwd = lambda: F.layer_norm(x, (N,), w, b, 1e-5)
                    inputs = (x, w, b)
                else:
                    fwd = lambda: F.rms_norm(x, (N,), w, 1e-5)
                    inputs = (x, w)
                with torch.no_grad():
                    ms = time_ms(fwd, hold=False)
                rows.append({"dtype": dname, "norm": norm, "pass": "forward", "N": N, "M": M, "ms": ms,
                             "gbps": 2 * size / ms / 1e6})
                y = fwd()
                ms = time_ms(lambda: torch.autograd.grad(y, inputs, dy, retain_graph=True), hold=False)
                rows.append({"dtype": dname, "norm": norm, "pass": "backward", "N": N, "M": M, "ms": ms,
                             "gbps": 3 * size / ms / 1e6})
                del y
            del x, dy, w, b
            torch.cuda.empty_cache()
    return rows


def markdown_table(merged):
    """One row per (dtype, norm, N): % of copy forward and backward under the input and output
    policies, the save-output backward's time over the save-input one's, forward and backward under
    the normalized policy (its forward counts x in, x_hat and y out), and ours / PyTorch (for the backward, the slower of input and output)."""
    by = {(r["dtype"], r["norm"], r["N"], r["pass"], r["policy"]): r for r in merged}
    lines = ["| dtype | norm | N | forward % copy | backward input % | backward output % | output / input time "
             "| forward normalized % | backward normalized % "
             "| PyTorch fwd % | PyTorch bwd % | ours / PyTorch fwd | ours / PyTorch bwd |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, norm, N in sorted({(k[0], k[1], k[2]) for k in by}, key=lambda k: (k[0], k[1], k[2])):
        f, bi, bo = by[(dtype, norm, N, "forward", "-")], by[(dtype, norm, N, "backward", "input")], \
            by[(dtype, norm, N, "backward", "output")]
        fn, bn = by[(dtype, norm, N, "forward", "normalized")], by[(dtype, norm, N, "backward", "normalized")]
        lines.append(f"| {dtype} | {norm} | {N} | {f['pct_copy']:.1f} | {bi['pct_copy']:.1f} | {bo['pct_copy']:.1f} "
                     f"| {bo['ms'] / bi['ms']:.3f} | {fn['pct_copy']:.1f} | {bn['pct_copy']:.1f} "
                     f"| {f['torch_pct_copy']:.1f} | {bi['torch_pct_copy']:.1f} "
                     f"| {f['speedup']:.2f} | {min(bi['speedup'], bo['speedup']):.2f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="JSON written by bench_norms --json")
    parser.add_argument("--out", help="write the merged rows as JSON here")
    parser.add_argument("--markdown", help="write the one-row-per-shape table (docs/PERFORMANCE.md) here")
    parser.add_argument("--quick", action="store_true", help="M = 2^20 / N, as bench_norms --quick")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_torch_norms.py: torch sees no CUDA device")
    ours = json.load(open(args.ours))
    cases = {(r["dtype"], r["N"]) for r in ours}
    theirs = {(r["dtype"], r["norm"], r["pass"], r["N"]): r
              for r in torch_rows(1 << (20 if args.quick else 28), cases)}
    copy = {(r["dtype"], r["N"]): r["gbps"] for r in ours if r["pass"] == "copy"}
    merged = []
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; % of the copy bandwidth of the same run")
    print(f"{'dtype':5} {'norm':5} {'pass':8} {'policy':6} {'N':>6} {'ours %':>7} {'torch %':>8} {'ours/torch':>10}")
    for r in ours:
        if r["pass"] == "copy" or "reference" in r["norm"] or "+residual" in r["norm"]:
            continue
        t = theirs[(r["dtype"], r["norm"], r["pass"], r["N"])]
        c = copy[(r["dtype"], r["N"])]
        row = dict(r, torch_ms=t["ms"], torch_pct_copy=100 * t["gbps"] / c, speedup=t["ms"] / r["ms"])
        merged.append(row)
        print(f"{r['dtype']:5} {r['norm']:5} {r['pass']:8} {r['policy']:6} {r['N']:>6} {r['pct_copy']:7.1f} "
              f"{row['torch_pct_copy']:8.1f} {row['speedup']:10.2f}")
    if args.out:
        json.dump(merged, open(args.out, "w"), indent=1)
    if args.markdown:
        open(args.markdown, "w").write(markdown_table(merged))


if __name__ == "__main__":
    main()
