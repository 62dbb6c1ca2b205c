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
#include <functional>
#include <limits>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "core/check.h"
#include "core/parallel.h"

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

// A pair of adjacent tokens as one key: the left id in the high 32 bits.
uint64_t pair_key(uint32_t a, uint32_t b) { return (uint64_t{a} << 32) | b; }

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

// A split pattern compiled once (JIT-compiled where PCRE2 has its JIT), and the pieces it cuts a
// text into (Note [Byte-level BPE], step 1).
class SplitPattern {
public:
    // Throws FormatError, naming `what`, when the pattern does not compile.
    SplitPattern(const std::string& pattern, const std::string& what) {
        int code = 0;
        PCRE2_SIZE offset = 0;
        code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
        NT_CHECK_AS(FormatError, code_ != nullptr, what, "the split pattern does not compile: ", pcre2_message(code),
                    " at offset ", offset);
        jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    }
    ~SplitPattern() { pcre2_code_free(code_); }
    SplitPattern(const SplitPattern&) = delete;
    SplitPattern& operator=(const SplitPattern&) = delete;

    // Calls piece(p) for each piece p of `text` in order: each match, and the bytes between matches
    // (and after the last) that no match covers. Thread-safe.
    template <class F>
    void for_each_piece(std::string_view text, const std::string& what, F&& piece) const {
        pcre2_match_data* match = pcre2_match_data_create_from_pattern(code_, nullptr);
        NT_CHECK_AS(OutOfMemoryError, match != nullptr, what, "cannot allocate PCRE2's match data");
        struct Free {
            pcre2_match_data* m;
            ~Free() { pcre2_match_data_free(m); }
        } free_match{match};
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        size_t at = 0;  // the first byte not yet in a piece
        while (at < text.size()) {
            // PCRE2_NOTEMPTY: a pattern that could match nothing moves on to its next non-empty match.
            const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), at, PCRE2_NOTEMPTY, match, nullptr)
                                : pcre2_match(code_, subject, text.size(), at, PCRE2_NOTEMPTY, match, nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            NT_CHECK(rc >= 0, what, "matching the split pattern failed at byte ", at, ": ", pcre2_message(rc));
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match);
            const size_t start = ov[0], end = ov[1];
            if (start > at) piece(text.substr(at, start - at));  // bytes no match covers
            piece(text.substr(start, end - start));
            at = end;
        }
        if (at < text.size()) piece(text.substr(at));
    }

private:
    pcre2_code* code_ = nullptr;
    bool jit_ = false;
};

// The merges of encode_piece for a long piece (a run of spaces or digits, a word with no break):
// the same ones, lowest rank first and the leftmost of equals, found with a heap of the adjacent
// pairs ordered by (rank, start) whose stale entries are skipped as they surface, O(n log n) where
// encode_piece's scan is O(n^2). A part is named by the byte it starts at. merge_of(a, b, l, end)
// is the rank and id of merging the parts [l, r) and [r, end) of ids a and b; byte_id(i) the id of
// byte i.
template <class MergeOf, class ByteId>
void encode_long_piece(std::string_view piece, std::vector<uint32_t>& out, const MergeOf& merge_of,
                       const ByteId& byte_id) {
    const size_t n = piece.size();
    std::vector<uint32_t> id(n);
    std::vector<size_t> next(n), prev(n);  // of a live part: the parts beside it (next == n: none)
    std::vector<char> alive(n, 1);
    for (size_t i = 0; i < n; ++i) id[i] = byte_id(i), next[i] = i + 1, prev[i] = i - 1;
    struct Pair {
        uint32_t rank;
        size_t left, right, end;
        uint32_t merged;
        bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> heap;
    auto push = [&](size_t l) {  // the live part at l and the one after it
        const size_t r = next[l];
        if (r >= n) return;
        const auto [rank, merged] = merge_of(id[l], id[r], l, next[r]);
        if (rank != kNoRank) heap.push({rank, l, r, next[r], merged});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
        const Pair p = heap.top();
        heap.pop();
        // Stale: the left part was merged into another, or the right one is no longer [right, end).
        if (!alive[p.left] || next[p.left] != p.right || next[p.right] != p.end) continue;
        id[p.left] = p.merged;
        alive[p.right] = 0;
        next[p.left] = p.end;
        if (p.end < n) prev[p.end] = p.left;
        if (p.left > 0) push(prev[p.left]);
        push(p.left);
    }
    for (size_t i = 0; i < n; i = next[i]) out.push_back(id[i]);
}

}  // namespace

struct Tokenizer::Regex {
    SplitPattern split;
    Regex(const std::string& pattern, const std::string& what) : split(pattern, what) {}
};

struct Tokenizer::Ranks {
    std::unordered_map<std::string_view, uint32_t> id_of;  // the ordinary tokens' bytes (keys view tokens_)
    // Hugging Face's rule: a pair of ids (pair_key) -> its merge's rank and the id it makes.
    std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merge_of;
    uint32_t byte_id[256] = {};  // each single byte's id
    uint32_t find(std::string_view bytes) const {
        auto it = id_of.find(bytes);
        return it == id_of.end() ? kNoRank : it->second;
    }
};

Tokenizer::Tokenizer(std::vector<std::string> tokens, const std::string& pattern,
                     std::map<std::string, uint32_t> special_tokens, std::string name)
    : tokens_(std::move(tokens)), special_(std::move(special_tokens)), pattern_(pattern), name_(std::move(name)) {
    init();
}

Tokenizer::Tokenizer(std::vector<std::string> tokens, const std::vector<std::pair<uint32_t, uint32_t>>& merges,
                     bool ignore_merges, const std::string& pattern, std::map<std::string, uint32_t> special_tokens,
                     std::string name)
    : tokens_(std::move(tokens)),
      by_list_(true),
      merge_list_(merges),
      ignore_merges_(ignore_merges),
      special_(std::move(special_tokens)),
      pattern_(pattern),
      name_(std::move(name)) {
    init();
}

void Tokenizer::init() {
    const std::string what = "Tokenizer " + name_ + ": ";
    const bool by_list = merges_by_list();
    ranks_ = std::make_unique<Ranks>();
    NT_CHECK(tokens_.size() < kMaxIds, what, "expected fewer than 2^31 tokens, got ", tokens_.size());
    ranks_->id_of.reserve(tokens_.size());
    for (size_t r = 0; r < tokens_.size(); ++r) {
        if (tokens_[r].empty() && by_list) continue;  // an id that is no ordinary token
        NT_CHECK(!tokens_[r].empty(), what, "expected a token of at least one byte, got an empty one at rank ", r);
        auto [it, inserted] = ranks_->id_of.emplace(tokens_[r], static_cast<uint32_t>(r));
        NT_CHECK(inserted, what, "expected each token once, got the bytes of ", by_list ? "id " : "rank ", it->second,
                 " again at ", by_list ? "id " : "rank ", r);
    }
    for (int b = 0; b < 256; ++b) {
        ranks_->byte_id[b] = ranks_->find(std::string(1, static_cast<char>(b)));
        NT_CHECK(ranks_->byte_id[b] != kNoRank, what,
                 "expected every single byte to be a token (a byte-level BPE), got none for byte ", b);
    }
    vocab_size_ = static_cast<int64_t>(tokens_.size());
    for (const auto& [text, id] : special_) {
        NT_CHECK(!text.empty(), what, "expected special tokens of at least one byte, got an empty one");
        NT_CHECK((id >= tokens_.size() || tokens_[id].empty()) && id < kMaxIds, what, "expected special token ", text,
                 "'s id past the ", tokens_.size(), " ranks", by_list ? " or at an id with no ordinary token" : "",
                 " and below 2^31, got ", id);
        auto [it, inserted] = special_by_id_.emplace(id, &text);
        NT_CHECK(inserted, what, "expected distinct ids, got ", id, " for special token ", text, " and for ",
                 *it->second);
        vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
    }
    ranks_->merge_of.reserve(merge_list_.size());
    for (size_t m = 0; m < merge_list_.size(); ++m) {
        const auto [a, b] = merge_list_[m];
        NT_CHECK(a < tokens_.size() && b < tokens_.size() && !tokens_[a].empty() && !tokens_[b].empty(), what,
                 "merge ", m, " (", a, ", ", b, ") names an id that is no ordinary token");
        const uint32_t id = ranks_->find(tokens_[a] + tokens_[b]);
        NT_CHECK(id != kNoRank, what, "merge ", m, " (", a, ", ", b, ") makes bytes that are no token");
        auto [it, inserted] = ranks_->merge_of.emplace(pair_key(a, b), std::pair{static_cast<uint32_t>(m), id});
        NT_CHECK(inserted, what, "merge ", m, " (", a, ", ", b, ") is listed twice, first as merge ", it->second.first);
    }
    regex_ = std::make_unique<Regex>(pattern_, what);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_tiktoken_file(const std::string& path, const std::string& pattern,
                                        std::map<std::string, uint32_t> special_tokens, std::string name) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw IOError("Tokenizer: cannot read the rank file " + path + ": " + std::strerror(errno));
    std::vector<std::pair<uint32_t, std::string>> ranked;  // as read; sorted and checked below
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
        ranked.emplace_back(static_cast<uint32_t>(rank), bytes);
    }
    if (f.bad()) throw IOError("Tokenizer: cannot read the rank file " + path + ": " + std::strerror(errno));
    // The ranks must be 0, 1, ..., n - 1, each once (a line's position does not matter).
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<std::string> tokens;
    tokens.reserve(ranked.size());
    for (size_t r = 0; r < ranked.size(); ++r) {
        if (ranked[r].first < r)
            throw FormatError("Tokenizer: rank file " + path + ": rank " + std::to_string(ranked[r].first) +
                              " appears twice");
        if (ranked[r].first > r)
            throw FormatError("Tokenizer: rank file " + path + ": expected the ranks 0 to " +
                              std::to_string(ranked.size() - 1) + " each once, got none for rank " + std::to_string(r));
        tokens.push_back(std::move(ranked[r].second));
    }
    NT_CHECK_AS(FormatError, !tokens.empty(), "Tokenizer: rank file ", path, ": expected ranks, got none");
    if (name.empty()) name = std::filesystem::path(path).stem().string();
    try {
        return Tokenizer(std::move(tokens), pattern, std::move(special_tokens), std::move(name));
    } catch (const Error& e) {  // a repeated token, or the pattern (from the file's JSON, for load)
        throw FormatError("Tokenizer: rank file " + path + ": " + e.what());
    }
}

void Tokenizer::save_tiktoken_file(const std::string& path) const {
    NT_CHECK(!merges_by_list(), "Tokenizer::save_tiktoken_file: ", name_, " merges by Hugging Face's list of pairs, "
             "which a rank file cannot hold: save it with save_tokenizer_json");
    std::string text;
    for (size_t r = 0; r < tokens_.size(); ++r) text += base64_encode(tokens_[r]) + " " + std::to_string(r) + "\n";
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f) throw IOError("Tokenizer::save_tiktoken_file: cannot write " + path + ": " + std::strerror(errno));
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
    if (ignore_merges_) {
        if (const uint32_t id = ranks_->find(piece); id != kNoRank) {
            out.push_back(id);
            return;
        }
    }
    // The merge of the parts [l, r) and [r, end) of ids a and b: its rank (kNoRank: none) and the id
    // it makes.
    const bool by_list = merges_by_list();
    auto merge_of = [&](uint32_t a, uint32_t b, size_t l, size_t end) -> std::pair<uint32_t, uint32_t> {
        if (!by_list) {
            const uint32_t id = ranks_->find(piece.substr(l, end - l));
            return {id, id};
        }
        auto it = ranks_->merge_of.find(pair_key(a, b));
        return it == ranks_->merge_of.end() ? std::pair{kNoRank, 0u} : it->second;
    };
    auto byte_id = [&](size_t i) { return ranks_->byte_id[static_cast<unsigned char>(piece[i])]; };
    if (piece.size() > 256) {
        encode_long_piece(piece, out, merge_of, byte_id);
        return;
    }
    // parts[i]: where part i begins and its id, and the rank of merging it with part i + 1 (kNoRank:
    // no merge) and the id that makes. One sentinel part at the end.
    struct Part {
        size_t start;
        uint32_t id, rank, merged;
    };
    std::vector<Part> parts(piece.size() + 1);
    for (size_t i = 0; i < parts.size(); ++i) parts[i] = {i, i < piece.size() ? byte_id(i) : kNoRank, kNoRank, 0};
    auto rank_pair = [&](size_t i) {  // parts i and i + 1, where part i + 1 exists
        Part& p = parts[i];
        p.rank = kNoRank;
        if (i + 2 < parts.size()) std::tie(p.rank, p.merged) = merge_of(p.id, parts[i + 1].id, p.start, parts[i + 2].start);
    };
    for (size_t i = 0; i + 1 < parts.size(); ++i) rank_pair(i);
    for (;;) {
        size_t best = 0;
        uint32_t best_rank = kNoRank;
        for (size_t i = 0; i + 1 < parts.size(); ++i)
            if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
        if (best_rank == kNoRank) break;
        parts[best].id = parts[best].merged;
        parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
        rank_pair(best);
        if (best > 0) rank_pair(best - 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i) out.push_back(parts[i].id);
}

std::vector<uint32_t> Tokenizer::encode_ordinary(std::string_view text) const {
    std::vector<uint32_t> ids;
    regex_->split.for_each_piece(text, "Tokenizer " + name_ + ": ", [&](std::string_view piece) { encode_piece(piece, ids); });
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
        if (ids[i] < tokens_.size() && !tokens_[ids[i]].empty()) {
            out += tokens_[ids[i]];
            continue;
        }
        auto it = special_by_id_.find(ids[i]);
        NT_CHECK(it != special_by_id_.end(), "Tokenizer ", name_, ": id ", ids[i], " at position ", i,
                 " is no token (the vocabulary has ", vocab_size_, " ids)");
        out += *it->second;
    }
    return out;
}

}  // namespace normtape

namespace normtape {

namespace {

// Where text may be cut for counting in parallel: after a newline between a visible ASCII character
// and an ASCII letter or digit (Note [Training a BPE]), about every `part` bytes.
std::vector<size_t> count_cuts(std::string_view text, size_t part) {
    std::vector<size_t> cuts = {0};
    auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); };
    auto visible = [](char c) { return c > ' ' && c < 127; };
    auto cut_after = [&](size_t p) { return p > 0 && p + 1 < text.size() && visible(text[p - 1]) && alnum(text[p + 1]); };
    for (size_t at = part; at < text.size();) {
        size_t p = text.find('\n', at);
        while (p != std::string_view::npos && p + 1 < text.size() && !cut_after(p)) p = text.find('\n', p + 1);
        if (p == std::string_view::npos || p + 1 >= text.size()) break;
        cuts.push_back(p + 1);
        at = p + 1 + part;
    }
    cuts.push_back(text.size());
    return cuts;
}

}  // namespace

Tokenizer train_bpe(std::string_view text, int64_t vocab_size, const std::string& pattern, std::string name) {
    const std::string what = "train_bpe: ";
    NT_CHECK(vocab_size >= 256 && static_cast<uint64_t>(vocab_size) < kMaxIds, what,
             "expected a vocab_size from 256 (the single bytes) to 2^31 - 1, got ", vocab_size);
    const SplitPattern split(pattern, what);

    // The distinct pieces and how often each occurs, counted over parts of the text in parallel.
    const std::vector<size_t> cuts = count_cuts(text, size_t{1} << 20);
    const auto parts = static_cast<int64_t>(cuts.size() - 1);
    std::vector<std::unordered_map<std::string_view, int64_t>> part_counts(static_cast<size_t>(parts));
    detail::parallel_for(0, parts, 1, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k)
            split.for_each_piece(text.substr(cuts[k], cuts[k + 1] - cuts[k]), what,
                                 [&](std::string_view piece) { ++part_counts[k][piece]; });
    });
    std::unordered_map<std::string_view, int64_t> piece_counts = std::move(part_counts[0]);
    for (int64_t k = 1; k < parts; ++k)
        for (const auto& [piece, n] : part_counts[k]) piece_counts[piece] += n;

    // Each distinct piece as a word of token ranks, with its count, in a fixed order.
    std::vector<std::pair<std::string_view, int64_t>> sorted(piece_counts.begin(), piece_counts.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::vector<uint32_t>> words;
    std::vector<int64_t> counts;
    for (const auto& [piece, n] : sorted) {
        if (piece.size() < 2) continue;  // no pair in it, ever
        words.emplace_back(piece.begin(), piece.end());
        for (uint32_t& t : words.back()) t &= 0xff;  // the bytes, as ranks 0 to 255
        counts.push_back(n);
    }

    // Pair counts, and the words each pair occurs in (stale entries are skipped when read).
    std::unordered_map<uint64_t, int64_t> pair_counts;
    std::unordered_map<uint64_t, std::vector<uint32_t>> where;
    auto add_pairs = [&](uint32_t w, int64_t sign, std::vector<uint64_t>* touched) {
        const std::vector<uint32_t>& word = words[w];
        for (size_t i = 0; i + 1 < word.size(); ++i) {
            const uint64_t key = pair_key(word[i], word[i + 1]);
            pair_counts[key] += sign * counts[w];
            if (sign > 0) {
                std::vector<uint32_t>& in = where[key];
                if (in.empty() || in.back() != w) in.push_back(w);
                if (touched) touched->push_back(key);
            }
        }
    };
    for (uint32_t w = 0; w < words.size(); ++w) add_pairs(w, +1, nullptr);

    // The most frequent pair first; of equal counts, the lower (left, right) ranks.
    struct Candidate {
        int64_t count;
        uint64_t pair;
        bool operator<(const Candidate& o) const { return count != o.count ? count < o.count : pair > o.pair; }
    };
    std::priority_queue<Candidate> heap;
    for (const auto& [key, n] : pair_counts)
        if (n > 0) heap.push({n, key});

    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
    std::vector<uint32_t> merged_at(words.size(), kNoRank);  // the merge that last rewrote each word
    while (static_cast<int64_t>(tokens.size()) < vocab_size && !heap.empty()) {
        const Candidate top = heap.top();
        heap.pop();
        const int64_t actual = pair_counts[top.pair];
        if (actual != top.count) {  // stale: a lower count is pushed back; a higher one is queued already
            if (actual > 0 && actual < top.count) heap.push({actual, top.pair});
            continue;
        }
        const auto a = static_cast<uint32_t>(top.pair >> 32), b = static_cast<uint32_t>(top.pair & 0xffffffffu);
        const auto t = static_cast<uint32_t>(tokens.size());
        tokens.push_back(tokens[a] + tokens[b]);
        std::vector<uint64_t> touched;
        std::vector<uint32_t> in = std::move(where[top.pair]);
        where.erase(top.pair);
        for (uint32_t w : in) {
            if (merged_at[w] == t) continue;  // listed twice
            std::vector<uint32_t>& word = words[w];
            bool has = false;
            for (size_t i = 0; i + 1 < word.size() && !has; ++i) has = word[i] == a && word[i + 1] == b;
            if (!has) continue;  // stale: an earlier merge took the pair apart
            merged_at[w] = t;
            add_pairs(w, -1, nullptr);
            size_t out = 0;
            for (size_t i = 0; i < word.size(); ++out) {
                if (i + 1 < word.size() && word[i] == a && word[i + 1] == b) {
                    word[out] = t;
                    i += 2;
                } else {
                    word[out] = word[i++];
                }
            }
            word.resize(out);
            add_pairs(w, +1, &touched);
        }
        std::sort(touched.begin(), touched.end());
        touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
        for (uint64_t key : touched)
            if (const int64_t n = pair_counts[key]; n > 0) heap.push({n, key});
    }
    return Tokenizer(std::move(tokens), pattern, {}, std::move(name));
}

}  // namespace normtape
