// tests/test_hf.cpp: Hugging Face checkpoints (nn/formats/hf.h) against transformers itself.
// - load_hf reads the fixtures that transformers 5.17 wrote (tests/fixtures/hf/{llama,gpt2},
//   scripts/hf_fixtures.py: a LlamaForCausalLM with grouped-query attention and a tied
//   GPT2LMHeadModel, random weights) and the logits match transformers' to 1e-5 (normwise),
//   in f32 and f64, on the cpu and on CUDA;
// - save_hf writes the fixtures' tensors back bit for bit, under the keys, shapes and dtypes
//   transformers wrote, and load_hf of what it wrote gives the same parameters and logits, bit for
//   bit (also for a tied Llama, an untied GPT-2 and a bf16 model); GPT2Model's unprefixed keys
//   and the legacy attention buffers are read;
// - bad directories, configs and tensors are refused naming load_hf / save_hf, the file and the
//   cause, and leak nothing;
// - where an interpreter with transformers is found (NORMTAPE_PYTHON), transformers reads what
//   save_hf wrote and computes normtape's logits (scripts/hf_fixtures.py check).
// Not here: the safetensors format (tests/test_safetensors.cpp); the generate binary on a
// Hugging Face directory (tests/test_generate.cpp).
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device_ptr.h"
#include "nn/formats/hf.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string fixture(const std::string& arch) { return std::string(NORMTAPE_SOURCE_DIR) + "/tests/fixtures/hf/" + arch; }

// The fixture's input_ids [2, 12] i64 and transformers' logits [2, 12, 64] f32.
struct Expected {
    Tensor input_ids, logits;
};
Expected expected(const std::string& dir) {
    std::map<std::string, Tensor> t;
    for (auto& [name, tensor] : load_safetensors(dir + "/expected.safetensors")) t.emplace(name, tensor);
    return {t.at("input_ids"), t.at("logits")};
}

Tensor logits_of(const GPT& model, const Tensor& input_ids) {
    NoGradGuard no_grad;
    return model.forward(input_ids.to(model.config().device)).to(Device::CPU);
}

// Bit for bit: same shape, dtype and bytes (cpu copies of tensors on any device).
bool same_bits(const Tensor& a, const Tensor& b) {
    Tensor x = a.to(Device::CPU), y = b.to(Device::CPU);
    return x.shape() == y.shape() && x.dtype() == y.dtype() &&
           std::memcmp(detail::byte_ptr(x), detail::byte_ptr(y), static_cast<size_t>(x.nbytes())) == 0;
}

void check_same_parameters(const GPT& a, const GPT& b) {
    NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
        INFO("parameter ", pa[i].first);
        CHECK(pa[i].first == pb[i].first);
        CHECK(same_bits(pa[i].second, pb[i].second));
    }
}

std::map<std::string, Tensor> tensors_of(const std::string& path,
                                         std::map<std::string, std::string>* metadata = nullptr) {
    std::map<std::string, Tensor> out;
    for (auto& [name, t] : load_safetensors(path, metadata)) out.emplace(name, t);
    return out;
}

// A small model of preset `arch` ("llama" with 2 key/value heads) with every field that
// config.json carries away from its default: mlp_hidden 96, rope_theta 500000, norm_eps 1e-6.
GPTConfig small_config(const std::string& arch, bool tie) {
    GPTConfig c = gpt_config(arch);
    c.vocab_size = 64;
    c.block_size = 32;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.n_kv_head = arch == "llama" ? 2 : 0;
    c.mlp_hidden = 96;
    c.rope_theta = 500000.0;
    c.norm_eps = 1e-6;
    c.tie_embeddings = tie;
    return c;
}

json read_json(const std::string& path) { return json::parse(slurp(path)); }
void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump(2)); }

// A copy of fixture `arch` in dir/name whose config.json is edited by `edit_config` and whose
// tensors by `edit_tensors`; returns the directory.
std::string edited_fixture(const TempDir& dir, const std::string& name, const std::string& arch,
                           const std::function<void(json&)>& edit_config,
                           const std::function<void(std::map<std::string, Tensor>&)>& edit_tensors = {}) {
    const std::string out = dir / name;
    fs::create_directories(out);
    json config = read_json(fixture(arch) + "/config.json");
    if (edit_config) edit_config(config);
    write_json(out + "/config.json", config);
    std::map<std::string, Tensor> tensors = tensors_of(fixture(arch) + "/model.safetensors");
    if (edit_tensors) edit_tensors(tensors);
    save_safetensors(out + "/model.safetensors", NamedTensors(tensors.begin(), tensors.end()), {{"format", "pt"}});
    return out;
}

}  // namespace

TEST_SUITE("hf") {
    TEST_CASE("hf: load_hf reads transformers' Llama and GPT-2, and the logits are transformers' to 1e-5, f32 and f64") {
        for (std::string arch : {"llama", "gpt2"})
            for (DType dt : {DType::F32, DType::F64}) {
                INFO(arch, " ", std::string(dtype_name(dt)));
                std::unique_ptr<GPT> model = load_hf(fixture(arch), Device::CPU, dt);
                const GPTConfig& c = model->config();
                CHECK(arch_name(c) == arch);
                CHECK(c.dtype == dt);
                CHECK(c.vocab_size == 64);
                CHECK(c.n_embd == 64);
                CHECK(c.n_layer == 2);
                CHECK(c.n_head == 4);
                CHECK(c.block_size == 32);
                CHECK(c.norm_eps == 1e-5);
                if (std::string(arch) == "llama") {
                    CHECK(c.kv_heads() == 2);
                    CHECK(c.hidden() == 160);
                    CHECK(c.rope_theta == 10000.0);
                    CHECK(!c.tie_embeddings);
                } else {
                    CHECK(c.kv_heads() == 4);
                    CHECK(c.hidden() == 256);
                    CHECK(c.tie_embeddings);
                    CHECK(model->lm_head->weight.impl_ptr() == model->wte->weight.impl_ptr());
                }
                Expected e = expected(fixture(arch));
                Tensor logits = logits_of(*model, e.input_ids);
                CHECK(logits.dtype() == dt);
                MESSAGE(arch, " ", std::string(dtype_name(dt)), ": normwise error against transformers ",
                        normwise_error(logits, e.logits));
                CHECK_NORMWISE(logits, e.logits, 1e-5);
            }
    }

    TEST_CASE("hf: load_hf in bf16: the logits are transformers' f32 logits to bf16's tolerance") {
        for (std::string arch : {"llama", "gpt2"}) {
            INFO(arch);
            std::unique_ptr<GPT> model = load_hf(fixture(arch), Device::CPU, DType::BF16);
            Expected e = expected(fixture(arch));
            Tensor logits = logits_of(*model, e.input_ids);
            MESSAGE(arch, " bf16: normwise error against transformers' f32 ", normwise_error(logits, e.logits));
            CHECK_NORMWISE(logits, e.logits, 3e-2);
        }
    }

    TEST_CASE("hf: save_hf writes the fixture's tensors back bit for bit, under transformers' keys, shapes and dtypes") {
        TempDir dir("hf_save_keys");
        for (std::string arch : {"llama", "gpt2"}) {
            INFO(arch);
            const std::string out = dir / arch;
            save_hf(*load_hf(fixture(arch)), out);
            std::map<std::string, std::string> meta;
            std::map<std::string, Tensor> ours = tensors_of(out + "/model.safetensors", &meta),
                                          theirs = tensors_of(fixture(arch) + "/model.safetensors");
            CHECK(meta.at("format") == "pt");  // transformers refuses the file without it
            std::set<std::string> our_keys, their_keys;
            for (const auto& [k, t] : ours) our_keys.insert(k);
            for (const auto& [k, t] : theirs) their_keys.insert(k);
            CHECK(our_keys == their_keys);
            for (const auto& [k, t] : theirs) {
                INFO(k);
                REQUIRE(ours.count(k) == 1);
                CHECK(ours.at(k).shape() == t.shape());
                CHECK(same_bits(ours.at(k), t));  // the transposes and the gate/up split undone exactly
            }
            const json ours_config = read_json(out + "/config.json");
            const json theirs_config = read_json(fixture(arch) + "/config.json");
            for (const char* key : {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                                    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                                    "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                    "attention_bias", "mlp_bias", "n_positions", "n_embd", "n_layer", "n_head",
                                    "n_inner", "activation_function", "layer_norm_epsilon", "dtype"}) {
                INFO(key);
                if (theirs_config.contains(key)) CHECK(ours_config.value(key, json("absent")) == theirs_config[key]);
            }
            if (std::string(arch) == "llama") {
                CHECK(ours_config["rope_theta"] == 10000.0);
                CHECK(ours_config["rope_parameters"] == theirs_config["rope_parameters"]);
            }
            CHECK(ours_config["torch_dtype"] == "float32");
        }
    }

    TEST_CASE("hf: save_hf then load_hf gives the same parameters and logits, bit for bit") {
        TempDir dir("hf_round_trip");
        for (std::string arch : {"llama", "gpt2"})
            for (DType dt : {DType::F32, DType::BF16}) {
                INFO(arch, " ", std::string(dtype_name(dt)));
                std::unique_ptr<GPT> a = load_hf(fixture(arch), Device::CPU, dt);
                const std::string out = dir / (std::string(arch) + std::string(dtype_name(dt)));
                save_hf(*a, out);
                CHECK(read_json(out + "/config.json")["dtype"] == (dt == DType::BF16 ? "bfloat16" : "float32"));
                CHECK(tensors_of(out + "/model.safetensors").begin()->second.dtype() == dt);
                std::unique_ptr<GPT> b = load_hf(out, Device::CPU, dt);
                check_same_parameters(*a, *b);
                Tensor ids = expected(fixture(arch)).input_ids;
                CHECK(same_bits(logits_of(*a, ids), logits_of(*b, ids)));
            }
        // An f64 model is written as F32: here its values are f32 ones, so they come back exactly.
        std::unique_ptr<GPT> f64 = load_hf(fixture("llama"), Device::CPU, DType::F64);
        save_hf(*f64, dir / "f64");
        CHECK(read_json(dir / "f64/config.json")["dtype"] == "float32");
        check_same_parameters(*load_hf(dir / "f64", Device::CPU, DType::F64), *f64);
    }

    TEST_CASE("hf: a tied Llama and an untied GPT-2 (train_gpt's default) round-trip, lm_head written when untied") {
        TempDir dir("hf_tie");
        for (auto [arch, tie] : {std::pair<const char*, bool>{"llama", true}, {"gpt2", false}}) {
            INFO(std::string(arch), " tie ", tie);
            const GPTConfig c = small_config(arch, tie);
            manual_seed(5);
            GPT model(c);
            save_hf(model, dir / arch);
            json config = read_json(dir / (std::string(arch) + "/config.json"));
            CHECK(config["tie_word_embeddings"] == tie);
            const auto written = tensors_of(dir / (std::string(arch) + "/model.safetensors"));
            CHECK(written.count("lm_head.weight") == (tie ? 0 : 1));
            std::unique_ptr<GPT> back = load_hf(dir / arch);
            CHECK(back->config().tie_embeddings == tie);
            if (std::string(arch) == "llama") CHECK(back->config().rope_theta == c.rope_theta);
            CHECK(back->config().norm_eps == c.norm_eps);
            CHECK(back->config().kv_heads() == c.kv_heads());
            CHECK(back->config().hidden() == 96);
            check_same_parameters(model, *back);
            Tensor ids = token_batch(c, 2, 16).idx;
            CHECK(same_bits(logits_of(model, ids), logits_of(*back, ids)));
        }
    }

    TEST_CASE("hf: GPT-2 keys without \"transformer.\", legacy buffers and a tied lm_head.weight stored anyway are read") {
        TempDir dir("hf_gpt2_legacy");
        const std::string d = edited_fixture(dir, "legacy", "gpt2", {}, [](std::map<std::string, Tensor>& t) {
            std::map<std::string, Tensor> stripped;
            for (auto& [k, v] : t) stripped.emplace(k.substr(std::string("transformer.").size()), v);
            for (int layer = 0; layer < 2; ++layer) {  // the causal mask, as old GPT2Model files hold it
                stripped.emplace("h." + std::to_string(layer) + ".attn.bias", ones({1, 1, 32, 32}));
                stripped.emplace("h." + std::to_string(layer) + ".attn.masked_bias", full({}, -1e4));
            }
            stripped.emplace("lm_head.weight", t.at("transformer.wte.weight").clone());
            t = stripped;
        });
        Expected e = expected(fixture("gpt2"));
        CHECK_NORMWISE(logits_of(*load_hf(d), e.input_ids), e.logits, 1e-5);
        // Llama's rotary frequencies, which transformers saved before 4.31, and a tied head stored.
        const std::string llama = edited_fixture(
            dir, "llama_legacy", "llama", [](json& j) { j["tie_word_embeddings"] = true; },
            [](std::map<std::string, Tensor>& t) {
                for (int layer = 0; layer < 2; ++layer)
                    t.emplace("model.layers." + std::to_string(layer) + ".self_attn.rotary_emb.inv_freq", ones({8}));
                t["lm_head.weight"] = t.at("model.embed_tokens.weight").clone();
            });
        std::unique_ptr<GPT> tied = load_hf(llama);
        CHECK(tied->config().tie_embeddings);
        CHECK(same_bits(tied->lm_head->weight, tensors_of(llama + "/model.safetensors").at("model.embed_tokens.weight")));
    }

    TEST_CASE("hf: a config.json nested 100,000 deep is a FormatError, and a long value is quoted by its first 80 characters") {
        TempDir dir("hf_deep");
        const std::string deep(100000, '['), close(100000, ']');
        for (const char* key : {"architectures", "vocab_size"}) {
            INFO(key);
            const std::string d = edited_fixture(dir, key, "llama", {});
            std::string text = slurp(d + "/config.json");
            const std::string field = "\"" + std::string(key) + "\": ";
            const size_t at = text.find(field);
            REQUIRE(at != std::string::npos);
            text.insert(at + field.size(), deep + "1" + close + ", \"was\": ");
            write_bytes(d + "/config.json", text);
            // Once a SIGSEGV: the value was copied and dump()ed, recursively.
            check_throws_in_child<FormatError>([&] { load_hf(d); },
                                               {"load_hf: ", "config.json", "nests deeper than 64 levels"});
        }
        // 60 deep parses; the message quotes 80 characters of the 121-character value, then "...".
        const std::string d = edited_fixture(dir, "long", "llama", [](json& j) {
            json v = 1;
            for (int i = 0; i < 60; ++i) v = json::array({v});
            j["architectures"] = v;
        });
        try {
            load_hf(d);
            FAIL("load_hf accepted a nested architectures list");
        } catch (const FormatError& e) {
            const std::string m = e.what();
            CHECK(m.find("architectures " + std::string(60, '[') + "1" + std::string(19, ']') +
                         "...: expected LlamaForCausalLM") != std::string::npos);
            CHECK(m.size() < 400);
        }
    }

    TEST_CASE("hf: a default rope object may carry what transformers ignores, and nulls that stand for absent keys") {
        TempDir dir("hf_rope");
        const std::string d = edited_fixture(dir, "llama", "llama", [](json& j) {
            j["rope_theta"] = 500000.0;
            j["partial_rotary_factor"] = nullptr;
            j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", nullptr}, {"factor", 1.0},
                                    {"original_max_position_embeddings", 8192}, {"low_freq_factor", nullptr}};
            j["rope_scaling"] = {{"type", nullptr}, {"rope_theta", 500000.0}};
        });
        CHECK(load_hf(d)->config().rope_theta == 500000.0);  // a null rope_theta keeps the top-level one
    }

    TEST_CASE("hf: bad directories, configs and tensors: each names load_hf, the file and the cause, and leaks nothing") {
        TempDir dir("hf_bad");
        const int64_t before = cpu_allocated();
        const std::string llama_config = fixture("llama") + "/config.json";
        auto with = [&](const std::string& name, const char* arch, const std::function<void(json&)>& edit,
                        const std::function<void(std::map<std::string, Tensor>&)>& tensors = {}) {
            return edited_fixture(dir, name, arch, edit, tensors);
        };
        CHECK_THROWS_KIND_WITH(load_hf(dir / "missing"), IOError, "load_hf", "missing: no such directory");
        fs::create_directories(dir / "empty");
        CHECK_THROWS_KIND_WITH(load_hf(dir / "empty"), IOError, "load_hf", "empty/config.json: no such file");
        const std::string no_model = dir / "no_model";
        fs::create_directories(no_model);
        fs::copy_file(llama_config, no_model + "/config.json");
        CHECK_THROWS_KIND_WITH(load_hf(no_model), IOError, "load_hf", "no_model/model.safetensors");
        write_bytes(no_model + "/model.safetensors.index.json", "{}");
        CHECK_THROWS_KIND_WITH(load_hf(no_model), FormatError, "load_hf", "sharded checkpoint");
        const std::string junk = with("junk", "llama", {});
        write_bytes(junk + "/config.json", "{not json");
        CHECK_THROWS_KIND_WITH(load_hf(junk), FormatError, "load_hf", "junk/config.json: not valid JSON");
        CHECK_THROWS_KIND_WITH(load_hf(fixture("llama"), Device::CPU, DType::I64), DTypeError, "load_hf", "i64");

        struct ConfigCase {
            const char* arch;
            std::function<void(json&)> edit;
            std::vector<std::string> says;
        };
        for (const ConfigCase& c : std::vector<ConfigCase>{
                 {"llama", [](json& j) { j["architectures"] = {"MistralForCausalLM"}; },
                  {"[\"MistralForCausalLM\"]", "expected LlamaForCausalLM or GPT2LMHeadModel"}},
                 {"llama", [](json& j) { j.erase("architectures"), j["model_type"] = "t5"; },
                  {"model_type \"t5\"", "expected \"llama\" or \"gpt2\""}},
                 {"llama", [](json& j) { j["rope_parameters"]["rope_type"] = "llama3"; },
                  {"rope_parameters.rope_type \"llama3\"", "not scaled"}},
                 {"llama", [](json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; },
                  {"rope_scaling.type \"linear\"", "expected \"default\""}},
                 // transformers 4 reads a top-level partial_rotary_factor; a scaling factor without a
                 // type is a scaling too.
                 {"llama", [](json& j) { j["partial_rotary_factor"] = 0.5; },
                  {"partial_rotary_factor 0.5", "expected 1", "rotates every dimension"}},
                 {"llama", [](json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.5; },
                  {"rope_parameters.partial_rotary_factor 0.5", "expected 1"}},
                 {"llama", [](json& j) { j["rope_scaling"] = {{"factor", 8.0}}; },
                  {"rope_scaling.factor 8.0", "expected no scaling"}},
                 {"llama", [](json& j) { j["rope_scaling"] = {{"original_max_position_embeddings", 8192}}; },
                  {"rope_scaling.original_max_position_embeddings 8192", "expected no scaling"}},
                 {"llama", [](json& j) { j["rope_parameters"]["factor"] = 2.0; },
                  {"rope_parameters.factor 2.0", "expected no scaling"}},
                 {"llama", [](json& j) { j["hidden_act"] = "gelu"; }, {"hidden_act \"gelu\"", "expected \"silu\""}},
                 {"llama", [](json& j) { j["attention_bias"] = true; }, {"attention_bias true", "no biases"}},
                 {"llama", [](json& j) { j["head_dim"] = 32; }, {"head_dim 32", "hidden_size / num_attention_heads"}},
                 {"llama", [](json& j) { j.erase("hidden_size"); }, {"missing \"hidden_size\""}},
                 {"llama", [](json& j) { j["num_hidden_layers"] = "2"; },
                  {"num_hidden_layers \"2\"", "expected an integer from 1 to 4096"}},
                 {"llama", [](json& j) { j["vocab_size"] = -1; }, {"vocab_size -1", "expected an integer"}},
                 {"llama", [](json& j) { j["num_key_value_heads"] = 3; },
                  {"cannot build", "n_kv_head dividing n_head"}},
                 {"llama", [](json& j) { j["num_hidden_layers"] = 3; },
                  {"model.safetensors: missing tensor model.layers.2.input_layernorm.weight [64]"}},
                 {"gpt2", [](json& j) { j["activation_function"] = "relu"; },
                  {"activation_function \"relu\"", "gelu_new"}},
                 {"gpt2", [](json& j) { j["scale_attn_by_inverse_layer_idx"] = true; },
                  {"scale_attn_by_inverse_layer_idx true"}},
             }) {
            const std::string d = with("config", c.arch, c.edit);
            INFO(read_json(d + "/config.json").dump());
            check_throws<FormatError>([&] { load_hf(d); }, [&] {
                std::vector<std::string> words = c.says;
                words.push_back("load_hf: ");
                words.push_back("config");
                return words;
            }());
        }

        const std::string up = "model.layers.1.mlp.up_proj.weight";
        CHECK_THROWS_KIND_WITH(load_hf(with("missing_tensor", "llama", {}, [&](auto& t) { t.erase(up); })), FormatError,
                               "load_hf: ", "model.safetensors: missing tensor " + up + " [160, 64]",
                               "normtape's h.1.mlp.c_fc.weight");
        // A forged config is refused from the file's shapes, before the model is allocated.
        CHECK_THROWS_KIND_WITH(load_hf(with("wide", "llama", [](json& j) {
                                   j["hidden_size"] = 1 << 20;
                                   j.erase("head_dim");
                               })),
                               ShapeError, "model.embed_tokens.weight expected [64, 1048576], got [64, 64]");
        CHECK_THROWS_KIND_WITH(
            load_hf(with("missing_head", "llama", {}, [&](auto& t) { t.erase("lm_head.weight"); })), FormatError,
            "missing tensor lm_head.weight", "tie_word_embeddings is false");
        CHECK_THROWS_KIND_WITH(load_hf(with("wrong_shape", "llama", {}, [&](auto& t) { t[up] = zeros({64, 160}); })),
                               ShapeError, "load_hf: ", "tensor " + up + " expected [160, 64], got [64, 160]",
                               "h.1.mlp.c_fc.weight [320, 64]");
        const std::string c_fc = "transformer.h.0.mlp.c_fc.weight";
        CHECK_THROWS_KIND_WITH(load_hf(with("transposed", "gpt2", {}, [&](auto& t) { t[c_fc] = zeros({256, 64}); })),
                               ShapeError, "transformer.h.0.mlp.c_fc.weight expected [64, 256], got [256, 64]");
        CHECK_THROWS_KIND_WITH(
            load_hf(with("integer", "llama", {}, [](auto& t) { t["model.norm.weight"] = zeros({64}, opts(DType::I64)); })),
            DTypeError, "model.norm.weight is i64");
        const std::string q_norm = "model.layers.0.self_attn.q_norm.weight";  // Qwen3's, say
        CHECK_THROWS_KIND_WITH(load_hf(with("extra", "llama", {}, [&](auto& t) { t[q_norm] = zeros({16}); })),
                               FormatError, "unexpected tensor " + q_norm + " [16]", "no such weight");
        CHECK_THROWS_KIND_WITH(
            load_hf(with("untied_head", "gpt2", {}, [&](auto& t) { t["lm_head.weight"] = zeros({64, 64}); })), FormatError,
            "lm_head.weight differs from transformer.wte.weight", "tie_word_embeddings");
        const std::string f16 = with("f16", "llama", {});
        {
            std::string bytes = slurp(f16 + "/model.safetensors");
            const size_t at = bytes.find("\"F32\"");
            REQUIRE(at != std::string::npos);
            bytes.replace(at, 5, "\"F16\"");
            write_bytes(f16 + "/model.safetensors", bytes);
        }
        CHECK_THROWS_KIND_WITH(load_hf(f16), FormatError, "load_hf: ", "unsupported dtype \"F16\"");
        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("hf: save_hf writes the tokenizer's tokenizer.json beside the model, or removes an old one, and refuses a bad one") {
        TempDir dir("hf_tokenizer");
        GPTConfig c = small_config("llama", true);
        c.vocab_size = 300;
        const Tokenizer tok = train_bpe("the cat sat on the mat, the cat ate the rat", 270);
        std::filesystem::create_directories(dir / "model");
        for (const char* stale : {"vocab.json", "merges.txt", "special_tokens_map.json"})  // another tokenizer's
            write_bytes(dir / ("model/" + std::string(stale)), "{}");
        save_hf(GPT(c), dir / "model", &tok);
        for (const char* stale : {"vocab.json", "merges.txt", "special_tokens_map.json"})
            CHECK(!std::filesystem::exists(dir / ("model/" + std::string(stale))));
        CHECK(!std::filesystem::exists(dir / "model/tokenizer.json.tmp"));
        const Tokenizer back = Tokenizer::load(dir / "model/tokenizer.json");
        CHECK(back.name() == "model");
        CHECK(back.encode_ordinary("the rat sat") == tok.encode_ordinary("the rat sat"));
        CHECK(read_json(dir / "model/tokenizer_config.json")["tokenizer_class"] == "PreTrainedTokenizerFast");
        save_hf(GPT(c), dir / "model");  // without a tokenizer: none left from before
        CHECK(!std::filesystem::exists(dir / "model/tokenizer.json"));
        CHECK(!std::filesystem::exists(dir / "model/tokenizer_config.json"));
        const Tokenizer not_utf8(tok.tokens(), tok.pattern(), {{"\xff<s>", 270}});
        CHECK_THROWS_KIND_WITH(save_hf(GPT(c), dir / "not_utf8", &not_utf8), Error, "save_hf", "not UTF-8");
        CHECK(!std::filesystem::exists(dir / "not_utf8/model.safetensors"));
        c.vocab_size = 260;  // fewer than the tokenizer's 270 ids
        CHECK_THROWS_KIND_WITH(save_hf(GPT(c), dir / "small", &tok), Error, "save_hf", "270 ids",
                               "model's vocabulary of 260");
        CHECK(!std::filesystem::exists(dir / "small"));
    }

    TEST_CASE("hf: save_hf refuses architectures transformers' Llama and GPT-2 do not compute, writing nothing") {
        TempDir dir("hf_save_bad");
        CHECK_THROWS_KIND_WITH(save_hf(GPT(small_config("nanochat", false)), dir / "nanochat"), Error, "save_hf", "nanochat",
                               "no transformers class");
        GPTConfig rms_gpt2 = small_config("gpt2", false);
        rms_gpt2.norm = NormKind::RMS;
        CHECK_THROWS_KIND_WITH(save_hf(GPT(rms_gpt2), dir / "custom"), Error, "save_hf", "custom architecture",
                               "norm rms");
        GPTConfig gqa_gpt2 = small_config("gpt2", false);
        gqa_gpt2.n_kv_head = 1;
        CHECK_THROWS_KIND_WITH(save_hf(GPT(gqa_gpt2), dir / "gqa"), Error, "save_hf", "grouped-query");
        CHECK(listing(dir.path).empty());
        write_bytes(dir / "a_file", "");
        CHECK_THROWS_KIND_WITH(save_hf(GPT(small_config("llama", false)), dir / "a_file"), IOError, "save_hf", "a_file");
    }

    TEST_CASE("hf: on cuda, load_hf's logits are transformers' to 1e-5 (f32) and bf16's tolerance") {
        REQUIRE_CUDA_OR_SKIP();
        for (std::string arch : {"llama", "gpt2"})
            for (DType dt : {DType::F32, DType::BF16}) {
                INFO(arch, " ", std::string(dtype_name(dt)));
                std::unique_ptr<GPT> model = load_hf(fixture(arch), Device::CUDA, dt);
                CHECK(model->wte->weight.device().is_cuda());
                Expected e = expected(fixture(arch));
                Tensor logits = logits_of(*model, e.input_ids);
                MESSAGE(arch, " ", std::string(dtype_name(dt)), " on cuda: normwise error against transformers ",
                        normwise_error(logits, e.logits));
                CHECK_NORMWISE(logits, e.logits, dt == DType::F32 ? 1e-5 : 3e-2);
                TempDir dir("hf_cuda_" + std::string(arch));
                save_hf(*model, dir / "out");
                check_same_parameters(*load_hf(dir / "out", Device::CUDA, dt), *model);
            }
    }

    TEST_CASE("hf: transformers reads what save_hf wrote and computes normtape's logits (scripts/hf_fixtures.py check)") {
        if (!python_succeeds("import transformers, safetensors"))
            SKIP_TEST(python() << " cannot import transformers (set NORMTAPE_PYTHON)");
        TempDir dir("hf_transformers");
        struct Case {
            std::string name;
            std::function<std::unique_ptr<GPT>()> make;
            const Tokenizer* tokenizer = nullptr;  // written beside, and its ids compared with AutoTokenizer's
        };
        const Tokenizer tok = train_bpe(slurp(shakespeare_path()).substr(0, 100000), 300);
        auto fresh = [](const char* arch, bool tie) {
            manual_seed(9);
            auto model = std::make_unique<GPT>(small_config(arch, tie));
            NoGradGuard no_grad;
            for (Tensor& p : model->parameters()) p.add_(randn(p.shape()), 0.2);  // away from 1s and 0s
            return model;
        };
        for (const Case& c : std::vector<Case>{
                 {"llama", [] { return load_hf(fixture("llama")); }},
                 {"gpt2", [] { return load_hf(fixture("gpt2")); }},
                 {"llama_tied", [&] { return fresh("llama", true); }},
                 {"gpt2_untied", [&] { return fresh("gpt2", false); }},
                 {"llama_bf16", [] { return load_hf(fixture("llama"), Device::CPU, DType::BF16); }},
                 {"gpt2_tokenizer",
                  [] {
                      GPTConfig c = small_config("gpt2", true);
                      c.vocab_size = 304;
                      manual_seed(9);
                      return std::make_unique<GPT>(c);
                  },
                  &tok},
             }) {
            INFO(c.name);
            std::unique_ptr<GPT> model = c.make();
            const std::string out = dir / c.name;
            save_hf(*model, out, c.tokenizer);
            // normtape's f32 logits of what was written (a bf16 model's values, exactly, in f32:
            // the script runs transformers in f32), and the tokenizer's ids of expected_text.txt.
            Tensor ids = expected(fixture("llama")).input_ids;
            NamedTensors written = {{"input_ids", ids}, {"logits", logits_of(*load_hf(out), ids)}};
            if (c.tokenizer) {
                const std::string text = "ROMEO:\nBut soft, what light through yonder window breaks? \xe6\xbc\xa2 \r\n  12345\n";
                write_bytes(out + "/expected_text.txt", text);
                std::vector<int64_t> text_ids;
                for (uint32_t id : c.tokenizer->encode_ordinary(text)) text_ids.push_back(id);
                written.emplace_back("text_ids", from_vector<int64_t>(text_ids, {static_cast<int64_t>(text_ids.size())}));
            }
            save_safetensors(out + "/expected.safetensors", written);
            const std::string log = dir / (c.name + ".log");
            const std::string cmd =
                python() + " " + NORMTAPE_SOURCE_DIR + "/scripts/hf_fixtures.py check " + out + " > " + log + " 2>&1";
            const int status = std::system(cmd.c_str());
            MESSAGE(c.name, ": ", slurp(log));
            CHECK(status == 0);
        }
    }
}
