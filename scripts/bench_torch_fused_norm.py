#!/usr/bin/env python3
"""The fused add + norm (layer_norm_fn, rms_norm_fn with a residual) beside PyTorch eager's and
torch.compile's s = x + residual; y = F.layer_norm(s) (or F.rms_norm), forward and backward, timed as
examples/bench/bench_norms.cpp times ours (CUDA events, 3 warm-ups, then the median of 20 runs queued
back to back, each between its own pair of events; PyTorch's behind a wait on the GPU: GPU time, not
the host's).

  python3 scripts/bench_torch_fused_norm.py --ours bench.json [--out compare.json] [--markdown table.md]

--ours: bench_norms --rows M --json of the same GPU and run, whose "+residual" rows (forward: x and
the residual in, s and y out; backward under Input: dy, s and s's gradient in, dx out, with dweight
and dbias) and copy rows are read. PyTorch's forward returns y and s with autograd recording (its
forward saves what its backward needs); its backward is torch.autograd.grad of (y, s) with the
gradients (dy, ds) for x, the residual, the weight and the bias. torch.compile compiles the function
for each case afresh (dynamic=False, dynamo reset first) in the first warm-up. forward + backward is the sum of the two medians
for each; % copy counts the bytes ours must move (4 M N elements a pass) against the copy's bandwidth.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from torch_timing import time_ms

DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}


def add_norm(norm, N):
    """s = x + residual and the norm of s, returned as (y, s)."""
    if norm == "layer":
        def f(x, r, w, b):
            s = x + r
            return F.layer_norm(s, (N,), w, b, 1e-5), s
    else:
        def f(x, r, w, b):
            s = x + r
            return F.rms_norm(s, (N,), w, 1e-5), s
    return f


def torch_times(dtype, norm, M, N, compiled):
    """(forward ms, backward ms) of eager PyTorch or torch.compile."""
    o = {"device": "cuda", "dtype": dtype}
    x = torch.randn(M, N, **o, requires_grad=True)
    r = torch.randn(M, N, **o, requires_grad=True)
    w = (1 + 0.1 * torch.randn(N, **o)).requires_grad_()
    b = (0.1 * torch.randn(N, **o)).requires_grad_()
    dy, ds = torch.randn(M, N, **o), torch.randn(M, N, **o)
    inputs = (x, r, w, b) if norm == "layer" else (x, r, w)
    f = add_norm(norm, N)
    if compiled:
        torch._dynamo.reset()  # one code object for every case: dynamo's recompile limit would fall back to eager
        f = torch.compile(f, dynamic=False)
    forward_ms = time_ms(lambda: f(x, r, w, b))
    y, s = f(x, r, w, b)
    backward_ms = time_ms(lambda: torch.autograd.grad((y, s), inputs, (dy, ds), retain_graph=True))
    return forward_ms, backward_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", required=True, help="JSON written by bench_norms --rows M --json")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--markdown", help="write the table of docs/PERFORMANCE.md here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_torch_fused_norm.py: torch sees no CUDA device")
    ours = json.load(open(args.ours))
    by = {(r["dtype"], r["norm"], r["pass"], r["N"]): r for r in ours}
    rows = []
    for (dtype, norm_name, pass_, N), forward in sorted(by.items()):
        if not norm_name.endswith(" +residual") or pass_ != "forward":
            continue
        norm = norm_name.split()[0]
        backward = by[(dtype, norm_name, "backward", N)]
        copy = by[(dtype, "-", "copy", N)]
        M = forward["M"]
        eager = torch_times(DTYPES[dtype], norm, M, N, compiled=False)
        compiled = torch_times(DTYPES[dtype], norm, M, N, compiled=True)
        torch.cuda.empty_cache()
        ours_ms = forward["ms"] + backward["ms"]
        bytes_moved = 8 * M * N * (2 if dtype == "bf16" else 4)  # 4 M N elements a pass, two passes
        rows.append({"dtype": dtype, "norm": norm, "N": N, "M": M, "ours_forward_ms": forward["ms"],
                     "ours_backward_ms": backward["ms"], "ours_ms": ours_ms,
                     "ours_pct_copy": 100 * bytes_moved / ours_ms / 1e6 / copy["gbps"],
                     "eager_ms": sum(eager), "compile_forward_ms": compiled[0], "compile_backward_ms": compiled[1],
                     "compile_ms": sum(compiled)})
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; forward + backward, ms")
    print(f"{'dtype':5} {'norm':5} {'N':>6} {'M':>6} {'ours':>8} {'% copy':>7} {'eager':>8} {'compile':>8} "
          f"{'ours/compile':>12}")
    for r in rows:
        print(f"{r['dtype']:5} {r['norm']:5} {r['N']:>6} {r['M']:>6} {r['ours_ms']:8.4f} {r['ours_pct_copy']:7.1f} "
              f"{r['eager_ms']:8.4f} {r['compile_ms']:8.4f} {r['ours_ms'] / r['compile_ms']:12.3f}")
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)
    if args.markdown:
        lines = ["| dtype | norm | N | M | ours fwd + bwd ms | % copy | eager ms | compile fwd + bwd ms | ours / compile |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['dtype']} | {r['norm']} | {r['N']} | {r['M']} | {r['ours_forward_ms']:.4f} + "
                         f"{r['ours_backward_ms']:.4f} | {r['ours_pct_copy']:.1f} | {r['eager_ms']:.4f} "
                         f"| {r['compile_forward_ms']:.4f} + {r['compile_backward_ms']:.4f} "
                         f"| {r['ours_ms'] / r['compile_ms']:.3f} |")
        open(args.markdown, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
