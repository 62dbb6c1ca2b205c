// core/dispatch.h: calling a templated CPU kernel with the C++ type of a runtime DType.
//
//   dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
//       using T = decltype(tag);
//       layer_norm_forward_cpu<T>(...);
//   });
#pragma once

#include <cstdint>

#include "core/check.h"
#include "core/dry_run.h"
#include "core/dtype.h"

namespace normtape {

// Calls f(float{}), f(double{}) or f(bf16{}); throws DTypeError naming `op` for i64. In a dry run
// on the cpu (core/dry_run.h) it checks the dtype and returns without calling f: f is a kernel.
template <class F>
void dispatch_floating(DType dtype, const char* op, F&& f) {
    if (detail::dry_run_skips_kernels()) {
        NT_CHECK_AS(DTypeError, is_floating(dtype), op, ": expected a floating dtype (f32, f64 or bf16), got ",
                    dtype_name(dtype));
        return;
    }
    switch (dtype) {
        case DType::F32: f(float{}); return;
        case DType::F64: f(double{}); return;
        case DType::BF16: f(bf16{}); return;
        default: NT_CHECK_AS(DTypeError, false, op, ": expected a floating dtype (f32, f64 or bf16), got ", dtype_name(dtype));
    }
}

// As dispatch_floating, plus f(int64_t{}) for I64.
template <class F>
void dispatch_all(DType dtype, F&& f) {
    if (detail::dry_run_skips_kernels()) return;
    switch (dtype) {
        case DType::F32: f(float{}); return;
        case DType::F64: f(double{}); return;
        case DType::BF16: f(bf16{}); return;
        case DType::I64: f(int64_t{}); return;
    }
}

}  // namespace normtape
