// ops/dropout.cu: dropout's CUDA kernel. Each thread takes four consecutive elements, the four
// words of one Philox counter, so it draws exactly the words the CPU kernel (ops/dropout.cpp)
// draws for them. Arithmetic in acc_t<T>, as on the cpu.
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

template <class T>
__global__ void dropout_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t n, uint32_t threshold,
                               acc_t<T> keep_scale, PhiloxState state) {
    using A = acc_t<T>;
    const int64_t counters = (n + 3) / 4;
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < counters;
         c += int64_t(gridDim.x) * blockDim.x) {
        const uint64_t counter = state.offset + static_cast<uint64_t>(c);
        const PhiloxWords r = philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0,
                                            static_cast<uint32_t>(state.seed), static_cast<uint32_t>(state.seed >> 32));
        for (int k = 0; k < 4; ++k) {
            const int64_t i = 4 * c + k;
            if (i < n) out[i] = dropout_keep(r.w[k], threshold) ? static_cast<T>(A(x[i]) * keep_scale) : T(0);
        }
    }
}

}  // namespace

template <class T>
void dropout_cuda(T* out, const T* x, int64_t n, double p, PhiloxState state, int device) {
    if (n == 0) return;
    using A = acc_t<T>;
    dropout_kernel<T><<<cuda::blocks_for((n + 3) / 4), cuda::kThreads, 0, cuda::stream(device)>>>(
        out, x, n, drop_threshold(p), A(1) / (A(1) - A(p)), state);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T) template void dropout_cuda<T>(T*, const T*, int64_t, double, PhiloxState, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
