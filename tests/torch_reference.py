#!/usr/bin/python3
"""tests/torch_reference.py: the PyTorch side of tests/test_torch.cpp.

Rebuilds normtape's GPT (nn/gpt.h) purely functionally from a checkpoint written by
save_checkpoint, runs one forward and backward on a batch with PyTorch autograd, and writes the
loss and every parameter's gradient. No nn.Module is built: each line below mirrors one line of
nn/gpt.cpp, so a mismatch points at an op of normtape, not at a model definition.

Dimensions (nn/gpt.h): B batch, T sequence length, C n_embd, NH heads, hs = C / NH, L layers,
V vocabulary size.

    x = wte[idx] + wpe[0..T-1]                      [B, T, C]
    for each block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
    logits = ln_f(x) @ lm_head.weight^T             [B, T, V]
    loss = cross_entropy(logits.view(-1, V), targets.view(-1))

Files are safetensors (huggingface/safetensors), read and written here with the standard
library: 8 bytes little-endian header length n, n bytes of JSON, then raw little-endian data.

Usage:
    /usr/bin/python3 tests/torch_reference.py --checkpoint ckpt.safetensors \
        --batch batch.safetensors --out grads.safetensors --norm layer|rms --n-head 2 [--eps 1e-5]

Writes "loss" (0-dim) and "grad.<name>" for every parameter, in the checkpoint's dtype.
Exits with status 1 and a message on stderr on any error.

Needs torch (Debian's python3-torch 1.13, which has no F.rms_norm) and numpy; nothing else.
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
# the model, one function per module of nn/gpt.h

def norm(kind, x, p, prefix, eps):
    """LayerNorm (F.layer_norm) or RMSNorm written out: torch 1.13 has no F.rms_norm."""
    C = x.shape[-1]
    if kind == "layer":
        return F.layer_norm(x, [C], p[prefix + ".weight"], p[prefix + ".bias"], eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * p[prefix + ".weight"]


def linear(x, p, prefix, bias=True):
    return F.linear(x, p[prefix + ".weight"], p[prefix + ".bias"] if bias else None)


def attn(x, p, prefix, n_head):
    B, T, C = x.shape
    hs = C // n_head
    qkv = linear(x, p, prefix + ".c_attn")                                # [B, T, 3C]
    q, k, v = qkv.split(C, dim=2)                                         # [B, T, C] each
    q = q.view(B, T, n_head, hs).transpose(1, 2)                          # [B, NH, T, hs]
    k = k.view(B, T, n_head, hs).transpose(1, 2)
    v = v.view(B, T, n_head, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))               # [B, NH, T, T]
    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)  # True above the diagonal
    att = att.masked_fill(mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)              # heads concatenated
    return linear(y, p, prefix + ".c_proj")


def mlp(x, p, prefix):
    return linear(F.gelu(linear(x, p, prefix + ".c_fc"), approximate="tanh"), p, prefix + ".c_proj")


def gpt_loss(p, idx, targets, kind, n_head, n_layer, eps):
    B, T = idx.shape
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]           # [B, T, C]
    for i in range(n_layer):
        h = f"h.{i}"
        x = x + attn(norm(kind, x, p, h + ".ln_1", eps), p, h + ".attn", n_head)
        x = x + mlp(norm(kind, x, p, h + ".ln_2", eps), p, h + ".mlp")
    logits = linear(norm(kind, x, p, "ln_f", eps), p, "lm_head", bias=False)  # [B, T, V]
    V = logits.shape[-1]
    return F.cross_entropy(logits.view(-1, V), targets.view(-1))


# ---------------------------------------------------------------------------------------------
# checks: the checkpoint must hold exactly the parameters of nn/gpt.h

def expected_shapes(kind, n_layer, V, block_size, C):
    shapes = {"wte.weight": [V, C], "wpe.weight": [block_size, C], "lm_head.weight": [V, C]}
    norms = [f"h.{i}.{ln}" for i in range(n_layer) for ln in ("ln_1", "ln_2")] + ["ln_f"]
    for prefix in norms:
        shapes[prefix + ".weight"] = [C]
        if kind == "layer":
            shapes[prefix + ".bias"] = [C]
    for i in range(n_layer):
        for prefix, n_out, n_in in ((f"h.{i}.attn.c_attn", 3 * C, C), (f"h.{i}.attn.c_proj", C, C),
                                    (f"h.{i}.mlp.c_fc", 4 * C, C), (f"h.{i}.mlp.c_proj", C, 4 * C)):
            shapes[prefix + ".weight"] = [n_out, n_in]
            shapes[prefix + ".bias"] = [n_out]
    return shapes


def check_inputs(p, idx, targets, kind, n_head):
    for name in ("wte.weight", "wpe.weight", "lm_head.weight"):
        if name not in p:
            raise ScriptError(f"checkpoint: missing parameter {name}")
        if p[name].dim() != 2:
            raise ScriptError(f"checkpoint: {name} expected 2-D, got shape {list(p[name].shape)}")
    V, C = p["wte.weight"].shape
    block_size = p["wpe.weight"].shape[0]
    layers = {int(m.group(1)) for name in p for m in [re.match(r"h\.(\d+)\.", name)] if m}
    n_layer = len(layers)
    if layers != set(range(n_layer)):
        raise ScriptError(f"checkpoint: block indices {sorted(layers)} are not 0..{n_layer - 1}")
    if n_head < 1 or C % n_head != 0:
        raise ScriptError(f"--n-head {n_head} does not divide n_embd {C}")

    shapes = expected_shapes(kind, n_layer, V, block_size, C)
    missing = sorted(set(shapes) - set(p))
    unexpected = sorted(set(p) - set(shapes))
    if missing:
        raise ScriptError(f"checkpoint: missing parameters for --norm {kind}: {', '.join(missing)}")
    if unexpected:
        raise ScriptError(f"checkpoint: unexpected parameters for --norm {kind}: {', '.join(unexpected)}")
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
    if not 1 <= T <= block_size:
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
    parser.add_argument("--norm", required=True, choices=["layer", "rms"])
    parser.add_argument("--n-head", required=True, type=int)
    parser.add_argument("--eps", type=float, default=1e-5)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the model runs there; files stay on the host)")
    args = parser.parse_args()

    torch.set_num_threads(1)  # deterministic reductions; the model is tiny
    params = load_safetensors(args.checkpoint)
    batch = load_safetensors(args.batch)
    idx, targets = batch.get("idx"), batch.get("targets")
    n_layer = check_inputs(params, idx, targets, args.norm, args.n_head)
    if args.device != "cpu" and not torch.cuda.is_available():
        raise ScriptError(f"--device {args.device}: torch sees no CUDA device")
    params = {name: t.to(args.device) for name, t in params.items()}
    idx, targets = idx.to(args.device), targets.to(args.device)

    for t in params.values():
        t.requires_grad_(True)
    loss = gpt_loss(params, idx, targets, args.norm, args.n_head, n_layer, args.eps)
    loss.backward()

    out = {"loss": loss.detach()}
    for name, t in params.items():
        if t.grad is None:
            raise ScriptError(f"parameter {name} got no gradient")
        out["grad." + name] = t.grad
    save_safetensors(args.out, out)


if __name__ == "__main__":
    try:
        main()
    except ScriptError as e:
        print(f"torch_reference.py: error: {e}", file=sys.stderr)
        sys.exit(1)
