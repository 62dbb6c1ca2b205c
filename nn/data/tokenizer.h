// nn/data/tokenizer.h: a byte-level BPE tokenizer that encodes as OpenAI's tiktoken does (GPT-2's
// r50k, cl100k_base, o200k_base), read from and written to tiktoken's rank files. Not here: the
// token files its ids are stored in (nn/data/token_file.h), the batches (nn/data/data.h).
//
// Note [Byte-level BPE]
// A vocabulary is a list of byte strings, each with its rank (its id); every single byte is one of
// them. Encoding a text:
//  1. The text is split into pieces by a regular expression, the encoding's split pattern (e.g.
//     cl100k_base's: contractions, words with one leading non-letter, numbers of up to 3 digits,
//     runs of punctuation, whitespace), run by PCRE2 with Unicode properties. Each match is a
//     piece; bytes no match covers (invalid UTF-8, which no pattern item matches) are pieces too.
//  2. A piece that is a token is its id. Otherwise it starts as its single bytes and, repeatedly,
//     the adjacent pair whose concatenation has the lowest rank is merged (the leftmost among
//     equals), until no adjacent pair's concatenation is a token; each part is then its id
//     (tiktoken's byte_pair_merge, Sennrich et al. 2016 applied to bytes as GPT-2 did).
// Special tokens (e.g. "<|endoftext|>") are ids outside the ranks, matched as literal strings
// before the split when allowed. Decoding concatenates the ids' bytes: decode(encode(t)) == t for
// every byte string t, valid UTF-8 or not.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/check.h"

namespace normtape {

// The split patterns of tiktoken's encodings (PCRE2 syntax): GPT-2's (r50k_base, gpt2), GPT-4's
// (cl100k_base; also train_bpe's default) and GPT-4o's (o200k_base).
extern const char* const kGPT2SplitPattern;
extern const char* const kGPT4SplitPattern;
extern const char* const kGPT4oSplitPattern;

class Tokenizer {
public:
    // A tokenizer of the byte strings `tokens` (tokens[r] has rank and id r), splitting by `pattern`,
    // with `special_tokens` (string -> id, each id >= tokens.size()). `name` names it in messages
    // and checkpoints. Throws Error naming the tokenizer when a token is empty or appears twice, a
    // single byte is not a token, a special token's id collides with another id or the ids reach
    // 2^31, or (FormatError) the pattern does not compile (PCRE2's message and offset).
    Tokenizer(std::vector<std::string> tokens, const std::string& pattern,
              std::map<std::string, uint32_t> special_tokens = {}, std::string name = "bpe");
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    // Reads tiktoken's rank file `path` (a line per token: its bytes in base64, a space, its rank in
    // decimal; the ranks 0, 1, 2, ... in any order), with `pattern` and `special_tokens` as in the
    // constructor (a rank file holds neither) and the file's stem as the name unless given. Throws
    // IOError when the file cannot be read; FormatError naming the file and the line when a line is
    // not "BASE64 RANK", the base64 is malformed, a rank is out of [0, 2^31), repeated or leaves a
    // gap, or a token appears twice; and the constructor's errors.
    static Tokenizer from_tiktoken_file(const std::string& path, const std::string& pattern,
                                        std::map<std::string, uint32_t> special_tokens = {}, std::string name = "");
    // Writes the ranks as tiktoken's rank file (base64 with padding, in rank order), replacing
    // `path`; IOError when it cannot be written.
    void save_tiktoken_file(const std::string& path) const;

    // The ids of `text` (any bytes), its special tokens encoded as ordinary text (tiktoken's
    // encode_ordinary). Thread-safe: each call uses match data of its own.
    std::vector<uint32_t> encode_ordinary(std::string_view text) const;
    // The ids of `text`, each special token named in `allowed_special` as its id and the rest of the
    // text as encode_ordinary. Throws Error naming the token and its byte offset when the text holds
    // a special token not allowed (tiktoken's encode with disallowed_special "all"): encode it as
    // text with encode_ordinary, or allow it.
    std::vector<uint32_t> encode(std::string_view text, const std::vector<std::string>& allowed_special = {}) const;
    // encode with every special token allowed.
    std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const;
    // The bytes of `ids`, concatenated. Throws Error naming the id and its position for an id that is
    // no token.
    std::string decode(const std::vector<uint32_t>& ids) const;

    // The number of ids: one past the largest rank or special token id.
    int64_t vocab_size() const { return vocab_size_; }
    // The ordinary tokens (ranks), their bytes in rank order.
    const std::vector<std::string>& tokens() const { return tokens_; }
    const std::map<std::string, uint32_t>& special_tokens() const { return special_; }
    const std::string& pattern() const { return pattern_; }
    const std::string& name() const { return name_; }

private:
    struct Regex;  // the compiled split pattern (PCRE2)
    std::vector<std::string> tokens_;  // by rank
    std::map<std::string, uint32_t> special_;
    std::map<uint32_t, const std::string*> special_by_id_;  // each special token's id -> its text
    int64_t vocab_size_ = 0;
    std::string pattern_, name_;
    std::unique_ptr<Regex> regex_;
    struct Ranks;  // bytes -> rank
    std::unique_ptr<Ranks> ranks_;

    // Appends the ids of one piece (step 2 of Note [Byte-level BPE]).
    void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;
};

// Note [Training a BPE]
// train_bpe learns a vocabulary from a text by minbpe's and nanochat's rustbpe's algorithm: the text is split
// by `pattern` into pieces (as encoding splits it), and the distinct pieces are counted. Starting
// from the 256 single bytes, each step merges the adjacent pair of tokens that occurs most often
// within the pieces (a pair inside a piece that occurs n times counts n; overlapping pairs, as in
// "aaa", count each), the new token taking the next rank; ties go to the pair whose left token,
// then right token, has the lower rank. Merging a pair in a piece replaces its occurrences left to
// right (rustbpe breaks ties so; minbpe takes the pair it saw first). Training stops at `vocab_size`
// tokens, or earlier when no piece has two tokens left.
// Counting runs on the cpu threads (core/parallel.h) over parts of about 1 MiB, cut after a newline
// that follows a visible ASCII character and precedes an ASCII letter or digit: a boundary of GPT-2's,
// GPT-4's and GPT-4o's patterns that their lookahead does not see past, so that for them the counts
// are those of the whole text, at any number of threads.

// A tokenizer trained on `text` with `vocab_size` tokens (Note [Training a BPE]), no special
// tokens, named `name`. Throws Error unless 256 <= vocab_size < 2^31, and FormatError for a
// pattern that does not compile.
Tokenizer train_bpe(std::string_view text, int64_t vocab_size, const std::string& pattern = kGPT4SplitPattern,
                    std::string name = "bpe");

}  // namespace normtape
