// core/tensor_cuda.h: the CUDA side of Tensor's own operations (copies, fills, in-place updates,
// random fill). Internal: called by core/tensor.cpp, core/factories.cpp (randn) and core/random.cpp
// (manual_seed). Every function queues its work on the tensor's device stream and checks its
// launch; none synchronizes unless it says so.
#pragma once

#include "core/tensor.h"

namespace normtape::detail {

// dst[i] = convert(src[i]) in row-major order; dst contiguous, both on the same CUDA device,
// any dtypes; src any strides (at most 8 dims). Floats out of the range of i64 saturate here
// (the cpu path throws).
void copy_cuda(const Tensor& dst, const Tensor& src);
// Every element of the contiguous CUDA tensor dst = value.
void fill_cuda(const Tensor& dst, double value);
// out = a + alpha * b; all contiguous, same shape, dtype and device (out may be a).
void add_scaled_cuda(const Tensor& out, const Tensor& a, const Tensor& b, double alpha);
// a *= value; a contiguous.
void mul_scalar_cuda(const Tensor& a, double value);
// Standard normal samples from the device's cuRAND generator (Philox; manual_seed seeds it) into
// t, through `pairs`: cuRAND's normal generators make pairs, so pairs is t.numel() rounded up to
// even, f64 for an f64 t and f32 otherwise.
void randn_cuda(const Tensor& t, const Tensor& pairs);
// Reseeds every device's generator (manual_seed calls it).
void cuda_manual_seed(uint64_t seed);
// Copies the bytes of contiguous src into contiguous dst of the same dtype and numel, any
// devices (host <-> device or device <-> device); returns when the copy is done.
void copy_bytes_across(const Tensor& dst, const Tensor& src);

}  // namespace normtape::detail
