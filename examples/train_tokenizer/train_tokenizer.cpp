// examples/train_tokenizer/train_tokenizer.cpp: trains a byte-level BPE vocabulary on a text (train_bpe,
// nn/data/tokenizer.h), or converts one, and saves it as tiktoken's rank file beside a JSON of its
// split pattern (as scripts/fetch_tiktoken.sh writes tiktoken's own encodings) and as Hugging Face's
// tokenizer.json:
//
//   train_tokenizer --data FILE --out PREFIX [--vocab N] [--pattern gpt2|gpt4|gpt4o|REGEX] [--val-fraction F]
//   train_tokenizer --from TOKENIZER --out PREFIX [--data FILE] [--val-fraction F]
//
// trains on the first 1 - F of FILE's bytes (train_gpt's training split: its last F is held out,
// default 0.1) with N tokens (default 4,096) and GPT-4's pattern unless --pattern names another;
// or reads TOKENIZER (a rank file beside its .json, or a tokenizer.json: Tokenizer::load). Writes
// PREFIX.tiktoken and PREFIX.json ({"pat_str", "special_tokens", "n_vocab"}; not for a
// tokenizer.json that merges by its list, which a rank file cannot hold) and PREFIX.tokenizer.json,
// and prints the time it took and, with --data, the bytes per token on the training split and on
// the held-out part.
// Exit status: 0; 2 for a bad flag or an unreadable file, with one line on stderr; 1 for an error
// while training or writing.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "normtape.h"

using namespace normtape;

namespace {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The bytes of a non-empty regular file; UsageError naming it and the reason otherwise.
std::string read_text(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
        throw UsageError("--data " + path + ": expected a text file, got " +
                         (std::filesystem::exists(path, ec) ? "something else (a directory?)" : "no such file"));
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    if (!(f && ss << f.rdbuf())) throw UsageError("--data " + path + ": cannot read the file: " + std::strerror(errno));
    if (ss.str().empty()) throw UsageError("--data " + path + ": the file is empty");
    return ss.str();
}

std::string pattern_of(const std::string& name) {
    if (name == "gpt2") return kGPT2SplitPattern;
    if (name == "gpt4") return kGPT4SplitPattern;
    if (name == "gpt4o") return kGPT4oSplitPattern;
    return name;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"train_tokenizer: train a byte-level BPE vocabulary on a text, or convert one, and save it as "
                 "tiktoken's rank file and Hugging Face's tokenizer.json"};
    std::string data, from, out, pattern = "gpt4";
    int64_t vocab = 4096;
    double val_fraction = 0.1;
    app.add_option("--data", data, "the text to train on (with --from: to measure bytes per token on; default: none)");
    auto* from_flag = app.add_option("--from", from, "convert this tokenizer instead: a rank file beside its .json, "
                                     "or a tokenizer.json (default: none, train one)");
    app.add_option("--out", out, "writes OUT.tiktoken and OUT.json (the ranks, the split pattern), OUT.tokenizer.json")
        ->required();
    app.add_option("--vocab", vocab, "tokens, 256 to 2^31 - 1 (the 256 single bytes first)")
        ->capture_default_str()
        ->excludes(from_flag);
    app.add_option("--pattern", pattern, "the split pattern: gpt2, gpt4 or gpt4o (tiktoken's), or a PCRE2 regex")
        ->capture_default_str()
        ->excludes(from_flag);
    app.add_option("--val-fraction", val_fraction, "the text's last part held out, 0 to 0.5, as train_gpt's")
        ->capture_default_str();
    try {
        app.parse(argc, argv);
        if (vocab < 256 || vocab >= (int64_t{1} << 31))
            throw UsageError("--vocab " + std::to_string(vocab) + ": expected 256 to 2^31 - 1 tokens");
        if (!(val_fraction >= 0 && val_fraction <= 0.5))
            throw UsageError("--val-fraction " + std::to_string(val_fraction) + ": expected a fraction from 0 to 0.5");
        if (data.empty() && from.empty()) throw UsageError("give --data to train on, or --from a tokenizer to convert");
        const std::string text = data.empty() ? std::string() : read_text(data);
        const auto held = static_cast<size_t>(std::floor(static_cast<double>(text.size()) * val_fraction));
        const std::string_view train(text.data(), text.size() - held), val(text.data() + text.size() - held, held);
        const auto t0 = std::chrono::steady_clock::now();
        Tokenizer tok = [&] {
            if (!from.empty()) {
                try {
                    return Tokenizer::load(from);
                } catch (const Error& e) {
                    throw UsageError(std::string("--from ") + from + ": " + e.what());
                }
            }
            try {
                return train_bpe(train, vocab, pattern_of(pattern), std::filesystem::path(out).filename().string());
            } catch (const FormatError& e) {
                throw UsageError(std::string("--pattern: ") + e.what());
            }
        }();
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::string wrote;
        if (!tok.merges_by_list()) {
            tok.save_tiktoken_file(out + ".tiktoken");
            const nlohmann::json meta = {{"pat_str", tok.pattern()}, {"special_tokens", tok.special_tokens()},
                                         {"n_vocab", tok.vocab_size()}};
            std::ofstream f(out + ".json");
            f << meta.dump(2) << "\n";
            f.close();
            if (!f) throw IOError("cannot write " + out + ".json");
            wrote = out + ".tiktoken, " + out + ".json and ";
        }
        tok.save_tokenizer_json(out + ".tokenizer.json");
        if (from.empty())
            std::printf("train_tokenizer: %lld tokens trained on %zu bytes of %s in %.2f s (%d threads)\n",
                        static_cast<long long>(tok.vocab_size()), train.size(), data.c_str(), seconds, get_num_threads());
        else
            std::printf("train_tokenizer: %s read, %lld ids, in %.2f s\n", from.c_str(),
                        static_cast<long long>(tok.vocab_size()), seconds);
        for (const auto& [part, what] : {std::pair{train, "training split"}, {val, "held-out part"}}) {
            if (part.empty()) continue;
            const size_t ids = tok.encode_ordinary(part).size();
            std::printf("  %s: %zu bytes in %zu tokens, %.3f bytes per token\n", what, part.size(), ids,
                        static_cast<double>(part.size()) / static_cast<double>(ids));
        }
        std::printf("wrote %s%s.tokenizer.json\n", wrote.c_str(), out.c_str());
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "train_tokenizer: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train_tokenizer: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
