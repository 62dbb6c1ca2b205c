// nn/data/tokenizer.h: a byte-level BPE tokenizer that encodes as OpenAI's tiktoken does (GPT-2's
// r50k, cl100k_base, o200k_base) and as Hugging Face's tokenizers does a byte-level BPE, read from
// and written to tiktoken's rank files and Hugging Face's tokenizer.json. Not here: the token files
// its ids are stored in (nn/data/token_file.h), the batches (nn/data/data.h).
//
// Note [Byte-level BPE]
// A vocabulary is a list of byte strings, each with its id; every single byte is one of them.
// Encoding a text:
//  1. The text is split into pieces by a regular expression, the encoding's split pattern (e.g.
//     cl100k_base's: contractions, words with one leading non-letter, numbers of up to 3 digits,
//     runs of punctuation, whitespace), run by PCRE2 with Unicode properties. Each match is a
//     piece; so is each run of bytes that no match covers: invalid UTF-8, which no pattern item
//     matches and no lookahead sees past, so that the valid text around it is split as it would be
//     alone (tiktoken's private _encode_bytes, by contrast, merges all bytes from the first invalid
//     one on as a single piece).
//  2. A piece that is a token is its id. Otherwise it starts as its single bytes and, repeatedly,
//     the adjacent pair of lowest merge rank is merged (the leftmost among equals), until no
//     adjacent pair has a rank; each part is then its id (Sennrich et al. 2016, applied to bytes
//     as GPT-2 did). The rank of a pair is, by tiktoken's rule, the rank (id) of its concatenation
//     when that is a token (tiktoken's byte_pair_merge). By Hugging Face's rule (a tokenizer.json's
//     BPE model) it is the pair's position in the model's list of merges, and pairs not listed never
//     merge; a piece that is a token is its id only when the model says "ignore_merges".
// Special tokens (e.g. "<|endoftext|>") are ids outside the merges, matched as literal strings
// before the split when allowed. Decoding concatenates the ids' bytes: decode(encode(t)) == t for
// every byte string t, valid UTF-8 or not.
//
// Note [tokenizer.json]
// Hugging Face's tokenizers stores a byte-level BPE as JSON: "model" {"type": "BPE", "vocab":
// {token: id}, "merges": ["left right", ...] or [["left", "right"], ...], "ignore_merges"}, whose
// token strings spell each byte as one character by GPT-2's byte-to-unicode map (the printable
// bytes ! to ~, 0xA1 to 0xAC and 0xAE to 0xFF as themselves, the other 68 as U+0100 on in byte
// order); "pre_tokenizer" ByteLevel with use_regex (GPT-2's pattern), or a Sequence of a Split on a
// Regex (behavior Isolated) and a ByteLevel without use_regex; "added_tokens", the special tokens,
// matched as text. normtape reads exactly that, and refuses (FormatError) what would change the
// ids or the decoded text: add_prefix_space, a normalizer, truncation or padding, BPE dropout,
// subword prefixes or suffixes (null, "" and a dropout of 0 are none, as GPT-2's files have them),
// byte fallback, added tokens that are not special (tokenizers matches those in all text) or that
// strip or match single words, a decoder other than ByteLevel. An unk_token is never used (every
// byte is a token). A post_processor (e.g. TemplateProcessing's BOS) is not applied: encode's ids
// are those of tokenizers' encode(text, add_special_tokens=False). Saving writes that form. A tokenizer of
// tiktoken's rule is written with "ignore_merges" and, as transformers' TikTokenConverter does,
// every pair of tokens whose concatenation is a token, ordered by the concatenation's rank, then the
// left's, then the right's. tokenizers' list cannot give pairs equal ranks, so the two rules can
// differ on a piece where two different pairs that make the same token overlap (as "ab" "a" "ba");
// the tests compare the ids on real text.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
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
    // A tokenizer of tiktoken's rule (Note [Byte-level BPE]): the byte strings `tokens` (tokens[r]
    // has rank and id r), splitting by `pattern`, with `special_tokens` (string -> id, each id >=
    // tokens.size()). `name` names it in messages and checkpoints. Throws Error naming the tokenizer
    // when a token is empty or appears twice, a single byte is not a token, a special token's id
    // collides with another id or the ids reach 2^31, or (FormatError) the pattern does not compile
    // (PCRE2's message and offset).
    Tokenizer(std::vector<std::string> tokens, const std::string& pattern,
              std::map<std::string, uint32_t> special_tokens = {}, std::string name = "bpe");
    // A tokenizer of Hugging Face's rule: `tokens` by id (an empty string where an id is not an
    // ordinary token, e.g. a special token's), `merges` the pairs of ids that merge, highest
    // priority first, each pair's concatenation a token; with `ignore_merges` a piece that is a
    // token is its id at once. Throws as the constructor above, and Error naming the merge when a
    // pair is listed twice, names an id that is no ordinary token, or its concatenation is no token.
    Tokenizer(std::vector<std::string> tokens, const std::vector<std::pair<uint32_t, uint32_t>>& merges,
              bool ignore_merges, const std::string& pattern, std::map<std::string, uint32_t> special_tokens = {},
              std::string name = "bpe");
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
    // `path`. Throws Error for a tokenizer of Hugging Face's rule (its merges are not ranks: save it
    // with save_tokenizer_json), IOError when the file cannot be written.
    void save_tiktoken_file(const std::string& path) const;

    // Reads Hugging Face's tokenizer.json `path` (Note [tokenizer.json]), named by the file's stem
    // unless given ("gpt2" for gpt2/tokenizer.json and gpt2.tokenizer.json). Throws IOError when the file cannot
    // be read; FormatError naming the file and the key when it is not JSON, not a byte-level BPE of
    // the form the Note describes, a token holds a character outside the byte-to-unicode map, or a
    // merge names a string that is not in the vocabulary; and the constructors' errors.
    static Tokenizer from_tokenizer_json(const std::string& path, std::string name = "");
    // Writes Hugging Face's tokenizer.json (Note [tokenizer.json]), replacing `path`. Throws Error,
    // writing nothing, when a special token or the pattern is not UTF-8 (JSON holds only UTF-8);
    // IOError when the file cannot be written.
    void save_tokenizer_json(const std::string& path) const;
    // Reads either file: a name ending in ".json" as tokenizer.json, any other as a rank file beside
    // its JSON (the path with the extension .json, as scripts/fetch_tiktoken.sh and train_tokenizer
    // write it: "pat_str" and, if any, "special_tokens" {string: id}). Throws as the readers do, and
    // FormatError naming the JSON when it lacks "pat_str" or its special tokens are not ids.
    static Tokenizer load(const std::string& path);

    // The ids of `text` (any bytes), its special tokens encoded as ordinary text (tiktoken's
    // encode_ordinary). Thread-safe: each call uses match data of its own.
    std::vector<uint32_t> encode_ordinary(std::string_view text) const;
    // The ids of `text`, each special token named in `allowed_special` as its id and the rest of the
    // text as encode_ordinary. Throws Error naming the token and its byte offset when the text holds
    // a special token not allowed (tiktoken's encode with disallowed_special "all"): encode it as
    // text with encode_ordinary, or allow it.
    std::vector<uint32_t> encode(std::string_view text, const std::vector<std::string>& allowed_special = {}) const;
    // encode with every special token allowed (tokenizers' encode without its post-processor).
    std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const;
    // The bytes of `ids`, concatenated. Throws Error naming the id and its position for an id that is
    // no token.
    std::string decode(const std::vector<uint32_t>& ids) const;

    // The number of ids: one past the largest ordinary or special token id.
    int64_t vocab_size() const { return vocab_size_; }
    // The ordinary tokens' bytes by id (an empty string where an id is not an ordinary token); in
    // rank order for tiktoken's rule.
    const std::vector<std::string>& tokens() const { return tokens_; }
    const std::map<std::string, uint32_t>& special_tokens() const { return special_; }
    const std::string& pattern() const { return pattern_; }
    const std::string& name() const { return name_; }
    // Whether pairs merge by Hugging Face's list (the second constructor) rather than by rank.
    bool merges_by_list() const { return by_list_; }

private:
    struct Regex;  // the compiled split pattern (PCRE2)
    struct Ranks;  // bytes -> id, and pair -> merge, for encoding
    std::vector<std::string> tokens_;  // by id
    bool by_list_ = false;  // Hugging Face's rule
    std::vector<std::pair<uint32_t, uint32_t>> merge_list_;  // its merges, in order
    bool ignore_merges_ = true;
    std::map<std::string, uint32_t> special_;
    std::map<uint32_t, const std::string*> special_by_id_;  // each special token's id -> its text
    int64_t vocab_size_ = 0;
    std::string pattern_, name_;
    std::unique_ptr<Regex> regex_;
    std::unique_ptr<Ranks> ranks_;

    // Checks and indexes the tokens, merges and special tokens; compiles the pattern.
    void init();
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
