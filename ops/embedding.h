// ops/embedding.h: table lookup by index.
#pragma once

#include "core/tensor.h"

namespace normtape {

// embedding(ids, weight)[..., :] = weight[ids[...], :], as torch.nn.functional.embedding.
// ids: [...] i64, each in [0, V); weight: [V, C] f32, f64 or bf16 on ids' device (cpu or CUDA;
// a CUDA ids is copied to the host to be checked) -> [..., C].
// Saves ids (the table is not needed). dweight is a fresh [V, C] tensor, zero except the rows
// that were looked up, where the gradients of every occurrence are summed (scatter-add).
// Throws, naming embedding: Error on an undefined input or an id out of [0, V) (the message
// gives the id, its position and V); DTypeError on ids not i64 or a non-floating weight;
// ShapeError on empty ids or weight, a weight not 2-D, or on CUDA more than INT32_MAX ids;
// DeviceError on ids and weight on different devices; AnomalyError on a non-finite output under
// anomaly detection (the table itself held it).
Tensor embedding(const Tensor& ids, const Tensor& weight);

}  // namespace normtape
