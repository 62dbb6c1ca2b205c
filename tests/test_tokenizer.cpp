// tests/test_tokenizer.cpp: the byte-level BPE tokenizer (nn/data/tokenizer.h): merges worked out by
// hand on a small vocabulary, special tokens allowed and refused, every byte string decoded back to
// itself, each malformed rank file's error; and, where scripts/fetch_tiktoken.sh has fetched them
// (vocab/, or NORMTAPE_VOCAB_DIR) and node runs, the ids of OpenAI's tiktoken (its WASM build, the
// reference) for gpt2, cl100k_base and o200k_base on tinyshakespeare and on a text of Unicode's
// corners (tests/fixtures/tokenizer/unicode.txt).
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// The 256 single bytes (rank = the byte), then `merged`, ranks 256 on.
std::vector<std::string> bytes_and(const std::vector<std::string>& merged) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    tokens.insert(tokens.end(), merged.begin(), merged.end());
    return tokens;
}

std::string vocab_dir() {
    const char* dir = std::getenv("NORMTAPE_VOCAB_DIR");
    return dir && *dir ? dir : std::string(NORMTAPE_SOURCE_DIR) + "/vocab";
}

// Skips the rest of the test case unless scripts/fetch_tiktoken.sh has fetched tiktoken's encodings
// and node, which runs its reference encoder, is installed.
#define REQUIRE_TIKTOKEN_OR_SKIP()                                                                        \
    do {                                                                                                  \
        if (!std::filesystem::exists(vocab_dir() + "/o200k_base.tiktoken") ||                              \
            !std::filesystem::exists(vocab_dir() + "/tiktoken"))                                          \
            SKIP_TEST("no tiktoken encodings in " << vocab_dir() << " (run scripts/fetch_tiktoken.sh)");  \
        if (std::system("node --version > /dev/null 2>&1") != 0)                                          \
            SKIP_TEST("node, which runs tiktoken's reference encoder, is not installed");                 \
    } while (0)

Tokenizer tiktoken_encoding(const std::string& name) {
    const nlohmann::json meta = nlohmann::json::parse(slurp(vocab_dir() + "/" + name + ".json"));
    return Tokenizer::from_tiktoken_file(vocab_dir() + "/" + name + ".tiktoken", meta["pat_str"].get<std::string>(),
                                         meta["special_tokens"].get<std::map<std::string, uint32_t>>());
}

// tiktoken's ids for the file `input` (scripts/tiktoken_reference.mjs), special tokens allowed or not.
std::vector<uint32_t> reference_ids(const TempDir& dir, const std::string& name, const std::string& input, bool special) {
    const std::string out = dir / "ids.bin";
    const std::string cmd = "node " + std::string(NORMTAPE_SOURCE_DIR) + "/scripts/tiktoken_reference.mjs encode " +
                            shell_quote(vocab_dir()) + " " + name + " " + shell_quote(input) + " " + out +
                            (special ? " --special" : "") + " > " + (dir / "node.log") + " 2>&1";
    REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, slurp(dir / "node.log"));
    const std::string bytes = slurp(out);
    std::vector<uint32_t> ids(bytes.size() / 4);
    for (size_t i = 0; i < ids.size(); ++i)
        for (int k = 3; k >= 0; --k) ids[i] = (ids[i] << 8) | static_cast<unsigned char>(bytes[4 * i + k]);
    return ids;
}

// Pieces past 256 bytes (encode's heap path): runs of letters, spaces, digits, punctuation, emoji.
std::string long_pieces() {
    std::string text = std::string(3000, 'a') + std::string(50000, ' ') + "x\n" + std::string(10000, '7') + " ";
    for (int i = 0; i < 20000; ++i) text += "qwertyuiopasdfghjklzxcvbnm"[(i * 7919) % 26];
    text += std::string(5000, '!') + " ";
    for (int i = 0; i < 2000; ++i) text += "\xf0\x9f\x98\x80";
    return text;
}

// The first position where a and b differ, for the failure's message.
size_t first_difference(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    return i;
}

}  // namespace

TEST_CASE("tokenizer: a piece is its token, or its bytes merged lowest rank first, the leftmost of equal ranks") {
    // 256 "th", 257 "he", 258 "the", 259 " t", 260 " the", 261 "aa".
    const Tokenizer tok(bytes_and({"th", "he", "the", " t", " the", "aa"}), kGPT2SplitPattern);
    CHECK(tok.vocab_size() == 262);
    // "the" and " the" are tokens: one id each, whatever merges would give.
    CHECK(tok.encode_ordinary("the the") == std::vector<uint32_t>{258, 260});
    // "then": t h e n -> "th" (256, lower than "he" 257) -> "the" (258) -> "the" n.
    CHECK(tok.encode_ordinary("then") == std::vector<uint32_t>{258, 'n'});
    // "hthe": h t h e: "th" (256) at 1 first, then "the" (258); "hthe" is no token.
    CHECK(tok.encode_ordinary("hthe") == std::vector<uint32_t>{'h', 258});
    // "aaa": the pairs at 0 and 1 are both "aa": the leftmost merges, leaving a.
    CHECK(tok.encode_ordinary("aaa") == std::vector<uint32_t>{261, 'a'});
    // GPT-2's pattern keeps a space with the word after it: " then" is " " t h e n; "th" (256)
    // merges before " t" (259), then "the" (258), then " the" (260).
    CHECK(tok.encode_ordinary(" then") == std::vector<uint32_t>{260, 'n'});
    CHECK(tok.decode({260, 'n', 258}) == " thenthe");
    // A piece past 256 bytes takes the heap's path, to the same merges: 301 a's are 150 "aa" and an
    // a, then 75 "aaaa" (the leftmost pairs first), by rank and by Hugging Face's list alike.
    std::vector<uint32_t> quads(75, 257);
    quads.push_back('a');
    const Tokenizer a_rank(bytes_and({"aa", "aaaa"}), kGPT2SplitPattern);
    const Tokenizer a_list(bytes_and({"aa", "aaaa"}), {{'a', 'a'}, {256, 256}}, false, kGPT2SplitPattern);
    for (const Tokenizer* t : {&a_rank, &a_list}) {
        CHECK(t->encode_ordinary(std::string(301, 'a')) == quads);
        CHECK(t->encode_ordinary(std::string(255, 'a')).size() == 65);  // the scan: 63 "aaaa", "aa", a
    }
}

TEST_CASE("tokenizer: special tokens are ids when allowed, an Error when not, and text under encode_ordinary") {
    const Tokenizer tok(bytes_and({"ab"}), kGPT4SplitPattern, {{"<|end|>", 300}, {"<|end|>x", 301}}, "small");
    CHECK(tok.vocab_size() == 302);
    CHECK(tok.encode("ab<|end|>ab", {"<|end|>"}) == std::vector<uint32_t>{256, 300, 256});
    // The longest of the special tokens that start at one place.
    CHECK(tok.encode_with_special_tokens("<|end|>x<|end|>") == std::vector<uint32_t>{301, 300});
    CHECK_THROWS_KIND_WITH(tok.encode("ab <|end|>"), Error, "Tokenizer small", "special token <|end|> at byte 3",
                           "not allowed");
    const std::vector<uint32_t> ordinary = tok.encode_ordinary("<|end|>");
    CHECK(ordinary.size() > 1);
    CHECK(tok.decode(ordinary) == "<|end|>");
    CHECK(tok.decode({300, 256}) == "<|end|>ab");
    CHECK_THROWS_KIND_WITH(tok.decode({256, 299}), Error, "Tokenizer small", "id 299 at position 1 is no token");
    CHECK_THROWS_KIND_WITH(tok.decode({302}), Error, "id 302 at position 0");
}

TEST_CASE("tokenizer: every byte string decodes back to itself, invalid UTF-8 included") {
    const Tokenizer tok(bytes_and({"ab", "\xc3\xa9", " \xe6\xbc\xa2"}), kGPT4oSplitPattern);
    std::string all;
    for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
    for (const std::string& text : {all + all, std::string("caf\xc3\xa9 \xe6\xbc\xa2\xe5\xad\x97 ab"),
                                    std::string("\xff\xfe broken \xc3 UTF-8 \xe6\xbc"), std::string(), std::string("  \r\n\t ")}) {
        CAPTURE(text.size());
        CHECK(tok.decode(tok.encode_ordinary(text)) == text);
    }
    // Invalid bytes are pieces of their own: the valid text around them is split as without them.
    const std::vector<uint32_t> ids = tok.encode_ordinary("ab\xff" "ab");
    CHECK(ids == std::vector<uint32_t>{256, 0xff, 256});
}

TEST_CASE("tokenizer: a rank file round-trips, and a malformed one is a FormatError naming the file and the line") {
    TempDir dir("tokenizer");
    const Tokenizer tok(bytes_and({"ab", "\n\xff"}), kGPT2SplitPattern);
    tok.save_tiktoken_file(dir / "small.tiktoken");
    const std::string text = slurp(dir / "small.tiktoken");
    CHECK(text.find("YWI= 256\n") != std::string::npos);  // "ab"
    CHECK(text.find("Cv8= 257\n") != std::string::npos);  // "\n\xff"
    const Tokenizer back = Tokenizer::from_tiktoken_file(dir / "small.tiktoken", kGPT2SplitPattern);
    CHECK(back.tokens() == tok.tokens());
    CHECK(back.name() == "small");
    const std::string base = text.substr(0, text.find("YWI= 256\n"));  // the 256 bytes' lines
    struct Case {
        std::string body, says;
    };
    for (const Case& c : {
             Case{base + "YWI=256\n", "line 257: expected \"BASE64 RANK\""},
             Case{base + "YWI= 256 x\n", "line 257: expected \"BASE64 RANK\""},
             Case{base + "YW!= 256\n", "line 257: malformed base64 \"YW!=\""},
             Case{base + "YWJ= 256\n", "malformed base64"},  // bits past the last byte
             Case{base + "YWI 256\n", "malformed base64"},
             Case{base + "YWI= -1\n", "expected a rank from 0 to 2^31 - 1, got \"-1\""},
             Case{base + "YWI= 2147483648\n", "got \"2147483648\""},
             Case{base + "YWI= 255\n", "rank 255 appears twice"},
             Case{base + "YWI= 258\n", "expected the ranks 0 to 256 each once, got none for rank 256"},
             // A rank far past the others: a gap, found without making room for two billion tokens.
             Case{base + "YWI= 2000000000\n", "got none for rank 256"},
             Case{base + "YWI= 256\nYWI= 257\n", "expected each token once, got the bytes of rank 256 again at rank 257"},
             Case{"YWI= 0\n", "expected every single byte to be a token"},
             Case{"", "expected ranks, got none"},
         }) {
        CAPTURE(c.says);
        write_bytes(dir / "bad.tiktoken", c.body);
        CHECK_THROWS_KIND_WITH(Tokenizer::from_tiktoken_file(dir / "bad.tiktoken", kGPT2SplitPattern), FormatError,
                               "bad.tiktoken", c.says);
    }
    CHECK_THROWS_KIND_WITH(Tokenizer::from_tiktoken_file(dir / "missing.tiktoken", kGPT2SplitPattern), IOError,
                           "missing.tiktoken");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({}), "(unclosed"), FormatError, "split pattern does not compile",
                           "at offset");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({}), kGPT2SplitPattern, {{"<s>", 3}}), Error,
                           "special token <s>'s id past the 256 ranks");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({}), kGPT2SplitPattern, {{"<s>", 300}, {"</s>", 300}}), Error,
                           "expected distinct ids, got 300");
}

TEST_CASE("tokenizer: Hugging Face's rule merges only the listed pairs, by their place in the list") {
    // 256 "ab", 257 "bc", 258 "abc"; tokenizers' list: (b, c), then (a, b), and neither (ab, c) nor (a, bc).
    const std::vector<std::pair<uint32_t, uint32_t>> merges = {{'b', 'c'}, {'a', 'b'}};
    const Tokenizer by_list(bytes_and({"ab", "bc", "abc"}), merges, false, kGPT2SplitPattern);
    const Tokenizer by_rank(bytes_and({"ab", "bc", "abc"}), kGPT2SplitPattern);
    CHECK(by_list.merges_by_list());
    CHECK(!by_rank.merges_by_list());
    // "xabc": by the list, (b, c) is first and (a, bc) is not listed; by rank, "ab" (256) merges
    // before "bc" (257), then "abc" is a token.
    CHECK(by_list.encode_ordinary("xabc") == std::vector<uint32_t>{'x', 'a', 257});
    CHECK(by_rank.encode_ordinary("xabc") == std::vector<uint32_t>{'x', 258});
    // A piece that is a token: its id under ignore_merges (and tiktoken's rule), merged otherwise.
    CHECK(by_list.encode_ordinary("abc") == std::vector<uint32_t>{'a', 257});
    const Tokenizer ignoring(bytes_and({"ab", "bc", "abc"}), merges, true, kGPT2SplitPattern);
    CHECK(ignoring.encode_ordinary("abc") == std::vector<uint32_t>{258});
    CHECK(ignoring.encode_ordinary("xabc") == std::vector<uint32_t>{'x', 'a', 257});
    // Ids need not follow the merges, and special tokens may sit between them: the bytes at 1 and 2,
    // a special token at 0.
    std::vector<std::string> tokens = bytes_and({"ab"});
    std::swap(tokens[0], tokens[256]);  // "ab" at 0, byte 0 at 256
    tokens.push_back(std::exchange(tokens[0], ""));  // "ab" at 257, none at 0
    const Tokenizer moved(tokens, {{'a', 'b'}}, false, kGPT2SplitPattern, {{"<s>", 0}});
    CHECK(moved.vocab_size() == 258);
    CHECK(moved.encode_with_special_tokens("<s>abab") == std::vector<uint32_t>{0, 257, 257});
    CHECK(moved.decode({0, 257, 256}) == std::string("<s>ab") + '\0');
    TempDir dir("tokenizer_rule");
    CHECK_THROWS_KIND_WITH(by_list.save_tiktoken_file(dir / "x.tiktoken"), Error, "Hugging Face's list",
                           "save_tokenizer_json");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({"ab"}), {{'a', 'b'}, {'a', 'b'}}, false, kGPT2SplitPattern), Error,
                           "merge 1 (97, 98) is listed twice, first as merge 0");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({"ab"}), {{'a', 'c'}}, false, kGPT2SplitPattern), Error,
                           "merge 0 (97, 99) makes bytes that are no token");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({"ab"}), {{'a', 400}}, false, kGPT2SplitPattern), Error,
                           "names an id that is no ordinary token");
    CHECK_THROWS_KIND_WITH(Tokenizer(bytes_and({"ab"}), {{'a', 'b'}}, false, kGPT2SplitPattern, {{"<s>", 'a'}}),
                           Error, "special token <s>'s id past the 257 ranks or at an id with no ordinary token");
}

TEST_CASE("tokenizer: a tokenizer.json round-trips in tokenizers' form, and a malformed one is a FormatError naming the file") {
    TempDir dir("tokenizer_json");
    const Tokenizer tok(bytes_and({" t", "he", " the", "\n\n", "\xe6\xbc"}), kGPT4SplitPattern, {{"<|end|>", 262}}, "small");
    tok.save_tokenizer_json(dir / "small.tokenizer.json");
    const nlohmann::json j = nlohmann::json::parse(slurp(dir / "small.tokenizer.json"));
    // GPT-2's byte-to-unicode map: a space is U+0120, a newline U+010A, 0xE6 itself (U+00E6).
    CHECK(j["model"]["vocab"]["\xc4\xa0t"] == 256);
    CHECK(j["model"]["vocab"]["\xc4\x8a\xc4\x8a"] == 259);
    CHECK(j["model"]["vocab"]["\xc3\xa6\xc2\xbc"] == 260);
    CHECK(j["model"]["vocab"]["<|end|>"] == 262);
    CHECK(j["model"]["ignore_merges"] == true);
    // Every split of each token into two tokens, in the tokens' rank order: " the" is " t" + "he"
    // alone ("the" is no token).
    const std::vector<std::string> merges = j["model"]["merges"].get<std::vector<std::string>>();
    CHECK(merges == std::vector<std::string>{"\xc4\xa0 t", "h e", "\xc4\xa0t he", "\xc4\x8a \xc4\x8a", "\xc3\xa6 \xc2\xbc"});
    CHECK(j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == kGPT4SplitPattern);
    CHECK(j["added_tokens"][0]["content"] == "<|end|>");
    const Tokenizer back = Tokenizer::from_tokenizer_json(dir / "small.tokenizer.json");
    CHECK(back.name() == "small");
    CHECK(back.merges_by_list());
    CHECK(back.vocab_size() == 263);
    CHECK(back.special_tokens() == tok.special_tokens());
    for (const std::string& text : {std::string(" the then\n\n\n\xe6\xbc\xa2<|end|>he"), slurp(shakespeare_path()).substr(0, 5000)})
        CHECK(back.encode_with_special_tokens(text) == tok.encode_with_special_tokens(text));
    // GPT-2's pattern is ByteLevel's own; written back, the list of the loaded one as it is.
    const Tokenizer gpt2_like(bytes_and({"ab"}), kGPT2SplitPattern);
    std::filesystem::create_directories(dir / "gpt2");
    gpt2_like.save_tokenizer_json(dir / "gpt2/tokenizer.json");
    const Tokenizer gpt2_back = Tokenizer::load(dir / "gpt2/tokenizer.json");
    CHECK(gpt2_back.name() == "gpt2");  // a directory's tokenizer.json is named by the directory
    CHECK(gpt2_back.pattern() == kGPT2SplitPattern);
    back.save_tokenizer_json(dir / "again.json");
    CHECK(nlohmann::json::parse(slurp(dir / "again.json")) == j);

    // Each malformed file: a FormatError naming it and what is wrong.
    auto with = [&](const std::function<void(nlohmann::json&)>& change) {
        nlohmann::json bad = j;
        change(bad);
        write_bytes(dir / "bad.json", bad.dump());
    };
    struct Case {
        std::function<void(nlohmann::json&)> change;
        std::string says;
    };
    for (const Case& c : std::vector<Case>{
             {[](nlohmann::json& b) { b["model"]["type"] = "WordPiece"; }, "expected \"model\" of \"type\" \"BPE\""},
             {[](nlohmann::json& b) { b["model"]["continuing_subword_prefix"] = "##"; },
              "\"continuing_subword_prefix\" is not supported"},
             {[](nlohmann::json& b) { b["truncation"] = {{"max_length", 8}}; }, "\"truncation\" is not supported"},
             {[](nlohmann::json& b) { b["added_tokens"][0]["special"] = false; }, "\"<|end|>\" is not \"special\""},
             {[](nlohmann::json& b) { b["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(["; },
              "split pattern does not compile"},
             {[](nlohmann::json& b) { b["model"]["dropout"] = 0.1; }, "\"dropout\" is not supported"},
             {[](nlohmann::json& b) { b["model"]["byte_fallback"] = true; }, "\"byte_fallback\" is not supported"},
             {[](nlohmann::json& b) { b["normalizer"] = {{"type", "NFC"}}; }, "\"normalizer\" is not supported"},
             {[](nlohmann::json& b) { b["decoder"] = {{"type", "Metaspace"}}; }, "decoder\" of \"type\" \"ByteLevel\""},
             {[](nlohmann::json& b) { b.erase("pre_tokenizer"); }, "expected a \"pre_tokenizer\""},
             {[](nlohmann::json& b) { b["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
              "add_prefix_space is not supported"},
             {[](nlohmann::json& b) { b["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
              "expected ByteLevel's \"use_regex\" false"},
             {[](nlohmann::json& b) { b["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
              "expected a Split on a \"Regex\""},
             {[](nlohmann::json& b) { b["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "expected a ByteLevel"},
             {[](nlohmann::json& b) { b["pre_tokenizer"] = {{"type", "ByteLevel"}, {"use_regex", false}}; },
              "expected ByteLevel's \"use_regex\" true"},
             {[](nlohmann::json& b) { b["model"]["vocab"]["a b"] = 263; }, "token \"a b\" holds a character"},
             {[](nlohmann::json& b) { b["model"]["vocab"]["\xe6\xbc\xa2"] = 263; }, "holds a character"},
             {[](nlohmann::json& b) { b["model"]["vocab"]["xy"] = 256; }, "id 256 is given twice"},
             {[](nlohmann::json& b) { b["model"]["vocab"]["xy"] = -1; }, "has id -1"},
             {[](nlohmann::json& b) { b["model"]["vocab"]["xy"] = 1.5; }, "has id 1.5, expected an integer"},
             {[](nlohmann::json& b) { b["model"]["vocab"]["xy"] = 2000000000; }, "expected ids below 264"},
             {[](nlohmann::json& b) { b["model"]["vocab"] = {1, 2}; }, "\"vocab\" to be an object"},
             {[](nlohmann::json& b) { b["model"]["merges"] = {{"x", 1}}; }, "\"merges\" to be an array"},
             {[](nlohmann::json& b) { b["added_tokens"] = {{"x", 1}}; }, "\"added_tokens\" to be an array"},
             {[](nlohmann::json& b) { b["added_tokens"][0]["id"] = "262"; }, "has id \"262\""},
             {[](nlohmann::json& b) { b["model"]["vocab"].erase("a"); }, "none for byte 97"},
             {[](nlohmann::json& b) { b["model"]["merges"].push_back("x yz"); },
              "merges\" 5: \"yz\" is not an ordinary token of the vocabulary"},
             {[](nlohmann::json& b) { b["model"]["merges"].push_back("<|end|> h"); },
              "merges\" 5: \"<|end|>\" is not an ordinary token"},
             {[](nlohmann::json& b) { b["model"]["merges"].push_back("xyz"); }, "expected \"left right\", got \"xyz\""},
             {[](nlohmann::json& b) { b["model"]["merges"].push_back("h e"); }, "merge 5 (104, 101) is listed twice"},
             {[](nlohmann::json& b) { b["model"].erase("merges"); }, "not a byte-level BPE tokenizer.json"},
             {[](nlohmann::json& b) { b["added_tokens"][0]["lstrip"] = true; }, "<|end|>\"'s \"lstrip\" is not supported"},
             {[](nlohmann::json& b) { b["added_tokens"][0]["id"] = 263; }, "<|end|>\" has id 263, the vocabulary 262"},
             {[](nlohmann::json& b) { b["added_tokens"].push_back({{"id", 256}, {"content", "<|new|>"}, {"special", true}}); },
              "id 256 is \"\xc4\xa0t\" and the added token \"<|new|>\""},
         }) {
        CAPTURE(c.says);
        with(c.change);
        CHECK_THROWS_KIND_WITH(Tokenizer::from_tokenizer_json(dir / "bad.json"), FormatError, "bad.json", c.says);
    }
    // What tokenizers reads as none is accepted: "" for the subword prefix and suffix (GPT-2's files),
    // a dropout of 0, an unk_token (never used: every byte is a token).
    for (const auto& change : std::vector<std::function<void(nlohmann::json&)>>{
             [](nlohmann::json& b) { b["model"]["continuing_subword_prefix"] = b["model"]["end_of_word_suffix"] = ""; },
             [](nlohmann::json& b) { b["model"]["dropout"] = 0.0; },
             [](nlohmann::json& b) { b["model"]["unk_token"] = "<unk>"; }}) {
        with(change);
        CHECK(Tokenizer::from_tokenizer_json(dir / "bad.json").encode_ordinary(" the then") ==
              tok.encode_ordinary(" the then"));
    }
    write_bytes(dir / "bad.json", "{\"model\": ");
    CHECK_THROWS_KIND_WITH(Tokenizer::from_tokenizer_json(dir / "bad.json"), FormatError, "bad.json: not JSON");
    write_bytes(dir / "bad.json", std::string(100000, '[') + std::string(100000, ']'));  // no stack overflow
    CHECK_THROWS_KIND_WITH(Tokenizer::from_tokenizer_json(dir / "bad.json"), FormatError, "bad.json: not JSON",
                           "nests deeper");
    CHECK_THROWS_KIND_WITH(Tokenizer::from_tokenizer_json(dir / "missing.json"), IOError, "missing.json");
    // A rank file's JSON: "pat_str" is needed; a missing one is an IOError.
    tok.save_tiktoken_file(dir / "ranks.tiktoken");
    CHECK_THROWS_KIND_WITH(Tokenizer::load(dir / "ranks.tiktoken"), IOError, "ranks.json");
    write_bytes(dir / "ranks.json", "{\"special_tokens\": {}}");
    CHECK_THROWS_KIND_WITH(Tokenizer::load(dir / "ranks.tiktoken"), FormatError, "ranks.json", "\"pat_str\"");
    write_bytes(dir / "ranks.json", nlohmann::json{{"pat_str", kGPT4SplitPattern}, {"special_tokens", {{"<|end|>", 262}}}}.dump());
    CHECK(Tokenizer::load(dir / "ranks.tiktoken").encode_with_special_tokens("he<|end|>") == std::vector<uint32_t>{257, 262});
}

TEST_CASE("tokenizer: the ids of Hugging Face's tokenizers for two tokenizer.json files it trained") {
    // scripts/tokenizer_reference.py fixtures wrote these, tokenizers 0.23: a Split on GPT-4's pattern
    // with two special tokens at ids 0 and 1 (merges by the list), and ByteLevel's own pattern with
    // ignore_merges; the ids of encode(text, add_special_tokens=False) for three texts.
    const std::string fixtures = std::string(NORMTAPE_SOURCE_DIR) + "/tests/fixtures/tokenizer/";
    const nlohmann::json expected = nlohmann::json::parse(slurp(fixtures + "hf_ids.json"));
    const std::string shakespeare = slurp(shakespeare_path());
    const std::map<std::string, std::string> texts = {
        {"unicode.txt", slurp(fixtures + "unicode.txt")},
        {"shakespeare_tail", shakespeare.substr(shakespeare.size() - 4000)},
        {"special", "First<|endoftext|>second <|pad|><|endoftext|> end<|endofprompt|>\n"}};
    for (const std::string kind : {"split", "byte_level"}) {
        CAPTURE(kind);
        const Tokenizer tok = Tokenizer::load(fixtures + "hf_" + kind + ".tokenizer.json");
        CHECK(tok.merges_by_list());
        CHECK(tok.special_tokens().size() == (kind == "split" ? 2u : 0u));
        for (const auto& [name, text] : texts) {
            CAPTURE(name);
            const std::vector<uint32_t> ours = tok.encode_with_special_tokens(text);
            const auto theirs = expected[kind][name].get<std::vector<uint32_t>>();
            CHECK_MESSAGE(ours == theirs, "first difference at id ", first_difference(ours, theirs), " of ", theirs.size());
            CHECK(tok.decode(ours) == text);
        }
    }
}

TEST_CASE("tokenizer: invalid UTF-8 is pieces of its own bytes, between valid text that tiktoken encodes") {
    REQUIRE_TIKTOKEN_OR_SKIP();
    // scripts/tokenizer_reference.py invalid wrote the ids with Python's tiktoken 0.14: each valid run
    // by encode_ordinary, each run of invalid bytes by _encode_single_piece.
    const std::string fixtures = std::string(NORMTAPE_SOURCE_DIR) + "/tests/fixtures/tokenizer/";
    const nlohmann::json expected = nlohmann::json::parse(slurp(fixtures + "invalid_utf8.ids.json"));
    const std::string text = slurp(fixtures + "invalid_utf8.txt");
    for (const std::string name : {"gpt2", "cl100k_base", "o200k_base"}) {
        CAPTURE(name);
        const Tokenizer tok = tiktoken_encoding(name);
        const std::vector<uint32_t> ours = tok.encode_ordinary(text);
        const auto theirs = expected[name].get<std::vector<uint32_t>>();
        CHECK_MESSAGE(ours == theirs, "first difference at id ", first_difference(ours, theirs), " of ", theirs.size());
        CHECK(tok.decode(ours) == text);
    }
}

TEST_CASE("tokenizer: gpt2, cl100k_base and o200k_base written as tokenizer.json read back to tiktoken's ids") {
    // tokenizers itself reads these files to tiktoken's ids (scripts/tokenizer_reference.py compare,
    // docs/GPU_TESTS.md); here our reader of them meets our rank files.
    REQUIRE_TIKTOKEN_OR_SKIP();
    TempDir dir("tokenizer_json_real");
    const std::string text = slurp(shakespeare_path()).substr(0, 200000) +
                             slurp(std::string(NORMTAPE_SOURCE_DIR) + "/tests/fixtures/tokenizer/unicode.txt") +
                             long_pieces();
    for (const std::string name : {"gpt2", "cl100k_base", "o200k_base"}) {
        CAPTURE(name);
        const Tokenizer tok = tiktoken_encoding(name);
        tok.save_tokenizer_json(dir / (name + ".json"));
        const Tokenizer back = Tokenizer::from_tokenizer_json(dir / (name + ".json"));
        CHECK(back.vocab_size() == tok.vocab_size());
        CHECK(back.special_tokens() == tok.special_tokens());
        const std::vector<uint32_t> ours = back.encode_ordinary(text), theirs = tok.encode_ordinary(text);
        CHECK_MESSAGE(ours == theirs, "first difference at id ", first_difference(ours, theirs), " of ", theirs.size());
    }
}

TEST_CASE("tokenizer: the ids of tiktoken for gpt2, cl100k_base and o200k_base on Shakespeare and on Unicode's corners") {
    REQUIRE_TIKTOKEN_OR_SKIP();
    TempDir dir("tokenizer_tiktoken");
    const std::string unicode = std::string(NORMTAPE_SOURCE_DIR) + "/tests/fixtures/tokenizer/unicode.txt";
    // A text with special tokens in it, for encode with them allowed.
    write_bytes(dir / "special.txt", "First<|endoftext|>second <|endoftext|><|endofprompt|> end\n");
    write_bytes(dir / "long.txt", long_pieces());
    const std::map<std::string, const char*> patterns = {
        {"gpt2", kGPT2SplitPattern}, {"cl100k_base", kGPT4SplitPattern}, {"o200k_base", kGPT4oSplitPattern}};
    for (const auto& [name, pattern] : patterns) {
        CAPTURE(name);
        const Tokenizer tok = tiktoken_encoding(name);
        CHECK(tok.pattern() == pattern);  // the constants are tiktoken's patterns
        for (const std::string& input : {shakespeare_path(), unicode, dir / "long.txt"}) {
            CAPTURE(input);
            const std::string text = slurp(input);
            const std::vector<uint32_t> ours = tok.encode_ordinary(text), theirs = reference_ids(dir, name, input, false);
            CHECK_MESSAGE(ours == theirs, "first difference at id ", first_difference(ours, theirs), " of ",
                          theirs.size());
            CHECK(tok.decode(ours) == text);
        }
        if (name != "gpt2") {  // gpt2 has <|endoftext|> alone: the text's <|endofprompt|> is text there
            const std::vector<uint32_t> ours = tok.encode_with_special_tokens(slurp(dir / "special.txt"));
            CHECK(ours == reference_ids(dir, name, dir / "special.txt", true));
        }
    }
}

TEST_CASE("tokenizer: train_bpe's merges equal a plain Python implementation of the same rules, at any number of threads") {
    TempDir dir("train_bpe");
    // An ASCII form of GPT-2's pattern, which Python's re runs: the text is ASCII.
    const std::string pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+)";
    const std::string script = R"PY(
import collections, re, sys
text, pattern, merges = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), int(sys.argv[3])
pieces = collections.Counter(re.findall(pattern, text))
words = [[list(p), n] for p, n in pieces.items()]
tokens = [bytes([b]) for b in range(256)]
for _ in range(merges):
    stats = collections.Counter()
    for word, n in words:
        for pair in zip(word, word[1:]):
            stats[pair] += n
    if not stats:
        break
    a, b = max(stats, key=lambda p: (stats[p], -p[0], -p[1]))
    t = len(tokens)
    tokens.append(tokens[a] + tokens[b])
    for entry in words:
        word, out, i = entry[0], [], 0
        while i < len(word):
            if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                out.append(t)
                i += 2
            else:
                out.append(word[i])
                i += 1
        entry[0] = out
print("\n".join(t.hex() for t in tokens[256:]))
)PY";
    write_bytes(dir / "train_bpe.py", script);
    write_bytes(dir / "pattern.txt", pattern);
    const std::string text = slurp(shakespeare_path());
    const int threads_before = get_num_threads();
    // The whole text (past 1 MB: counted in two parts), and a short one with merges enough for
    // many pairs of equal counts.
    for (const auto& [sample, merges] : {std::pair{text, 64}, std::pair{text.substr(0, 60000), 300}}) {
        CAPTURE(sample.size());
        write_bytes(dir / "text.txt", sample);
        const std::string cmd = python() + " " + (dir / "train_bpe.py") + " " + (dir / "text.txt") + " " +
                                (dir / "pattern.txt") + " " + std::to_string(merges) + " > " + (dir / "merges.txt");
        REQUIRE(std::system(cmd.c_str()) == 0);
        const std::string expected = slurp(dir / "merges.txt");
        for (int threads : {1, 3}) {
            CAPTURE(threads);
            set_num_threads(threads);
            const Tokenizer tok = train_bpe(sample, 256 + merges, pattern);
            std::string ours;
            for (size_t r = 256; r < tok.tokens().size(); ++r) {
                for (unsigned char c : tok.tokens()[r]) {
                    static const char* const kHex = "0123456789abcdef";
                    ours += kHex[c >> 4];
                    ours += kHex[c & 15];
                }
                ours += '\n';
            }
            CHECK(ours == expected);
            CHECK(tok.vocab_size() == 256 + merges);
            const std::vector<uint32_t> ids = tok.encode_ordinary(sample);
            CHECK(ids.size() < sample.size() * 3 / 4);  // 64 merges already shorten English by a quarter
            CHECK(tok.decode(ids) == sample);
        }
    }
    set_num_threads(threads_before);
    CHECK_THROWS_KIND_WITH(train_bpe(text, 255), Error, "train_bpe", "vocab_size from 256", "got 255");
    CHECK_THROWS_KIND_WITH(train_bpe(text, 300, "(["), FormatError, "train_bpe", "does not compile");
    // Past 1 MiB, where counting cuts the text: "q \n" repeated is "q", " " and "\n" under GPT-2's
    // pattern (its lookahead sees the "q" after each newline), pieces of one byte: nothing to merge.
    std::string spaced;
    for (int i = 0; i < 400000; ++i) spaced += "q \n";
    CHECK(train_bpe(spaced + "q", 300, kGPT2SplitPattern).vocab_size() == 256);
    // A text too short for the vocabulary: "ab" and " ab" merge (a, b), then (" ", ab), and no
    // piece has two tokens left.
    const Tokenizer small = train_bpe("ab ab", 1000);
    CHECK(small.vocab_size() == 258);
    CHECK(small.tokens().back() == " ab");
}

TEST_CASE("train_tokenizer: 4,096 tokens on Shakespeare's training split, saved as a rank file and a tokenizer.json that load back, and bad flags exit 2") {
    if (std::string(NORMTAPE_TRAIN_TOKENIZER).empty()) SKIP_TEST("train_tokenizer was not built");
    TempDir dir("train_tokenizer");
    auto run = [&](const std::string& args) {
        const std::string cmd = std::string(NORMTAPE_TRAIN_TOKENIZER) + " " + args + " > " + (dir / "out") + " 2> " +
                                (dir / "err");
        const int status = std::system(cmd.c_str());
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    };
    REQUIRE(run("--data " + shell_quote(shakespeare_path()) + " --out " + (dir / "shakespeare")) == 0);
    const std::string out = slurp(dir / "out");
    CAPTURE(out);
    CHECK(out.find("4096 tokens trained on 1003855 bytes") != std::string::npos);  // the first 90%
    const nlohmann::json meta = nlohmann::json::parse(slurp(dir / "shakespeare.json"));
    CHECK(meta["pat_str"] == kGPT4SplitPattern);
    CHECK(meta["n_vocab"] == 4096);
    const Tokenizer tok = Tokenizer::from_tiktoken_file(dir / "shakespeare.tiktoken", meta["pat_str"].get<std::string>());
    const std::string text = slurp(shakespeare_path());
    CHECK(tok.tokens() == train_bpe(std::string_view(text).substr(0, 1003855), 4096).tokens());
    CHECK(tok.decode(tok.encode_ordinary(text)) == text);
    // Its tokenizer.json, written beside, converts back to the same ids (tokenizers' list rule).
    const Tokenizer from_json = Tokenizer::from_tokenizer_json(dir / "shakespeare.tokenizer.json");
    CHECK(from_json.merges_by_list());
    CHECK(from_json.encode_ordinary(text) == tok.encode_ordinary(text));
    REQUIRE(run("--from " + (dir / "shakespeare.tokenizer.json") + " --data " + shell_quote(shakespeare_path()) +
                " --out " + (dir / "again")) == 0);
    CHECK(slurp(dir / "out").find("held-out part: 111539 bytes") != std::string::npos);
    CHECK(std::filesystem::exists(dir / "again.tokenizer.json"));
    CHECK(!std::filesystem::exists(dir / "again.tiktoken"));  // a list of merges is no rank file
    for (const auto& [args, says] : std::initializer_list<std::pair<std::string, std::string>>{
             {"--data /nonexistent --out x", "--data /nonexistent: expected a text file, got no such file"},
             {"--data " + dir.path.string() + " --out x", "expected a text file, got something else"},
             {"--data /dev/null --out x", "expected a text file"},
             {"--data " + shell_quote(shakespeare_path()) + " --out x --vocab 100", "--vocab 100: expected 256"},
             {"--data " + shell_quote(shakespeare_path()) + " --out x --pattern '(['", "--pattern: "},
             {"--data " + shell_quote(shakespeare_path()) + " --out x --val-fraction 0.9", "--val-fraction"},
             {"--out x", "give --data to train on, or --from a tokenizer to convert"},
             {"--from " + (dir / "shakespeare.tiktoken") + " --out x --vocab 300", "excludes"},
             {"--from /nonexistent.json --out x", "--from /nonexistent.json: Tokenizer: cannot read"},
         }) {
        CAPTURE(args);
        CHECK(run(args) == 2);
        CHECK(slurp(dir / "err").find(says) != std::string::npos);
    }
}
