// fuzz/fuzz_tokenizer_files.cpp: a libFuzzer target for the tokenizer's files (nn/data/tokenizer.h) and
// the token files (nn/data/token_file.h), which a user hands train_gpt, generate and train_tokenizer.
//
// Each input is read four ways:
//   - as Hugging Face's tokenizer.json (Tokenizer::from_tokenizer_json);
//   - as tiktoken's rank file, with GPT-2's split pattern (Tokenizer::from_tiktoken_file);
//   - as the JSON beside a rank file (Tokenizer::load of a fixed rank file whose .json is the input);
//   - as a token file in each format (parse_token_file: auto, llm.c, raw).
// FormatError is the expected answer to bad bytes. A tokenizer that reads must give a fixed text
// back from its ids, with special tokens allowed and as text, and every id it gives must be below
// its vocab_size; an Error while encoding is allowed only from matching the split pattern (PCRE2's
// match limit, on a pattern the input chose). Anything else is a finding: a crash, an
// AddressSanitizer or UndefinedBehaviorSanitizer report, a leak, an exception of another kind, or
// a message longer than 1,000 bytes. Run by scripts/fuzz.sh.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "check_message.h"
#include "core/check.h"
#include "nn/data/token_file.h"
#include "nn/data/tokenizer.h"

namespace {

void write(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) std::abort();
}

// A tokenizer the input made: it must encode and decode the text back.
void check_round_trip(const normtape::Tokenizer& tok) {
    // Short pieces, and long ones (encode's heap path).
    static const std::string text = "Hello, world! It's 2026: 12345 \xe6\xbc\xa2\xe5\xad\x97 \xff\xfe <|endoftext|>\r\n  end" +
                                    std::string(300, ' ') + "x" + std::string(300, 'a') + std::string(300, '7');
    try {
        for (const std::vector<uint32_t>& ids : {tok.encode_ordinary(text), tok.encode_with_special_tokens(text)}) {
            for (uint32_t id : ids)
                if (id >= tok.vocab_size()) std::abort();
            if (tok.decode(ids) != text) std::abort();
        }
    } catch (const normtape::Error& e) {
        if (std::string(e.what()).find("matching the split pattern failed") == std::string::npos) throw;
        check_message(e);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace normtape;
    static const std::string dir = [] {
        char tmpl[] = "/tmp/normtape_fuzz_tokenizer_XXXXXX";
        if (!mkdtemp(tmpl)) std::abort();
        // A fixed rank file (the 256 bytes), for the input as its JSON (bytes.json).
        std::vector<std::string> bytes;
        for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
        normtape::Tokenizer(bytes, normtape::kGPT2SplitPattern).save_tiktoken_file(std::string(tmpl) + "/bytes.tiktoken");
        return std::string(tmpl);
    }();
    const std::string input(reinterpret_cast<const char*>(data), size);
    write(dir + "/input.json", input);
    write(dir + "/input.tiktoken", input);
    write(dir + "/bytes.json", input);
    for (int way = 0; way < 3; ++way) {
        try {
            const Tokenizer tok = way == 0   ? Tokenizer::from_tokenizer_json(dir + "/input.json")
                                  : way == 1 ? Tokenizer::from_tiktoken_file(dir + "/input.tiktoken", kGPT2SplitPattern)
                                             : Tokenizer::load(dir + "/bytes.tiktoken");
            check_round_trip(tok);
        } catch (const FormatError& e) {
            check_message(e);
        }
    }
    for (TokenFileFormat format : {TokenFileFormat::Auto, TokenFileFormat::LlmC, TokenFileFormat::Raw}) {
        try {
            const std::vector<uint32_t> ids = parse_token_file(input, "<fuzz input>", format);
            if (ids.size() > size) std::abort();
        } catch (const FormatError& e) {
            check_message(e);
        }
    }
    return 0;
}
