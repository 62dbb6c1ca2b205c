#!/usr/bin/python3
"""tests/torch_reference.py: the PyTorch side of tests/test_torch.cpp.

Rebuilds normtape's GPT (nn/model/gpt.h) purely functionally from a checkpoint written by
save_checkpoint, optionally trains it for a few AdamW steps (torch.optim.AdamW), then runs one
forward and backward on a batch with PyTorch autograd and writes the loss and every parameter's
gradient. No nn.Module is built: each line below mirrors one line of nn/model/gpt.cpp, so a mismatch
points at an op of normtape, not at a model definition.

Dimensions (nn/model/gpt.h): B batch, T sequence length, C n_embd, NH heads, NKV key/value heads,
hs = C / NH, L layers, V vocabulary size, H the MLP's hidden width.

    x = wte[idx] [+ wpe[0..T-1]]                    [B, T, C]; wpe with learned positions only
    [x = emb_norm(x)]                               nanochat
    for each block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
    logits = ln_f(x) @ lm_head.weight^T             [B, T, V]; lm_head.weight is wte.weight when tied
    [logits = softcap * tanh(logits / softcap)]     nanochat (15)
    loss = cross_entropy(logits.view(-1, V), targets.view(-1))

The attention is GPT-2's packed c_attn when positions are learned, there is no QK-norm and
NKV == NH; otherwise c_q, c_k, c_v, the rotary embedding on q and k (Hugging Face's rotate_half
convention, ops/rotary.h), QK-norm (a weightless RMSNorm over hs, after the rotation) and
grouped-query attention (query head h uses key/value head h // (NH / NKV)). The MLP is GELU (tanh),
ReLU^2 or SwiGLU (c_fc's output split [gate | up], silu(gate) * up).

--arch picks the architecture of gpt_config(arch) (nn/model/gpt.cpp); --norm, --softcap, --n-kv-head,
--rope-theta, --tie change it. With --adamw-steps N > 0, N steps of torch.optim.AdamW (one group,
every parameter, --lr, --beta1, --beta2, --adam-eps, --weight-decay) run on the batch first
(forward, backward, step, zero_grad), and the loss and gradients written are those of the
(N+1)-th forward and backward.

Files are safetensors (huggingface/safetensors), read and written here with the standard
library: 8 bytes little-endian header length n, n bytes of JSON, then raw little-endian data.

Usage:
    /usr/bin/python3 tests/torch_reference.py --checkpoint ckpt.safetensors \
        --batch batch.safetensors --out grads.safetensors --n-head 2 [--norm layer|rms] [--eps 1e-5]
        [--arch gpt2|nanochat|llama] [--n-kv-head 2] [--tie] [--softcap 15] [--rope-theta 10000]
        [--mlp-hidden H] [--adamw-steps 3 --lr 1e-2 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8
        --weight-decay 0.1]

Writes "loss" (0-dim) and "grad.<name>" for every parameter of the checkpoint, in its dtype; with
--adamw-steps N > 0 also "losses" ([N + 1], the loss of every forward, the last one "loss") and
"param.<name>" (every parameter after the N steps, before the last forward).
Exits with status 1 and a message on stderr on any error.

Needs torch (Debian's python3-torch 1.13, which has neither F.rms_norm nor grouped-query
scaled_dot_product_attention) and numpy; nothing else.
"""

import argparse
import json
import math
import re
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# safetensors dtype names <-> torch and numpy dtypes (little-endian).
ST_TO_TORCH = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "BF16": torch.bfloat16}
# numpy has no bf16: its bytes are read and written as uint16, the upper half of an f32.
ST_TO_NUMPY = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "BF16": np.dtype("<u2")}
TORCH_TO_ST = {v: k for k, v in ST_TO_TORCH.items()}


class ScriptError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


# ---------------------------------------------------------------------------------------------
# safetensors

def load_safetensors(path):
    """Returns {name: tensor} (cpu, contiguous) of the safetensors file `path`."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise ScriptError(f"cannot read {path}: {e}")
    if len(blob) < 8:
        raise ScriptError(f"{path}: file of {len(blob)} bytes is too short for a header")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ScriptError(f"{path}: header length {n} exceeds the file size {len(blob)}")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ScriptError(f"{path}: header is not valid JSON: {e}")
    if not isinstance(header, dict):
        raise ScriptError(f"{path}: header is not a JSON object")
    data = blob[8 + n:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ScriptError(f"{path}: tensor {name} needs dtype, shape and data_offsets [begin, end]")
        if dtype not in ST_TO_NUMPY:
            raise ScriptError(f"{path}: tensor {name} has unsupported dtype {dtype} (expected F32, F64, BF16 or I64)")
        np_dtype = ST_TO_NUMPY[dtype]
        numel = math.prod(shape)
        if not (0 <= begin <= end <= len(data)) or end - begin != numel * np_dtype.itemsize:
            raise ScriptError(f"{path}: tensor {name} has data_offsets [{begin}, {end}] that do not fit "
                                 f"shape {shape} {dtype} within {len(data)} data bytes")
        array = np.frombuffer(data, dtype=np_dtype, count=numel, offset=begin).reshape(shape)
        # astype(native) copies: the tensor then owns writable, aligned, native-endian memory.
        native = array.astype(np_dtype.newbyteorder("="))
        if dtype == "BF16":  # exact: a bf16 value is the f32 with these 16 upper bits
            native = (native.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.from_numpy(native).to(ST_TO_TORCH[dtype])
    return tensors


def save_safetensors(path, tensors):
    """Writes {name: tensor} to `path`, names sorted, data 8-byte aligned."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in TORCH_TO_ST:
            raise ScriptError(f"cannot write tensor {name} of dtype {t.dtype}")
        st = TORCH_TO_ST[t.dtype]
        if st == "BF16":
            raw = (t.float().numpy().view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = t.numpy().astype(ST_TO_NUMPY[st]).tobytes()
        header[name] = {"dtype": st, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    try:
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for raw in chunks:
                f.write(raw)
    except OSError as e:
        raise ScriptError(f"cannot write {path}: {e}")


# ---------------------------------------------------------------------------------------------
# the architecture: the fields of GPTConfig (nn/model/gpt.h) that the model's code reads

# gpt_config(arch) of nn/model/gpt.cpp, less the sizes (read from the checkpoint) and zero_init_proj
# (an initialization: the checkpoint holds the parameters).
PRESETS = {
    "gpt2": dict(rotary=False, qk_norm=False, norm="layer", norm_affine=True, mlp="gelu", bias=True,
                 softcap=0.0, emb_norm=False),
    "nanochat": dict(rotary=True, qk_norm=True, norm="rms", norm_affine=False, mlp="relu2", bias=False,
                     softcap=15.0, emb_norm=True),
    "llama": dict(rotary=True, qk_norm=False, norm="rms", norm_affine=True, mlp="swiglu", bias=False,
                  softcap=0.0, emb_norm=False),
}


class Arch:
    """The architecture of one model: a preset with the command line's changes, and the sizes."""

    def __init__(self, args):
        for key, value in PRESETS[args.arch].items():
            setattr(self, key, value)
        if args.norm is not None:
            self.norm = args.norm
        if args.softcap is not None:
            self.softcap = args.softcap
        self.arch = args.arch
        self.n_head = args.n_head
        self.n_kv_head = args.n_kv_head if args.n_kv_head > 0 else args.n_head
        self.rope_theta = args.rope_theta
        self.tie = args.tie
        self.eps = args.eps
        self.mlp_hidden = args.mlp_hidden  # 0: read from the checkpoint (h.0.mlp.c_proj.weight)

    def separate_qkv(self):  # GPTConfig::separate_qkv
        return self.rotary or self.qk_norm or self.n_kv_head != self.n_head

    def describe(self):
        return (f"--arch {self.arch} (norm {self.norm}{'' if self.norm_affine else ' weightless'}, mlp {self.mlp}, "
                f"{'rotary' if self.rotary else 'learned positions'}{', QK-norm' if self.qk_norm else ''}, "
                f"{'tied' if self.tie else 'untied'})")


# ---------------------------------------------------------------------------------------------
# the model, one function per module of nn/model/gpt.h

def norm(kind, x, p, prefix, eps, affine=True):
    """LayerNorm (F.layer_norm) or RMSNorm written out, torch 1.13 having no F.rms_norm:
    x * rsqrt(mean(x^2) + eps) [* weight]. Without affine, no weight (nor bias)."""
    C = x.shape[-1]
    if kind == "layer":
        if not affine:
            return F.layer_norm(x, [C], None, None, eps)
        return F.layer_norm(x, [C], p[prefix + ".weight"], p[prefix + ".bias"], eps)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * p[prefix + ".weight"] if affine else y


def linear(x, p, prefix, bias=True):
    return F.linear(x, p[prefix + ".weight"], p[prefix + ".bias"] if bias else None)


def rotate_half(x):
    """[x1 | x2] -> [-x2 | x1], halves of the last dim (transformers' Llama)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x, theta):
    """rotary_embedding(x, 0, theta) of ops/rotary.h, x: [B, T, H, hs], in x's dtype."""
    B, T, H, hs = x.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=x.dtype, device=x.device) / hs))  # [hs/2]
    t = torch.arange(T, dtype=x.dtype, device=x.device)
    freqs = torch.outer(t, inv_freq)                                       # [T, hs/2]: the angles
    emb = torch.cat((freqs, freqs), dim=-1)                                # [T, hs]
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]    # broadcast over B, H
    return x * cos + rotate_half(x) * sin


def causal_attention(q, k, v):
    """causal_attention(q, k, v) of ops/attention.h, q: [B, T, NH, hs], k, v: [B, T, NKV, hs] ->
    [B, T, NH, hs]; query head h uses key/value head h // (NH / NKV). Written out: torch 1.13's
    scaled_dot_product_attention has no grouped-query heads."""
    B, T, NH, hs = q.shape
    group = NH // k.shape[2]
    q = q.transpose(1, 2)                                                 # [B, NH, T, hs]
    k = k.transpose(1, 2).repeat_interleave(group, dim=1)                 # [B, NH, T, hs]
    v = v.transpose(1, 2).repeat_interleave(group, dim=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))               # [B, NH, T, T]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)  # True above the diagonal
    att = att.masked_fill(mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    return (att @ v).transpose(1, 2)                                      # [B, T, NH, hs]


def attn(x, p, prefix, a):
    B, T, C = x.shape
    NH, NKV = a.n_head, a.n_kv_head
    hs = C // NH
    if not a.separate_qkv():
        qkv = linear(x, p, prefix + ".c_attn", a.bias)                    # [B, T, 3C]
        q, k, v = qkv.split(C, dim=2)                                     # [B, T, C] each
        q, k, v = (t.view(B, T, NH, hs) for t in (q, k, v))
    else:
        q = linear(x, p, prefix + ".c_q", a.bias).view(B, T, NH, hs)
        k = linear(x, p, prefix + ".c_k", a.bias).view(B, T, NKV, hs)
        v = linear(x, p, prefix + ".c_v", a.bias).view(B, T, NKV, hs)
        if a.rotary:
            q = rotary(q, a.rope_theta)
            k = rotary(k, a.rope_theta)
        if a.qk_norm:  # after the rotation, as nanochat; always an RMSNorm, over hs
            q = norm("rms", q, p, prefix + ".q_norm", a.eps, a.norm_affine)
            k = norm("rms", k, p, prefix + ".k_norm", a.eps, a.norm_affine)
    y = causal_attention(q, k, v).contiguous().view(B, T, C)              # heads concatenated
    return linear(y, p, prefix + ".c_proj", a.bias)


def mlp(x, p, prefix, a):
    h = linear(x, p, prefix + ".c_fc", a.bias)                            # [B, T, H] (SwiGLU: [B, T, 2H])
    if a.mlp == "gelu":
        h = F.gelu(h, approximate="tanh")
    elif a.mlp == "relu2":
        h = F.relu(h).square()
    else:
        gate, up = h.chunk(2, dim=-1)                                     # [gate | up]
        h = F.silu(gate) * up
    return linear(h, p, prefix + ".c_proj", a.bias)


def gpt_loss(p, idx, targets, a, n_layer):
    B, T = idx.shape
    x = p["wte.weight"][idx]                                              # [B, T, C]
    if not a.rotary:
        x = x + p["wpe.weight"][torch.arange(T, device=idx.device)]
    if a.emb_norm:
        x = norm(a.norm, x, p, "emb_norm", a.eps, a.norm_affine)
    for i in range(n_layer):
        h = f"h.{i}"
        x = x + attn(norm(a.norm, x, p, h + ".ln_1", a.eps, a.norm_affine), p, h + ".attn", a)
        x = x + mlp(norm(a.norm, x, p, h + ".ln_2", a.eps, a.norm_affine), p, h + ".mlp", a)
    x = norm(a.norm, x, p, "ln_f", a.eps, a.norm_affine)
    logits = F.linear(x, p["wte.weight"] if a.tie else p["lm_head.weight"])  # [B, T, V]
    if a.softcap > 0:
        logits = a.softcap * torch.tanh(logits / a.softcap)
    V = logits.shape[-1]
    return F.cross_entropy(logits.view(-1, V), targets.view(-1))


# ---------------------------------------------------------------------------------------------
# checks: the checkpoint must hold exactly the parameters of nn/model/gpt.h

def expected_shapes(a, n_layer, V, block_size, C, H):
    NH, NKV = a.n_head, a.n_kv_head
    hs = C // NH
    shapes = {"wte.weight": [V, C]}
    if not a.rotary:
        shapes["wpe.weight"] = [block_size, C]
    if not a.tie:
        shapes["lm_head.weight"] = [V, C]

    def add_norm(prefix, kind, n):
        if a.norm_affine:
            shapes[prefix + ".weight"] = [n]
            if kind == "layer":
                shapes[prefix + ".bias"] = [n]

    def add_linear(prefix, n_out, n_in):
        shapes[prefix + ".weight"] = [n_out, n_in]
        if a.bias:
            shapes[prefix + ".bias"] = [n_out]

    if a.emb_norm:
        add_norm("emb_norm", a.norm, C)
    for i in range(n_layer):
        h = f"h.{i}"
        add_norm(h + ".ln_1", a.norm, C)
        add_norm(h + ".ln_2", a.norm, C)
        if a.separate_qkv():
            add_linear(h + ".attn.c_q", NH * hs, C)
            add_linear(h + ".attn.c_k", NKV * hs, C)
            add_linear(h + ".attn.c_v", NKV * hs, C)
            if a.qk_norm:
                add_norm(h + ".attn.q_norm", "rms", hs)
                add_norm(h + ".attn.k_norm", "rms", hs)
        else:
            add_linear(h + ".attn.c_attn", 3 * C, C)
        add_linear(h + ".attn.c_proj", C, C)
        add_linear(h + ".mlp.c_fc", 2 * H if a.mlp == "swiglu" else H, C)
        add_linear(h + ".mlp.c_proj", C, H)
    add_norm("ln_f", a.norm, C)
    return shapes


def check_inputs(p, idx, targets, a):
    """Checks the checkpoint against the architecture and the batch against both; returns n_layer."""
    for name in ["wte.weight"] + ([] if a.rotary else ["wpe.weight"]):
        if name not in p:
            raise ScriptError(f"checkpoint: missing parameter {name} for {a.describe()}")
        if p[name].dim() != 2:
            raise ScriptError(f"checkpoint: {name} expected 2-D, got shape {list(p[name].shape)}")
    V, C = p["wte.weight"].shape
    block_size = None if a.rotary else p["wpe.weight"].shape[0]
    layers = {int(m.group(1)) for name in p for m in [re.match(r"h\.(\d+)\.", name)] if m}
    n_layer = len(layers)
    if layers != set(range(n_layer)):
        raise ScriptError(f"checkpoint: block indices {sorted(layers)} are not 0..{n_layer - 1}")
    if a.n_head < 1 or C % a.n_head != 0:
        raise ScriptError(f"--n-head {a.n_head} does not divide n_embd {C}")
    if a.n_kv_head < 1 or a.n_head % a.n_kv_head != 0:
        raise ScriptError(f"--n-kv-head {a.n_kv_head} does not divide --n-head {a.n_head}")
    if a.rotary and (C // a.n_head) % 2 != 0:
        raise ScriptError(f"rotary positions need an even head size, got {C // a.n_head}")
    H = a.mlp_hidden
    if H <= 0:  # the MLP's hidden width, from its down projection
        w = p.get("h.0.mlp.c_proj.weight")
        if w is None or w.dim() != 2:
            raise ScriptError("checkpoint: no 2-D h.0.mlp.c_proj.weight to read the MLP's hidden width from "
                              "(give --mlp-hidden)")
        H = w.shape[1]

    shapes = expected_shapes(a, n_layer, V, block_size, C, H)
    missing = sorted(set(shapes) - set(p))
    unexpected = sorted(set(p) - set(shapes))
    if missing:
        raise ScriptError(f"checkpoint: missing parameters for {a.describe()}: {', '.join(missing)}")
    if unexpected:
        raise ScriptError(f"checkpoint: unexpected parameters for {a.describe()}: {', '.join(unexpected)}")
    dtype = p["wte.weight"].dtype
    if dtype not in (torch.float32, torch.float64, torch.bfloat16):
        raise ScriptError(f"checkpoint: expected F32, F64 or BF16 parameters, got {TORCH_TO_ST.get(dtype, dtype)}")
    for name, shape in shapes.items():
        if list(p[name].shape) != shape or p[name].dtype != dtype:
            raise ScriptError(f"checkpoint: {name} expected {shape} {TORCH_TO_ST[dtype]}, "
                                 f"got {list(p[name].shape)} {TORCH_TO_ST.get(p[name].dtype, p[name].dtype)}")

    for name, t in (("idx", idx), ("targets", targets)):
        if t is None:
            raise ScriptError(f"batch: missing tensor {name}")
        if t.dtype != torch.int64 or t.dim() != 2:
            raise ScriptError(f"batch: {name} expected [B, T] I64, got {list(t.shape)} {t.dtype}")
    if idx.shape != targets.shape:
        raise ScriptError(f"batch: idx {list(idx.shape)} and targets {list(targets.shape)} differ in shape")
    T = idx.shape[1]
    if T < 1 or (block_size is not None and T > block_size):
        raise ScriptError(f"batch: sequence length {T} not in [1, block_size = {block_size}]")
    for name, t in (("idx", idx), ("targets", targets)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= V):
            raise ScriptError(f"batch: {name} has ids outside [0, {V})")
    return n_layer


def main():
    parser = argparse.ArgumentParser(description="PyTorch reference loss and gradients of a normtape GPT.")
    parser.add_argument("--checkpoint", required=True, help="parameters written by normtape's save_checkpoint")
    parser.add_argument("--batch", required=True, help='safetensors with "idx" and "targets", I64 [B, T]')
    parser.add_argument("--out", required=True, help='safetensors to write: "loss" and "grad.<name>"')
    parser.add_argument("--arch", default="gpt2", choices=sorted(PRESETS), help="gpt_config's preset (nn/model/gpt.h)")
    parser.add_argument("--norm", choices=["layer", "rms"], help="the norm kind, if not the preset's")
    parser.add_argument("--n-head", required=True, type=int)
    parser.add_argument("--n-kv-head", type=int, default=0, help="key/value heads (0: --n-head)")
    parser.add_argument("--eps", type=float, default=1e-5, help="every norm's eps")
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--softcap", type=float, help="the logit softcap (0: none), if not the preset's")
    parser.add_argument("--tie", action="store_true", help="lm_head.weight is wte.weight")
    parser.add_argument("--mlp-hidden", type=int, default=0, help="H (0: from h.0.mlp.c_proj.weight)")
    parser.add_argument("--adamw-steps", type=int, default=0, help="AdamW steps before the forward written")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--adam-eps", type=float, default=1e-8)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the model runs there; files stay on the host)")
    args = parser.parse_args()
    if args.adamw_steps < 0:
        raise ScriptError(f"--adamw-steps expected >= 0, got {args.adamw_steps}")
    if args.softcap is not None and not args.softcap >= 0:
        raise ScriptError(f"--softcap expected >= 0, got {args.softcap}")

    torch.set_num_threads(1)  # deterministic reductions; the model is tiny
    arch = Arch(args)
    params = load_safetensors(args.checkpoint)
    batch = load_safetensors(args.batch)
    idx, targets = batch.get("idx"), batch.get("targets")
    n_layer = check_inputs(params, idx, targets, arch)
    if args.device != "cpu" and not torch.cuda.is_available():
        raise ScriptError(f"--device {args.device}: torch sees no CUDA device")
    params = {name: t.to(args.device) for name, t in params.items()}
    idx, targets = idx.to(args.device), targets.to(args.device)

    for t in params.values():
        t.requires_grad_(True)
    losses = []
    if args.adamw_steps > 0:
        # One group, every parameter (a tied table once: it is one tensor of the checkpoint).
        optimizer = torch.optim.AdamW(list(params.values()), lr=args.lr, betas=(args.beta1, args.beta2),
                                      eps=args.adam_eps, weight_decay=args.weight_decay)
        for _ in range(args.adamw_steps):
            loss = gpt_loss(params, idx, targets, arch, n_layer)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())
    loss = gpt_loss(params, idx, targets, arch, n_layer)
    loss.backward()
    losses.append(loss.detach())

    out = {"loss": loss.detach()}
    if args.adamw_steps > 0:
        out["losses"] = torch.stack(losses)
    for name, t in params.items():
        if t.grad is None:
            raise ScriptError(f"parameter {name} got no gradient")
        out["grad." + name] = t.grad
        if args.adamw_steps > 0:
            out["param." + name] = t.detach()
    save_safetensors(args.out, out)


if __name__ == "__main__":
    try:
        main()
    except ScriptError as e:
        print(f"torch_reference.py: error: {e}", file=sys.stderr)
        sys.exit(1)
