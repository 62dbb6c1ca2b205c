// examples/generate/generate.cpp: samples text from a checkpoint that train_gpt --save wrote, as nanoGPT's
// sample.py: generate CHECKPOINT --prompt TEXT --tokens N prints the N tokens that the model draws
// after the prompt (the continuation only) to standard output, as they are drawn.
//
// The text is bytes, or a tokenizer's ids. Without a tokenizer the prompt's bytes are its tokens
// and each token drawn is written as one byte (a model of more than 256 tokens is refused). With
// one (nn/data/tokenizer.h), the prompt is encoded (encode_ordinary, as train_gpt encodes its text)
// and each token drawn is written as its bytes; an id that is no token of it (a vocabulary padded
// past the tokenizer's) writes nothing, and their count is a warning at the end. The tokenizer is
// --tokenizer FILE, else the one train_gpt --tokenizer recorded in the checkpoint (its path and
// checksum: --tokenizer must be the same files, examples/common/checksums.h), else a Hugging Face
// directory's tokenizer.json.
// The model is rebuilt from the checkpoint's metadata entry "train_gpt.config" (layers, heads,
// embd, vocab, seq as block_size, norm, dtype; the sizes in train_gpt's ranges, the model no larger
// than the parameters the file holds) and its parameters are loaded from its tensors
// (nn/formats/checkpoint.h); the optimizer state it may hold is ignored. Sampling is nn/model/generate.h's:
// --temperature (0: greedy), --top-k (0: all), --seed, and --no-cache for the reference path.
// --device: cpu or cuda (default: cuda when a GPU is visible, else cpu), in the checkpoint's dtype.
// A file without checksums is read with the warning train_gpt --resume gives.
//
// CHECKPOINT may also be a Hugging Face model directory (one holding config.json, as
// transformers' save_pretrained or nn/formats/hf.h's save_hf writes it) of a LlamaForCausalLM or a
// GPT2LMHeadModel: it is read with load_hf (nn/formats/hf.h), in f32, with its tokenizer.json if it
// has one (save_hf writes it when given the tokenizer).
//
// Exit status: 0; 2 for a bad flag, prompt, tokenizer or checkpoint, with one line on stderr before
// anything is printed; 1 for an error while sampling (out of memory, a device error), with its message.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/checkpoint_checks.h"
#include "../common/checksums.h"
#include "../common/flag_syntax.h"
#include "nn/formats/json_read.h"
#include "normtape.h"

using namespace normtape;

namespace {

// A bad flag, prompt or checkpoint: main prints it and exits 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct GenerateArgs {
    std::string checkpoint, prompt, prompt_file, device, tokenizer;
    int64_t tokens = 500;  // nanoGPT's max_new_tokens
    double temperature = 0.8;
    int64_t top_k = 200;
    uint64_t seed = 1337;
    bool no_cache = false;
};

std::string number_text(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("--prompt-file " + path + ": cannot read the file");
    std::stringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw UsageError("--prompt-file " + path + ": cannot read the file");
    return ss.str();
}

// The tokenizer a checkpoint records (train_gpt --tokenizer): its path and checksum, "" for none;
// or a Hugging Face directory's tokenizer.json (no checksum).
struct RecordedTokenizer {
    std::string path, fnv1a64;
};

// The GPT of the checkpoint's "train_gpt.config" (see examples/train_gpt/resume.h), on `device`:
// its sizes within train_gpt's ranges, and no more parameters than the file's `tensors` hold; sets
// `recorded` to the tokenizer the config records.
GPTConfig checkpoint_config(const std::string& path, const std::map<std::string, std::string>& metadata,
                            const NamedTensors& tensors, Device device, RecordedTokenizer& recorded) {
    auto entry = metadata.find("train_gpt.config");
    if (entry == metadata.end())
        throw UsageError(path + ": not a train_gpt checkpoint (one written by train_gpt --save): no \"train_gpt.config\" "
                                "metadata");
    nlohmann::json c;
    std::string why;
    if (!detail::parse_json(entry->second, c, why))
        throw UsageError(path + ": malformed train_gpt.config metadata: " + why);
    if (!c.is_object()) throw UsageError(path + ": malformed train_gpt.config metadata (not a JSON object)");
    auto get = [&](const char* key, bool integer) {
        const nlohmann::json v = c.value(key, nlohmann::json());
        if (integer ? !v.is_number_integer() : !v.is_string())
            throw UsageError(path + ": the checkpoint's train_gpt.config has " +
                             (v.is_null() ? "no \"" + std::string(key) + "\"" : std::string(key) + " " + detail::json_excerpt(v)) +
                             ", expected " + (integer ? "an integer" : "a string"));
        return v;
    };
    // Each size within train_gpt's ranges for its flag, so that no product of them overflows.
    auto size = [&](const char* key, int64_t lo, int64_t hi, const char* what) {
        const nlohmann::json v = get(key, true);
        // An integer of 2^63 or more is unsigned in the JSON: compared as such, it cannot wrap.
        const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() >= static_cast<uint64_t>(lo) &&
                                                           v.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                                     : v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
        if (!in_range)
            throw UsageError(path + ": the checkpoint's train_gpt.config has " + key + " " + detail::json_excerpt(v) + ", expected " +
                             what + " from " + std::to_string(lo) + " to " + std::to_string(hi));
        return v.get<int64_t>();
    };
    // Checkpoints written before --arch, --kv-heads and --tie existed hold GPT-2's block, untied.
    const nlohmann::json arch = c.value("arch", nlohmann::json("gpt2")), tie = c.value("tie", nlohmann::json("off"));
    if (!arch.is_string() || (arch != "gpt2" && arch != "nanochat" && arch != "llama"))
        throw UsageError(path + ": the checkpoint's train_gpt.config has arch " + detail::json_excerpt(arch) +
                         ", expected gpt2, nanochat or llama");
    if (tie != "on" && tie != "off")
        throw UsageError(path + ": the checkpoint's train_gpt.config has tie " + detail::json_excerpt(tie) + ", expected on or off");
    GPTConfig g = gpt_config(arch.get<std::string>());
    g.tie_embeddings = tie == "on";
    if (c.contains("kv-heads")) g.n_kv_head = size("kv-heads", 0, kMaxHeads, "key/value heads");
    g.n_layer = size("layers", 1, kMaxLayers, "transformer blocks");
    g.n_head = size("heads", 1, kMaxHeads, "attention heads");
    g.n_embd = size("embd", 1, kMaxEmbd, "an embedding width");
    g.vocab_size = size("vocab", 2, kMaxVocab, "a vocabulary size");
    g.block_size = size("seq", 1, kMaxSeq, "a sequence length");
    const std::string norm = get("norm", false).get<std::string>(), dtype = get("dtype", false).get<std::string>();
    if (norm != "layer" && norm != "rms")
        throw UsageError(path + ": the checkpoint's train_gpt.config has norm \"" + norm + "\", expected layer or rms");
    if (dtype != "f32" && dtype != "bf16")
        throw UsageError(path + ": the checkpoint's train_gpt.config has dtype \"" + dtype + "\", expected f32 or bf16");
    g.norm = norm == "layer" ? NormKind::Layer : NormKind::RMS;
    g.dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
    g.device = device;
    try {
        check_config(g);
    } catch (const Error& e) {
        throw UsageError(path + ": the checkpoint's train_gpt.config: " + e.what());
    }
    // Checkpoints written before --tokenizer existed record none.
    const nlohmann::json tok_path = c.value("tokenizer", nlohmann::json(""));
    const nlohmann::json tok_hash = c.value("tokenizer_fnv1a64", nlohmann::json(""));
    if (!tok_path.is_string() || !tok_hash.is_string())
        throw UsageError(path + ": the checkpoint's train_gpt.config has tokenizer " + detail::json_excerpt(tok_path) +
                         " and tokenizer_fnv1a64 " + detail::json_excerpt(tok_hash) + ", expected strings");
    recorded = {tok_path.get<std::string>(), tok_hash.get<std::string>()};
    if (std::string why = model_larger_than_file(g, tensors); !why.empty()) throw UsageError(path + ": " + why);
    return g;
}

// fn(), with the errors of a bad file (IOError, FormatError, ShapeError, DTypeError) turned into
// UsageError, on which generate exits 2.
template <class F>
auto bad_file_is_usage_error(F&& fn) -> decltype(fn()) {
    try {
        return fn();
    } catch (const IOError& e) {
        throw UsageError(e.what());
    } catch (const FormatError& e) {
        throw UsageError(e.what());
    } catch (const ShapeError& e) {
        throw UsageError(e.what());
    } catch (const DTypeError& e) {
        throw UsageError(e.what());
    }
}

// The model of a train_gpt checkpoint, on `device`: its config checked (checkpoint_config) before
// the model is built, then its parameters loaded.
std::unique_ptr<GPT> checkpoint_model(const std::string& path, Device device, RecordedTokenizer& recorded) {
    std::map<std::string, std::string> metadata;
    bool checksummed = false;
    NamedTensors tensors = bad_file_is_usage_error([&] { return load_safetensors(path, &metadata, &checksummed); });
    if (!checksummed) warn_unverified("generate", path);
    auto model = std::make_unique<GPT>(checkpoint_config(path, metadata, tensors, device, recorded));
    bad_file_is_usage_error([&] { load_checkpoint(path, tensors, metadata, *model); });
    return model;
}

// A Hugging Face model directory: one that holds config.json.
bool is_hf_directory(const std::string& path) {
    std::error_code ec;
    return std::filesystem::is_directory(path, ec) && std::filesystem::exists(std::filesystem::path(path) / "config.json", ec);
}

// The tokenizer of the run (see the top of this file), or none: --tokenizer, else the recorded one
// (for a Hugging Face directory: its tokenizer.json). UsageError when it cannot be read, is not the
// recorded one (another checksum), or has more ids than the model's vocabulary.
std::unique_ptr<Tokenizer> run_tokenizer(const GenerateArgs& a, const RecordedTokenizer& recorded, int64_t vocab_size) {
    const std::string path = a.tokenizer.empty() ? recorded.path : a.tokenizer;
    if (path.empty()) return nullptr;
    const std::string what = a.tokenizer.empty() ? "the checkpoint's tokenizer " + path : "--tokenizer " + path;
    std::unique_ptr<Tokenizer> tok;
    try {
        const std::string hash = hex(tokenizer_fnv1a64(path));
        if (!recorded.fnv1a64.empty() && hash != recorded.fnv1a64)
            throw UsageError(what + ": not the tokenizer the model was trained with (checksum " + hash +
                             ", the checkpoint's " + recorded.fnv1a64 + ")");
        tok = std::make_unique<Tokenizer>(Tokenizer::load(path));
    } catch (const Error& e) {
        const bool moved_hint = a.tokenizer.empty() && !recorded.fnv1a64.empty();  // a checkpoint's path
        throw UsageError(what + ": " + e.what() + (moved_hint ? " (give --tokenizer FILE if it has moved)" : ""));
    }
    if (tok->vocab_size() > vocab_size)
        throw UsageError(what + " has " + std::to_string(tok->vocab_size()) + " ids, more than the model's vocabulary of " +
                         std::to_string(vocab_size));
    return tok;
}

int run(const GenerateArgs& a) {
    // Everything a user can get wrong is checked before the model is built, but the prompt's bytes
    // and the tokenizer, which are checked against its vocabulary.
    if (!std::isfinite(a.temperature) || a.temperature < 0)
        throw UsageError("--temperature " + number_text(a.temperature) + ": expected a finite number >= 0 (0: greedy)");
    if (a.top_k < 0) throw UsageError("--top-k " + std::to_string(a.top_k) + ": expected an integer >= 0 (0: all)");
    if (a.tokens < 0) throw UsageError("--tokens " + std::to_string(a.tokens) + ": expected an integer >= 0");
    const std::string text = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
    if (text.empty())
        throw UsageError(a.prompt_file.empty() ? "--prompt: expected at least one byte, got an empty prompt"
                                               : "--prompt-file " + a.prompt_file + ": the file is empty");
    std::string device = a.device.empty() ? (cuda_is_available() ? "cuda" : "cpu") : a.device;
    if (device != "cpu" && device != "cuda") throw UsageError("--device \"" + device + "\": expected cpu or cuda");
    if (device == "cuda" && !cuda_is_available())
        throw UsageError(cuda_is_built() ? "--device cuda: no CUDA GPU is visible"
                                         : "--device cuda: this build of normtape has no CUDA backend");

    const Device dev = device == "cuda" ? Device::CUDA : Device::CPU;
    RecordedTokenizer recorded;
    std::unique_ptr<GPT> model;
    if (is_hf_directory(a.checkpoint)) {
        model = bad_file_is_usage_error([&] { return load_hf(a.checkpoint, dev, DType::F32); });
        std::error_code ec;
        const std::string json = (std::filesystem::path(a.checkpoint) / "tokenizer.json").string();
        if (std::filesystem::exists(json, ec)) recorded.path = json;
    } else {
        model = checkpoint_model(a.checkpoint, dev, recorded);
    }
    const GPTConfig& config = model->config();
    const std::unique_ptr<Tokenizer> tok = run_tokenizer(a, recorded, config.vocab_size);
    if (!tok && config.vocab_size > 256)
        throw UsageError(a.checkpoint + ": the model has a vocabulary of " + std::to_string(config.vocab_size) +
                         " tokens and no tokenizer: give --tokenizer FILE (without one, generate reads and writes "
                         "bytes, at most 256)");
    std::vector<int64_t> prompt;
    if (tok) {
        for (uint32_t id : tok->encode_ordinary(text)) prompt.push_back(id);
    } else {
        for (size_t i = 0; i < text.size(); ++i) {
            const int64_t byte = static_cast<unsigned char>(text[i]);
            if (byte >= config.vocab_size)
                throw UsageError("the prompt's byte " + std::to_string(byte) + " at offset " + std::to_string(i) +
                                 " is outside the checkpoint's vocabulary of " + std::to_string(config.vocab_size) +
                                 " tokens");
            prompt.push_back(byte);
        }
    }
    model->eval();  // sampling is inference

    SamplingOptions o;
    o.temperature = a.temperature;
    o.top_k = a.top_k;
    o.seed = a.seed;
    o.use_cache = !a.no_cache;
    int64_t no_token = 0;  // ids drawn that are no token of the tokenizer
    generate(*model, prompt, a.tokens, o, [&](int64_t token) {
        if (!tok) {
            std::fputc(static_cast<int>(token), stdout);
        } else {
            try {
                const std::string bytes = tok->decode({static_cast<uint32_t>(token)});
                std::fwrite(bytes.data(), 1, bytes.size(), stdout);
            } catch (const Error&) {
                ++no_token;
            }
        }
        std::fflush(stdout);  // each token as it is drawn
    });
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) throw std::runtime_error("cannot write to standard output");
    if (no_token > 0)
        std::fprintf(stderr, "generate: warning: %lld of the ids drawn are no token of %s (nothing was written for them)\n",
                     static_cast<long long>(no_token), tok->name().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    GenerateArgs a;
    CLI::App app{"generate: sample text from a train_gpt checkpoint (nanoGPT's sample.py, with a key/value cache)"};
    app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.add_option("checkpoint", a.checkpoint,
                   "a checkpoint written by train_gpt --save, or a Hugging Face model directory (config.json, "
                   "model.safetensors, tokenizer.json if any) of a Llama or GPT-2")->required()->type_name("PATH");
    auto* prompt = app.add_option("--prompt", a.prompt, "the text to continue (at least one byte)")->type_name("TEXT");
    auto* prompt_file =
        app.add_option("--prompt-file", a.prompt_file, "read the text to continue from this file")->type_name("FILE");
    prompt->excludes(prompt_file);
    app.add_option("--tokens", a.tokens, "tokens to generate, 0 or more")->check(number<int64_t>("an integer"));
    app.add_option("--tokenizer", a.tokenizer,
                   "encode the prompt and decode the tokens with this tokenizer (a rank file beside its .json, or a "
                   "tokenizer.json) (default: the one the checkpoint records, a directory's tokenizer.json, or "
                   "none: bytes)")
        ->type_name("FILE");
    app.add_option("--temperature", a.temperature, "divides the logits; 0: always the most likely token (greedy)")
        ->check(number<double>("a number"));
    app.add_option("--top-k", a.top_k, "draw among the k most likely tokens only (0: all)")
        ->check(number<int64_t>("an integer"));
    app.add_option("--seed", a.seed, "the sampler's seed, 0 to 2^64 - 1")
        ->check(number<uint64_t>("an integer from 0 to 2^64 - 1"));
    app.add_option("--device", a.device, "cpu or cuda (default: cuda when a GPU is visible, else cpu)");
    app.add_flag("--no-cache", a.no_cache,
                 "run the whole context through the model for every token (the reference; slower) instead of the "
                 "key/value cache");
    try {
        app.parse(argc, argv);
        if (app.count("--prompt") == 0 && app.count("--prompt-file") == 0)
            throw UsageError("give the text to continue: --prompt TEXT or --prompt-file FILE");
        return run(a);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "generate: %s (see --help)\n", e.what());
        return 2;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "generate: %s\n", e.what());
        return 2;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "generate: error: out of host memory (std::bad_alloc)\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "generate: error: %s\n", e.what());
        return 1;
    }
}
