#!/usr/bin/env python3
"""PyTorch eager's training of normtape's GPT on nanoGPT's character-level Shakespeare configurations.

  /usr/bin/python3 scripts/train_torch_shakespeare.py --preset nanogpt-cpu [--json torch_cpu.json]
  python3 scripts/train_torch_shakespeare.py --preset nanogpt-gpu [--json torch_gpu.json]     (torch 2.x, CUDA)
  other flags, each over its preset's value: --data FILE --device cpu|cuda --dtype f32|bf16 --steps --batch
  --seq --layers --heads --embd --dropout --lr --min-lr --warmup --beta2 --weight-decay --eval-every
  --eval-batches --val-fraction --seed --threads, and --stop-at N (stop after step N of the --steps schedule)
  --optimizer adamw|muon (default adamw; muon: as train_gpt's --optimizer muon, below)
  the model's, as train_gpt's: --arch gpt2|nanochat|llama (default gpt2), --kv-heads N (grouped-query
  attention; 0, the default: --heads), --tie on|off (on: lm_head's weight is wte's; default off), and
  --eps (every norm's epsilon, default 1e-5, GPTConfig::norm_eps)

The PyTorch side of the comparison with examples/train_gpt/train_gpt.cpp: the same model, data and schedule, with
the settings of karpathy/nanoGPT's config/train_shakespeare_char.py, timed on the same machine.
  nanogpt-cpu (the default): L=4 NH=4 C=128 T=64 B=12, 2000 steps, dropout 0, cpu, f32 (nanoGPT's CPU run)
  nanogpt-gpu: L=6 NH=6 C=384 T=256 B=64, 5000 steps, dropout 0.2, cuda, bf16
  both: lr 1e-3 to min lr 1e-4, warm-up 100, AdamW betas (0.9, 0.99) eps 1e-8 weight decay 0.1, clip 1.0,
  an evaluation every 250 steps of 20 held-out batches.

Model: nn/model/gpt.h's, GPT(gpt_config(--arch)) with train_gpt's --kv-heads and --tie, as scripts/bench_torch_gpt.py
(B batch, T block, C width, NH heads, NKV key/value heads, hs = C / NH, L layers, H the MLP's hidden width,
V = 256 bytes), with dropout (p = --dropout, in training only) where nanoGPT's model.py has it.
--arch gpt2 (the default; GPT-2):
    x = drop(wte[idx] + wpe[0..T-1])                                          [B, T, C]
    each block: x = x + drop(attn.c_proj(attention(ln_1(x))))                 pre-LN
                x = x + drop(mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x)))))        c_fc Linear(C, 4C)
      attention: q, k, v = split(c_attn(x)) in NH heads; drop(softmax(q k^T / sqrt(hs), causal)) v
    loss = cross_entropy(lm_head(ln_f(x)), targets), the mean over B*T
  LayerNorm (weight and bias), Linear layers with bias. With NKV < NH (--kv-heads) c_attn gives way to
  c_q, c_k, c_v (with biases) and the grouped-query attention below, as nn/model/gpt.cpp's.
--arch nanochat (karpathy/nanochat's GPT):
    x = emb_norm(drop(wte[idx]))                                              no wpe
    each block: x = x + drop(attn.c_proj(attention(ln_1(x))))
                x = x + drop(mlp.c_proj(relu(mlp.c_fc(ln_2(x)))^2))           c_fc Linear(C, 4C)
      attention: q = c_q(x) [B, T, NH, hs]; k = c_k(x), v = c_v(x) [B, T, NKV, hs];
                 q, k = rms(rope(q)), rms(rope(k)) (QK-norm over hs, after the rotation);
                 grouped-query: drop(softmax(q k^T / sqrt(hs), causal)) v, query head h with
                 key/value head h // (NH / NKV)
    loss = cross_entropy(15 * tanh(lm_head(ln_f(x)) / 15), targets)          logit softcap 15, in f32
  Every norm (emb_norm, ln_1, ln_2, ln_f, QK-norm) a weightless RMSNorm; no biases; attn.c_proj and
  mlp.c_proj initialized to zero.
--arch llama (Hugging Face's LlamaForCausalLM):
    x = drop(wte[idx])                                                        no wpe
    each block: x = x + drop(attn.c_proj(attention(ln_1(x))))
                x = x + drop(mlp.c_proj(silu(gate) * up)), [gate | up] = mlp.c_fc(ln_2(x))
      attention: nanochat's without QK-norm: q, k = rope(q), rope(k); grouped-query
      mlp: c_fc Linear(C, 2H), gate its first H columns, up the last H; c_proj Linear(H, C);
           H = 8C/3 rounded up to a multiple of 64, ((8 * C) // 3 + 63) // 64 * 64
    loss = cross_entropy(lm_head(ln_f(x)), targets)
  RMSNorm with weight at ln_1, ln_2 and ln_f; no biases.
The pieces:
  rms(x) = x / sqrt(mean(x^2) + eps) over the last dim (times the weight where it has one), written out
    (torch 1.13 has no F.rms_norm), in f32 and returned in x's dtype, as transformers' LlamaRMSNorm.
  rope(x), x [B, T, heads, hs]: the rotary embedding in Hugging Face's rotate_half convention (ops/rotary.h):
    inv_freq = 1 / 10000^(arange(0, hs, 2) / hs), angle[t] = t * inv_freq, cos and sin of
    cat(angle, angle) [T, hs] (f32, then x's dtype); rope(x) = x * cos + cat(-x2, x1) * sin, x1 and x2
    the halves of each head.
  attention: F.scaled_dot_product_attention(dropout_p=p, is_causal=True) where torch has it (>= 2.0), else
    written out; with NKV < NH, k and v repeated to NH heads first (repeat_interleave: head h reads copy
    h of kv head h // (NH / NKV)), where normtape's causal_attention reads them in place.
  lm_head: no bias; its own weight, or with --tie on wte's (one parameter, counted and decayed once).
Initialization as GPT(): N(0, 0.02) for the embeddings and Linear weights, the residual projections (both
c_proj weights) N(0, 0.02 / sqrt(2L)) (nanochat: zeros), biases 0, norm weights 1.
f32 parameters; --dtype bf16 runs the forward and the loss under torch.autocast(bfloat16), as nanoGPT.
--arch gpt2 with the default --kv-heads, --tie and --eps trains as this script did before it had them.

Data: the bytes of --data; the last floor(n * --val-fraction) held out, as train_gpt. A batch: B starts s
drawn uniformly from [0, len(part) - T), inputs part[s:s+T], targets part[s+1:s+T+1], as nn/data/data.cpp's
Batcher, but from torch.randint on a torch.Generator (the Batcher's is mt19937_64: other windows).
Training windows come from a generator seeded with --seed; held-out ones from one seeded with --seed + 1
and re-seeded before each evaluation, so that every evaluation scores the same batches (as train_gpt).

Learning rate of step s = 0 .. steps-1 (nn/optim/lr_scheduler.h's WarmupCosineLR, decay_steps = --steps):
    s <  warmup:  lr * (s + 1) / warmup                       (lr on the warm-up's last step)
    s >= warmup:  min_lr + (lr - min_lr) * (1 + cos(pi * (s - warmup) / (steps - warmup))) / 2
--optimizer adamw (the default): AdamW, betas (0.9, --beta2), eps 1e-8, --weight-decay on the matrices
(dim >= 2: embeddings, weights), 0 on the rest; fused on CUDA. Gradients clipped to a global norm of 1.0.
--optimizer muon (as train_gpt's; nanochat's GPT.setup_optimizers): the blocks' matrices (h.*, dim >= 2) to
Muon, the rest to AdamW in three groups: "embeddings" (wte, and wpe with gpt2), "head" (lm_head's weight;
with --tie on it is wte's, in embeddings) and "vectors" (norm weights, biases). With m = lr(step) / --lr,
the schedule above as a multiplier, and s = (C / 768)^-0.5 (nanochat's dmodel_lr_scale): Muon's lr 0.02 m,
embeddings' 0.2 s m, head's and vectors' 0.004 s m. AdamW betas (0.8, 0.95), eps 1e-10, no weight decay
(--beta2 and --weight-decay unused); fused on CUDA. Muon (KellerJordan/Muon's single-device algorithm):
for each matrix p [rows, cols] with gradient g, buf = lerp(buf, g, 0.05) (from zeros), u = lerp(g, buf, 0.95)
(Nesterov), o = Newton-Schulz(u): X = u (bf16 on CUDA, f32 on the cpu), transposed if rows > cols,
X = X / (|X| + 1e-7), 5 times X = a X + (b A + c A^2) X with A = X X^T and (a, b, c) = (3.4445, -4.7750,
2.0315), transposed back; p -= lr max(1, rows / cols)^0.5 o. The parameters stay f32 (bf16 is autocast's), so
Muon keeps no master copy. Both steps after one clipping (AdamW's, then Muon's).

Measurements. Every --eval-every steps and after the last: the validation loss, the mean loss of
--eval-batches held-out batches in model.eval() under torch.no_grad(); the train loss, the mean loss of
the training steps since the previous evaluation (with dropout); the train time, time.perf_counter()
summed over the training steps (batches, forward, backward, clip, the optimizers; the first steps' one-time
costs included, the evaluations not), read after torch.cuda.synchronize() on the GPU. Summary: the best
validation loss and its step, the train time, tokens/s = steps * B * T / train time. --json FILE writes
the config, the arch and its model's settings, the optimizer (and muon's settings), the machine, every
evaluation, every step's loss and the summary. On the CPU, Debian's torch calls libblas.so.3 for its matrix
products: netlib's reference BLAS unless OpenBLAS provides it.

Differences from nanoGPT's train.py on these configs: V = 256 bytes against its 65 characters (the text
is ASCII: the same token sequence, 191 rows of wte and lm_head never used); gpt2's biases and untied
lm_head (--tie off) against its bias=False and tied weights; our random windows; its warm-up
lr * (s + 1) / (warmup + 1) and its max_iters + 1 steps; its evaluations draw fresh batches of both splits
(200 on its GPU config) before the step; it compiles the model and allows TF32 (here eager, and f32 stays
f32).
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


# nn/model/gpt.cpp's gpt_config(arch): GPTConfig's architecture fields (rope_theta 10000 for all).
ARCHS = {
    "gpt2": {"rotary": False, "qk_norm": False, "norm": "layer", "norm_affine": True, "mlp": "gelu", "bias": True,
             "softcap": 0.0, "emb_norm": False, "zero_proj": False},
    "nanochat": {"rotary": True, "qk_norm": True, "norm": "rms", "norm_affine": False, "mlp": "relu2",
                 "bias": False, "softcap": 15.0, "emb_norm": True, "zero_proj": True},
    "llama": {"rotary": True, "qk_norm": False, "norm": "rms", "norm_affine": True, "mlp": "swiglu", "bias": False,
              "softcap": 0.0, "emb_norm": False, "zero_proj": False},
}
ROPE_THETA = 10000.0


def model_config(a):
    """The model's settings: ARCHS[--arch] and the sizes (GPTConfig; H as GPTConfig::hidden())."""
    m = argparse.Namespace(**ARCHS[a.arch], L=a.layers, NH=a.heads, NKV=a.kv_heads or a.heads, C=a.embd, T=a.seq,
                           dropout=a.dropout, eps=a.eps, tie=a.tie == "on")
    m.H = ((8 * m.C) // 3 + 63) // 64 * 64 if m.mlp == "swiglu" else 4 * m.C
    return m


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) over the last dim, times weight (ones) when affine; in f32 (f64 for f64), returned
    in x's dtype (as transformers' LlamaRMSNorm, the weight's product after). Written out: torch 1.13 has no
    F.rms_norm."""

    def __init__(self, width, eps, affine):
        super().__init__()
        self.eps = eps
        self.register_parameter("weight", nn.Parameter(torch.ones(width)) if affine else None)

    def forward(self, x):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return y if self.weight is None else y * self.weight


def make_norm(m, width):
    if m.norm == "layer":
        return nn.LayerNorm(width, eps=m.eps, elementwise_affine=m.norm_affine)
    return RMSNorm(width, m.eps, m.norm_affine)


def rope_tables(T, hs, theta):
    """cos, sin [T, 1, hs] f32 of the rotary embedding: of cat(angle, angle), angle[t, d] = t * inv_freq[d]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))  # [hs / 2]
    angle = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]            # [T, hs / 2]
    angle = torch.cat((angle, angle), dim=-1)[:, None, :]
    return angle.cos(), angle.sin()


def rope(x, cos, sin):
    """x [B, T, heads, hs] rotated: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1) of its halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, self.NH, self.NKV, self.dropout = m.C, m.NH, m.NKV, m.dropout
        hs = C // m.NH
        self.rotary, self.separate = m.rotary, m.rotary or m.qk_norm or m.NKV != m.NH  # GPTConfig::separate_qkv
        if self.separate:
            self.c_q, self.c_k, self.c_v = (nn.Linear(C, n * hs, bias=m.bias) for n in (m.NH, m.NKV, m.NKV))
            self.q_norm, self.k_norm = ((RMSNorm(hs, m.eps, m.norm_affine), RMSNorm(hs, m.eps, m.norm_affine))
                                        if m.qk_norm else (None, None))
        else:
            self.c_attn = nn.Linear(C, 3 * C, bias=m.bias)
        self.c_proj = nn.Linear(C, C, bias=m.bias)
        if self.rotary:  # the same tables at every forward: made once (not parameters, not saved)
            cos, sin = rope_tables(m.T, hs, ROPE_THETA)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        if self.separate:
            q = self.c_q(x).view(B, T, self.NH, C // self.NH)
            k, v = (c(x).view(B, T, self.NKV, C // self.NH) for c in (self.c_k, self.c_v))
            if self.rotary:
                cos, sin = self.cos[:T].to(q.dtype), self.sin[:T].to(q.dtype)
                q, k = rope(q, cos, sin), rope(k, cos, sin)
            if self.q_norm is not None:  # QK-norm, after the rotation (nanochat)
                q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hs]
            if self.NKV != self.NH:  # grouped-query: query head h reads key/value head h // (NH / NKV)
                k, v = (t.repeat_interleave(self.NH // self.NKV, dim=1) for t in (k, v))
        else:
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
    def __init__(self, m):
        super().__init__()
        self.kind, self.dropout = m.mlp, m.dropout
        self.c_fc = nn.Linear(m.C, 2 * m.H if m.mlp == "swiglu" else m.H, bias=m.bias)
        self.c_proj = nn.Linear(m.H, m.C, bias=m.bias)

    def forward(self, x):
        h = self.c_fc(x)
        if self.kind == "gelu":
            h = F.gelu(h, approximate="tanh")
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:  # swiglu: h = [gate | up]
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return F.dropout(self.c_proj(h), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.ln_1, self.attn = make_norm(m, m.C), Attention(m)
        self.ln_2, self.mlp = make_norm(m, m.C), MLP(m)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.dropout, self.softcap = m.dropout, m.softcap
        self.wte, self.wpe = nn.Embedding(VOCAB, m.C), None if m.rotary else nn.Embedding(m.T, m.C)
        self.emb_norm = make_norm(m, m.C) if m.emb_norm else None
        self.h = nn.ModuleList(Block(m) for _ in range(m.L))
        self.ln_f, self.lm_head = make_norm(m, m.C), nn.Linear(m.C, VOCAB, bias=False)
        if m.tie:
            self.lm_head.weight = self.wte.weight  # one parameter: named_parameters() names it wte.weight
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2 and name.endswith("c_proj.weight") and m.zero_proj:  # nanochat's residual projections
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * m.L) if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe.weight[:T]
        x = F.dropout(x, self.dropout, self.training)
        if self.emb_norm is not None:
            x = self.emb_norm(x)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if self.softcap:  # the logit softcap, in f32
            logits = self.softcap * torch.tanh(logits.float() / self.softcap)
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1.0 + math.cos(math.pi * (step - a.warmup) / (a.steps - a.warmup)))


# --optimizer muon's settings (nanochat's): Muon's, and AdamW's lrs per group before s and the schedule.
MUON = {"lr": 0.02, "momentum": 0.95, "nesterov": True, "ns_steps": 5, "ns_coefficients": (3.4445, -4.7750, 2.0315),
        "adamw_lr": {"embeddings": 0.2, "head": 0.004, "vectors": 0.004}, "adamw_betas": (0.8, 0.95),
        "adamw_eps": 1e-10, "weight_decay": 0.0}


def newton_schulz(u, steps):
    """KellerJordan/Muon's quintic Newton-Schulz iteration: u [rows, cols] to about its nearest semi-orthogonal
    matrix, in bf16 on CUDA, f32 on the cpu."""
    a, b, c = MUON["ns_coefficients"]
    x = u.bfloat16() if u.is_cuda else u.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * (A @ A)) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """KellerJordan/Muon's single-device Muon on matrices: momentum (Nesterov), orthogonalized by newton_schulz,
    scaled by max(1, rows / cols)^0.5. f32 parameters only (this script's: bf16 is autocast's)."""

    def __init__(self, params, lr, momentum, nesterov, ns_steps, weight_decay):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                                      weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g, state = p.grad, self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.lerp_(g, 1 - momentum)
                o = newton_schulz(g.lerp(buf, momentum) if group["nesterov"] else buf, group["ns_steps"])
                o *= max(1.0, p.shape[0] / p.shape[1]) ** 0.5
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(o.to(p.dtype), alpha=-lr)


def make_optimizers(model, a):
    """(--optimizer's optimizers, muon's settings): adamw's one AdamW and None, or muon's AdamW and Muon, each
    group with its "name" and "peak_lr" (its lr before the schedule's multiplier), and MUON with s."""
    params = list(model.parameters())
    fused = {"fused": True} if a.device == "cuda" else {}
    if a.optimizer == "adamw":
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": a.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return [torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, **fused)], None
    split = {"muon": [], "embeddings": [], "head": [], "vectors": []}
    for name, p in model.named_parameters():  # with --tie on, wte.weight only (lm_head's is the same one)
        if name.startswith("h.") and p.dim() >= 2:
            split["muon"].append(p)
        elif name in ("wte.weight", "wpe.weight"):
            split["embeddings"].append(p)
        elif name == "lm_head.weight":
            split["head"].append(p)
        else:
            split["vectors"].append(p)
    scale = (a.embd / 768) ** -0.5  # nanochat's dmodel_lr_scale
    groups = [{"params": split[k], "name": k, "peak_lr": lr * scale} for k, lr in MUON["adamw_lr"].items()
              if split[k]]
    adamw = torch.optim.AdamW(groups, lr=0.0, betas=MUON["adamw_betas"], eps=MUON["adamw_eps"], weight_decay=0.0,
                              **fused)
    muon = Muon([{"params": split["muon"], "name": "muon", "peak_lr": MUON["lr"]}], lr=0.0,
                momentum=MUON["momentum"], nesterov=MUON["nesterov"], ns_steps=MUON["ns_steps"],
                weight_decay=MUON["weight_decay"])
    return [adamw, muon], {**MUON, "dmodel_lr_scale": scale}


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
    parser.add_argument("--arch", choices=sorted(ARCHS), default="gpt2",
                        help="the model: nn/model/gpt.h's gpt_config(ARCH), as train_gpt's --arch (default gpt2)")
    parser.add_argument("--kv-heads", type=int, default=0,
                        help="key/value heads (grouped-query attention), dividing --heads (0, the default: --heads)")
    parser.add_argument("--tie", choices=("on", "off"), default="off",
                        help="on: lm_head's weight is wte's (one parameter); off (default): its own")
    parser.add_argument("--eps", type=float, default=1e-5, help="every norm's epsilon (default 1e-5)")
    parser.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw",
                        help="adamw (default), or muon: Muon on the blocks' matrices, AdamW on the rest (nanochat's)")
    parser.add_argument("--stop-at", type=int, default=0,
                        help="stop after this step of the --steps schedule, as train_gpt's (default 0: at --steps)")
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
    if not 0 <= a.stop_at <= a.steps:
        parser.error(f"expected --stop-at from 0 to --steps {a.steps}, got {a.stop_at}")
    if a.embd % a.heads:
        parser.error(f"expected --embd divisible by --heads, got {a.embd} and {a.heads}")
    if a.kv_heads < 0 or a.heads % (a.kv_heads or a.heads):
        parser.error(f"expected --kv-heads dividing --heads (or 0: --heads), got {a.kv_heads} and {a.heads}")
    if ARCHS[a.arch]["rotary"] and (a.embd // a.heads) % 2:
        parser.error(f"--arch {a.arch} rotates pairs of each head's values: expected an even head size "
                     f"--embd / --heads, got {a.embd // a.heads}")
    if not 0 < a.eps < math.inf:
        parser.error(f"expected --eps > 0 and finite, got {a.eps}")
    if not 0 < a.val_fraction < 1 or not 0 <= a.dropout < 1 or a.warmup < 0 or not 0 <= a.min_lr <= a.lr:
        parser.error("expected 0 < --val-fraction < 1, 0 <= --dropout < 1, --warmup >= 0 and 0 <= --min-lr <= --lr")
    if a.optimizer == "muon" and a.lr <= 0:
        parser.error("--optimizer muon follows the schedule as a multiplier, lr(step) / --lr: expected --lr > 0")
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
    m = model_config(a)
    model = GPT(m).to(a.device)
    params = list(model.parameters())
    opts, muon = make_optimizers(model, a)
    machine = torch.cuda.get_device_name() if a.device == "cuda" else f"cpu, {a.threads} threads"
    n_params = sum(p.numel() for p in params)
    print(f"torch {a.preset}: torch {torch.__version__} on {machine}; {a.arch}, L={m.L} NH={m.NH} NKV={m.NKV} "
          f"C={m.C} H={m.H} V={VOCAB}, lm_head {'tied' if m.tie else 'untied'}, {n_params:,} parameters; "
          f"B={a.batch} T={a.seq}, {a.steps} steps, lr {a.lr:g} to {a.min_lr:g}, warm-up {a.warmup}, "
          f"dropout {a.dropout:g}, {a.dtype}, eager, {a.optimizer}")
    if muon:
        print("muon: " + ", ".join(f"{g['name']} {len(g['params'])} parameters, lr {g['peak_lr']:g}"
                                   for opt in opts for g in opt.param_groups) + f"; {json.dumps(muon)}")
    print(f"data: {a.data}, {len(train):,} training and {len(val):,} held-out bytes")
    if a.steps <= a.warmup:
        print(f"note: --steps {a.steps} <= --warmup {a.warmup}: the run ends in the warm-up, at "
              f"lr {lr_at(a, a.steps - 1):g}")

    train_gen, val_gen = torch.Generator().manual_seed(a.seed), torch.Generator()
    train_time, pending, losses, evals = 0.0, [], [], []
    end = a.stop_at or a.steps
    synchronize(a)
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for step in range(end):
        x, y = get_batch(train, a, train_gen)
        for group in (g for opt in opts for g in opt.param_groups):  # muon: the schedule as a multiplier
            group["lr"] = lr_at(a, step) if a.optimizer == "adamw" else group["peak_lr"] * (lr_at(a, step) / a.lr)
        with autocast(a):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for opt in opts:
            opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        pending.append(loss.detach())
        if (step + 1) % a.eval_every and step + 1 < end:
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
               "tokens_per_s": end * a.batch * a.seq / train_time, "steps_per_s": end / train_time}
    if a.device == "cuda":  # evaluations included: they allocate less than a training step
        summary["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    print(f"torch: best val loss {summary['best_val_loss']:.4f} at step {summary['best_val_step']} | train time "
          f"{train_time:.2f} s | {summary['tokens_per_s']:,.0f} tokens/s | {summary['steps_per_s']:.2f} steps/s")
    if a.json:
        config = {k: v for k, v in vars(a).items() if k != "json"}
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "machine": machine, "config": config, "arch": a.arch,
                       "model": vars(m), "optimizer": a.optimizer, **({"muon": muon} if muon else {}),
                       "parameters": n_params, "vocab": VOCAB, "evaluations": evals, "losses": losses, **summary},
                      f, indent=1)


if __name__ == "__main__":
    main()
