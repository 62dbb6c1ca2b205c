// examples/train_gpt/train_data.h: train_gpt's data: the text it trains on (a file, by default the project's
// data/tinyshakespeare.txt, or none for random tokens), its held-out tail, and the validation
// loss measured on it. Not here: the batches drawn from it
// (normtape::Batcher, nn/data/data.h), the training step that uses a batch (examples/train_gpt/train_gpt.cpp),
// the checkpoint that saves the batcher's state (examples/train_gpt/resume.h).
#pragma once

#include <cstdint>
#include <string>

#include "normtape.h"
#include "train_args.h"

// The text that --data names, by default kDefaultData.
inline const char* const kDefaultData = NORMTAPE_SOURCE_DIR "/data/tinyshakespeare.txt";

// The file --data names: kDefaultData without --data, "" for --data random.
std::string data_file(const Args& a);

// The text `a` asks for: data_file(a)'s bytes, or "" for --data random. Sets `description` to what
// was read (the file's path), for the report. Throws UsageError naming the file and the reason
// when it cannot be read (a directory, missing, unreadable; a read that fails, or that ends before
// or after the file's size, or bytes that do not fit in memory: with the bytes read and expected
// and the system's error) or is shorter than --seq + 2 bytes.
std::string load_text(const Args& a, std::string* description);

// Note [Held-out loss]
// nanoGPT holds out the last 10% of its text and reports the mean loss over random batches of it.
// train_gpt does the same (--val-fraction, default 0.1), with one difference: every evaluation
// scores the same --eval-batches batches (drawn from their own generator, seeded with --seed + 1,
// rewound before each evaluation), so that two evaluations differ only by the model. It evaluates
// every --eval-every steps and after the last one, in the progress output, the JSON and the chart;
// --save-best writes the checkpoint at each new best instead of at the end. With --data random or
// --val-fraction 0 nothing is held out and nothing is evaluated.

// The text split as nanoGPT splits it: train, the first bytes; val, the last
// floor(size * --val-fraction) bytes ("" with --val-fraction 0 or --data random). Throws UsageError
// naming --val-fraction and --seq when a non-empty part is shorter than --seq + 1 bytes.
struct TextSplit {
    std::string train, val;
};
TextSplit split_text(const Args& a, const std::string& text);

// The validation loss: the mean of model.loss over `batches` batches of `val` under NoGradGuard
// and in evaluation mode (no dropout; the model is back in training mode on return), the same
// batches at every call (`val` is rewound to `start`, a state of its own). Waits for the device
// (each loss is read on the host). With `world` processes, this one (`rank`) scores its rows of
// each batch, [rank b, (rank + 1) b) of its world b rows (Note [Training on several processes]):
// the mean over the ranks is the whole batches' loss.
double evaluate(normtape::GPT& model, normtape::Batcher& val, const std::string& start, int64_t batches,
                int rank = 0, int world = 1);
