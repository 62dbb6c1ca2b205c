// nn/formats/hf_config.cpp: a transformers config.json read into a GPTConfig (detail::hf_config, nn/formats/hf.h),
// with the checks of nn/formats/hf.h. Not here: the tensors of model.safetensors and their mapping onto
// the GPT's parameters (nn/formats/hf.cpp).
#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "nn/formats/hf.h"
#include "nn/formats/json_read.h"

namespace normtape {

namespace {

using json = nlohmann::json;

// The largest sizes a config may give, so that every shape computed from them (hf_tensors,
// nn/formats/hf.cpp) and its element count stay far below 2^63.
constexpr int64_t kMaxCount = int64_t{1} << 24;  // vocab_size, block_size
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // hidden and intermediate sizes, heads
constexpr int64_t kMaxLayers = 4096;

// The fields of config.json, read with the checks of nn/formats/hf.h; each error names load_hf and the file.
struct ConfigReader {
    const json& j;
    std::string file;

    // The value of `key`, or null when it is absent (transformers writes null for "the default").
    json get(const char* key) const { return j.contains(key) ? j.at(key) : json(); }
    [[noreturn]] void fail(const std::string& what) const {
        detail::throw_error<FormatError>("load_hf: ", file, ": ", what);
    }
    // An integer in [1, hi]; `fallback` when absent or null (-1: required).
    int64_t size(const char* key, int64_t hi, int64_t fallback = -1) const {
        const json v = get(key);
        if (v.is_null()) {
            if (fallback < 0)
                fail(std::string("missing \"") + key + "\" (expected an integer from 1 to " + std::to_string(hi) + ")");
            return fallback;
        }
        // An integer of 2^63 or more is unsigned in the JSON: compared as such, it cannot wrap.
        const bool in_range = v.is_number_unsigned()
                                  ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                              : v.is_number_integer() ? v.get<int64_t>() >= 1 && v.get<int64_t>() <= hi
                                                      : false;
        if (!in_range)
            fail(std::string(key) + " " + detail::json_excerpt(v) + ": expected an integer from 1 to " + std::to_string(hi));
        return v.get<int64_t>();
    }
    // A finite number > 0; `fallback` when absent or null (<= 0: required).
    double positive(const char* key, double fallback = 0.0) const { return positive(get(key), key, fallback); }
    double positive(const json& v, const std::string& key, double fallback) const {
        if (v.is_null()) {
            if (fallback <= 0) fail("missing \"" + key + "\" (expected a number > 0)");
            return fallback;
        }
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
            fail(key + " " + detail::json_excerpt(v) + ": expected a finite number > 0");
        return v.get<double>();
    }
    bool flag(const char* key, bool fallback) const {
        const json v = get(key);
        if (v.is_null()) return fallback;
        if (!v.is_boolean()) fail(std::string(key) + " " + detail::json_excerpt(v) + ": expected true or false");
        return v.get<bool>();
    }
    // `key` must be absent, null or `want` (a boolean or a string): what normtape computes.
    void require(const char* key, const json& want, const std::string& why) const {
        const json v = get(key);
        if (!v.is_null() && v != want)
            fail(std::string(key) + " " + detail::json_excerpt(v) + ": expected " + detail::json_excerpt(want) + " (" + why + ")");
    }
};

// The rotary base, refusing a scaled or partial rotary embedding: transformers 4's "rope_theta",
// "partial_rotary_factor" and "rope_scaling", transformers 5's "rope_parameters" {"rope_theta",
// "rope_type", "partial_rotary_factor"}. A rope object's null values are absent ones. It may name
// the type "default" (or none) and carry rope_theta and partial_rotary_factor 1; with the type
// named "default", also what transformers ignores then (original_max_position_embeddings, a factor
// of 1). Any other key ("factor", "low_freq_factor", ...) belongs to a scaling that normtape does
// not compute, and so does any key but those without a type.
double llama_rope_theta(const ConfigReader& r) {
    const auto check_partial = [&](const json& v, const std::string& key) {
        if (!v.is_null() && !(v.is_number() && v.get<double>() == 1.0))
            r.fail(key + " " + detail::json_excerpt(v) + ": expected 1 (normtape rotates every dimension of a head)");
    };
    check_partial(r.get("partial_rotary_factor"), "partial_rotary_factor");
    double theta = r.positive("rope_theta", 10000.0);
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
        const json p = r.get(key);
        if (p.is_null()) continue;
        if (!p.is_object()) r.fail(std::string(key) + " " + detail::json_excerpt(p) + ": expected an object or null");
        bool typed_default = false;
        for (const char* type_key : {"rope_type", "type"}) {  // first: the type names the scaling best
            if (!p.contains(type_key) || p[type_key].is_null()) continue;
            if (p[type_key] != "default")
                r.fail(std::string(key) + "." + type_key + " " + detail::json_excerpt(p[type_key]) +
                       ": expected \"default\" (normtape's rotary embedding is not scaled: ops/rotary.h)");
            typed_default = true;
        }
        for (const auto& [name, value] : p.items()) {
            const std::string path = std::string(key) + "." + name;
            if (value.is_null() || name == "rope_type" || name == "type") continue;
            if (name == "partial_rotary_factor") {
                check_partial(value, path);
            } else if (name == "rope_theta") {
                theta = r.positive(value, path, theta);
            } else if (!(typed_default && (name == "original_max_position_embeddings" ||
                                           (name == "factor" && value.is_number() && value.get<double>() == 1.0)))) {
                r.fail(path + " " + detail::json_excerpt(value) + ": expected no scaling (normtape's rotary embedding " +
                       "is not scaled: ops/rotary.h; a rope object holds rope_type \"default\", rope_theta and " +
                       "partial_rotary_factor 1)");
            }
        }
    }
    return theta;
}

GPTConfig llama_config(const ConfigReader& r) {
    GPTConfig c = gpt_config("llama");
    c.vocab_size = r.size("vocab_size", kMaxCount);
    c.n_embd = r.size("hidden_size", kMaxWidth);
    c.n_layer = r.size("num_hidden_layers", kMaxLayers);
    c.n_head = r.size("num_attention_heads", kMaxWidth);
    c.n_kv_head = r.size("num_key_value_heads", kMaxWidth, c.n_head);
    c.mlp_hidden = r.size("intermediate_size", kMaxWidth);
    c.block_size = r.size("max_position_embeddings", kMaxCount);
    c.norm_eps = r.positive("rms_norm_eps", 1e-6);  // LlamaConfig's default
    c.rope_theta = llama_rope_theta(r);
    c.tie_embeddings = r.flag("tie_word_embeddings", false);
    const int64_t head_dim = r.size("head_dim", kMaxWidth, 0);
    if (head_dim != 0 && head_dim * c.n_head != c.n_embd)
        r.fail("head_dim " + std::to_string(head_dim) +
               ": expected hidden_size / num_attention_heads = " + std::to_string(c.n_embd) + " / " +
               std::to_string(c.n_head) + " (normtape's heads split the embedding: c_q is [C, C])");
    r.require("hidden_act", "silu", "normtape's SwiGLU gates with silu");
    r.require("attention_bias", false, "normtape's llama preset has no biases");
    r.require("mlp_bias", false, "normtape's llama preset has no biases");
    return c;
}

GPTConfig gpt2_config(const ConfigReader& r) {
    GPTConfig c = gpt_config("gpt2");
    c.vocab_size = r.size("vocab_size", kMaxCount);
    c.n_embd = r.size("n_embd", kMaxWidth);
    c.n_layer = r.size("n_layer", kMaxLayers);
    c.n_head = r.size("n_head", kMaxWidth);
    c.block_size = r.size("n_positions", kMaxCount);
    c.mlp_hidden = r.size("n_inner", kMaxWidth, 0);  // null: 4 n_embd
    c.norm_eps = r.positive("layer_norm_epsilon", 1e-5);
    c.tie_embeddings = r.flag("tie_word_embeddings", true);
    const json act = r.get("activation_function");
    if (!act.is_null() && act != "gelu_new" && act != "gelu_pytorch_tanh")
        r.fail("activation_function " + detail::json_excerpt(act) +
               ": expected \"gelu_new\" or \"gelu_pytorch_tanh\" (the tanh GELU, normtape's)");
    r.require("scale_attn_weights", true, "normtape's attention scales by 1 / sqrt(hs)");
    r.require("scale_attn_by_inverse_layer_idx", false, "normtape's attention scales by 1 / sqrt(hs) in every layer");
    return c;
}

// Whether config.json names a Llama (else a GPT-2) (nn/formats/hf.h).
bool config_is_llama(const ConfigReader& r) {
    const json archs = r.get("architectures");
    if (!archs.is_null()) {
        if (!archs.is_array()) r.fail("architectures " + detail::json_excerpt(archs) + ": expected a list of class names");
        for (const json& a : archs) {
            if (a == "LlamaForCausalLM") return true;
            if (a == "GPT2LMHeadModel") return false;
        }
        r.fail("architectures " + detail::json_excerpt(archs) + ": expected LlamaForCausalLM or GPT2LMHeadModel");
    }
    const json type = r.get("model_type");
    if (type == "llama") return true;
    if (type == "gpt2") return false;
    r.fail("model_type " + detail::json_excerpt(type) + " (and no \"architectures\"): expected \"llama\" or \"gpt2\"");
}

}  // namespace

GPTConfig detail::hf_config(const std::string& text, const std::string& file) {
    json j;
    std::string why;
    NT_CHECK_AS(FormatError, detail::parse_json(text, j, why), "load_hf: ", file, ": ", why,
                " (expected a transformers config.json)");
    NT_CHECK_AS(FormatError, j.is_object(), "load_hf: ", file, ": not a JSON object (expected a transformers config.json)");
    const ConfigReader reader{j, file};
    GPTConfig config = config_is_llama(reader) ? llama_config(reader) : gpt2_config(reader);
    try {
        check_config(config);
    } catch (const Error& e) {
        detail::throw_error<FormatError>("load_hf: ", file, ": describes a model normtape cannot build: ", e.what());
    }
    return config;
}

}  // namespace normtape
