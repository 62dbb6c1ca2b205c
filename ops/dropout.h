// ops/dropout.h: dropout whose mask is never stored (Note [Counter-based masks], core/philox.h).
#pragma once

#include "core/philox.h"
#include "core/tensor.h"

namespace normtape {

// dropout(x, p, training): y = x * keep / (1 - p), keep[i] = 0 with probability p, else 1
// (Srivastava et al. 2014, inverted dropout; as torch.nn.functional.dropout). x: any shape, f32,
// f64 or bf16, cpu or CUDA; y: a new contiguous tensor of x's shape, dtype and device (arithmetic
// in acc_t: f32, f64 for f64). With training false or p == 0 it returns x itself and records
// nothing. The mask is element i's Philox word of a range drawn from the global dropout stream
// (philox_next(x.numel())), so the cpu and CUDA draw the same mask after the same manual_seed.
// Saves no tensor for backward, only the stream's seed and offset (16 bytes): dx = dy * keep /
// (1 - p) with the mask drawn again. dx is returned fresh (=).
// Throws, naming dropout: Error on an undefined x or p outside [0, 1); DTypeError on a
// non-floating x; ShapeError on an empty x; AnomalyError on a non-finite output under anomaly
// detection.
Tensor dropout(const Tensor& x, double p, bool training = true);

namespace detail {
// The kernel behind dropout and its backward: out = x * keep / (1 - p) for the mask of `state`.
// Internal: checks nothing, records nothing; x contiguous. Returns a new contiguous tensor.
Tensor dropout_apply(const Tensor& x, double p, PhiloxState state);
}  // namespace detail

}  // namespace normtape
