// core/tensor_internal.h: internal (not installed): the shape checks and the allocating factory
// that Tensor's methods (core/tensor.cpp) and the factories (core/factories.cpp) share. Not here:
// anything public (core/tensor.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace normtape::detail {

// The row-major strides of a contiguous tensor of `shape`, in elements.
Shape contiguous_strides(const Shape& shape);

// Throws ShapeError naming `op` unless the contiguous strides of `shape` (sizes >= 0) fit in
// int64: the product of its sizes, a size of 0 counted as 1, bounds every stride. A shape with a
// 0 has no elements but still has strides, as in PyTorch ({0, 2^62, 2^62}: 2^124).
void check_strides_fit(const char* op, const Shape& shape);

// empty() on behalf of the factory `op`, whose name the messages carry. Throws ShapeError on a
// negative size or a byte count or stride that overflows int64, DTypeError on requires_grad for i64,
// DeviceError for a CUDA device this build or machine does not have, OutOfMemoryError when the
// allocator cannot give the bytes (the message gives the shape, dtype and bytes).
Tensor empty_for(const char* op, const Shape& shape, TensorOptions options);

// out = a + alpha * b elementwise, on their device; all contiguous, of one shape, dtype and device
// (out may be a: Tensor::add_). Records nothing, checks nothing.
void add_scaled_into(const Tensor& out, const Tensor& a, const Tensor& b, double alpha);

}  // namespace normtape::detail
