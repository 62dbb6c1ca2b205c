// nn/data/tokenizer_json.cpp: the tokenizer's files in JSON: Hugging Face's tokenizer.json (Note
// [tokenizer.json], nn/data/tokenizer.h), and the JSON beside a tiktoken rank file that Tokenizer::load reads.
#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "nn/data/tokenizer.h"
#include "nn/formats/json_read.h"

namespace normtape {

namespace {

using nlohmann::json;

// GPT-2's byte-to-unicode map: the code point that spells byte b in a tokenizer.json.
uint32_t byte_to_code_point(int b) {
    static const auto table = [] {
        std::vector<uint32_t> t(256);
        uint32_t next = 256;
        for (int c = 0; c < 256; ++c) {
            const bool as_itself = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
            t[static_cast<size_t>(c)] = as_itself ? static_cast<uint32_t>(c) : next++;
        }
        return t;
    }();
    return table[static_cast<size_t>(b)];
}

// `bytes` spelled by the map, in UTF-8 (every code point is below 0x800: one or two bytes).
std::string spell(std::string_view bytes) {
    std::string out;
    for (unsigned char b : bytes) {
        const uint32_t c = byte_to_code_point(b);
        if (c < 0x80) {
            out += static_cast<char>(c);
        } else {
            out += static_cast<char>(0xC0 | (c >> 6));
            out += static_cast<char>(0x80 | (c & 0x3F));
        }
    }
    return out;
}

// The bytes that `text` (UTF-8, as nlohmann-json checks) spells, or false when a character is not
// one of the map's 256.
bool unspell(std::string_view text, std::string& out) {
    static const auto inverse = [] {
        std::vector<int> t(324, -1);
        for (int b = 0; b < 256; ++b) t[byte_to_code_point(b)] = b;
        return t;
    }();
    out.clear();
    for (size_t i = 0; i < text.size();) {
        const auto lead = static_cast<unsigned char>(text[i]);
        uint32_t c = lead;
        if (lead >= 0xC0 && lead < 0xE0 && i + 1 < text.size()) {
            c = ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
            i += 2;
        } else if (lead < 0x80) {
            i += 1;
        } else {
            return false;  // three or four bytes: past the map
        }
        if (c >= inverse.size() || inverse[c] < 0) return false;
        out += static_cast<char>(inverse[c]);
    }
    return true;
}

std::string read_file(const std::string& path, const char* what) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    if (f) ss << f.rdbuf();
    if (!f || f.bad()) throw IOError(std::string("Tokenizer: cannot read ") + what + " " + path + ": " + std::strerror(errno));
    return ss.str();
}

// Whether `j` holds `key` with a value other than null.
bool has(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

// A ByteLevel object (pre-tokenizer) as Hugging Face writes it.
json byte_level(bool use_regex) {
    return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

}  // namespace

Tokenizer Tokenizer::from_tokenizer_json(const std::string& path, std::string name) {
    const std::string text = read_file(path, "the tokenizer.json");
    auto fail = [&](const std::string& why) { return FormatError("Tokenizer: " + path + ": " + why); };
    auto quote = [](const std::string& s) { return detail::json_excerpt(json(s)); };  // short, and escaped
    // An id: an integer from 0 to 2^31 - 1.
    auto id_of_value = [&](const json& value, const std::string& what) {
        if (!value.is_number_integer() || (value.is_number_unsigned() ? value.get<uint64_t>() >= (uint64_t{1} << 31)
                                                                       : value.get<int64_t>() < 0 ||
                                                                             value.get<int64_t>() >= (int64_t{1} << 31)))
            throw fail(what + " has id " + detail::json_excerpt(value) + ", expected an integer from 0 to 2^31 - 1");
        return value.get<uint32_t>();
    };
    json j;
    std::string why;
    if (!detail::parse_json(text, j, why)) throw fail("not JSON: " + why);
    try {
        const json& model = j.at("model");
        if (model.value("type", std::string("BPE")) != "BPE")
            throw fail("expected \"model\" of \"type\" \"BPE\", got " + detail::json_excerpt(model.at("type")));
        // What tokenizers reads as "none" is accepted: GPT-2's files (transformers' GPT2Converter) write
        // "" for the subword prefix and suffix. An unk_token is never used: every byte is a token.
        for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
            if (has(model, key) && model.at(key) != "")
                throw fail(std::string("\"model\": \"") + key + "\" is not supported (expected null or \"\")");
        if (has(model, "dropout") && model.at("dropout") != 0)
            throw fail("\"model\": \"dropout\" is not supported (expected null or 0)");
        if (model.value("byte_fallback", false)) throw fail("\"model\": \"byte_fallback\" is not supported");
        const bool ignore_merges = model.value("ignore_merges", false);
        for (const char* key : {"normalizer", "truncation", "padding"})
            if (has(j, key))
                throw fail(std::string("\"") + key + "\" is not supported (expected null): it would change the ids");
        if (has(j, "decoder") && j.at("decoder").at("type") != "ByteLevel")
            throw fail("expected a \"decoder\" of \"type\" \"ByteLevel\", got " + detail::json_excerpt(j.at("decoder").at("type")));

        // The split pattern: ByteLevel's own (GPT-2's), or a Split before a ByteLevel without it.
        if (!has(j, "pre_tokenizer")) throw fail("expected a \"pre_tokenizer\", got none");
        const json& pre = j.at("pre_tokenizer");
        auto check_byte_level = [&](const json& p, bool use_regex) {
            if (p.at("type") != "ByteLevel")
                throw fail("expected a ByteLevel \"pre_tokenizer\", got " + detail::json_excerpt(p.at("type")));
            if (p.value("add_prefix_space", false)) throw fail("\"pre_tokenizer\": add_prefix_space is not supported");
            if (p.value("use_regex", true) != use_regex)
                throw fail(std::string("\"pre_tokenizer\": expected ByteLevel's \"use_regex\" ") +
                           (use_regex ? "true (a ByteLevel alone)" : "false (after a Split)"));
        };
        std::string pattern;
        if (pre.at("type") == "Sequence" && pre.at("pretokenizers").size() == 2) {
            const json& split = pre.at("pretokenizers")[0];
            if (split.at("type") != "Split" || !split.at("pattern").contains("Regex") ||
                split.value("behavior", std::string()) != "Isolated" || split.value("invert", false))
                throw fail("\"pre_tokenizer\": expected a Split on a \"Regex\", \"behavior\" \"Isolated\", not inverted, "
                           "got " + detail::json_excerpt(split));
            pattern = split.at("pattern").at("Regex").get<std::string>();
            check_byte_level(pre.at("pretokenizers")[1], false);
        } else {
            check_byte_level(pre, true);
            pattern = kGPT2SplitPattern;
        }

        // The added tokens: the special tokens, each at its id in the vocabulary if it is there.
        const json& vocab = model.at("vocab");
        if (!vocab.is_object()) throw fail("expected \"model\" \"vocab\" to be an object of token: id");
        if (has(j, "added_tokens") && !j.at("added_tokens").is_array())
            throw fail("expected \"added_tokens\" to be an array");
        std::map<std::string, uint32_t> special;
        std::map<uint32_t, std::string> special_at;
        if (has(j, "added_tokens"))
            for (const json& added : j.at("added_tokens")) {
                const auto content = added.at("content").get<std::string>();
                const uint32_t id = id_of_value(added.at("id"), "\"added_tokens\": " + quote(content));
                for (const char* key : {"lstrip", "rstrip", "single_word"})
                    if (added.value(key, false))
                        throw fail("\"added_tokens\": " + quote(content) + "'s \"" + key + "\" is not supported");
                // tokenizers matches an added token that is not special in all text: a special token
                // here is matched only where allowed (Tokenizer::encode).
                if (!added.value("special", false))  // tokenizers' default
                    throw fail("\"added_tokens\": " + quote(content) + " is not \"special\", which is not supported");
                if (auto it = vocab.find(content); it != vocab.end() && *it != id)
                    throw fail("\"added_tokens\": " + quote(content) + " has id " + std::to_string(id) +
                               ", the vocabulary " + detail::json_excerpt(*it));
                special[content] = id;
                special_at[id] = content;
            }
        // The ordinary tokens by id: each one's bytes, spelled by the byte-to-unicode map.
        std::vector<std::string> tokens;
        std::string bytes;
        // An ordinary id past the entries (holes in the ids) would only allocate: refused.
        const size_t id_bound = vocab.size() + special.size();
        for (const auto& [spelled, value] : vocab.items()) {
            const uint32_t id = id_of_value(value, "\"model\" \"vocab\": token " + quote(spelled));
            if (auto it = special_at.find(id); it != special_at.end()) {
                if (it->second != spelled)
                    throw fail("\"model\" \"vocab\": id " + std::to_string(id) + " is " + quote(spelled) +
                               " and the added token " + quote(it->second));
                continue;
            }
            if (id >= id_bound)
                throw fail("\"model\" \"vocab\": token " + quote(spelled) + " has id " + std::to_string(id) +
                           ", expected ids below " + std::to_string(id_bound) + " (the entries and added tokens)");
            if (!unspell(spelled, bytes))
                throw fail("\"model\" \"vocab\": token " + quote(spelled) + " holds a character that is not one of "
                           "ByteLevel's 256 (not a byte-level vocabulary)");
            if (id >= tokens.size()) tokens.resize(id + size_t{1});
            if (!tokens[id].empty()) throw fail("\"model\" \"vocab\": id " + std::to_string(id) + " is given twice");
            tokens[id] = bytes;
        }
        // The merges, "left right" or ["left", "right"], as pairs of ids.
        std::vector<std::pair<uint32_t, uint32_t>> merges;
        const json& list = model.at("merges");
        if (!list.is_array()) throw fail("expected \"model\" \"merges\" to be an array");
        merges.reserve(list.size());
        for (size_t m = 0; m < list.size(); ++m) {
            std::string left, right;
            if (list[m].is_string()) {
                const auto s = list[m].get<std::string>();
                const size_t space = s.find(' ');
                if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
                    throw fail("\"model\" \"merges\" " + std::to_string(m) + ": expected \"left right\", got " + quote(s));
                left = s.substr(0, space), right = s.substr(space + 1);
            } else {
                if (list[m].size() != 2) throw fail("\"model\" \"merges\" " + std::to_string(m) + ": expected two tokens");
                left = list[m][0].get<std::string>(), right = list[m][1].get<std::string>();
            }
            auto id = [&](const std::string& token) {  // an ordinary token's, checked above
                auto it = vocab.find(token);
                if (it == vocab.end() || special_at.count(it->get<uint32_t>()))
                    throw fail("\"model\" \"merges\" " + std::to_string(m) + ": " + quote(token) +
                               " is not an ordinary token of the vocabulary");
                return it->get<uint32_t>();
            };
            merges.emplace_back(id(left), id(right));
        }
        if (name.empty()) {  // "gpt2/tokenizer.json" and "gpt2.tokenizer.json" are gpt2
            std::error_code ec;
            std::filesystem::path p = std::filesystem::absolute(path, ec);
            p = (ec ? std::filesystem::path(path) : p).lexically_normal();
            name = p.stem().string();
            if (name == "tokenizer" && p.parent_path().has_filename()) name = p.parent_path().filename().string();
            if (name.size() > 10 && name.ends_with(".tokenizer")) name.resize(name.size() - 10);
        }
        try {
            return Tokenizer(std::move(tokens), merges, ignore_merges, pattern, std::move(special), std::move(name));
        } catch (const Error& e) {  // the constructor's checks, the pattern's included: the file's fault
            throw fail(e.what());
        }
    } catch (const FormatError&) {
        throw;
    } catch (const json::exception& e) {  // a key missing or of the wrong type
        throw fail(std::string("not a byte-level BPE tokenizer.json: ") + e.what());
    }
}

void Tokenizer::save_tokenizer_json(const std::string& path) const {
    // The merges: the list, or every pair of tokens whose concatenation is a token (Note [tokenizer.json]).
    std::vector<std::pair<uint32_t, uint32_t>> merges = merge_list_;
    if (!by_list_) {
        std::unordered_map<std::string_view, uint32_t> id_of;
        for (size_t t = 0; t < tokens_.size(); ++t) id_of.emplace(tokens_[t], static_cast<uint32_t>(t));
        auto find = [&](std::string_view b) {
            auto it = id_of.find(b);
            return it == id_of.end() ? UINT32_MAX : it->second;
        };
        for (size_t t = 0; t < tokens_.size(); ++t) {
            std::vector<std::pair<uint32_t, uint32_t>> pairs;
            const std::string_view bytes = tokens_[t];
            for (size_t k = 1; k < bytes.size(); ++k) {
                const uint32_t l = find(bytes.substr(0, k)), r = find(bytes.substr(k));
                if (l != UINT32_MAX && r != UINT32_MAX) pairs.emplace_back(l, r);
            }
            std::sort(pairs.begin(), pairs.end());
            merges.insert(merges.end(), pairs.begin(), pairs.end());
        }
    }
    const std::string what = "Tokenizer::save_tokenizer_json: " + name_ + ": ";
    json added = json::array();
    for (const auto& [id, content] : special_by_id_)
        added.push_back({{"id", id}, {"content", *content}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", true}});
    const json pre = pattern_ == kGPT2SplitPattern
                         ? byte_level(true)
                         : json{{"type", "Sequence"},
                                {"pretokenizers",
                                 {{{"type", "Split"}, {"pattern", {{"Regex", pattern_}}}, {"behavior", "Isolated"},
                                   {"invert", false}},
                                  byte_level(false)}}};
    auto dump = [&](const json& j) {  // strictly UTF-8: tokenizers reads nothing else
        try {
            return j.dump();
        } catch (const json::exception& e) {
            throw Error(what + "a special token or the pattern is not UTF-8: " + e.what());
        }
    };
    // Written by hand from here: nlohmann's ordered objects find each key by a linear search.
    std::string out = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":" + dump(added) +
                      ",\"normalizer\":null,\"pre_tokenizer\":" + dump(pre) + ",\"post_processor\":null,\"decoder\":" +
                      byte_level(true).dump() +
                      ",\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
                      "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,\"ignore_merges\":" +
                      (ignore_merges_ ? "true" : "false") + ",\"vocab\":{";
    // The special tokens are in the vocabulary too, as Hugging Face's files have them: tokenizers
    // numbers an added token the vocabulary lacks by itself. Their keys are their text as it is.
    std::vector<std::pair<uint32_t, std::string>> vocab;  // id, key
    for (size_t id = 0; id < tokens_.size(); ++id)
        if (!tokens_[id].empty()) vocab.emplace_back(static_cast<uint32_t>(id), spell(tokens_[id]));
    for (const auto& [id, content] : special_by_id_) vocab.emplace_back(id, *content);
    std::sort(vocab.begin(), vocab.end());
    for (size_t i = 0; i < vocab.size(); ++i)
        out += (i ? "," : "") + dump(vocab[i].second) + ":" + std::to_string(vocab[i].first);
    out += "},\"merges\":[";
    for (size_t m = 0; m < merges.size(); ++m)
        out += (m ? "," : "") + json(spell(tokens_[merges[m].first]) + " " + spell(tokens_[merges[m].second])).dump();
    out += "]}}\n";
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(out.data(), static_cast<std::streamsize>(out.size()));
    f.close();
    if (!f) throw IOError(what + "cannot write " + path + ": " + std::strerror(errno));
}

Tokenizer Tokenizer::load(const std::string& path) {
    if (std::filesystem::path(path).extension() == ".json") return from_tokenizer_json(path);
    const std::string meta_path = std::filesystem::path(path).replace_extension(".json").string();
    const std::string meta_text = read_file(meta_path, "the JSON beside the rank file");
    std::string pattern;
    std::map<std::string, uint32_t> special;
    json meta;
    std::string why;
    if (!detail::parse_json(meta_text, meta, why)) throw FormatError("Tokenizer: " + meta_path + ": not JSON: " + why);
    try {
        pattern = meta.at("pat_str").get<std::string>();
        if (meta.contains("special_tokens")) special = meta.at("special_tokens").get<std::map<std::string, uint32_t>>();
    } catch (const json::exception& e) {
        throw FormatError("Tokenizer: " + meta_path + ": expected a JSON object with the string \"pat_str\" and an "
                          "object \"special_tokens\" of ids: " + e.what());
    }
    return from_tiktoken_file(path, pattern, std::move(special));
}

}  // namespace normtape
