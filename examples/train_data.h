// examples/train_data.h: train_gpt's data: the text it trains on (a file, by default the project's
// data/tinyshakespeare.txt, or none for random tokens). Not here: the batches drawn from it
// (normtape::Batcher, nn/data.h), the training step that uses a batch (examples/train_gpt.cpp),
// the checkpoint that saves the batcher's state (examples/resume.h).
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
// when it cannot be read (a directory, missing, unreadable) or is shorter than --seq + 2 bytes.
std::string load_text(const Args& a, std::string* description);
