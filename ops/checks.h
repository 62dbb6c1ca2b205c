// ops/checks.h: the argument checks every op starts with. Internal. Not here: device_ptr, the data
// pointer passed to the CUDA launchers (core/device_ptr.h).
// Each check throws naming the op, the argument, what was expected and what was found: Error for
// an undefined tensor or an index out of range, DTypeError, ShapeError (empty tensors, sizes too
// large for the CUDA kernels' 32-bit arithmetic) and DeviceError as their names say.
#pragma once

#include "core/cuda_graph.h"
#include "core/dry_run.h"
#include "core/tensor.h"

namespace normtape::detail {

// bf16 arithmetic on a GPU (cuBLAS's bf16 products, the tensor-core kernels) needs compute
// capability 8.0 or later; `compute_capability` is the device's (cuda_compute_capability).
inline void check_dtype_on_gpu(const char* op, const char* name, DType dtype, Device device, int compute_capability) {
    NT_CHECK_AS(DTypeError, dtype != DType::BF16 || compute_capability >= 80, op, ": expected ", name,
                " of dtype f32 on ", device_name(device), ", a GPU of compute capability ", compute_capability / 10, ".",
                compute_capability % 10, " (bf16 needs 8.0 or later: A100, RTX 30xx and newer), got bf16");
}

// t is defined, non-empty, of a floating dtype, on any device (bf16 on a GPU that has it).
inline void check_floating_input(const char* op, const char* name, const Tensor& t) {
    NT_CHECK(t.defined(), op, ": expected a tensor ", name, ", got an undefined tensor");
    NT_CHECK_AS(DTypeError, is_floating(t.dtype()), op, ": expected ", name,
                " of a floating dtype (f32, f64 or bf16), got ", dtype_name(t.dtype()));
    NT_CHECK_AS(ShapeError, t.numel() > 0, op, ": expected a non-empty ", name, ", got shape ", shape_str(t.shape()));
    if (t.device().is_cuda() && t.dtype() == DType::BF16)
        check_dtype_on_gpu(op, name, t.dtype(), t.device(), cuda_compute_capability(t.device()));
}

// t has the dtype and device of ref (an already checked input named ref_name).
inline void check_like(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
    NT_CHECK(t.defined(), op, ": expected a tensor ", name, ", got an undefined tensor");
    NT_CHECK_AS(DTypeError, t.dtype() == ref.dtype(), op, ": expected ", name, " of dtype ", dtype_name(ref.dtype()),
                " (as ", ref_name, "), got ", dtype_name(t.dtype()));
    NT_CHECK_AS(DeviceError, t.device() == ref.device(), op, ": expected ", name, " on ", device_name(ref.device()),
                " (as ", ref_name, "), got ", device_name(t.device()));
}

// t holds token ids or class indices: i64, non-empty, on any device.
inline void check_index_input(const char* op, const char* name, const Tensor& t) {
    NT_CHECK(t.defined(), op, ": expected a tensor ", name, ", got an undefined tensor");
    NT_CHECK_AS(DTypeError, t.dtype() == DType::I64, op, ": expected ", name, " of dtype i64, got ",
                dtype_name(t.dtype()));
    NT_CHECK_AS(ShapeError, t.numel() > 0, op, ": expected a non-empty ", name, ", got shape ", shape_str(t.shape()));
}

// Every element of the i64 tensor t (contiguous) lies in [0, n); the message gives the first
// value outside, its flat position and n. A CUDA tensor is copied to the host first (this waits
// for the device); during a CUDA graph capture nothing is checked (core/cuda_graph.h).
inline void check_indices(const char* op, const char* name, const Tensor& t, int64_t n) {
    if (t.device().is_cuda() && cuda_graph_capturing()) return;  // Note [CUDA graphs]: no value read
    Tensor host = t.device().is_cuda() ? t.to(Device::CPU) : t;
    if (is_dry_run()) return;  // Note [The dry run]: the placeholder indices, 0, are in range
    const int64_t* p = host.data_ptr<int64_t>();
    for (int64_t i = 0, end = host.numel(); i < end; ++i)
        NT_CHECK(p[i] >= 0 && p[i] < n, op, ": expected ", name, " in [0, ", n, "), got ", p[i], " at flat position ", i,
                 " of ", name, " ", shape_str(t.shape()));
}

// On CUDA, throws ShapeError naming `op` unless `value` (the size called `what`) fits the
// kernels' or cuBLAS's 32-bit int arithmetic (at most INT32_MAX: also the grid's x limit).
inline void check_fits_int32(const char* op, const Tensor& t, const char* what, int64_t value) {
    if (!t.device().is_cuda()) return;
    NT_CHECK_AS(ShapeError, value <= INT32_MAX, op, ": expected ", what, " <= ", INT32_MAX,
                " on cuda (32-bit kernel and cuBLAS sizes), got ", value, " for shape ", shape_str(t.shape()));
}

}  // namespace normtape::detail
