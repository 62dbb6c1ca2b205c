// core/device_ptr.h: the data pointer of a tensor on any device, for passing to a kernel or a
// CUDA launcher. Internal: not installed, not included by include/normtape.h; used by core/, ops/,
// nn/ and bench_norms. Not here: Tensor::data_ptr (core/tensor.h), the public accessor, which
// checks the dtype and refuses non-cpu tensors.
#pragma once

#include "core/tensor.h"

namespace normtape::detail {

// Pointer to t's first element (its storage's data plus its offset) on whatever device t lives,
// or nullptr for an undefined tensor (an absent weight, bias or gradient). No dtype or device
// check: the caller has dispatched on t.dtype(); dereference it only on t's device.
template <class T>
T* device_ptr(const Tensor& t) {
    return t.defined() ? static_cast<T*>(t.storage()->data()) + t.impl().offset : nullptr;
}

// The same pointer as bytes, for code that moves bytes whatever the dtype (copies, file I/O).
inline char* byte_ptr(const Tensor& t) {
    return t.defined() ? static_cast<char*>(t.storage()->data()) + t.impl().offset * element_size(t.dtype()) : nullptr;
}

}  // namespace normtape::detail
