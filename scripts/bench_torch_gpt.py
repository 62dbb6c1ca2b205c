#!/usr/bin/env python3
"""PyTorch's training step (eager, or with --compile torch.compile's) for normtape's GPT (nn/model/gpt.h), timed per phase, beside train_gpt's figures.

  python3 scripts/bench_torch_gpt.py [--ours medium.json] [--json torch_gpt.json] [--steps 10] [--compile]
                                     [--batch 16] [--seq 1024] [--layers 12] [--heads 16] [--embd 1024]
                                     [--vocab 32768] [--norm layer|rms] [--lr 3e-3] [--seed 1337]

The model of nn/model/gpt.cpp in pure bf16 parameters on the GPU (defaults: train_gpt's gpt2-medium-ish
preset). Dimensions: B batch, T sequence, C width, NH heads, hs = C / NH, L layers, V vocabulary.
    x = wte[idx] + wpe[0..T-1]                                     [B, T, C]
    each block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))        pre-LN
      attn: c_attn Linear(C, 3C) -> q, k, v = split(C) viewed [B, NH, T, hs]
            -> F.scaled_dot_product_attention(is_causal=True) (PyTorch's default backend) -> c_proj Linear(C, C)
      mlp:  c_fc Linear(C, 4C) -> F.gelu(approximate="tanh") -> c_proj Linear(4C, C)
    logits = lm_head(ln_f(x))                                      [B, T, V]; lm_head has no bias, not tied
    loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))   mean over B*T
Norms F.layer_norm (or F.rms_norm), eps 1e-5. Initialization as GPT(): N(0, 0.02), the two c_proj
N(0, 0.02 / sqrt(2L)), biases 0, norm weights 1. Random tokens in [0, V), drawn before the run.
A step is train_gpt's: forward (the loss), backward (loss.backward()), optimizer
(clip_grad_norm_(1.0), torch.optim.AdamW(fused=True) with train_gpt's settings: betas (0.9, 0.95),
eps 1e-8, weight decay 0.1 for matrices and 0 otherwise, its learning-rate schedule, then
zero_grad(set_to_none=False): the gradients' memory is kept from step to step). AdamW's moments
are bf16 here (PyTorch keeps them in the parameters' dtype); normtape keeps f32 moments and an f32
master copy of each bf16 parameter.
Each phase is timed with CUDA events on the current stream, read after the step; after 2 warm-up
steps, the medians over --steps steps are reported. Memory per step: reset_peak_memory_stats() right
before the forward, then max_memory_allocated() - memory_allocated() (the base: parameters,
gradients, optimizer state) after the backward: the peak over the base during forward+backward;
and the peak over the whole step, max_memory_allocated(), to set beside train_gpt's
peak_allocated_bytes (reset at its step's start).
--ours FILE: train_gpt --json output (e.g. of --preset gpt2-medium-ish); its config is the default
for the model's flags, and each of its runs is printed beside PyTorch's (ratio ours / torch: below 1
is faster or smaller).
--compile: the loss function through torch.compile (default mode: Inductor's fused kernels and its
own choice of what to save); the warm-up steps include the compilation.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

PRESET = {"batch": 16, "seq": 1024, "layers": 12, "heads": 16, "embd": 1024, "vocab": 32768, "norm": "layer",
          "lr": 3e-3}
WARMUP_STEPS = 2


def make_params(V, T, C, L, norm, device):
    """{name: bf16 leaf} under nn/model/gpt.cpp's names, initialized as GPT()."""
    g = {}

    def normal(shape, std):
        return torch.randn(shape, device=device) * std

    residual = 0.02 / math.sqrt(2 * L)
    g["wte.weight"] = normal((V, C), 0.02)
    g["wpe.weight"] = normal((T, C), 0.02)
    for i in range(L):
        h = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            g[h + ln + ".weight"] = torch.ones(C, device=device)
            if norm == "layer":
                g[h + ln + ".bias"] = torch.zeros(C, device=device)
        for name, fan_in, fan_out, std in (("attn.c_attn", C, 3 * C, 0.02), ("attn.c_proj", C, C, residual),
                                           ("mlp.c_fc", C, 4 * C, 0.02), ("mlp.c_proj", 4 * C, C, residual)):
            g[h + name + ".weight"] = normal((fan_out, fan_in), std)
            g[h + name + ".bias"] = torch.zeros(fan_out, device=device)
    g["ln_f.weight"] = torch.ones(C, device=device)
    if norm == "layer":
        g["ln_f.bias"] = torch.zeros(C, device=device)
    g["lm_head.weight"] = normal((V, C), 0.02)
    return {k: v.to(torch.bfloat16).requires_grad_() for k, v in g.items()}


def norm_fn(kind, x, p, prefix):
    C = x.shape[-1]
    if kind == "layer":
        return F.layer_norm(x, (C,), p[prefix + ".weight"], p[prefix + ".bias"], 1e-5)
    return F.rms_norm(x, (C,), p[prefix + ".weight"], 1e-5)


def linear(x, p, prefix, bias=True):
    return F.linear(x, p[prefix + ".weight"], p[prefix + ".bias"] if bias else None)


def loss_fn(p, idx, targets, L, NH, norm):
    B, T = idx.shape
    x = F.embedding(idx, p["wte.weight"]) + p["wpe.weight"][:T]  # positions: wpe's first T rows, a view
    C = x.shape[-1]
    for i in range(L):
        h = f"h.{i}."
        q, k, v = linear(norm_fn(norm, x, p, h + "ln_1"), p, h + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
        x = x + linear(y, p, h + "attn.c_proj")
        a = F.gelu(linear(norm_fn(norm, x, p, h + "ln_2"), p, h + "mlp.c_fc"), approximate="tanh")
        x = x + linear(a, p, h + "mlp.c_proj")
    logits = linear(norm_fn(norm, x, p, "ln_f"), p, "lm_head", bias=False)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def lr_at(lr, steps, step):
    """train_gpt's schedule: linear warm-up over 10% of the steps, cosine decay to lr / 10."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def median(v):
    v = sorted(v)
    n = len(v)
    return (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])) if n else float("nan")


def run(cfg, steps, seed, compiled=False):
    torch.manual_seed(seed)
    step_loss = torch.compile(loss_fn) if compiled else loss_fn
    dev = "cuda"
    B, T, C, NH, L, V = cfg["batch"], cfg["seq"], cfg["embd"], cfg["heads"], cfg["layers"], cfg["vocab"]
    p = make_params(V, T, C, L, cfg["norm"], dev)
    params = list(p.values())
    decay = [t for t in params if t.dim() >= 2]
    no_decay = [t for t in params if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8, fused=True)
    total = WARMUP_STEPS + steps
    batches = [(torch.randint(0, V, (B, T), device=dev), torch.randint(0, V, (B, T), device=dev))
               for _ in range(total)]
    rows = []
    for step in range(total):
        idx, targets = batches[step]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ev[0].record()
        loss = step_loss(p, idx, targets, L, NH, cfg["norm"])
        ev[1].record()
        loss.backward()
        ev[2].record()
        fwd_bwd_peak = torch.cuda.max_memory_allocated() - base  # the allocator counts on the host: no wait
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg["lr"], total, step)
        opt.step()
        opt.zero_grad(set_to_none=False)
        ev[3].record()
        torch.cuda.synchronize()
        rows.append({"forward_ms": ev[0].elapsed_time(ev[1]), "backward_ms": ev[1].elapsed_time(ev[2]),
                     "optimizer_ms": ev[2].elapsed_time(ev[3]), "loss": loss.item(), "base_bytes": base,
                     "fwd_bwd_peak_over_base_bytes": fwd_bwd_peak,
                     "step_peak_bytes": torch.cuda.max_memory_allocated()})
    measured = rows[WARMUP_STEPS:]
    out = {k: median([r[k] for r in measured]) for k in ("forward_ms", "backward_ms", "optimizer_ms")}
    out["step_ms"] = out["forward_ms"] + out["backward_ms"] + out["optimizer_ms"]
    out["tokens_per_s"] = B * T / (out["step_ms"] / 1000)
    for k in ("base_bytes", "fwd_bwd_peak_over_base_bytes", "step_peak_bytes"):
        out[k] = max(r[k] for r in measured)
    out["parameters"] = sum(t.numel() for t in params)
    out["final_loss"] = measured[-1]["loss"]
    out["per_step"] = rows
    return out


def compare(ours, torch_row):
    """Lines: each of our runs beside PyTorch's, and ours / torch."""
    mib = lambda b: f"{b / 2**20:,.1f}"
    lines = [f"{'':34} {'torch':>12}" + "".join(f" {'ours ' + r['policy']:>14} {'ratio':>7}" for r in ours["runs"])]

    def row(label, theirs, key, fmt, scale=1.0):
        text = f"{label:34} {fmt(theirs):>12}"
        for r in ours["runs"]:
            v = r.get(key)
            text += f" {'-':>14} {'-':>7}" if v is None else f" {fmt(v * scale):>14} {v * scale / theirs:7.2f}"
        return text

    ms = lambda v: f"{v:.2f}"
    lines.append(row("forward ms (median)", torch_row["forward_ms"], "forward_ms", ms))
    lines.append(row("backward ms (median)", torch_row["backward_ms"], "backward_ms", ms))
    lines.append(row("optimizer ms (median)", torch_row["optimizer_ms"], "optimizer_ms", ms))
    for r in ours["runs"]:
        if "forward_ms" in r:
            r["phases_ms"] = r["forward_ms"] + r["backward_ms"] + r["optimizer_ms"]
    lines.append(row("forward+backward+optimizer ms", torch_row["step_ms"], "phases_ms", ms))
    lines.append(row("peak allocated MiB in a step", torch_row["step_peak_bytes"], "peak_allocated_bytes", mib))
    lines.append(f"torch: peak over base during forward+backward {mib(torch_row['fwd_bwd_peak_over_base_bytes'])} MiB, "
                 f"base {mib(torch_row['base_bytes'])} MiB (bf16 parameters, gradients and AdamW moments); normtape "
                 "also holds f32 moments and master weights (12 bytes per parameter) and frees the gradients "
                 "between steps")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("batch", "seq", "layers", "heads", "embd", "vocab"):
        parser.add_argument("--" + flag, type=int, help=f"default: --ours's config, else {PRESET[flag]}")
    parser.add_argument("--norm", choices=("layer", "rms"), help="default: --ours's config, else layer")
    parser.add_argument("--lr", type=float, help=f"peak learning rate (default: --ours's config, else {PRESET['lr']})")
    parser.add_argument("--steps", type=int, default=10, help="measured steps after 2 warm-up steps (default 10)")
    parser.add_argument("--seed", type=int, default=1337, help="seed of the initialization and tokens (default 1337)")
    parser.add_argument("--json", help="write the medians, the memory figures and every step's here")
    parser.add_argument("--ours", help="train_gpt --json output to print beside PyTorch's figures")
    parser.add_argument("--compile", action="store_true", help="torch.compile the loss function (default: eager)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"expected --steps >= 1, got {args.steps}")
    if not torch.cuda.is_available():
        sys.exit("bench_torch_gpt.py: torch sees no CUDA device")
    ours = json.load(open(args.ours)) if args.ours else None
    cfg = {}
    for key in PRESET:
        given = getattr(args, key)
        from_ours = ours["config"].get(key) if ours else None
        cfg[key] = given if given is not None else from_ours if from_ours is not None else PRESET[key]
        if ours and from_ours is not None and cfg[key] != from_ours:
            print(f"note: --{key} {cfg[key]} differs from {args.ours}'s {from_ours}: the runs are not the same model")
    if ours and ours["config"].get("dtype") not in (None, "bf16"):
        print(f"note: {args.ours} ran in {ours['config']['dtype']}, this script in bf16")
    if cfg["embd"] % cfg["heads"]:
        parser.error(f"expected --embd divisible by --heads, got {cfg['embd']} and {cfg['heads']}")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPT L={cfg['layers']} NH={cfg['heads']} "
          f"C={cfg['embd']} V={cfg['vocab']} B={cfg['batch']} T={cfg['seq']}, {cfg['norm']} norm, bf16, "
          f"{'torch.compile' if args.compile else 'eager'}; medians over {args.steps} steps after {WARMUP_STEPS} warm-up steps")
    r = run(cfg, args.steps, args.seed, args.compile)
    print(f"torch: {r['parameters']:,} parameters; forward {r['forward_ms']:.2f} ms "
          f"| backward {r['backward_ms']:.2f} ms | optimizer {r['optimizer_ms']:.2f} ms "
          f"| {r['tokens_per_s']:,.0f} tok/s | peak over base during "
          f"forward+backward {r['fwd_bwd_peak_over_base_bytes'] / 2**20:,.1f} MiB | final loss {r['final_loss']:.4f}")
    if ours:
        print(compare(ours, r))
    if args.json:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "config": cfg,
                   "mode": "compile" if args.compile else "eager",
                   "steps": args.steps, "warmup_steps": WARMUP_STEPS, **r}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
