#!/usr/bin/env python3
"""scripts/hf_fixtures.py: the Hugging Face fixtures of normtape's import test, and the check of
its export. Needs torch and transformers (the GPU machine has both; CI does not run this).

  scripts/hf_fixtures.py make OUT     writes OUT/llama and OUT/gpt2: a tiny LlamaForCausalLM and
                                      GPT2LMHeadModel with random weights (save_pretrained:
                                      config.json, model.safetensors) and expected.safetensors,
                                      the input_ids [2, 12] and the f32 logits transformers computes
                                      for them. tests/fixtures/hf holds what it wrote.
  scripts/hf_fixtures.py check DIR    loads DIR (a model normtape wrote with save_hf) with
                                      transformers and compares its logits for DIR/expected's
                                      input_ids with DIR/expected's logits (normtape's); prints
                                      the relative error and exits 1 above 1e-5. With a
                                      DIR/tokenizer.json, AutoTokenizer reads the directory too,
                                      and its ids of DIR/expected_text.txt must be DIR/expected's
                                      text_ids (normtape's) and decode back to the text.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB, WIDTH, LAYERS, HEADS, T = 64, 64, 2, 4, 12


def perturb(model, seed):
    # transformers initializes norms to ones and biases to zeros, and its N(0, 0.02) weights give
    # nearly uniform logits: every parameter moves, so that each one's import is tested.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def write(model, out, seed):
    os.makedirs(out, exist_ok=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, T), generator=g)
    with torch.no_grad():
        logits = model(ids).logits.float()
    save_file({"input_ids": ids.contiguous(), "logits": logits.contiguous()}, os.path.join(out, "expected.safetensors"))
    for name in os.listdir(out):
        if name not in ("config.json", "model.safetensors", "expected.safetensors"):
            os.remove(os.path.join(out, name))  # generation_config.json: not needed


def make(out):
    torch.manual_seed(1)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=160, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        initializer_range=0.2, torch_dtype="float32"))
    perturb(llama, 2)
    write(llama, os.path.join(out, "llama"), 3)
    torch.manual_seed(4)
    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, activation_function="gelu_new",
        initializer_range=0.2))
    perturb(gpt2, 5)
    write(gpt2, os.path.join(out, "gpt2"), 6)
    print(json.dumps({"written": [os.path.join(out, "llama"), os.path.join(out, "gpt2")]}))


def check(d):
    expected = load_file(os.path.join(d, "expected.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits.float()
    err = ((logits - expected["logits"]).norm() / expected["logits"].norm()).item()
    result = {"dir": d, "architecture": type(model).__name__, "relative_error": err}
    same_ids = True
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        tokenizer = AutoTokenizer.from_pretrained(d)
        with open(os.path.join(d, "expected_text.txt"), encoding="utf-8", newline="") as f:
            text = f.read()
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        same_ids = ids == expected["text_ids"].tolist() and tokenizer.decode(ids) == text
        result.update(tokenizer=type(tokenizer).__name__, same_ids=same_ids)
    print(json.dumps(result))
    return 0 if err <= 1e-5 and same_ids else 1


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit(__doc__)
    sys.exit(make(sys.argv[2]) if sys.argv[1] == "make" else check(sys.argv[2]))
