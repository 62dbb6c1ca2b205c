#!/usr/bin/env python3
"""PyTorch eager's training of normtape's GPT on nanoGPT's character-level Shakespeare configurations.

  /usr/bin/python3 scripts/train_torch_shakespeare.py --preset nanogpt-cpu [--json torch_cpu.json]
  python3 scripts/train_torch_shakespeare.py --preset nanogpt-gpu [--json torch_gpu.json]     (torch 2.x, CUDA)
  other flags, each over its preset's value: --data FILE --device cpu|cuda --dtype f32|bf16 --steps --batch
  --seq --layers --heads --embd --dropout --lr --min-lr --warmup --beta2 --weight-decay --eval-every
  --eval-batches --val-fraction --seed --threads

The PyTorch side of the comparison with examples/train_gpt/train_gpt.cpp: the same model, data and schedule, with
the settings of karpathy/nanoGPT's config/train_shakespeare_char.py, timed on the same machine.
  nanogpt-cpu (the default): L=4 NH=4 C=128 T=64 B=12, 2000 steps, dropout 0, cpu, f32 (nanoGPT's CPU run)
  nanogpt-gpu: L=6 NH=6 C=384 T=256 B=64, 5000 steps, dropout 0.2, cuda, bf16
  both: lr 1e-3 to min lr 1e-4, warm-up 100, AdamW betas (0.9, 0.99) eps 1e-8 weight decay 0.1, clip 1.0,
  an evaluation every 250 steps of 20 held-out batches.

Model: nn/gpt.h's, as scripts/bench_torch_gpt.py (B batch, T block, C width, NH heads, hs = C / NH,
L layers, V = 256 bytes), with dropout (p = --dropout, in training only) where nanoGPT's model.py has it:
    x = drop(wte[idx] + wpe[0..T-1])                                          [B, T, C]
    each block: x = x + drop(attn.c_proj(attention(ln_1(x))))                 pre-LN
                x = x + drop(mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x)))))
      attention: q, k, v = split(c_attn(x)) in NH heads; drop(softmax(q k^T / sqrt(hs), causal)) v;
                 F.scaled_dot_product_attention(dropout_p=p) where torch has it (>= 2.0), else written out
    loss = cross_entropy(lm_head(ln_f(x)), targets), the mean over B*T
LayerNorm eps 1e-5 with bias, Linear layers with bias, lm_head without bias and not tied to wte.
Initialization as GPT(): N(0, 0.02), both c_proj weights N(0, 0.02 / sqrt(2L)), biases 0.
f32 parameters; --dtype bf16 runs the forward and the loss under torch.autocast(bfloat16), as nanoGPT.

Data: the bytes of --data; the last floor(n * --val-fraction) held out, as train_gpt. A batch: B starts s
drawn uniformly from [0, len(part) - T), inputs part[s:s+T], targets part[s+1:s+T+1], as nn/data.cpp's
Batcher, but from torch.randint on a torch.Generator (the Batcher's is mt19937_64: other windows).
Training windows come from a generator seeded with --seed; held-out ones from one seeded with --seed + 1
and re-seeded before each evaluation, so that every evaluation scores the same batches (as train_gpt).

Learning rate of step s = 0 .. steps-1 (nn/lr_scheduler.h's WarmupCosineLR, decay_steps = --steps):
    s <  warmup:  lr * (s + 1) / warmup                       (lr on the warm-up's last step)
    s >= warmup:  min_lr + (lr - min_lr) * (1 + cos(pi * (s - warmup) / (steps - warmup))) / 2
AdamW: betas (0.9, --beta2), eps 1e-8, --weight-decay on the matrices (dim >= 2: embeddings, weights),
0 on the rest; fused on CUDA. Gradients clipped to a global norm of 1.0.

Measurements. Every --eval-every steps and after the last: the validation loss, the mean loss of
--eval-batches held-out batches in model.eval() under torch.no_grad(); the train loss, the mean loss of
the training steps since the previous evaluation (with dropout); the train time, time.perf_counter()
summed over the training steps (batches, forward, backward, clip, AdamW; the first steps' one-time
costs included, the evaluations not), read after torch.cuda.synchronize() on the GPU. Summary: the best
validation loss and its step, the train time, tokens/s = steps * B * T / train time. --json FILE writes
the config, the machine, every evaluation, every step's loss and the summary. On the CPU, Debian's torch
calls libblas.so.3 for its matrix products: netlib's reference BLAS unless OpenBLAS provides it.

Differences from nanoGPT's train.py on these configs: V = 256 bytes against its 65 characters (the text
is ASCII: the same token sequence, 191 rows of wte and lm_head never used); biases and an untied lm_head
against its bias=False and tied weights; our random windows; its warm-up lr * (s + 1) / (warmup + 1)
and its max_iters + 1 steps; its evaluations draw fresh batches of both splits (200 on its GPU config)
before the step; it compiles the model and allows TF32 (here eager, and f32 stays f32).
"""
import argparse
import json
import math
import os
import pathlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "nanogpt-cpu": {"device": "cpu", "dtype": "f32", "steps": 2000, "batch": 12, "seq": 64, "layers": 4,
                    "heads": 4, "embd": 128, "dropout": 0.0},
    "nanogpt-gpu": {"device": "cuda", "dtype": "bf16", "steps": 5000, "batch": 64, "seq": 256, "layers": 6,
                    "heads": 6, "embd": 384, "dropout": 0.2},
}
COMMON = {"lr": 1e-3, "min_lr": 1e-4, "warmup": 100, "beta2": 0.99, "weight_decay": 0.1, "eval_every": 250,
          "eval_batches": 20, "val_fraction": 0.1, "seed": 1337, "threads": len(os.sched_getaffinity(0)),
          "data": str(pathlib.Path(__file__).resolve().parent.parent / "data" / "tinyshakespeare.txt")}
VOCAB = 256
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class Attention(nn.Module):
    def __init__(self, C, NH, dropout):
        super().__init__()
        self.NH, self.dropout = NH, dropout
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        p = self.dropout if self.training else 0.0
        if HAS_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:  # torch < 2.0: the same attention written out, as nanoGPT's fallback
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = F.dropout(F.softmax(att.masked_fill(future, float("-inf")), dim=-1), p) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return F.dropout(self.c_proj(y), self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, C, dropout):
        super().__init__()
        self.dropout = dropout
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, C, NH, dropout):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C), Attention(C, NH, dropout)
        self.ln_2, self.mlp = nn.LayerNorm(C), MLP(C, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, dropout):
        super().__init__()
        self.dropout = dropout
        self.wte, self.wpe = nn.Embedding(VOCAB, C), nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH, dropout) for _ in range(L))
        self.ln_f, self.lm_head = nn.LayerNorm(C), nn.Linear(C, VOCAB, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = F.dropout(self.wte(idx) + self.wpe.weight[:T], self.dropout, self.training)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * (step - a.warmup) / (a.steps - a.warmup)))


def autocast(a):
    return torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16")


def synchronize(a):
    if a.device == "cuda":
        torch.cuda.synchronize()


def get_batch(part, a, gen):
    """(inputs, targets), [B, T] int64 on --device: B windows of T + 1 bytes of `part` at uniform starts."""
    starts = torch.randint(len(part) - a.seq, (a.batch,), generator=gen)
    w = part[starts[:, None] + torch.arange(a.seq + 1)].long()  # [B, T + 1]
    x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
    if a.device == "cuda":
        return x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True)
    return x, y


@torch.no_grad()
def evaluate(model, val, a, gen):
    """The mean loss of --eval-batches held-out batches, the same ones at every call."""
    model.eval()
    gen.manual_seed(a.seed + 1)
    losses = []
    for _ in range(a.eval_batches):
        x, y = get_batch(val, a, gen)
        with autocast(a):
            losses.append(model(x, y).float())
    model.train()
    return torch.stack(losses).mean().item()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="nanogpt-cpu",
                        help="nanoGPT's configuration whose values the other flags override (default nanogpt-cpu)")
    parser.add_argument("--device", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", choices=("f32", "bf16"))
    parser.add_argument("--data", help="text file (default: the repository's data/tinyshakespeare.txt)")
    parser.add_argument("--json", help="write the config, every evaluation and step loss, and the summary here")
    for flag, kind in (("steps", int), ("batch", int), ("seq", int), ("layers", int), ("heads", int),
                       ("embd", int), ("dropout", float), ("lr", float), ("min-lr", float), ("warmup", int),
                       ("beta2", float), ("weight-decay", float), ("eval-every", int), ("eval-batches", int),
                       ("val-fraction", float), ("seed", int), ("threads", int)):
        parser.add_argument("--" + flag, type=kind)
    a = parser.parse_args()
    for key, value in {**COMMON, **PRESETS[a.preset]}.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    for key in ("steps", "batch", "seq", "layers", "heads", "embd", "eval_every", "eval_batches", "threads"):
        if getattr(a, key) < 1:
            parser.error(f"expected --{key.replace('_', '-')} >= 1, got {getattr(a, key)}")
    if a.embd % a.heads:
        parser.error(f"expected --embd divisible by --heads, got {a.embd} and {a.heads}")
    if not 0 < a.val_fraction < 1 or not 0 <= a.dropout < 1 or a.warmup < 0 or not 0 <= a.min_lr <= a.lr:
        parser.error("expected 0 < --val-fraction < 1, 0 <= --dropout < 1, --warmup >= 0 and 0 <= --min-lr <= --lr")
    if a.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    return a, parser


def main():
    a, parser = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the initialization and the dropout masks
    data = torch.frombuffer(bytearray(pathlib.Path(a.data).read_bytes()), dtype=torch.uint8)
    n_val = math.floor(len(data) * a.val_fraction)
    train, val = data[:len(data) - n_val], data[len(data) - n_val:]
    if min(len(train), len(val)) < a.seq + 1:
        parser.error(f"{a.data}: {len(train)} training and {len(val)} held-out bytes; --seq {a.seq} needs "
                     f"at least {a.seq + 1} in each")
    model = GPT(a.layers, a.heads, a.embd, a.seq, a.dropout).to(a.device)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8,
                            **({"fused": True} if a.device == "cuda" else {}))
    machine = torch.cuda.get_device_name() if a.device == "cuda" else f"cpu, {a.threads} threads"
    n_params = sum(p.numel() for p in params)
    print(f"torch {a.preset}: torch {torch.__version__} on {machine}; L={a.layers} NH={a.heads} C={a.embd} "
          f"V={VOCAB}, {n_params:,} parameters; B={a.batch} T={a.seq}, {a.steps} steps, lr {a.lr:g} to "
          f"{a.min_lr:g}, warm-up {a.warmup}, dropout {a.dropout:g}, {a.dtype}, eager")
    print(f"data: {a.data}, {len(train):,} training and {len(val):,} held-out bytes")
    if a.steps <= a.warmup:
        print(f"note: --steps {a.steps} <= --warmup {a.warmup}: the run ends in the warm-up, at "
              f"lr {lr_at(a, a.steps - 1):g}")

    train_gen, val_gen = torch.Generator().manual_seed(a.seed), torch.Generator()
    train_time, pending, losses, evals = 0.0, [], [], []
    synchronize(a)
    t0 = time.perf_counter()
    for step in range(a.steps):
        x, y = get_batch(train, a, train_gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        with autocast(a):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        pending.append(loss.detach())
        if (step + 1) % a.eval_every and step + 1 < a.steps:
            continue
        synchronize(a)
        train_time += time.perf_counter() - t0
        losses += torch.stack(pending).float().tolist()
        e = {"step": step + 1, "train_loss": sum(losses[-len(pending):]) / len(pending),
             "val_loss": evaluate(model, val, a, val_gen), "train_time_s": train_time}
        pending = []
        best = not evals or e["val_loss"] < min(v["val_loss"] for v in evals)
        evals.append(e)
        print(f"step {e['step']:5d}/{a.steps} | train loss {e['train_loss']:.4f} | val loss {e['val_loss']:.4f}"
              f"{' (best)' if best else '       '} | train time {train_time:.2f} s")
        t0 = time.perf_counter()

    best = min(evals, key=lambda v: v["val_loss"])
    summary = {"best_val_loss": best["val_loss"], "best_val_step": best["step"], "train_time_s": train_time,
               "tokens_per_s": a.steps * a.batch * a.seq / train_time, "steps_per_s": a.steps / train_time}
    print(f"torch: best val loss {summary['best_val_loss']:.4f} at step {summary['best_val_step']} | train time "
          f"{train_time:.2f} s | {summary['tokens_per_s']:,.0f} tokens/s | {summary['steps_per_s']:.2f} steps/s")
    if a.json:
        config = {k: v for k, v in vars(a).items() if k != "json"}
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "machine": machine, "config": config, "parameters": n_params,
                       "vocab": VOCAB, "evaluations": evals, "losses": losses, **summary}, f, indent=1)


if __name__ == "__main__":
    main()
