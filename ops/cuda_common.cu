// ops/cuda_common.cu: the deterministic reductions shared by the CUDA code of ops/ and nn/ (fixed
// order of additions, no floating-point atomics), declared in ops/cuda_launchers.h:
// - column_sum_cuda: out[j] = sum over rows of in[r, j] (add's and linear's bias gradients, the
//   norms' dweight and dbias from their per-block or per-chunk partial rows);
// - single_block_sum_cuda: out[0] = scale * sum of a short vector, by one block (the last pass of
//   sum/mean, cross-entropy's mean over rows).
// Not here: reductions that compute what they add (the norms' partial rows, sum's first pass, the
// gradient norm's sums of squares in nn/optim/adamw.cu), which stay beside their op.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// A thread of column_sum_kernel adds at most this many rows of a chunk; a chunk is 32 times that.
constexpr int64_t kColumnSumRowsPerThread = 64;
constexpr int64_t kColumnSumChunkRows = 32 * kColumnSumRowsPerThread;

// out[c, j] = sum of in[r, j] over the rows r of chunk c, [c * chunk_rows, (c + 1) * chunk_rows)
// clipped to rows, for c < chunks; in: [rows, n], out: [chunks, n]. A block of 32 x 32 threads
// takes 32 columns of a chunk: thread (x, y) adds rows y, y + 32, ... of column x, then the 32
// sums of a column are added in order. Deterministic, and each row of 32 columns is read by a
// warp at once. Blocks step over chunks gridDim.y apart (gridDim.y is capped at 65535).
template <class In, class Out>
__global__ void column_sum_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t rows, int64_t n,
                                  int64_t chunk_rows, int64_t chunks) {
    using A = acc_t<Out>;
    __shared__ A sums[32][33];
    const int64_t j = blockIdx.x * int64_t(32) + threadIdx.x;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
        const int64_t end = min(rows, (c + 1) * chunk_rows);
        A s = 0;
        if (j < n)
            for (int64_t r = c * chunk_rows + threadIdx.y; r < end; r += 32) s += A(in[r * n + j]);
        sums[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && j < n) {
            A total = 0;
            for (int y = 0; y < 32; ++y) total += sums[y][threadIdx.x];
            out[c * n + j] = static_cast<Out>(total);
        }
        __syncthreads();
    }
}

// The same sums read in 16-byte vectors (In f32 or bf16, n a multiple of the vector, in 16-byte
// aligned), for kVectorSumChunkRows-row chunks: a block of 32 x kVectorSumY threads takes 32
// vectors of columns (256 bf16 or 128 f32) of a chunk; thread (x, y) adds rows y, y + kVectorSumY,
// ... of its vector, four rows' loads in flight, then the kVectorSumY sums of a column are added in
// order. Deterministic. Chunks of 256 rows give enough blocks to fill the GPU at the shapes of a
// bias gradient ([B*T, N], N in the thousands): a warp reads 512 contiguous bytes of a row.
constexpr int kVectorSumY = 16;
constexpr int64_t kVectorSumChunkRows = 256;

template <class In, class Out>
__global__ void __launch_bounds__(32 * kVectorSumY) column_sum_vector_kernel(Out* __restrict__ out,
                                                                              const In* __restrict__ in, int64_t rows,
                                                                              int64_t n, int64_t chunk_rows,
                                                                              int64_t chunks) {
    constexpr int E = Pack<In>::E;
    constexpr int64_t Y = kVectorSumY;
    __shared__ float sums[kVectorSumY][32 * E];
    const int64_t j0 = (blockIdx.x * int64_t(32) + threadIdx.x) * E;  // this thread's first column
    const int t = threadIdx.y * 32 + threadIdx.x;
    for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y) {
        const int64_t end = min(rows, (c + 1) * chunk_rows);
        float s[E] = {};
        if (j0 < n) {
            int64_t r = c * chunk_rows + threadIdx.y;
            for (; r + 3 * Y < end; r += 4 * Y) {
                uint4 q[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) q[u] = *reinterpret_cast<const uint4*>(in + (r + u * Y) * n + j0);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    float v[E];
                    unpack(q[u], v);
#pragma unroll
                    for (int e = 0; e < E; ++e) s[e] += v[e];
                }
            }
            for (; r < end; r += Y) {
                float v[E];
                unpack(*reinterpret_cast<const uint4*>(in + r * n + j0), v);
#pragma unroll
                for (int e = 0; e < E; ++e) s[e] += v[e];
            }
        }
#pragma unroll
        for (int e = 0; e < E; ++e) sums[threadIdx.y][threadIdx.x * E + e] = s[e];
        __syncthreads();
        for (int k = t; k < 32 * E; k += 32 * kVectorSumY) {
            const int64_t j = blockIdx.x * int64_t(32 * E) + k;
            if (j >= n) continue;
            float total = 0;
            for (int y = 0; y < kVectorSumY; ++y) total += sums[y][k];
            out[c * n + j] = static_cast<Out>(total);
        }
        __syncthreads();
    }
}

// The same sums for a few rows (fewer than 32) and many columns, as the gradient of positions
// broadcast over a batch ([B, T * C] summed over B): a thread per column adds its rows in order,
// and a warp reads 32 neighbouring columns of a row at once (the kernel above would leave 32 - rows
// of each block's rows idle).
template <class In, class Out>
__global__ void column_sum_thin_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t rows, int64_t n) {
    using A = acc_t<Out>;
    for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n; j += int64_t(gridDim.x) * blockDim.x) {
        A s = 0;
#pragma unroll 8
        for (int64_t r = 0; r < rows; ++r) s += A(in[r * n + j]);
        out[j] = static_cast<Out>(s);
    }
}

// out[0] = scale * sum of in[0..n), by one block: thread t adds in[t], in[t + blockDim.x], ... in
// order, then block_sum adds the threads' sums in a fixed order.
template <class In, class Out>
__global__ void single_block_sum_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t n, acc_t<Out> scale) {
    using A = acc_t<Out>;
    __shared__ A shared[32];
    A s = 0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += A(in[k]);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) out[0] = static_cast<Out>(s * scale);
}

}  // namespace

// Fewer than 32 rows: a thread per column. Else up to a chunk of rows (kVectorSumChunkRows with
// vectors, kColumnSumChunkRows without) in one pass; more are summed per chunk into a temporary
// [chunks, n] acc_t<Out> tensor, whose rows are then summed the same way. The temporary
// is freed on return: the caching allocator may hand it out again at once, as later work is queued
// on the same stream.
template <class In, class Out>
void column_sum_cuda(Out* out, const In* in, int64_t rows, int64_t n, int device) {
    using A = acc_t<Out>;
    if (n == 0) return;
    cudaStream_t stream = cuda::stream(device);
    if (rows < 32) {
        column_sum_thin_kernel<In, Out><<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(out, in, rows, n);
        CUDA_LAUNCH_CHECK();
        return;
    }
    // One pass where the rows fit one chunk; else the chunks' sums into a temporary, summed again.
    using Direct = void (*)(Out*, const In*, int64_t, int64_t, int64_t, int64_t);
    using Partial = void (*)(A*, const In*, int64_t, int64_t, int64_t, int64_t);
    auto by_chunks = [&](Direct direct, Partial partial_kernel, dim3 block, unsigned columns, int64_t chunk_rows) {
        if (rows <= chunk_rows) {
            direct<<<dim3(columns, 1), block, 0, stream>>>(out, in, rows, n, rows, 1);
            CUDA_LAUNCH_CHECK();
            return;
        }
        const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
        Tensor partial = empty({chunks, n}, TensorOptions().dtype(dtype_of<A>()).device(Device::cuda(device)));
        const dim3 grid(columns, static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
        partial_kernel<<<grid, block, 0, stream>>>(device_ptr<A>(partial), in, rows, n, chunk_rows, chunks);
        CUDA_LAUNCH_CHECK();
        column_sum_cuda<A, Out>(out, device_ptr<A>(partial), chunks, n, device);
    };
    if constexpr (!std::is_same_v<In, double>) {
        constexpr int E = Pack<In>::E;
        if (n % E == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0) {
            by_chunks(column_sum_vector_kernel<In, Out>, column_sum_vector_kernel<In, A>, dim3(32, kVectorSumY),
                      static_cast<unsigned>((n / E + 31) / 32), kVectorSumChunkRows);
            return;
        }
    }
    by_chunks(column_sum_kernel<In, Out>, column_sum_kernel<In, A>, dim3(32, 32), static_cast<unsigned>((n + 31) / 32),
              kColumnSumChunkRows);
}

template <class In, class Out>
void single_block_sum_cuda(Out* out, const In* in, int64_t n, double scale, int device) {
    single_block_sum_kernel<In, Out><<<1, cuda::kThreads, 0, cuda::stream(device)>>>(out, in, n, acc_t<Out>(scale));
    CUDA_LAUNCH_CHECK();
}

template void column_sum_cuda<float, float>(float*, const float*, int64_t, int64_t, int);
template void column_sum_cuda<double, double>(double*, const double*, int64_t, int64_t, int);
template void column_sum_cuda<bf16, bf16>(bf16*, const bf16*, int64_t, int64_t, int);
template void column_sum_cuda<float, bf16>(bf16*, const float*, int64_t, int64_t, int);
template void single_block_sum_cuda<float, float>(float*, const float*, int64_t, double, int);
template void single_block_sum_cuda<double, double>(double*, const double*, int64_t, double, int);
template void single_block_sum_cuda<float, bf16>(bf16*, const float*, int64_t, double, int);

}  // namespace normtape::detail
