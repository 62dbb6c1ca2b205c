// ops/activation.cu: the CUDA kernels of relu_squared and swiglu. relu_squared and its backward
// are map_cuda() (core/cuda_map.cuh), at copy bandwidth. swiglu reads two halves of a row of h
// [rows, 2H] per output element, so it has kernels of its own over (row, j), j < H: 16-byte
// vectors (a vector never crosses a half, since H is a multiple of the vector) where T is f32 or
// bf16, H % (16 / sizeof(T)) == 0 and the pointers are 16-byte aligned; one element a thread
// otherwise (f64 included). Arithmetic in acc_t<T>, as on the cpu (ops/activation.cpp), rounded
// once on store; exp is CUDA's exp/expf, not __expf.
#include <initializer_list>

#include "core/cuda_map.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// max(v, 0)^2 with NaN kept (v < 0 is false for NaN): ops/activation.cpp's relu.
template <class A>
struct ReluSquaredOp {
    __device__ A operator()(const A (&x)[1]) const {
        const A r = x[0] < A(0) ? A(0) : x[0];
        return r * r;
    }
};
// dy * 2 relu(h); x = {dy, h}
template <class A>
struct ReluSquaredBackwardOp {
    __device__ A operator()(const A (&x)[2]) const { return x[0] * (A(2) * (x[1] < A(0) ? A(0) : x[1])); }
};

// silu(gate) * up, silu(x) = x / (1 + exp(-x)).
template <class A>
__device__ inline A swiglu_value(A gate, A up) {
    return gate / (A(1) + exp(-gate)) * up;
}
// dgate = g * up * s (1 + gate (1 - s)), dup = g * silu(gate), s = sigmoid(gate).
template <class A>
__device__ inline void swiglu_gradients(A g, A gate, A up, A& dgate, A& dup) {
    const A d = A(1) + exp(-gate), s = A(1) / d;
    dgate = g * up * (s * (A(1) + gate * (A(1) - s)));
    dup = g * (gate / d);
}

// out[v*E .. v*E+E) for every vector v < vectors of out [rows, H], H = row_vectors * E: from the
// vectors at j of gate and up, j = (v % row_vectors) * E, in row v / row_vectors of h [rows, 2H].
template <class I, class T>
__global__ void __launch_bounds__(cuda::kThreads)
    swiglu_forward_vector_kernel(T* __restrict__ out, const T* __restrict__ h, I vectors, I row_vectors) {
    constexpr int E = Pack<T>::E;
    const I H = row_vectors * I(E);
    for (I v = I(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += I(gridDim.x) * blockDim.x) {
        const I row = v / row_vectors, j = (v - row * row_vectors) * I(E);
        const T* gate = h + row * 2 * H + j;
        float x[E], u[E], r[E];
        load_pack(gate, x);
        load_pack(gate + H, u);
#pragma unroll
        for (int e = 0; e < E; ++e) r[e] = swiglu_value(x[e], u[e]);
        store_pack(out + v * I(E), r);
    }
}

// The same one element k < n (= rows * H) a thread: any H, any alignment, f64.
template <class I, class T>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ h, I n, I H) {
    using A = acc_t<T>;
    for (I k = I(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += I(gridDim.x) * blockDim.x) {
        const I row = k / H;
        const T* gate = h + row * 2 * H + (k - row * H);
        out[k] = static_cast<T>(swiglu_value(A(gate[0]), A(gate[H])));
    }
}

// dh [rows, 2H] = [dgate | dup] from dy [rows, H] and h [rows, 2H], by vectors as the forward.
template <class I, class T>
__global__ void __launch_bounds__(cuda::kThreads) swiglu_backward_vector_kernel(
    T* __restrict__ dh, const T* __restrict__ dy, const T* __restrict__ h, I vectors, I row_vectors) {
    constexpr int E = Pack<T>::E;
    const I H = row_vectors * I(E);
    for (I v = I(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += I(gridDim.x) * blockDim.x) {
        const I row = v / row_vectors, at = row * 2 * H + (v - row * row_vectors) * I(E);
        float g[E], x[E], u[E], dgate[E], dup[E];
        load_pack(dy + v * I(E), g);
        load_pack(h + at, x);
        load_pack(h + at + H, u);
#pragma unroll
        for (int e = 0; e < E; ++e) swiglu_gradients(g[e], x[e], u[e], dgate[e], dup[e]);
        store_pack(dh + at, dgate);
        store_pack(dh + at + H, dup);
    }
}

template <class I, class T>
__global__ void swiglu_backward_kernel(T* __restrict__ dh, const T* __restrict__ dy, const T* __restrict__ h, I n,
                                       I H) {
    using A = acc_t<T>;
    for (I k = I(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += I(gridDim.x) * blockDim.x) {
        const I row = k / H, at = row * 2 * H + (k - row * H);
        A dgate, dup;
        swiglu_gradients(A(dy[k]), A(h[at]), A(h[at + H]), dgate, dup);
        dh[at] = static_cast<T>(dgate);
        dh[at + H] = static_cast<T>(dup);
    }
}

// Whether swiglu's vector kernels apply: f32 or bf16, H a multiple of the vector, every pointer
// 16-byte aligned.
template <class T>
bool swiglu_vectors(int64_t H, std::initializer_list<const void*> pointers) {
    if constexpr (std::is_same_v<T, double>) {
        return false;
    } else {
        bool ok = H % Pack<T>::E == 0;
        for (const void* p : pointers) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
        return ok;
    }
}

// Launches swiglu's forward (dy == nullptr) or backward with index type I.
template <class I, class T>
void swiglu_launch(T* out, const T* dy, const T* h, int64_t rows, int64_t H, [[maybe_unused]] bool vector,
                   cudaStream_t stream) {
    if constexpr (!std::is_same_v<T, double>) {
        if (vector) {
            constexpr int E = Pack<T>::E;
            const int64_t vectors = rows * H / E;
            if (dy == nullptr)
                swiglu_forward_vector_kernel<I, T><<<cuda::blocks_for(vectors), cuda::kThreads, 0, stream>>>(
                    out, h, static_cast<I>(vectors), static_cast<I>(H / E));
            else
                swiglu_backward_vector_kernel<I, T><<<cuda::blocks_for(vectors), cuda::kThreads, 0, stream>>>(
                    out, dy, h, static_cast<I>(vectors), static_cast<I>(H / E));
            CUDA_LAUNCH_CHECK();
            return;
        }
    }
    const int64_t n = rows * H;
    if (dy == nullptr)
        swiglu_forward_kernel<I, T>
            <<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(out, h, static_cast<I>(n), static_cast<I>(H));
    else
        swiglu_backward_kernel<I, T>
            <<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(out, dy, h, static_cast<I>(n), static_cast<I>(H));
    CUDA_LAUNCH_CHECK();
}

template <class T>
void swiglu_cuda(T* out, const T* dy, const T* h, int64_t rows, int64_t H, int device) {
    if (rows == 0 || H == 0) return;
    const bool vector = swiglu_vectors<T>(H, {out, h, dy});  // nullptr (forward) is aligned
    cudaStream_t stream = cuda::stream(device);
    // uint32_t indices while every index into h, and the grid-stride loop's next one, stays below 2^32.
    if (rows * 2 * H <= (int64_t(1) << 31)) swiglu_launch<uint32_t>(out, dy, h, rows, H, vector, stream);
    else swiglu_launch<int64_t>(out, dy, h, rows, H, vector, stream);
}

}  // namespace

template <class T>
void relu_squared_forward_cuda(T* out, const T* h, int64_t n, int device) {
    map_cuda<T, 1>(out, {{h}, {0}}, n, ReluSquaredOp<acc_t<T>>{}, device);
}

template <class T>
void relu_squared_backward_cuda(T* dh, const T* dout, const T* h, int64_t n, int device) {
    map_cuda<T, 2>(dh, {{dout, h}, {0, 0}}, n, ReluSquaredBackwardOp<acc_t<T>>{}, device);
}

template <class T>
void swiglu_forward_cuda(T* out, const T* h, int64_t rows, int64_t H, int device) {
    swiglu_cuda<T>(out, nullptr, h, rows, H, device);
}

template <class T>
void swiglu_backward_cuda(T* dh, const T* dout, const T* h, int64_t rows, int64_t H, int device) {
    swiglu_cuda<T>(dh, dout, h, rows, H, device);
}

#define NT_INSTANTIATE(T)                                                                   \
    template void relu_squared_forward_cuda<T>(T*, const T*, int64_t, int);                 \
    template void relu_squared_backward_cuda<T>(T*, const T*, const T*, int64_t, int);      \
    template void swiglu_forward_cuda<T>(T*, const T*, int64_t, int64_t, int);              \
    template void swiglu_backward_cuda<T>(T*, const T*, const T*, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
