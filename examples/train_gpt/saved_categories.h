// examples/train_gpt/saved_categories.h: train_gpt's reading of the saved-tensor report
// (core/saved_report.h): each saved storage put in one part of the GPT (norms, attention, MLP,
// embeddings, logits and loss, checkpointed block inputs, other), the bytes of each part, and the
// --memory-report printout. GPT-specific: it knows the module names of nn/model/gpt.h. Not here: taking
// the report (examples/train_gpt/train_gpt.cpp), the JSON and the chart (examples/train_gpt/report.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "normtape.h"

// The categories, in the order they are printed, stored and stacked in the chart.
inline constexpr std::array<const char*, 7> kSavedCategories = {
    "norms", "attention", "MLP", "embeddings", "logits and loss", "checkpointed block inputs", "other"};

// The category of one saved storage, from its holders (the first one unless said otherwise):
//  - "checkpointed block inputs": a holder keeps it via "checkpoint" (GPTConfig::checkpoint_blocks);
//  - "norms": LayerNormBackward or RMSNormBackward (ln_1, ln_2, ln_f; under SavePolicy::Input the
//    residual stream the norm reads);
//  - "attention": a module path with an "attn" part (h.3.attn, h.3.attn.c_attn, h.3.attn.c_proj);
//  - "MLP": a module path with an "mlp" part;
//  - "embeddings": wte or wpe, EmbeddingBackward, or an AddBackward outside every module;
//  - "logits and loss": lm_head, CrossEntropyBackward;
//  - "other": anything else.
// Returns one of kSavedCategories. Never throws.
const char* saved_category(const normtape::SavedTensorEntry& entry);

// The bytes of the report's entries by category, one pair per kSavedCategories entry in its
// order (zeros included); they add up to report.total_bytes. Never throws except std::bad_alloc.
std::vector<std::pair<std::string, int64_t>> saved_bytes_by_category(const normtape::SavedTensorsReport& report);

// Prints (stdout) what a run's first forward saved: the `top` largest storages, one line each
// (bytes, shape, dtype, device, its first holder and how many more), then the bytes by category
// with their share and the total, which equals saved_bytes(). `run` labels the lines ("input").
// `device`: the run's device, whose share of the bytes is printed beside the total.
void print_memory_report(const char* run, const normtape::SavedTensorsReport& report, normtape::Device device,
                         size_t top = 10);
