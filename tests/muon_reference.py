#!/usr/bin/python3
"""tests/muon_reference.py: the PyTorch side of tests/test_muon_api.cpp's cross-check of Muon.

Runs Muon as KellerJordan/Muon describes it (https://github.com/KellerJordan/Muon; nn/optim/muon.h),
written here with torch ops, over parameters and per-step gradients that normtape wrote, and
writes the parameters after every step. For each matrix parameter p [rows, cols] with gradient g:

    buf.lerp_(g, 1 - momentum)                         buf = momentum buf + (1 - momentum) g
    update = g.lerp(buf, momentum) if nesterov else buf
    update = newton_schulz(update, ns_steps)           in --ns-dtype (f32, or bf16 as the reference on a GPU)
    update *= max(1, rows / cols) ** 0.5
    p.mul_(1 - lr * weight_decay); p.add_(update, alpha=-lr)

newton_schulz: X = G / (||G||_F + 1e-7), transposed when rows > cols; ns_steps times
A = X X^T, B = b A + c A A, X = a X + B X, (a, b, c) = (3.4445, -4.7750, 2.0315); transposed back.
The parameter and the buffer are kept in f32 (normtape keeps a bf16 parameter's f32 master copy
and updates that, so a bf16 parameter is read into f32 once and its f32 value is what is written).

Where the interpreter's torch has torch.optim.Muon (torch >= 2.9), the same steps also run
through it on f32 copies of the parameters (it orthogonalizes in bf16 whatever the dtype, and
divides by max(||G||_F, eps) rather than ||G||_F + eps).

Files are safetensors, read and written by tests/torch_reference.py's functions.
    --in:  "param.<name>" [rows, cols] f32 or bf16; "grad<k>.<name>", k = 1 .. --steps, same shape
    --out: "step<k>.<name>" f32, the parameter after step k; "buf.<name>" f32, the momentum buffer
           after the last step; with torch.optim.Muon also "optim.step<k>.<name>" f32.

Usage:
    /usr/bin/python3 tests/muon_reference.py --in in.safetensors --out out.safetensors --steps 3
        [--lr 0.02] [--momentum 0.95] [--no-nesterov] [--weight-decay 0] [--ns-steps 5]
        [--ns-dtype f32|bf16] [--device cpu|cuda]
Exits with status 1 and a message on stderr on any error.
"""

import argparse
import sys

import torch

from torch_reference import ScriptError, load_safetensors, save_safetensors

NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315
NS_EPS = 1e-7
NS_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def newton_schulz(g, steps, dtype):
    """The approximate orthogonalization of g [rows, cols], iterated in `dtype`; returned in f32."""
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + NS_EPS)
    for _ in range(steps):
        gram = x @ x.T
        poly = NS_B * gram + NS_C * (gram @ gram)
        x = NS_A * x + poly @ x
    if tall:
        x = x.T
    return x.float()


def muon_step(p, buf, g, args):
    """One step of Muon on the f32 parameter p and buffer buf, in place."""
    buf.lerp_(g, 1 - args.momentum)
    update = g.lerp(buf, args.momentum) if args.nesterov else buf
    update = newton_schulz(update, args.ns_steps, NS_DTYPES[args.ns_dtype])
    rows, cols = p.shape
    update = update * max(1, rows / cols) ** 0.5
    p.mul_(1 - args.lr * args.weight_decay)
    p.add_(update, alpha=-args.lr)


def read_inputs(path, steps):
    """{name: initial parameter} and [{name: gradient} per step], checked."""
    tensors = load_safetensors(path)
    params = {key[len("param."):]: t for key, t in tensors.items() if key.startswith("param.")}
    if not params:
        raise ScriptError(f"{path}: no param.<name> tensor")
    grads = []
    for k in range(1, steps + 1):
        step = {}
        for name, p in params.items():
            g = tensors.get(f"grad{k}.{name}")
            if g is None:
                raise ScriptError(f"{path}: missing grad{k}.{name}")
            if p.dim() != 2 or g.shape != p.shape:
                raise ScriptError(f"{path}: {name} expected a matrix and a gradient of its shape, "
                                  f"got {list(p.shape)} and {list(g.shape)}")
            step[name] = g
        grads.append(step)
    return params, grads


def main():
    parser = argparse.ArgumentParser(description="PyTorch reference steps of Muon (KellerJordan/Muon).")
    parser.add_argument("--in", dest="inp", required=True, help='safetensors with "param.<name>", "grad<k>.<name>"')
    parser.add_argument("--out", required=True, help='safetensors to write: "step<k>.<name>", "buf.<name>"')
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.95)
    parser.add_argument("--no-nesterov", dest="nesterov", action="store_false")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--ns-steps", type=int, default=5)
    parser.add_argument("--ns-dtype", choices=sorted(NS_DTYPES), default="f32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the steps run there; files stay on the host)")
    args = parser.parse_args()
    if args.steps < 1:
        raise ScriptError(f"--steps expected >= 1, got {args.steps}")
    if args.device != "cpu" and not torch.cuda.is_available():
        raise ScriptError(f"--device {args.device}: torch sees no CUDA device")

    torch.set_num_threads(1)
    params, grads = read_inputs(args.inp, args.steps)
    out = {}
    with torch.no_grad():
        work = {name: p.to(args.device).float().clone() for name, p in params.items()}
        bufs = {name: torch.zeros_like(p) for name, p in work.items()}
        for k, step in enumerate(grads, start=1):
            for name, p in work.items():
                muon_step(p, bufs[name], step[name].to(args.device).float(), args)
                out[f"step{k}.{name}"] = p.clone()
        for name, b in bufs.items():
            out[f"buf.{name}"] = b

    if hasattr(torch.optim, "Muon"):
        leaves = {name: p.to(args.device).float().clone().requires_grad_(True) for name, p in params.items()}
        optimizer = torch.optim.Muon(list(leaves.values()), lr=args.lr, weight_decay=args.weight_decay,
                                     momentum=args.momentum, nesterov=args.nesterov, ns_steps=args.ns_steps)
        for k, step in enumerate(grads, start=1):
            for name, p in leaves.items():
                p.grad = step[name].to(args.device).float()
            optimizer.step()
            for name, p in leaves.items():
                out[f"optim.step{k}.{name}"] = p.detach().clone()
    save_safetensors(args.out, out)


if __name__ == "__main__":
    try:
        main()
    except ScriptError as e:
        print(f"muon_reference.py: error: {e}", file=sys.stderr)
        sys.exit(1)
