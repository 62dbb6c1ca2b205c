// nn/formats/hf.h: Hugging Face checkpoints in and out: a directory that transformers' save_pretrained
// writes (config.json and model.safetensors) for LlamaForCausalLM or GPT2LMHeadModel, read into a
// GPT of the matching preset (nn/model/gpt.h gpt_config "llama" or "gpt2"), and a GPT of either preset
// written so that transformers' from_pretrained reads it (scripts/hf_fixtures.py check).
// Not here: normtape's own checkpoints (nn/formats/checkpoint.h), the safetensors format (nn/formats/safetensors.h),
// the tokenizer (nn/data/tokenizer.h: save_hf writes one's tokenizer.json when given it, load_hf
// reads none), sharded checkpoints (model.safetensors.index.json: refused), quantized weights.
//
// The layouts are transformers' (src/transformers/models/llama/modeling_llama.py,
// models/gpt2/modeling_gpt2.py; fixtures made by transformers 5.17, tests/fixtures/hf). With
// C = n_embd, V = vocab_size, H = mlp_hidden, NH heads, NKV key/value heads, hs = C / NH, N a layer:
//
//   Llama (LlamaForCausalLM, model_type "llama")       normtape (gpt_config("llama"))
//   model.embed_tokens.weight        [V, C]            wte.weight
//   model.layers.N.input_layernorm.weight   [C]        h.N.ln_1.weight
//   model.layers.N.self_attn.q_proj.weight  [NH hs, C] h.N.attn.c_q.weight
//   model.layers.N.self_attn.k_proj.weight  [NKV hs, C] h.N.attn.c_k.weight
//   model.layers.N.self_attn.v_proj.weight  [NKV hs, C] h.N.attn.c_v.weight
//   model.layers.N.self_attn.o_proj.weight  [C, C]     h.N.attn.c_proj.weight
//   model.layers.N.post_attention_layernorm.weight     h.N.ln_2.weight
//   model.layers.N.mlp.gate_proj.weight     [H, C]     h.N.mlp.c_fc.weight rows [0, H)   ([gate; up]:
//   model.layers.N.mlp.up_proj.weight       [H, C]     h.N.mlp.c_fc.weight rows [H, 2H)  swiglu's order)
//   model.layers.N.mlp.down_proj.weight     [C, H]     h.N.mlp.c_proj.weight
//   model.norm.weight                [C]               ln_f.weight
//   lm_head.weight                   [V, C]            lm_head.weight (absent when tied)
// Both use transformers' rotate_half rotary convention (ops/rotary.h), so q_proj and k_proj are
// taken as they are, with no permutation of their rows. load_hf skips the rotary frequencies
// model.layers.N.self_attn.rotary_emb.inv_freq that transformers saved before 4.31 (computed, not
// stored, here, as transformers itself ignores them).
//
//   GPT-2 (GPT2LMHeadModel, model_type "gpt2")         normtape (gpt_config("gpt2"))
//   transformer.wte.weight  [V, C], transformer.wpe.weight [block_size, C]: the same names;
//   transformer.h.N.ln_1 / ln_2 / ln_f weight and bias [C]: the same names;
//   transformer.h.N.attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj: weight and bias, the same
//     names, but each weight is a Conv1D's, stored [in, out] (c_attn [C, 3C], c_fc [C, H],
//     c_proj [C, C] and [H, C]): TRANSPOSED to and from our Linear's [out, in];
//   lm_head.weight [V, C]: tied to wte (transformers leaves it out of the file); untied
//     (tie_word_embeddings false) it is lm_head.weight.
// load_hf takes the keys with or without the "transformer." prefix (GPT2Model's files lack it)
// and skips the legacy buffers h.N.attn.bias and h.N.attn.masked_bias (the causal mask) that old
// files hold; save_hf writes the prefix, as save_pretrained does.
//
// config.json <-> GPTConfig:
//   Llama: vocab_size, hidden_size (n_embd), num_hidden_layers (n_layer), num_attention_heads
//     (n_head), num_key_value_heads (n_kv_head; absent: n_head), intermediate_size (mlp_hidden),
//     rms_norm_eps (norm_eps), max_position_embeddings (block_size), rope_theta (transformers 4)
//     or rope_parameters.rope_theta (transformers 5; default 10000), tie_word_embeddings (absent:
//     false). Required to be what normtape computes: rope_scaling and rope_parameters absent,
//     null, or objects whose rope_type (or type) is absent, null or "default" and that hold no
//     key but rope_type, type, rope_theta and partial_rotary_factor, and, with the type named
//     "default", original_max_position_embeddings and a factor of 1, which transformers ignores
//     then (null values count as absent; scaled rotary, as Llama 3.1's "llama3", or a "factor"
//     without a type, is refused); partial_rotary_factor, at the top level or in either object,
//     absent, null or 1; head_dim (if given) hidden_size / num_attention_heads; hidden_act "silu";
//     attention_bias and mlp_bias false.
//   GPT-2: vocab_size, n_embd, n_layer, n_head, n_positions (block_size), n_inner (mlp_hidden;
//     null: 4 n_embd), layer_norm_epsilon (norm_eps), tie_word_embeddings (absent: true).
//     Required: activation_function "gelu_new" or "gelu_pytorch_tanh" (both the tanh GELU,
//     normtape's), scale_attn_weights true (or absent), scale_attn_by_inverse_layer_idx false
//     (or absent).
//   The architecture is the first of "architectures" that is LlamaForCausalLM or
//   GPT2LMHeadModel, else model_type "llama" or "gpt2" when "architectures" is absent. Dropout
//   is not read (the model is built with dropout 0: what it computes is what transformers computes
//   in eval mode); torch_dtype / dtype is not read (the values are converted to `dtype`).
#pragma once

#include <memory>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "nn/model/gpt.h"

namespace normtape {

class Tokenizer;  // nn/data/tokenizer.h

// Reads dir/config.json and dir/model.safetensors (written by transformers' save_pretrained, or by
// save_hf) into a new GPT of gpt_config("llama") or gpt_config("gpt2") with the sizes the config
// gives (see above), its parameters on `device` in `dtype` (f32, f64 or bf16): every tensor of the
// file (F32, F64 or BF16; load_safetensors refuses F16) is converted with Tensor::to(dtype), on the
// host, then moved to `device`. The rest of the config is GPTConfig's defaults (SavePolicy::Input,
// dropout 0, recompute_activation on); the model is in training mode, as any new GPT.
// The file is read unverified when it carries no normtape checksums (transformers writes none;
// save_hf does, and they are then verified), without a warning. Every tensor is checked before
// the model is built (so that a forged config cannot make it allocate more than the file holds):
// every expected key with its expected shape, no key it does not expect (but the legacy buffers
// above) and, when the embeddings are tied, lm_head.weight only if it equals the embedding, bit
// for bit. Values are not checked (a NaN is loaded as it is). Peak host memory: the file's
// tensors plus one converted tensor, plus the model when `device` is the cpu.
// Throws, each message beginning "load_hf: " and naming the file (a value it quotes is cut to
// its first 80 characters): IOError when dir/config.json or dir/model.safetensors is missing or
// cannot be read (and for a directory that is missing); FormatError when config.json is not JSON
// or nests deeper than 64 levels, names another architecture, lacks a size or has one
// of the wrong type or out of range ([1, 2^24]; layers [1, 4096]; heads, hidden and intermediate
// sizes [1, 2^20]), asks for what normtape does not compute (scaled rotary, another activation,
// biases, a head_dim other than hidden / heads, a partial rotary factor), describes an invalid model (check_config's
// message), or when model.safetensors is not a valid safetensors file (its F16 tensors included),
// lacks an expected tensor, holds one it does not expect, or holds a tied lm_head.weight that
// differs from the embedding, and when dir holds a sharded checkpoint; ShapeError for a tensor of
// another shape than expected (expected and found, with the normtape parameter it feeds);
// DTypeError for a tensor of an integer dtype; DTypeError for a `dtype` that is not floating;
// DeviceError and OutOfMemoryError as the GPT constructor. Nothing is left allocated after a throw.
std::unique_ptr<GPT> load_hf(const std::string& dir, Device device = Device::CPU, DType dtype = DType::F32);

namespace detail {
// The GPTConfig of the config.json text `text` (read from `file`, which the messages name), as
// load_hf reads it (above): arch_name is "llama" or "gpt2", dtype and device GPTConfig's defaults.
// Throws FormatError as load_hf does for the config, and nothing else.
GPTConfig hf_config(const std::string& text, const std::string& file);
}  // namespace detail

// Writes `model` to dir/config.json and dir/model.safetensors (the directory and its parents are
// created if missing; the two files are replaced) so that transformers' from_pretrained(dir) reads
// it: a LlamaForCausalLM for a model of the llama preset (arch_name "llama": c_fc split into
// gate_proj and up_proj; lm_head.weight left out when tied), a GPT2LMHeadModel for the gpt2 preset
// (Conv1D weights transposed, keys under "transformer.", lm_head.weight left out when tied and
// written when not, with tie_word_embeddings saying which). config.json holds the sizes and
// constants above, the model's rope_theta under both "rope_theta" and "rope_parameters" (read by
// transformers 4 and 5), dropout (GPT-2's three pdrops; Llama's attention_dropout), and
// "torch_dtype" and "dtype" ("float32" or "bfloat16"). The parameters are written in the model's
// dtype, f32 or bf16; an f64 model is written as F32 ("float32"), which rounds its values:
// transformers runs these models in f32, bf16 or f16, and a config's dtype has no float64 in practice.
// model.safetensors carries the metadata "format": "pt" (transformers refuses a safetensors file
// with metadata but no such entry) and normtape's checksums; it is written atomically
// (save_safetensors), then config.json (through a temporary file renamed over it). The tokenizer
// files transformers reads (tokenizer.json, tokenizer_config.json, vocab.json, merges.txt,
// added_tokens.json, special_tokens_map.json, tokenizer.model) are then removed: they would
// describe another model's ids (a directory that load_hf read loses its tokenizer). With a
// `tokenizer` (the one the model's ids are of), dir/tokenizer.json (Tokenizer::save_tokenizer_json,
// written to a temporary before anything else) and dir/tokenizer_config.json (tokenizer_class
// PreTrainedTokenizerFast, model_max_length block_size) take their place, so that transformers'
// AutoTokenizer reads it as it is.
// Throws Error naming save_hf and why, writing nothing, for a model of another architecture
// (arch_name "nanochat" or "custom": a field of the gpt2 or llama preset changed, as another
// norm kind, weightless norms, QK-norm, a softcap) or a gpt2 model with grouped-query attention
// (n_kv_head other than n_head: GPT2LMHeadModel has none) or a tokenizer of more ids than the
// model's vocabulary, and Error naming save_hf, having written nothing but the directory, for a
// tokenizer that save_tokenizer_json refuses; IOError naming save_hf and the path when the
// directory cannot be created or a file cannot be written or removed.
void save_hf(const GPT& model, const std::string& dir, const Tokenizer* tokenizer = nullptr);

}  // namespace normtape
