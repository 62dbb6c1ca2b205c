// examples/bench/bench_tokenizer.cpp: the tokenizer's encoding throughput (nn/data/tokenizer.h) on one
// cpu thread, for a text file and a tiktoken encoding that scripts/fetch_tiktoken.sh fetched;
// scripts/bench_tokenizer.sh times tiktoken itself (node, the WASM build) on the same file in the
// same run and sets the two side by side.
//
//   bench_tokenizer --vocab DIR --encoding NAME --input FILE [--repeat N] [--ids FILE]
// Loads DIR/NAME.tiktoken with DIR/NAME.json's pattern and special tokens, then encodes FILE's bytes
// as ordinary text --repeat times (default 3) with the steady clock, and prints the tokens, the
// bytes and the fastest run's ms and MB/s. --ids writes the ids as little-endian uint32 (as
// scripts/tiktoken_reference.mjs does), for comparison.
// Exit status: 0 done, 2 a bad flag, 1 an error.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "normtape.h"

using namespace normtape;

namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw IOError("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_tokenizer: the BPE tokenizer's encoding throughput on one cpu thread"};
    std::string vocab, encoding, input, ids_path;
    int repeat = 3;
    app.add_option("--vocab", vocab, "the directory of scripts/fetch_tiktoken.sh's files")->required();
    app.add_option("--encoding", encoding, "gpt2, cl100k_base or o200k_base")->required();
    app.add_option("--input", input, "the text to encode")->required();
    app.add_option("--repeat", repeat, "timed runs, the fastest reported")->check(CLI::Range(1, 100));
    app.add_option("--ids", ids_path, "write the ids here (little-endian uint32)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        const nlohmann::json meta = nlohmann::json::parse(read_file(vocab + "/" + encoding + ".json"));
        const Tokenizer tok = Tokenizer::from_tiktoken_file(vocab + "/" + encoding + ".tiktoken",
                                                            meta.at("pat_str").get<std::string>(),
                                                            meta.at("special_tokens").get<std::map<std::string, uint32_t>>());
        const std::string text = read_file(input);
        std::vector<uint32_t> ids;
        double best = std::numeric_limits<double>::infinity();
        for (int r = 0; r < repeat; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            ids = tok.encode_ordinary(text);
            best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::printf("normtape %s: %zu tokens from %zu bytes in %.1f ms (%.2f MB/s, the fastest of %d)\n",
                    encoding.c_str(), ids.size(), text.size(), best, static_cast<double>(text.size()) / 1e3 / best,
                    repeat);
        if (!ids_path.empty()) {
            std::string bytes;
            for (uint32_t id : ids)
                for (int k = 0; k < 4; ++k) bytes += static_cast<char>((id >> (8 * k)) & 0xff);
            std::ofstream f(ids_path, std::ios::binary);
            f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
            if (!f) throw IOError("cannot write " + ids_path);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
