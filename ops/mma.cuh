// ops/mma.cuh: warp-level bf16 tensor-core products for the kernels that tile their own matrices
// (ops/attention_flash.cu): mma.sync m16n8k16 (bf16 in, f32 accumulate), its operand fragments
// read from shared memory with ldmatrix, the accumulator-to-operand conversion, and a cp.async
// wait by immediate count beside ops/cuda_common.cuh's cp.async helpers. sm_80 and later; earlier
// GPUs trap (callers check the compute capability). Internal, CUDA code only.
//
// Fragments (PTX ISA, "Matrix fragments for mma.m16n8k16"): lane l, g = l / 4, t = l % 4 holds
// A rows g and g + 8, columns 2t, 2t + 1 (+ 8); B column g, rows 2t, 2t + 1 (+ 8); C rows g and
// g + 8, columns 2t, 2t + 1.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "core/bf16.h"

namespace normtape::detail {

// Two floats as bf16 (round to nearest even) in one register, lo in the low half.
__device__ inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// d += a b: a 16 x 16 (row), b 16 x 8 (col), bf16; d 16 x 8 f32.
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// Four 8 x 8 matrices of b16 from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
template <bool Trans>
__device__ inline void ldmatrix(uint32_t (&r)[4], const bf16* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    if constexpr (Trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
#else
    __trap();
#endif
}

// The operand fragments, from a tile with row stride `ld` elements, at (row0, col0); lane = lane id.
// A (16 x 16) of a tile stored as [m][k]:
__device__ inline void load_a(uint32_t (&a)[4], const bf16* tile, int ld, int row0, int col0, int lane) {
    ldmatrix<false>(a, tile + (row0 + lane % 16) * ld + col0 + (lane / 16) * 8);
}
// B for two adjacent 8-column tiles (k 16 x n 16) of a tile stored as [n][k]: {b[0], b[1]} for
// columns n0..n0+7, {b[2], b[3]} for n0+8..n0+15.
__device__ inline void load_b(uint32_t (&b)[4], const bf16* tile, int ld, int n0, int k0, int lane) {
    ldmatrix<false>(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * ld + k0 + (lane / 8 % 2) * 8);
}
// The same from a tile stored as [k][n].
__device__ inline void load_b_trans(uint32_t (&b)[4], const bf16* tile, int ld, int k0, int n0, int lane) {
    ldmatrix<true>(b, tile + (k0 + lane % 8 + (lane / 8 % 2) * 8) * ld + n0 + (lane / 16) * 8);
}

// Accumulators c[2j], c[2j+1] (16 x 8 each) as the A fragment of the 16 x 16 block j, in bf16.
__device__ inline void to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

template <int N>
__device__ inline void copy_async_wait_n() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace normtape::detail
