// tests/checkpoint_test_util.h: what tests/test_checkpoint.cpp and tests/test_checkpoint_load.cpp
// share: a small GPT's config, its AdamW, train_gpt --optimizer muon's two optimizers, a training
// step on a fixed batch, and the raw bytes of a tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device_ptr.h"
#include "test_util.h"

namespace normtape::testing {

inline GPTConfig small_config(DType dtype = DType::F32) {
    return {.block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8, .dtype = dtype};
}

inline AdamW make_optimizer(const GPT& model, double beta2 = 0.95) {
    std::vector<ParamGroup> groups(2);
    groups[0].weight_decay = 0.1;
    groups[1].weight_decay = 0.0;
    for (const Tensor& p : model.parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
    AdamWOptions o;
    o.lr = 1e-2;
    o.beta2 = beta2;
    return AdamW(groups, o);
}

// train_gpt --optimizer muon's two optimizers (examples/train_gpt/optimizers.cpp, make_optimizers):
// AdamW for param_groups_for_muon's embeddings, head and vectors, one group each with its own
// lr_scale; Muon for the blocks' matrices, in one group of lr scale `muon_lr_scale`.
struct MuonOptimizers {
    AdamW adamw;
    Muon muon;
};
inline MuonOptimizers make_muon_optimizers(const GPT& model, MuonOptions muon = {}, double muon_lr_scale = 1.0) {
    const MuonParamSplit split = param_groups_for_muon(model);
    AdamWOptions o;
    o.lr = 1e-2;
    o.beta1 = 0.8;
    o.eps = 1e-10;
    return {AdamW({{split.embeddings, 0.0, 20.0}, {split.head, 0.0, 0.4}, {split.vectors, 0.0, 0.4}}, o),
            Muon(std::vector<ParamGroup>{{split.matrices, 0.0, muon_lr_scale}}, muon)};
}

// One training step on a fixed batch drawn from `seed`, with `muon` too (it steps after AdamW, as
// train_gpt's).
inline void train_step(GPT& model, AdamW& optimizer, uint64_t seed, Muon* muon = nullptr) {
    std::vector<int64_t> idx(16), targets(16);
    for (int i = 0; i < 16; ++i) {
        idx[i] = static_cast<int64_t>((seed * 31 + i * 7) % 256);
        targets[i] = static_cast<int64_t>((seed * 17 + i * 13) % 256);
    }
    Tensor loss = model.loss(from_vector(idx, {2, 8}), from_vector(targets, {2, 8}));
    loss.backward();
    optimizer.step();
    if (muon) muon->step();
    optimizer.zero_grad();
    if (muon) muon->zero_grad();
}
inline void train_step(GPT& model, MuonOptimizers& o, uint64_t seed) { train_step(model, o.adamw, seed, &o.muon); }

// The raw bytes of a cpu tensor, to compare bit for bit (NaN-safe, -0 != +0).
inline std::string bytes_of(const Tensor& t) {
    Tensor c = t.contiguous();
    return std::string(detail::byte_ptr(c), static_cast<size_t>(c.nbytes()));
}

}  // namespace normtape::testing
