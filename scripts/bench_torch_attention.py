#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on bench_attention's shapes, timed the same way, beside ours.

  python3 scripts/bench_torch_attention.py [--ours attention.json] [--out torch_attention.json]
                                           [--markdown attention.md] [--shapes B,NH,T,hs ...]
                                           [--warmup 3] [--repeat 20]

For each shape (B, NH, T, hs), C = NH * hs, in bf16 on the GPU: qkv [B, T, 3C] N(0, 1) requiring grad,
and q, k, v the views of it that normtape's causal_self_attention reads (q = qkv[..., :C], k the
next C columns, v the last C, each viewed [B, T, NH, hs].transpose(1, 2)), taken as nanoGPT does,
with qkv.split(C, dim=2). Then
  y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
under torch.nn.attention.sdpa_kernel for each backend: default (no context: PyTorch's choice),
FLASH_ATTENTION, CUDNN_ATTENTION. A backend that cannot run the shape is skipped with its reason.
Timed (CUDA events, --warmup runs, then the median of --repeat runs queued back to back behind a
wait on the GPU, each between its own pair of events, so that Python's launch overhead is not counted):
  fwd          y with grad enabled (as in training), the graph dropped after
  fwd+bwd      y, then torch.autograd.grad(y, qkv, dy): dqkv, the packed gradient normtape's op
               returns (split's backward joins dq, dk, dv into it, as the engine's copy into
               qkv.grad does for ours)
  kernels      y, then torch.autograd.grad(y, (q, k, v), dy): the attention kernels alone
FLOPs count the causal half (forward 4 B NH T^2 hs / 2, fwd+bwd 3.5 times that), as bench_attention.
Memory: saved bytes, the unique storages the graph of one forward saves, without qkv's (ours does
not count qkv either: a leaf that requires grad); peak bytes over the base during one fwd+bwd.
--ours FILE: bench_attention --json output; its shapes are used, and the table printed (and
written by --markdown) puts each of our backends (cuDNN, our kernels) beside each of PyTorch's, with
ours / flash, ours / cudnn and ours / default (fwd+bwd times: below 1 is faster).
"""
import argparse
import contextlib
import json
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import time_ms

DEFAULT_SHAPES = [(16, 16, 1024, 64), (8, 16, 2048, 64), (4, 16, 4096, 64), (16, 8, 1024, 128)]
BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def parse_shape(text):
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected B,NH,T,hs as four positive integers, got {text!r}")
    return shape


def forward_flops(B, NH, T, hs):
    return 4.0 * B * NH * T * T * hs / 2


def views(qkv, NH):
    """q, k, v [B, NH, T, hs] as views of qkv [B, T, 3C], the columns causal_self_attention reads."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    return [t.view(B, T, NH, C // NH).transpose(1, 2) for t in qkv.split(C, dim=2)]


def attention(q, k, v):
    B, NH, T, hs = q.shape
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, NH * hs)


def default_choice(q, k, v):
    """The backend PyTorch picks with no context, by name, or '?' when this torch cannot say."""
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, True))
        for name, member in SDPBackend.__members__.items():
            if int(member) == choice:
                return name
    except Exception:  # a private function: absent or changed in some versions
        pass
    return "?"


def saved_bytes(fn, exclude):
    """Bytes of the unique storages that the graph of fn() saves, other than `exclude`'s."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() != exclude.untyped_storage().data_ptr():
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn()
    del y
    return sum(storages.values())


def bench_backend(backend, shape, warmup, repeats):
    B, NH, T, hs = shape
    C = NH * hs
    qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(B, T, C, device="cuda", dtype=torch.bfloat16)

    def fwd():
        return attention(*views(qkv, NH))

    def fwd_bwd():
        return torch.autograd.grad(attention(*views(qkv, NH)), qkv, dy)

    def kernels():
        q, k, v = views(qkv, NH)
        return torch.autograd.grad(attention(q, k, v), (q, k, v), dy)

    row = {"backend": backend, "B": B, "NH": NH, "T": T, "hs": hs, "C": C}
    context = sdpa_kernel(BACKENDS[backend]) if BACKENDS[backend] is not None else contextlib.nullcontext()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with context:
                if backend == "default":
                    row["picks"] = default_choice(*views(qkv, NH))
                row["fwd_ms"] = time_ms(fwd, warmup, repeats)
                row["fwd_bwd_ms"] = time_ms(fwd_bwd, warmup, repeats)
                row["kernels_ms"] = time_ms(kernels, warmup, repeats)
                row["saved_bytes"] = saved_bytes(fwd, qkv)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                fwd_bwd()
                torch.cuda.synchronize()
                row["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        except RuntimeError as e:  # no kernel of this backend takes the shape (or out of memory)
            reasons = list(dict.fromkeys(str(w.message).strip().splitlines()[0] for w in caught))
            row["skipped"] = "; ".join([str(e).strip().splitlines()[0]] + reasons)[:400]
            for k in ("fwd_ms", "fwd_bwd_ms", "kernels_ms", "saved_bytes"):
                row.pop(k, None)
            return row
    f = forward_flops(B, NH, T, hs)
    row["fwd_tflops"] = f / (row["fwd_ms"] * 1e-3) / 1e12
    row["fwd_bwd_tflops"] = 3.5 * f / (row["fwd_bwd_ms"] * 1e-3) / 1e12
    return row


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def markdown_table(ours, theirs):
    """One row per shape and backend of ours: its times, each PyTorch backend's fwd+bwd, and ours / flash,
    ours / cudnn and ours / default (fwd+bwd)."""
    by = {(r["backend"], r["B"], r["NH"], r["T"], r["hs"]): r for r in theirs}
    lines = ["| B, NH, T, hs | ours | ours fwd ms | ours fwd+bwd ms | ours fwd+bwd TFLOP/s | default fwd+bwd ms "
             "| flash fwd+bwd ms | cudnn fwd+bwd ms | ours / flash | ours / cudnn | ours / default "
             "| saved MiB ours / flash |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in ours:
        key = (o["B"], o["NH"], o["T"], o["hs"])
        t = {b: by.get((b,) + key, {}) for b in BACKENDS}

        def ratio(backend):
            return o["fwd_bwd_ms"] / t[backend]["fwd_bwd_ms"] if "fwd_bwd_ms" in t[backend] else None

        mib = lambda r: fmt(r.get("saved_bytes") / 2**20 if "saved_bytes" in r else None, ".1f")
        default = fmt(t["default"].get("fwd_bwd_ms"), ".3f")
        if "picks" in t["default"]:
            default += f" ({t['default']['picks']})"
        lines.append(f"| {', '.join(map(str, key))} | {o.get('backend', 'kernels')} | {o['fwd_ms']:.3f} "
                     f"| {o['fwd_bwd_ms']:.3f} | {o['fwd_bwd_tflops']:.0f} | {default} "
                     f"| {fmt(t['flash'].get('fwd_bwd_ms'), '.3f')} | {fmt(t['cudnn'].get('fwd_bwd_ms'), '.3f')} "
                     f"| {fmt(ratio('flash'), '.2f')} | {fmt(ratio('cudnn'), '.2f')} | {fmt(ratio('default'), '.2f')} "
                     f"| {mib(o)} / {mib(t['flash'])} |")
    notes = [f"- {r['backend']} skipped at {r['B']}, {r['NH']}, {r['T']}, {r['hs']}: {r['skipped']}"
             for r in theirs if "skipped" in r]
    return "\n".join(lines + notes) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ours", help="JSON written by bench_attention --json (its shapes are used)")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, help="B,NH,T,hs ... (without --ours)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before the timed ones (default 3)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs, median reported (default 20)")
    parser.add_argument("--out", help="write PyTorch's rows (and ours, with --ours) as JSON here")
    parser.add_argument("--markdown", help="write the side-by-side table here (needs --ours)")
    args = parser.parse_args()
    if args.markdown and not args.ours:
        parser.error("--markdown needs --ours")
    if args.ours and args.shapes:
        parser.error("--ours gives the shapes: leave out --shapes")
    if args.warmup < 0 or args.repeat < 1:
        parser.error(f"expected --warmup >= 0 and --repeat >= 1, got {args.warmup} and {args.repeat}")
    if not torch.cuda.is_available():
        sys.exit("bench_torch_attention.py: torch sees no CUDA device")
    ours = json.load(open(args.ours))["rows"] if args.ours else []
    shapes = list(dict.fromkeys((r["B"], r["NH"], r["T"], r["hs"]) for r in ours)) or args.shapes or DEFAULT_SHAPES
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, median of {args.repeat} CUDA-event "
          f"timings after {args.warmup} warm-ups")
    print(f"{'B':>3} {'NH':>3} {'T':>5} {'hs':>4} {'backend':8} {'fwd ms':>8} {'fwd+bwd ms':>10} {'kernels ms':>10} "
          f"{'fwd+bwd TF/s':>12} {'saved MiB':>9} {'peak MiB':>9}")
    theirs = []
    for shape in shapes:
        for backend in BACKENDS:
            r = bench_backend(backend, shape, args.warmup, args.repeat)
            theirs.append(r)
            head = f"{shape[0]:>3} {shape[1]:>3} {shape[2]:>5} {shape[3]:>4} {backend:8}"
            if "skipped" in r:
                print(f"{head} skipped: {r['skipped']}")
                continue
            picks = f"  (picks {r['picks']})" if "picks" in r else ""
            print(f"{head} {r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:10.3f} {r['kernels_ms']:10.3f} "
                  f"{r['fwd_bwd_tflops']:12.0f} {r['saved_bytes'] / 2**20:9.1f} {r['peak_bytes'] / 2**20:9.1f}{picks}")
            torch.cuda.empty_cache()
    if ours:
        table = markdown_table(ours, theirs)
        print()
        print(table, end="")
        if args.markdown:
            open(args.markdown, "w").write(table)
    if args.out:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "torch_rows": theirs,
                   "ours": ours}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
