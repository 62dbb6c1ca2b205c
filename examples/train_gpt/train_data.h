// examples/train_gpt/train_data.h: train_gpt's data: the text or token files it trains on (by default the
// project's data/tinyshakespeare.txt, or none for random tokens), its held-out tail, and the validation
// loss measured on it. Not here: the batches drawn from it
// (normtape::Batcher, nn/data/data.h), the training step that uses a batch (examples/train_gpt/train_gpt.cpp),
// the checkpoint that saves the batcher's state (examples/train_gpt/resume.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "normtape.h"
#include "train_args.h"

// The text that --data names, by default kDefaultData.
inline const char* const kDefaultData = NORMTAPE_SOURCE_DIR "/data/tinyshakespeare.txt";

// The file --data names: kDefaultData without --data, "" for --data random (a glob pattern as given).
std::string data_file(const Args& a);

// Whether --data is read as token ids rather than text: --data-format llm.c or raw, or auto and a
// name ending in ".bin" (llm.c's and nanoGPT's token files, nn/data/token_file.h).
bool data_is_tokens(const Args& a);

// The data a run trains on.
struct TrainData {
    std::vector<uint32_t> tokens;  // a text's bytes or its --tokenizer ids, or a token file's ids; none for random
    std::string description;       // the file or files read and their format, for the report
    std::vector<std::string> files;  // the files read, in order (a --data pattern's matches)
    uint64_t bytes = 0;            // the bytes of the files read
    uint64_t fnv1a64 = 0;          // FNV-1a (64-bit) of those bytes, file after file: the checkpoint's check
    bool token_files = false;      // read as token files (data_is_tokens)
    // With --tokenizer: it, FNV-1a of its files (tokenizer_fnv1a64, examples/common/checksums.h),
    // and where the text's ids were cached or read from: " (cached in PATH)", " (read from the cache PATH)".
    std::shared_ptr<const normtape::Tokenizer> tokenizer;
    uint64_t tokenizer_fnv1a64 = 0;
    std::string token_cache;
};

// The bytes a token of `data` stands for, on average over `tokens`: 1 for a text's bytes, the
// tokenizer's bytes per token with --tokenizer, NaN for a token file (its text is unknown). Bits per
// byte = nats per token / (ln 2 * bytes per token).
double bytes_per_token(const TrainData& data, const std::vector<uint32_t>& tokens);

// The files the run reads: the data's and the tokenizer's, for check_outputs.
std::vector<RunInput> run_inputs(const Args& a, const TrainData& data);

// The data `a` asks for: data_file(a)'s bytes as text, or its ids as a token file (data_is_tokens),
// or none for --data random. A --data with *, ? or [ is a glob pattern: the files it matches, in
// byte order of their names (as llm.c's loader reads its shards), one after the other. Throws
// UsageError naming the file and the reason when: it cannot be read (a directory, missing,
// unreadable; a read that fails, or that ends before or after the file's size, or bytes that do
// not fit in memory: with the bytes read and expected and the system's error); a pattern matches
// no file; a token file is not in its format (a header's magic number, version or token count, a
// truncated file: nn/data/token_file.h); an id is not below --vocab (with its file and position);
// --tokenizer cannot be read (a rank file's error, a JSON without "pat_str", a tokenizer.json that
// Tokenizer::load refuses) or has more ids than a --vocab given or than 2^24; the data holds fewer
// than --seq + 2 tokens. With --tokenizer the text is encoded once: its ids are cached beside the
// first data file as .FILE.NAME.HASH.bin (hidden; llm.c's token file; HASH: FNV-1a of normtape's
// version and the text's and the tokenizer's checksums) and read from there by later runs; a cache
// that cannot be written or read, or holds an id that is no token, is a warning, and the text is
// encoded.
TrainData load_data(const Args& a);

// Note [Held-out loss]
// nanoGPT holds out the last 10% of its text and reports the mean loss over random batches of it.
// train_gpt does the same (--val-fraction, default 0.1), with one difference: every evaluation
// scores the same --eval-batches batches (drawn from their own generator, seeded with --seed + 1,
// rewound before each evaluation), so that two evaluations differ only by the model. It evaluates
// every --eval-every steps and after the last one, in the progress output, the JSON and the chart;
// --save-best writes the checkpoint at each new best instead of at the end. With --data random or
// --val-fraction 0 nothing is held out and nothing is evaluated.

// The tokens split as nanoGPT splits its text: train, the first tokens; val, the last
// floor(size * --val-fraction) tokens (none with --val-fraction 0 or --data random). Throws
// UsageError naming --val-fraction and --seq when a non-empty part is shorter than --seq + 1 tokens.
struct DataSplit {
    std::vector<uint32_t> train, val;
};
DataSplit split_data(const Args& a, const std::vector<uint32_t>& tokens);

// The validation loss: the mean of model.loss over `batches` batches of `val` under NoGradGuard
// and in evaluation mode (no dropout; the model is back in training mode on return), the same
// batches at every call (`val` is rewound to `start`, a state of its own). Waits for the device
// (each loss is read on the host). With `world` processes, this one (`rank`) scores its rows of
// each batch, [rank b, (rank + 1) b) of its world b rows (Note [Training on several processes]):
// the mean over the ranks is the whole batches' loss.
double evaluate(normtape::GPT& model, normtape::Batcher& val, const std::string& start, int64_t batches,
                int rank = 0, int world = 1);
