// nn/data/tokenizer.cpp: the byte-level BPE tokenizer (Note [Byte-level BPE], nn/data/tokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "nn/data/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/check.h"

namespace normtape {

const char* const kGPT2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kGPT4SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kGPT4oSplitPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxIds = uint64_t{1} << 31;

// PCRE2's message for `code`.
std::string pcre2_message(int code) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(code, buffer, sizeof buffer);
    return reinterpret_cast<const char*>(buffer);
}

// The 6-bit value of base64 character c (RFC 4648's alphabet), or -1.
int base64_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

// The bytes of base64 text `s` (padded to a multiple of 4 with '='), or false when it is malformed.
bool base64_decode(std::string_view s, std::string& out) {
    out.clear();
    if (s.empty() || s.size() % 4 != 0) return false;
    for (size_t i = 0; i < s.size(); i += 4) {
        const bool last = i + 4 == s.size();
        const int pad = last ? (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=') : 0;
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
            const int d = k >= 4 - pad ? 0 : base64_value(s[i + k]);
            if (d < 0) return false;
            v = (v << 6) | static_cast<uint32_t>(d);
        }
        out += static_cast<char>(v >> 16);
        if (pad < 2) out += static_cast<char>((v >> 8) & 0xff);
        if (pad < 1) out += static_cast<char>(v & 0xff);
        // The bits past the last byte must be zero (canonical base64, as tiktoken's files are).
        if ((pad == 1 && (v & 0xff)) || (pad == 2 && (v & 0xffff))) return false;
    }
    return true;
}

std::string base64_encode(std::string_view bytes) {
    static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < bytes.size(); i += 3) {
        const size_t n = std::min<size_t>(3, bytes.size() - i);
        uint32_t v = 0;
        for (size_t k = 0; k < 3; ++k) v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
        for (size_t k = 0; k < 4; ++k) out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=';
    }
    return out;
}

}  // namespace

// The split pattern compiled once, JIT-compiled where PCRE2 has its JIT.
struct Tokenizer::Regex {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Regex() { pcre2_code_free(code); }
};

struct Tokenizer::Ranks {
    std::unordered_map<std::string_view, uint32_t> of;  // keys view tokens_'s strings
    uint32_t find(std::string_view bytes) const {
        auto it = of.find(bytes);
        return it == of.end() ? kNoRank : it->second;
    }
};

Tokenizer::Tokenizer(std::vector<std::string> tokens, const std::string& pattern,
                     std::map<std::string, uint32_t> special_tokens, std::string name)
    : tokens_(std::move(tokens)),
      special_(std::move(special_tokens)),
      pattern_(pattern),
      name_(std::move(name)),
      regex_(std::make_unique<Regex>()),
      ranks_(std::make_unique<Ranks>()) {
    const std::string what = "Tokenizer " + name_ + ": ";
    NT_CHECK(tokens_.size() < kMaxIds, what, "expected fewer than 2^31 tokens, got ", tokens_.size());
    ranks_->of.reserve(tokens_.size());
    for (size_t r = 0; r < tokens_.size(); ++r) {
        NT_CHECK(!tokens_[r].empty(), what, "expected a token of at least one byte, got an empty one at rank ", r);
        auto [it, inserted] = ranks_->of.emplace(tokens_[r], static_cast<uint32_t>(r));
        NT_CHECK(inserted, what, "expected each token once, got the bytes of rank ", it->second, " again at rank ", r);
    }
    for (int b = 0; b < 256; ++b)
        NT_CHECK(ranks_->find(std::string(1, static_cast<char>(b))) != kNoRank, what,
                 "expected every single byte to be a token (a byte-level BPE), got none for byte ", b);
    uint64_t size = tokens_.size();
    for (const auto& [text, id] : special_) {
        NT_CHECK(!text.empty(), what, "expected special tokens of at least one byte, got an empty one");
        NT_CHECK(id >= tokens_.size() && id < kMaxIds, what, "expected special token ", text, "'s id past the ",
                 tokens_.size(), " ranks and below 2^31, got ", id);
        size = std::max<uint64_t>(size, uint64_t{id} + 1);
    }
    by_id_.assign(size, nullptr);
    for (size_t r = 0; r < tokens_.size(); ++r) by_id_[r] = &tokens_[r];
    for (const auto& [text, id] : special_) {
        NT_CHECK(by_id_[id] == nullptr, what, "expected distinct ids, got ", id, " for special token ", text,
                 " and for ", *by_id_[id]);
        by_id_[id] = &text;
    }
    int code = 0;
    PCRE2_SIZE offset = 0;
    regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
    NT_CHECK_AS(FormatError, regex_->code != nullptr, what, "the split pattern does not compile: ", pcre2_message(code),
                " at offset ", offset);
    regex_->jit = pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE) == 0;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_tiktoken_file(const std::string& path, const std::string& pattern,
                                        std::map<std::string, uint32_t> special_tokens, std::string name) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw IOError("Tokenizer: cannot read the rank file " + path + ": " + std::strerror(errno));
    std::vector<std::string> tokens;
    std::vector<bool> seen;
    std::string line, bytes;
    int64_t number = 0;
    auto fail = [&](const std::string& why) {
        return FormatError("Tokenizer: rank file " + path + ", line " + std::to_string(number) + ": " + why);
    };
    while (std::getline(f, line)) {
        ++number;
        const size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
            throw fail("expected \"BASE64 RANK\", got \"" + line.substr(0, 80) + "\"");
        const std::string_view b64(line.data(), space), digits(line.data() + space + 1, line.size() - space - 1);
        if (!base64_decode(b64, bytes)) throw fail("malformed base64 \"" + std::string(b64.substr(0, 80)) + "\"");
        uint64_t rank = 0;
        bool ok = !digits.empty() && digits.size() <= 10;
        for (char c : digits) ok = ok && c >= '0' && c <= '9', rank = rank * 10 + static_cast<uint64_t>(c - '0');
        if (!ok || rank >= kMaxIds)
            throw fail("expected a rank from 0 to 2^31 - 1, got \"" + std::string(digits.substr(0, 20)) + "\"");
        if (rank >= tokens.size()) tokens.resize(rank + 1), seen.resize(rank + 1, false);
        if (seen[rank]) throw fail("rank " + std::to_string(rank) + " appears twice");
        seen[rank] = true;
        tokens[rank] = bytes;
    }
    if (f.bad()) throw IOError("Tokenizer: cannot read the rank file " + path + ": " + std::strerror(errno));
    if (auto gap = std::find(seen.begin(), seen.end(), false); gap != seen.end())
        throw FormatError("Tokenizer: rank file " + path + ": expected the ranks 0 to " + std::to_string(seen.size() - 1) +
                          " each once, got none for rank " + std::to_string(gap - seen.begin()));
    NT_CHECK_AS(FormatError, !tokens.empty(), "Tokenizer: rank file ", path, ": expected ranks, got none");
    if (name.empty()) name = std::filesystem::path(path).stem().string();
    try {
        return Tokenizer(std::move(tokens), pattern, std::move(special_tokens), std::move(name));
    } catch (const FormatError&) {
        throw;
    } catch (const Error& e) {  // a repeated token: the file's fault
        throw FormatError("Tokenizer: rank file " + path + ": " + e.what());
    }
}

void Tokenizer::save_tiktoken_file(const std::string& path) const {
    std::string text;
    for (size_t r = 0; r < tokens_.size(); ++r) text += base64_encode(tokens_[r]) + " " + std::to_string(r) + "\n";
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) throw IOError("Tokenizer::save_tiktoken_file: cannot write " + path + ": " + std::strerror(errno));
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
    if (const uint32_t rank = ranks_->find(piece); rank != kNoRank) {
        out.push_back(rank);
        return;
    }
    // parts[i].start: where part i begins; parts[i].rank: the rank of part i joined with part i + 1
    // (kNoRank: not a token). One sentinel part at the end.
    struct Part {
        size_t start;
        uint32_t rank;
    };
    std::vector<Part> parts(piece.size() + 1);
    for (size_t i = 0; i < parts.size(); ++i) parts[i] = {i, kNoRank};
    auto pair_rank = [&](size_t i) {  // parts i and i + 1 joined, where part i + 1 exists
        return i + 2 < parts.size() ? ranks_->find(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start))
                                    : kNoRank;
    };
    for (size_t i = 0; i + 1 < parts.size(); ++i) parts[i].rank = pair_rank(i);
    for (;;) {
        size_t best = 0;
        uint32_t best_rank = kNoRank;
        for (size_t i = 0; i + 1 < parts.size(); ++i)
            if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
        if (best_rank == kNoRank) break;
        parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
        parts[best].rank = pair_rank(best);
        if (best > 0) parts[best - 1].rank = pair_rank(best - 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i)
        out.push_back(ranks_->find(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
}

std::vector<uint32_t> Tokenizer::encode_ordinary(std::string_view text) const {
    std::vector<uint32_t> ids;
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
    NT_CHECK_AS(OutOfMemoryError, match != nullptr, "Tokenizer ", name_, ": cannot allocate PCRE2's match data");
    struct Free {
        pcre2_match_data* m;
        ~Free() { pcre2_match_data_free(m); }
    } free_match{match};
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = 0;  // the first byte not yet encoded
    while (at < text.size()) {
        // PCRE2_NOTEMPTY: a pattern that could match nothing moves on to its next non-empty match.
        const int rc = regex_->jit
                           ? pcre2_jit_match(regex_->code, subject, text.size(), at, PCRE2_NOTEMPTY, match, nullptr)
                           : pcre2_match(regex_->code, subject, text.size(), at, PCRE2_NOTEMPTY, match, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        NT_CHECK(rc >= 0, "Tokenizer ", name_, ": matching the split pattern failed at byte ", at, ": ",
                 pcre2_message(rc));
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
        const size_t start = ov[0], end = ov[1];
        if (start > at) encode_piece(text.substr(at, start - at), ids);  // bytes no match covers
        encode_piece(text.substr(start, end - start), ids);
        at = end;
    }
    if (at < text.size()) encode_piece(text.substr(at), ids);
    return ids;
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, const std::vector<std::string>& allowed_special) const {
    std::vector<uint32_t> ids;
    // Where each special token next occurs at or after `at` (npos: nowhere), found again only once
    // `at` passes it: one scan of the text per special token and occurrence.
    std::vector<std::pair<const std::pair<const std::string, uint32_t>*, size_t>> next;
    for (const auto& entry : special_) next.emplace_back(&entry, text.find(entry.first));
    size_t at = 0;
    for (;;) {
        // The earliest special token at or after `at` (the longest where several start there).
        const std::pair<const std::string, uint32_t>* found = nullptr;
        size_t where = std::string_view::npos;
        for (auto& [entry, p] : next) {
            if (p != std::string_view::npos && p < at) p = text.find(entry->first, at);
            if (p < where || (p == where && p != std::string_view::npos && entry->first.size() > found->first.size()))
                where = p, found = entry;
        }
        if (!found) break;
        NT_CHECK(std::find(allowed_special.begin(), allowed_special.end(), found->first) != allowed_special.end(),
                 "Tokenizer ", name_, ": the text holds the special token ", found->first, " at byte ", where,
                 ", which is not allowed: allow it, or encode it as text with encode_ordinary");
        const std::vector<uint32_t> part = encode_ordinary(text.substr(at, where - at));
        ids.insert(ids.end(), part.begin(), part.end());
        ids.push_back(found->second);
        at = where + found->first.size();
    }
    const std::vector<uint32_t> rest = encode_ordinary(text.substr(at));
    ids.insert(ids.end(), rest.begin(), rest.end());
    return ids;
}

std::vector<uint32_t> Tokenizer::encode_with_special_tokens(std::string_view text) const {
    std::vector<std::string> all;
    for (const auto& [token, id] : special_) all.push_back(token);
    return encode(text, all);
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids) const {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        NT_CHECK(ids[i] < by_id_.size() && by_id_[ids[i]] != nullptr, "Tokenizer ", name_, ": id ", ids[i],
                 " at position ", i, " is no token (the vocabulary has ", by_id_.size(), " ids)");
        out += *by_id_[ids[i]];
    }
    return out;
}

}  // namespace normtape
