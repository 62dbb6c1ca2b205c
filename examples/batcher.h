// examples/batcher.h: train_gpt's data: the text it trains on (a file, by default the project's
// data/tinyshakespeare.txt, or none for random tokens) and Batcher, which draws each batch's windows from it. Not here: the
// training step that uses a batch (examples/train_gpt.cpp), the checkpoint that saves Batcher's
// state (examples/resume.h).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "normtape.h"
#include "train_args.h"

// The text that --data names, by default kDefaultData.
inline const char* const kDefaultData = NORMTAPE_SOURCE_DIR "/data/tinyshakespeare.txt";

// The file --data names: kDefaultData without --data, "" for --data random.
std::string data_file(const Args& a);

// The text `a` asks for: data_file(a)'s bytes, or "" for --data random. Sets `description` to what
// was read (the file's path), for the report. Throws UsageError naming the file and the reason
// when it cannot be read (a directory, missing, unreadable) or is shorter than --seq + 2 bytes.
std::string load_text(const Args& a, std::string* description);

// Random windows of the text: idx = text[s : s + T], targets = text[s + 1 : s + T + 1]; with an
// empty text, random tokens in [0, V). Batches are made on the host and copied to `device`.
// Holds a reference to `text`, which must outlive it.
class Batcher {
public:
    Batcher(const std::string& text, int64_t B, int64_t T, int64_t V, uint64_t seed, normtape::Device device)
        : text_(text), B_(B), T_(T), V_(V), rng_(seed), device_(device) {}
    // The generator's state (the standard text form of std::mt19937_64): where the run is in the
    // data, since every batch's windows are drawn from it.
    std::string state() const;
    // Throws UsageError when `s` is not a state written by state().
    void set_state(const std::string& s);
    // The next batch: idx and targets, [B, T] i64 on the device.
    void next(normtape::Tensor* idx, normtape::Tensor* targets);

private:
    const std::string& text_;
    int64_t B_, T_, V_;
    std::mt19937_64 rng_;
    normtape::Device device_;
};
