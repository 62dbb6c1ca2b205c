// nn/formats/checkpoint_metadata.h: a checkpoint's optimizer entries read back from its metadata
// (nn/formats/checkpoint.h: "optimizer" for AdamW, "optimizer.muon" for Muon, each a JSON object of the
// optimizer's type, step count, hyperparameters and groups). Internal: load_checkpoint's, and the
// fuzz target's (fuzz/fuzz_json_readers.cpp). Not here: writing them (nn/formats/checkpoint.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace normtape::detail {

// The step count of the file `path`'s entry metadata[key], after checking it against the
// optimizer's own entry `own` (what save_checkpoint writes for it): FormatError naming the file
// when the entry is absent, not JSON, nested deeper than 64 levels or not an entry of own's type
// (quoting at most its first 80 characters); Error when its hyperparameters differ from own's,
// naming both (each cut to its first 300 characters).
int64_t stored_step(const std::string& path, const std::map<std::string, std::string>& metadata, const std::string& key,
                    const std::string& own);

}  // namespace normtape::detail
