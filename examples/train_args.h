// examples/train_args.h: what train_gpt's flags hold (Args: CLI11 fills it in main, --resume and
// --preset complete it) and UsageError, the error for a bad flag, value or data file, on which
// train_gpt exits with status 2. Header only. Not here: the flags' parsing and checks
// (examples/train_gpt.cpp).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

struct Args {
    std::string data;  // empty: the project's own documentation and sources; "random": random tokens
    int64_t steps = 300, batch = 16, seq = 64, layers = 2, heads = 4, embd = 128, vocab = 256;
    std::string norm = "layer", policy = "both", device, dtype, preset;
    double lr = 3e-3;
    uint64_t seed = 1337;
    int64_t log_every = 50;
    std::string json, save, chart = "train_gpt.svg";
    bool detect_anomaly = false;
    std::string resume;      // checkpoint to continue from
    int64_t save_every = 0;  // also save every this many steps (0: only at the end)
    int64_t stop_at = 0;     // stop after this step of the --steps schedule (0: at --steps)
};

// Thrown for a bad flag value found after parsing; main prints it and exits 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
