// nn/formats/hf.cpp: Hugging Face checkpoints (config.json + model.safetensors) of LlamaForCausalLM and
// GPT2LMHeadModel, read into a GPT and written from one. The key mapping, the layouts and the
// config fields are listed in nn/formats/hf.h. Not here: the safetensors format (nn/formats/safetensors.cpp).
#include "nn/formats/hf.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/device_ptr.h"
#include "nn/data/tokenizer.h"
#include "nn/formats/safetensors.h"

namespace normtape {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

enum class Arch { Llama, GPT2 };
const char* class_name(Arch a) { return a == Arch::Llama ? "LlamaForCausalLM" : "GPT2LMHeadModel"; }

// How a tensor of the file holds a parameter (nn/formats/hf.h): as it is, transposed (GPT-2's Conv1D,
// [in, out]), or as the first or second half of its rows (Llama's gate_proj and up_proj, the two
// halves of c_fc: [gate; up]).
enum class Layout { Same, Transposed, FirstRows, SecondRows };

struct HfTensor {
    std::string key;    // in the file
    Shape shape;        // in the file
    std::string param;  // the GPT's named_parameters() name
    Shape param_shape;
    Layout layout;
};

// The file's tensors of a model of config `c` (the tables of nn/formats/hf.h), computed from the sizes
// alone, so that load_hf checks the file before it builds the model; in named_parameters() order
// (a tied lm_head is wte's, listed once). `prefix`: GPT-2's "transformer." or "".
std::vector<HfTensor> hf_tensors(const GPTConfig& c, Arch arch, const std::string& prefix) {
    const int64_t C = c.n_embd, V = c.vocab_size, H = c.hidden(), KV = c.kv_heads() * (C / c.n_head);
    std::vector<HfTensor> out;
    auto same = [&](const std::string& key, const std::string& param, const Shape& shape) {
        out.push_back({key, shape, param, shape, Layout::Same});
    };
    if (arch == Arch::GPT2) {
        // Conv1D: the file holds [in, out], the Linear [out, in].
        auto conv1d = [&](const std::string& name, int64_t in, int64_t outs) {
            out.push_back({prefix + name + ".weight", {in, outs}, name + ".weight", {outs, in}, Layout::Transposed});
            same(prefix + name + ".bias", name + ".bias", {outs});
        };
        auto layer_norm = [&](const std::string& name) {
            same(prefix + name + ".weight", name + ".weight", {C});
            same(prefix + name + ".bias", name + ".bias", {C});
        };
        same(prefix + "wte.weight", "wte.weight", {V, C});
        same(prefix + "wpe.weight", "wpe.weight", {c.block_size, C});
        for (int64_t l = 0; l < c.n_layer; ++l) {
            const std::string h = "h." + std::to_string(l) + ".";
            layer_norm(h + "ln_1");
            conv1d(h + "attn.c_attn", C, 3 * C);
            conv1d(h + "attn.c_proj", C, C);
            layer_norm(h + "ln_2");
            conv1d(h + "mlp.c_fc", C, H);
            conv1d(h + "mlp.c_proj", H, C);
        }
        layer_norm("ln_f");
    } else {
        same("model.embed_tokens.weight", "wte.weight", {V, C});
        for (int64_t l = 0; l < c.n_layer; ++l) {
            const std::string h = "h." + std::to_string(l) + ".", m = "model.layers." + std::to_string(l) + ".";
            same(m + "input_layernorm.weight", h + "ln_1.weight", {C});
            same(m + "self_attn.q_proj.weight", h + "attn.c_q.weight", {C, C});
            same(m + "self_attn.k_proj.weight", h + "attn.c_k.weight", {KV, C});
            same(m + "self_attn.v_proj.weight", h + "attn.c_v.weight", {KV, C});
            same(m + "self_attn.o_proj.weight", h + "attn.c_proj.weight", {C, C});
            same(m + "post_attention_layernorm.weight", h + "ln_2.weight", {C});
            // c_fc is [gate; up]: swiglu gates with the first half of its output.
            out.push_back({m + "mlp.gate_proj.weight", {H, C}, h + "mlp.c_fc.weight", {2 * H, C}, Layout::FirstRows});
            out.push_back({m + "mlp.up_proj.weight", {H, C}, h + "mlp.c_fc.weight", {2 * H, C}, Layout::SecondRows});
            same(m + "mlp.down_proj.weight", h + "mlp.c_proj.weight", {C, H});
        }
        same("model.norm.weight", "ln_f.weight", {C});
    }
    if (!c.tie_embeddings) same("lm_head.weight", "lm_head.weight", {V, C});
    return out;
}

// The parameters of `model` by name, checked against `entries` (hf_tensors of its config): the
// same names and shapes, or Error naming `who` (a GPT whose modules changed without this file).
std::map<std::string, Tensor> checked_parameters(const GPT& model, const std::vector<HfTensor>& entries,
                                                 const char* who) {
    std::map<std::string, Tensor> params;
    for (const auto& [name, p] : model.named_parameters()) params.emplace(name, p);
    std::set<std::string> covered;
    for (const HfTensor& e : entries) {
        auto it = params.find(e.param);
        NT_CHECK(it != params.end() && it->second.shape() == e.param_shape, who, ": the model has ",
                 it == params.end() ? "no parameter " + e.param
                                    : "parameter " + e.param + " of shape " + shape_str(it->second.shape()),
                 ", where nn/formats/hf.cpp's mapping expects ", e.param, " ", shape_str(e.param_shape), " (for ", e.key, ")");
        covered.insert(e.param);
    }
    for (const auto& [name, p] : params)
        NT_CHECK(covered.count(name), who, ": the model's parameter ", name, " has no ",
                 "Hugging Face tensor in nn/formats/hf.cpp's mapping");
    return params;
}

// ---------------------------------------------------------------- load_hf

std::string read_text(const std::string& path, const char* who) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
        detail::throw_error<IOError>(who, ": ", path, ": ",
                                     fs::exists(path, ec) ? "not a regular file" : "no such file");
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f || f.bad()) detail::throw_error<IOError>(who, ": ", path, ": cannot read the file");
    return ss.str();
}

// The buffers that older transformers saved with the weights and that transformers itself
// ignores on load: GPT-2's causal mask, "[prefix]h.N.attn.bias" and "[prefix]h.N.attn.masked_bias",
// and Llama's rotary frequencies, "model.layers.N.self_attn.rotary_emb.inv_freq" (computed, not
// stored, by normtape: ops/rotary.h).
bool legacy_buffer(const std::string& key, Arch arch, const std::string& prefix) {
    const std::string layers = arch == Arch::GPT2 ? prefix + "h." : "model.layers.";
    if (key.rfind(layers, 0) != 0) return false;
    const size_t start = layers.size(), dot = key.find('.', start);
    if (dot == std::string::npos || dot == start) return false;
    for (size_t i = start; i < dot; ++i)
        if (key[i] < '0' || key[i] > '9') return false;
    const std::string rest = key.substr(dot);
    if (arch == Arch::Llama) return rest == ".self_attn.rotary_emb.inv_freq";
    return rest == ".attn.bias" || rest == ".attn.masked_bias";
}

bool same_bytes(const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && a.dtype() == b.dtype() &&
           std::memcmp(detail::byte_ptr(a), detail::byte_ptr(b), static_cast<size_t>(a.nbytes())) == 0;
}

}  // namespace

std::unique_ptr<GPT> load_hf(const std::string& dir, Device device, DType dtype) {
    NT_CHECK_AS(DTypeError, is_floating(dtype), "load_hf: expected a floating dtype (f32, f64 or bf16), got ",
                dtype_name(dtype));
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        detail::throw_error<IOError>("load_hf: ", dir, ": ",
                                     fs::exists(dir, ec) ? "not a directory" : "no such directory",
                                     " (expected a Hugging Face model directory: config.json, model.safetensors)");
    const std::string config_path = (fs::path(dir) / "config.json").string();
    const std::string model_path = (fs::path(dir) / "model.safetensors").string();

    GPTConfig config = detail::hf_config(read_text(config_path, "load_hf"), config_path);
    const Arch arch = arch_name(config) == "llama" ? Arch::Llama : Arch::GPT2;
    config.dtype = dtype;
    config.device = device;

    if (!fs::exists(model_path, ec) && fs::exists(fs::path(dir) / "model.safetensors.index.json", ec))
        detail::throw_error<FormatError>(
            "load_hf: ", dir,
            ": holds a sharded checkpoint (model.safetensors.index.json), which load_hf does "
            "not read: expected one model.safetensors");
    NamedTensors file;
    try {
        file = load_safetensors(model_path);  // unverified when it has no checksums: normal for transformers' files
    } catch (const IOError& e) {
        detail::throw_error<IOError>("load_hf: ", e.what());
    } catch (const FormatError& e) {
        detail::throw_error<FormatError>("load_hf: ", e.what());
    }
    std::map<std::string, Tensor> by_key(file.begin(), file.end());
    file.clear();

    // GPT-2's keys are under "transformer." in GPT2LMHeadModel's files, at the top in GPT2Model's.
    const std::string prefix = arch == Arch::GPT2 && by_key.count("transformer.wte.weight") ? "transformer." : "";
    // Every tensor is checked before the model is built: its parameters are then exactly the
    // file's expected values, so a config cannot make it allocate more than the file holds.
    const std::vector<HfTensor> entries = hf_tensors(config, arch, prefix);
    std::set<std::string> used;
    for (const HfTensor& e : entries) {
        auto it = by_key.find(e.key);
        NT_CHECK_AS(
            FormatError, it != by_key.end(), "load_hf: ", model_path, ": missing tensor ", e.key, " ",
            shape_str(e.shape), " (normtape's ", e.param, ")",
            e.key == "lm_head.weight" ? " (config.json's tie_word_embeddings is false: an untied lm_head)" : "");
        const Tensor& t = it->second;
        NT_CHECK_AS(DTypeError, is_floating(t.dtype()), "load_hf: ", model_path, ": tensor ", e.key, " is ",
                    dtype_name(t.dtype()), ", expected a floating dtype (F32, F64 or BF16)");
        NT_CHECK_AS(ShapeError, t.shape() == e.shape, "load_hf: ", model_path, ": tensor ", e.key, " expected ",
                    shape_str(e.shape), ", got ", shape_str(t.shape()), " (normtape's ", e.param, " ",
                    shape_str(e.param_shape), ")");
        used.insert(e.key);
    }
    const std::string embedding = arch == Arch::Llama ? "model.embed_tokens.weight" : prefix + "wte.weight";
    for (const auto& [key, t] : by_key) {
        if (used.count(key) || legacy_buffer(key, arch, prefix)) continue;
        if (key == "lm_head.weight" && config.tie_embeddings) {
            // A tied head that a writer stored anyway: it must be the embedding.
            NT_CHECK_AS(FormatError, same_bytes(t, by_key.at(embedding)), "load_hf: ", model_path,
                        ": lm_head.weight differs from ", embedding,
                        ", but config.json ties them (tie_word_embeddings)");
            continue;
        }
        detail::throw_error<FormatError>("load_hf: ", model_path, ": unexpected tensor ", key, " ",
                                         shape_str(t.shape()), " (a ", class_name(arch), " of ", config_path,
                                         " has no such weight)");
    }

    auto model = std::make_unique<GPT>(config);
    std::map<std::string, Tensor> params = checked_parameters(*model, entries, "load_hf");
    NoGradGuard no_grad;
    for (const HfTensor& e : entries) {
        Tensor src = by_key.at(e.key);
        if (e.layout == Layout::Transposed) src = src.transpose(0, 1).contiguous();
        if (src.dtype() != dtype) src = src.to(dtype);
        if (src.device() != device) src = src.to(device);
        Tensor dst = params.at(e.param);
        if (e.layout == Layout::FirstRows) dst = dst.narrow(0, 0, e.shape[0]);
        if (e.layout == Layout::SecondRows) dst = dst.narrow(0, e.shape[0], e.shape[0]);
        dst.copy_(src);
    }
    return model;
}

// ---------------------------------------------------------------- save_hf

namespace {

// What makes a config another architecture than the gpt2 and llama presets, for save_hf's message.
std::string architecture_fields(const GPTConfig& c) {
    std::ostringstream ss;
    ss << "positions " << pos_embedding_name(c.pos_embedding) << ", norm "
       << (c.norm == NormKind::Layer ? "layer" : "rms") << (c.norm_affine ? "" : " without weights") << ", mlp "
       << mlp_kind_name(c.mlp) << ", bias " << (c.bias ? "on" : "off") << ", qk_norm " << (c.qk_norm ? "on" : "off")
       << ", embedding_norm " << (c.embedding_norm ? "on" : "off") << ", logit_softcap " << c.logit_softcap;
    return ss.str();
}

const char* hf_dtype_name(DType d) { return d == DType::BF16 ? "bfloat16" : "float32"; }

json llama_json(const GPTConfig& c) {
    json j;
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.n_embd;
    j["intermediate_size"] = c.hidden();
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.kv_heads();
    j["head_dim"] = c.n_embd / c.n_head;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.block_size;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;  // transformers 4
    j["rope_parameters"] = {{"rope_theta", c.rope_theta}, {"rope_type", "default"}};  // transformers 5
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["attention_dropout"] = c.dropout;
    j["tie_word_embeddings"] = c.tie_embeddings;
    return j;
}

json gpt2_json(const GPTConfig& c) {
    json j;
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.block_size;
    j["n_embd"] = c.n_embd;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.hidden() == 4 * c.n_embd ? json() : json(c.hidden());
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_eps;
    // nanoGPT's dropouts are where GPT-2's are: on the embeddings, the attention probabilities and
    // each residual projection.
    j["embd_pdrop"] = c.dropout;
    j["attn_pdrop"] = c.dropout;
    j["resid_pdrop"] = c.dropout;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["tie_word_embeddings"] = c.tie_embeddings;
    return j;
}

}  // namespace

void save_hf(const GPT& model, const std::string& dir, const Tokenizer* tokenizer) {
    const GPTConfig& c = model.config();
    const std::string name = arch_name(c);
    NT_CHECK(
        name == "gpt2" || name == "llama", "save_hf: expected a model of the gpt2 or llama preset (gpt_config), got ",
        name == "nanochat" ? "nanochat's architecture (QK-norm, weightless RMSNorm, ReLU^2, a logit softcap), which "
                             "no transformers class computes"
                           : "a custom architecture (" + architecture_fields(c) + ")",
        ": Hugging Face's LlamaForCausalLM and GPT2LMHeadModel hold only those");
    const Arch arch = name == "llama" ? Arch::Llama : Arch::GPT2;
    NT_CHECK(arch == Arch::Llama || c.kv_heads() == c.n_head,
             "save_hf: expected a gpt2 model with n_kv_head = n_head (", c.n_head, "), got ", c.kv_heads(),
             " key/value heads: GPT2LMHeadModel has no grouped-query attention");
    NT_CHECK(!tokenizer || tokenizer->vocab_size() <= c.vocab_size, "save_hf: the tokenizer ", tokenizer->name(),
             " has ", tokenizer->vocab_size(), " ids, more than the model's vocabulary of ", c.vocab_size);
    const DType dtype = c.dtype == DType::BF16 ? DType::BF16 : DType::F32;  // f64 is written as f32 (nn/formats/hf.h)

    NamedTensors tensors;
    {
        NoGradGuard no_grad;
        const std::vector<HfTensor> entries = hf_tensors(c, arch, arch == Arch::GPT2 ? "transformer." : "");
        std::map<std::string, Tensor> params = checked_parameters(model, entries, "save_hf");
        for (const HfTensor& e : entries) {
            Tensor t = params.at(e.param).detach();
            if (t.device() != Device::CPU) t = t.to(Device::CPU);
            if (e.layout == Layout::Transposed) t = t.transpose(0, 1).contiguous();
            if (e.layout == Layout::FirstRows) t = t.narrow(0, 0, e.shape[0]);
            if (e.layout == Layout::SecondRows) t = t.narrow(0, e.shape[0], e.shape[0]);
            tensors.emplace_back(e.key, t.dtype() == dtype ? t.contiguous() : t.to(dtype));
        }
    }
    json config = arch == Arch::Llama ? llama_json(c) : gpt2_json(c);
    config["torch_dtype"] = hf_dtype_name(dtype);  // transformers 4
    config["dtype"] = hf_dtype_name(dtype);        // transformers 5

    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir, ec))
        detail::throw_error<IOError>("save_hf: cannot create the directory ", dir, ": ",
                                     ec ? ec.message() : "a file of that name exists");
    const fs::path d(dir);
    // The tokenizer's tokenizer.json goes to a temporary first: its Error (a special token that is
    // not UTF-8) leaves the model unwritten.
    const std::string tokenizer_tmp = (d / "tokenizer.json.tmp").string();
    try {
        if (tokenizer) tokenizer->save_tokenizer_json(tokenizer_tmp);
    } catch (const IOError& e) {
        fs::remove(tokenizer_tmp, ec);
        detail::throw_error<IOError>("save_hf: ", e.what());
    } catch (const Error& e) {  // nothing was written
        detail::throw_error<Error>("save_hf: ", e.what());
    }
    try {
        // transformers refuses a safetensors file whose metadata has no "format" of "pt".
        save_safetensors((d / "model.safetensors").string(), tensors, {{"format", "pt"}});
    } catch (const IOError& e) {
        fs::remove(tokenizer_tmp, ec);
        detail::throw_error<IOError>("save_hf: ", e.what());
    }
    // A file replaced by a temporary renamed over it.
    auto replace = [&](const fs::path& path, const std::string& tmp) {
        fs::rename(tmp, path, ec);
        if (ec) {
            std::error_code ignored;
            fs::remove(tmp, ignored);
            detail::throw_error<IOError>("save_hf: cannot rename ", tmp, " to ", path.string(), ": ", ec.message());
        }
    };
    auto write = [&](const fs::path& path, const json& j) {
        const std::string tmp = path.string() + ".tmp";
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << j.dump(2) << "\n";
        f.close();
        if (!f) {
            fs::remove(tmp, ec);
            detail::throw_error<IOError>("save_hf: cannot write ", tmp);
        }
        replace(path, tmp);
    };
    write(d / "config.json", config);
    // The tokenizer files transformers reads are removed: they would describe another model's ids.
    // Then the tokenizer's tokenizer.json and tokenizer_config.json, naming the class that reads
    // tokenizer.json as it is.
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "added_tokens.json",
                             "special_tokens_map.json", "tokenizer.model"})
        if (fs::remove(d / name, ec); ec)
            detail::throw_error<IOError>("save_hf: cannot remove ", (d / name).string(), ", left from before: ",
                                         ec.message());
    if (tokenizer) {
        replace(d / "tokenizer.json", tokenizer_tmp);
        write(d / "tokenizer_config.json", json{{"tokenizer_class", "PreTrainedTokenizerFast"},
                                                {"model_max_length", c.block_size},
                                                {"clean_up_tokenization_spaces", false}});
    }
}

}  // namespace normtape
