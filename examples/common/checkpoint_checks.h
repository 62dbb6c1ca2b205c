// examples/common/checkpoint_checks.h: what train_gpt and generate check alike in a checkpoint
// they read: the model's sizes (the ranges of train_gpt's flags, which its config must also
// keep), that the model its config describes is no larger than the parameters the file holds,
// and the warning for a file without checksums. Not here: reading the file (nn/formats/safetensors.h),
// the config's other values (examples/train_gpt/train_args.h, examples/generate/generate.cpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "normtape.h"

// The model's sizes, from 1 (vocabulary: 2) to these, whether a flag or a checkpoint gives them.
// Within them no size a model allocates overflows int64 (num_parameters, the key/value cache's
// L * T * 3C).
inline constexpr int64_t kMaxSeq = int64_t{1} << 20;     // T, GPTConfig::block_size
inline constexpr int64_t kMaxLayers = 1024;              // L
inline constexpr int64_t kMaxHeads = 1024;               // NH
inline constexpr int64_t kMaxEmbd = int64_t{1} << 16;    // C
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;   // V

// "" when the GPT of `config` (its sizes within the limits above) has at most as many parameters
// as the file's tensors other than the optimizer's ("optimizer.*") hold values; else what is
// wrong. The model is allocated before its parameters are compared with the file's tensors, so a
// config that asks for more (a damaged or forged one) would otherwise fail for memory, not as a
// bad checkpoint.
inline std::string model_larger_than_file(const normtape::GPTConfig& config, const normtape::NamedTensors& tensors) {
    int64_t held = 0;
    for (const auto& [name, t] : tensors)
        if (name.rfind("optimizer.", 0) != 0) held += t.numel();  // the reader bounds each by the file's size
    const int64_t needed = normtape::num_parameters(config);
    if (needed <= held) return "";
    return "its config (layers " + std::to_string(config.n_layer) + ", heads " + std::to_string(config.n_head) +
           ", embd " + std::to_string(config.n_embd) + ", vocab " + std::to_string(config.vocab_size) + ", seq " +
           std::to_string(config.block_size) + ") describes a model of " + std::to_string(needed) +
           " parameters, but the file holds " + std::to_string(held) + " parameter values";
}

// Printed on stderr when a checkpoint was read without checksums (load_safetensors' `checksummed`
// false): `program` ("train_gpt"), `what` names the file ("--resume ck.safetensors").
inline void warn_unverified(const char* program, const std::string& what) {
    std::fprintf(stderr,
                 "%s: warning: %s: the file carries no checksums (it was written by an older normtape or another "
                 "program), so its bytes cannot be verified\n",
                 program, what.c_str());
}
