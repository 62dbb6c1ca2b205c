// ops/embedding.cu: the CUDA kernels of embedding: a row gather forward, and a deterministic
// scatter-add backward without atomics (see embedding_backward_cuda).
#include <cub/device/device_radix_sort.cuh>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// out[i, c] = weight[ids[i], c]; out: [n_ids, C]; ids: [n_ids]; weight: [V, C].
template <class T>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int64_t* __restrict__ ids,
                                         const T* __restrict__ weight, int64_t n_ids, int64_t C) {
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n_ids * C;
         k += int64_t(gridDim.x) * blockDim.x)
        out[k] = weight[ids[k / C] * C + k % C];
}

// p[i] = i, i < n.
__global__ void iota_kernel(int64_t* __restrict__ p, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        p[i] = i;
}

// offsets[v] = the first k with sorted[k] >= v (n when none), v <= V; sorted: [n] ascending.
__global__ void row_offsets_kernel(int64_t* __restrict__ offsets, const int64_t* __restrict__ sorted, int64_t n,
                                   int64_t V) {
    for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v <= V; v += int64_t(gridDim.x) * blockDim.x) {
        int64_t lo = 0, hi = n;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (sorted[mid] < v) lo = mid + 1;
            else hi = mid;
        }
        offsets[v] = lo;
    }
}

// dweight[v, c] = sum of dout[positions[k], c] over k in [offsets[v], offsets[v + 1]), in
// increasing k (0 when the range is empty). dweight: [V, C]; dout: [n_ids, C].
template <class T>
__global__ void embedding_backward_kernel(T* __restrict__ dweight, const int64_t* __restrict__ offsets,
                                          const int64_t* __restrict__ positions, const T* __restrict__ dout, int64_t V,
                                          int64_t C) {
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < V * C; k += int64_t(gridDim.x) * blockDim.x) {
        int64_t v = k / C, c = k % C;
        acc_t<T> s = 0;
        for (int64_t j = offsets[v], end = offsets[v + 1]; j < end; ++j) s += acc_t<T>(dout[positions[j] * C + c]);
        dweight[k] = static_cast<T>(s);
    }
}

}  // namespace

template <class T>
void embedding_forward_cuda(T* out, const int64_t* ids, const T* weight, int64_t n_ids, int64_t C, int device) {
    embedding_forward_kernel<T><<<cuda::blocks_for(n_ids * C), cuda::kThreads, 0, cuda::stream(device)>>>(
        out, ids, weight, n_ids, C);
    CUDA_LAUNCH_CHECK();
}

// Deterministic scatter-add, all on the device and without synchronizing:
// 1. (sorted, positions) = a stable radix sort (CUB) of the pairs (ids[i], i): for each v, the
//    positions i with ids[i] == v, in increasing i (a CSR layout of the ids by row);
// 2. offsets[v] = where row v's positions start (binary search in sorted), v <= V;
// 3. one thread per (v, c) sums dout[i, c] over row v's positions in increasing i, which is the
//    cpu reference's order, and writes dweight[v, c] (0 for rows never looked up).
// Temporaries (i64 tensors, freed on return; the caching allocator may reuse them at once, as
// later work is queued on the same stream): 3 n_ids + V + 1 values and CUB's scratch space.
template <class T>
void embedding_backward_cuda(T* dweight, const int64_t* ids, const T* dout, int64_t n_ids, int64_t V, int64_t C,
                             int device) {
    cudaStream_t stream = cuda::stream(device);
    TensorOptions i64 = TensorOptions().dtype(DType::I64).device(Device::cuda(device));
    Tensor order = empty({n_ids}, i64), sorted = empty({n_ids}, i64), positions = empty({n_ids}, i64);
    Tensor offsets = empty({V + 1}, i64);
    iota_kernel<<<cuda::blocks_for(n_ids), cuda::kThreads, 0, stream>>>(device_ptr<int64_t>(order), n_ids);
    CUDA_LAUNCH_CHECK();
    int end_bit = 1;  // ids lie in [0, V): only their low end_bit bits differ
    while ((int64_t(1) << end_bit) < V) ++end_bit;
    size_t scratch_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, scratch_bytes, ids, device_ptr<int64_t>(sorted),
                                               device_ptr<int64_t>(order), device_ptr<int64_t>(positions), n_ids, 0,
                                               end_bit, stream));
    Tensor scratch = empty({static_cast<int64_t>(scratch_bytes / 8 + 1)}, i64);  // never empty: nullptr means "query"
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(device_ptr<int64_t>(scratch), scratch_bytes, ids,
                                               device_ptr<int64_t>(sorted), device_ptr<int64_t>(order),
                                               device_ptr<int64_t>(positions), n_ids, 0, end_bit, stream));
    row_offsets_kernel<<<cuda::blocks_for(V + 1), cuda::kThreads, 0, stream>>>(device_ptr<int64_t>(offsets),
                                                                               device_ptr<int64_t>(sorted), n_ids, V);
    CUDA_LAUNCH_CHECK();
    embedding_backward_kernel<T><<<cuda::blocks_for(V * C), cuda::kThreads, 0, stream>>>(
        dweight, device_ptr<int64_t>(offsets), device_ptr<int64_t>(positions), dout, V, C);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                     \
    template void embedding_forward_cuda<T>(T*, const int64_t*, const T*, int64_t, int64_t, int);             \
    template void embedding_backward_cuda<T>(T*, const int64_t*, const T*, int64_t, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
