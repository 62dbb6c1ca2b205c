// core/device_ptr.h: the data pointer of a tensor on any device, for passing to a kernel or a
// CUDA launcher. Internal: not installed, not included by include/normtape.h; used by core/, ops/,
// nn/ and bench_norms. Not here: Tensor::data_ptr (core/tensor.h), the public accessor, which
// checks the dtype and refuses non-cpu tensors.
#pragma once

#include "core/dry_run.h"
#include "core/tensor.h"

namespace normtape::detail {

// Throws the Error of a kernel given a dry run's tensor (Note [The dry run], core/dry_run.h).
[[noreturn]] void throw_dry_access();

// Pointer to t's first element (its storage's data plus its offset) on whatever device t lives,
// or nullptr for an undefined tensor (an absent weight, bias or gradient). No dtype or device
// check: the caller has dispatched on t.dtype(); dereference it only on t's device.
// A dry run's tensor (core/dry_run.h) throws Error on the cpu, and on CUDA outside its dry run:
// a kernel would read memory that is not there (within a CUDA dry run the address is only
// recorded into the capture, so it is handed out).
template <class T>
T* device_ptr(const Tensor& t) {
    if (!t.defined()) return nullptr;
    if (t.storage()->is_dry() && (t.device().is_cpu() || !is_dry_run())) [[unlikely]] throw_dry_access();
    return static_cast<T*>(t.storage()->data()) + t.impl().offset;
}

// The same pointer as bytes, for code that moves bytes whatever the dtype (copies, file I/O).
inline char* byte_ptr(const Tensor& t) {
    if (!t.defined()) return nullptr;
    if (t.storage()->is_dry() && (t.device().is_cpu() || !is_dry_run())) [[unlikely]] throw_dry_access();
    return static_cast<char*>(t.storage()->data()) + t.impl().offset * element_size(t.dtype());
}

}  // namespace normtape::detail
