// ops/gemm.h: the matrix product every op of ops/ runs (internal): Eigen on the cpu, cuBLAS on
// CUDA (ops/matmul.cpp, ops/matmul.cu). Not for callers outside ops/.
#pragma once

#include "core/tensor.h"

namespace normtape::detail {

// out = op(a) @ op(b), op(m) = m^T when its flag is set; every tensor is a contiguous row-major
// matrix whose columns are its last dimension, all of one dtype (f32, f64, bf16) and device; out
// is overwritten. Accumulates in f32 (f64 for f64; on the cpu bf16 through f32 copies, rounded
// once into out). Shapes are the caller's to check (CUDA: ShapeError above cuBLAS's int).
void gemm(const Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b);

// out += op(a) @ op(b), out of stat_dtype(a.dtype()) (f32 for f32 and bf16, f64 for f64): the
// product's own f32 (f64) accumulation carried on into out, never rounded to a's dtype (cuBLAS's
// beta = 1). Otherwise as gemm.
void gemm_accumulate(const Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b);

}  // namespace normtape::detail
