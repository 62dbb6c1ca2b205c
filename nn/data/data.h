// nn/data/data.h: batches for language-model training: random windows of a token sequence, each
// window's targets the same window shifted by one, as nanoGPT's get_batch() draws them. Not here:
// reading a file (nn/data/token_file.h for token files), the model (nn/model/gpt.h).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace normtape {

// One batch: idx and targets, [B, T] i64, targets[b, t] = the token after idx[b, t].
struct Batch {
    Tensor idx, targets;
};

// Draws batches of B windows of T + 1 tokens from a sequence of token ids (the bytes of a text, or
// the ids a tokenizer made: nn/data/token_file.h), each window's start uniform in
// [0, size - T) from a 64-bit Mersenne Twister (std::mt19937_64) seeded with `seed`; with no
// tokens, random tokens in [0, vocab_size) instead (a benchmark's data). Batches are made on the
// host and copied to `device`. The generator's state is the position in the data: state() /
// set_state() save and restore it, so that a resumed run draws the batches the uninterrupted one
// would have drawn.
class Batcher {
public:
    // Keeps its own copy of `tokens`. Throws ShapeError naming Batcher unless B >= 1, T >= 1,
    // T + 1, B * (T + 1) and a batch tensor's B * T * 8 bytes fit in int64, vocab_size >= 1, and
    // (tokens given) tokens.size() >= T + 1; Error naming Batcher, the first id out of range and
    // its position unless every id is below vocab_size.
    Batcher(std::vector<uint32_t> tokens, int64_t B, int64_t T, int64_t vocab_size, uint64_t seed,
            Device device = Device::CPU);
    // The same over the bytes of `text`, each a token in [0, 256).
    Batcher(const std::string& text, int64_t B, int64_t T, int64_t vocab_size, uint64_t seed,
            Device device = Device::CPU);

    // The next batch; advances the generator by B draws (B * T * 2 for random tokens). Throws
    // OutOfMemoryError naming Batcher and the bytes when the batch cannot be allocated on the host
    // or on `device`, DeviceError for a device this build or machine lacks.
    Batch next();
    // The generator's state, as std::mt19937_64 writes itself to a stream (text).
    std::string state() const;
    // Restores a state written by state(); throws Error naming Batcher when `state` is not one,
    // leaving the generator as it was.
    void set_state(const std::string& state);

    int64_t batch_size() const { return B_; }
    int64_t block_size() const { return T_; }
    const std::vector<uint32_t>& tokens() const { return tokens_; }

private:
    std::vector<uint32_t> tokens_;
    int64_t B_, T_, V_;
    std::mt19937_64 rng_;
    Device device_;
};

}  // namespace normtape
