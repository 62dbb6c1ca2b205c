// ops/embedding.h: table lookup by index.
#pragma once

#include "core/tensor.h"

namespace normtape {

// embedding(ids, weight)[..., :] = weight[ids[...], :], as torch.nn.functional.embedding.
// ids: [...] i64, each in [0, V); weight: [V, C] f32, f64 or bf16 on ids' device (cpu or CUDA;
// a CUDA ids is copied to the host to be checked) -> [..., C].
// Saves ids (the table is not needed). dweight is a fresh [V, C] tensor, zero except the rows
// that were looked up, where the gradients of every occurrence are summed (scatter-add).
// Throws Error naming embedding on: ids not i64 or empty, weight not 2-D floating, ids and
// weight on different devices, an id out of [0, V) (the message gives the id, its position and V).
Tensor embedding(const Tensor& ids, const Tensor& weight);

}  // namespace normtape
