// core/tensor_cuda.cu: kernels and launchers behind core/tensor_cuda.h.
#include "core/tensor_cuda.h"

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/cuda_map.cuh"
#include "core/device_ptr.h"
#include "core/dispatch.h"

namespace normtape::detail {

namespace {

constexpr int kMaxDims = 8;

// Shape and strides of a source tensor, passed by value to the copy kernel.
struct StridedLayout {
    int ndim;
    int64_t shape[kMaxDims];
    int64_t strides[kMaxDims];
    int64_t offset;
};

template <class D, class S>
__global__ void copy_strided_kernel(D* __restrict__ dst, const S* __restrict__ src, StridedLayout layout, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        int64_t rest = i, off = layout.offset;
        for (int d = layout.ndim - 1; d >= 0; --d) {
            off += (rest % layout.shape[d]) * layout.strides[d];
            rest /= layout.shape[d];
        }
        dst[i] = static_cast<D>(static_cast<acc_t<S>>(src[off]));
    }
}

template <class T>
__global__ void fill_kernel(T* __restrict__ dst, T value, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = value;
}

template <class T>
__global__ void from_float_kernel(T* __restrict__ dst, const float* __restrict__ src, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        dst[i] = static_cast<T>(src[i]);
}


}  // namespace

void copy_cuda(const Tensor& dst, const Tensor& src) {
    NT_CHECK(src.dim() <= kMaxDims, "copy: at most ", kMaxDims, " dimensions on cuda, got ", src.dim());
    int64_t n = dst.numel();
    if (n == 0) return;
    StridedLayout layout{};
    layout.ndim = static_cast<int>(src.dim());
    for (int d = 0; d < layout.ndim; ++d) {
        layout.shape[d] = src.shape()[d];
        layout.strides[d] = src.strides()[d];
    }
    layout.offset = src.impl().offset;
    cudaStream_t stream = cuda::stream(dst.device().index);
    if (src.is_contiguous() && src.dtype() == dst.dtype()) {  // the common case: one DMA copy
        if (is_dry_run()) return;  // a copy's addresses are checked when it is captured; a kernel's are not
        CUDA_CHECK(cudaMemcpyAsync(byte_ptr(dst), byte_ptr(src), static_cast<size_t>(src.nbytes()),
                                   cudaMemcpyDeviceToDevice, stream));
        return;
    }
    dispatch_all(dst.dtype(), [&](auto dst_tag) {
        using D = decltype(dst_tag);
        dispatch_all(src.dtype(), [&](auto src_tag) {
            using S = decltype(src_tag);
            copy_strided_kernel<D, S><<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(
                device_ptr<D>(dst), static_cast<const S*>(src.storage()->data()), layout, n);
            CUDA_LAUNCH_CHECK();
        });
    });
}

void fill_cuda(const Tensor& dst, double value) {
    int64_t n = dst.numel();
    if (n == 0) return;
    cudaStream_t stream = cuda::stream(dst.device().index);
    dispatch_all(dst.dtype(), [&](auto tag) {
        using T = decltype(tag);
        fill_kernel<T>
            <<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(device_ptr<T>(dst), static_cast<T>(value), n);
        CUDA_LAUNCH_CHECK();
    });
}

namespace {
template <class A>
struct AddScaledOp {
    A alpha;
    __device__ A operator()(const A (&x)[2]) const { return x[0] + alpha * x[1]; }
};
template <class A>
struct MulScalarOp {
    A value;
    __device__ A operator()(const A (&x)[1]) const { return x[0] * value; }
};
}  // namespace

void add_scaled_cuda(const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
    dispatch_floating(a.dtype(), "add_", [&](auto tag) {
        using T = decltype(tag);
        map_cuda<T, 2>(device_ptr<T>(out), {{device_ptr<T>(a), device_ptr<T>(b)}, {0, 0}}, a.numel(),
                       AddScaledOp<acc_t<T>>{static_cast<acc_t<T>>(alpha)}, a.device().index);
    });
}

void mul_scalar_cuda(const Tensor& a, double value) {
    dispatch_floating(a.dtype(), "mul_", [&](auto tag) {
        using T = decltype(tag);
        map_cuda<T, 1>(device_ptr<T>(a), {{device_ptr<T>(a)}, {0}}, a.numel(),
                       MulScalarOp<acc_t<T>>{static_cast<acc_t<T>>(value)}, a.device().index);
    });
}

void randn_cuda(const Tensor& t, const Tensor& pairs) {
    const int64_t n = t.numel();
    if (n == 0) return;
    const int device = t.device().index;
    curandGenerator_t gen = cuda::curand(device);
    const size_t even = static_cast<size_t>(pairs.numel());
    cudaStream_t stream = cuda::stream(device);
    if (t.dtype() == DType::F64) {
        CURAND_CHECK(curandGenerateNormalDouble(gen, device_ptr<double>(pairs), even, 0.0, 1.0));
        CUDA_CHECK(cudaMemcpyAsync(device_ptr<double>(t), device_ptr<double>(pairs), n * sizeof(double),
                                   cudaMemcpyDeviceToDevice, stream));
        return;
    }
    CURAND_CHECK(curandGenerateNormal(gen, device_ptr<float>(pairs), even, 0.0f, 1.0f));
    dispatch_floating(t.dtype(), "randn", [&](auto tag) {
        using T = decltype(tag);
        from_float_kernel<T>
            <<<cuda::blocks_for(n), cuda::kThreads, 0, stream>>>(device_ptr<T>(t), device_ptr<float>(pairs), n);
        CUDA_LAUNCH_CHECK();
    });
}

void copy_bytes_across(const Tensor& dst, const Tensor& src) {
    size_t bytes = static_cast<size_t>(src.nbytes());
    if (bytes == 0) return;
    const Device d = dst.device().is_cuda() ? dst.device() : src.device();
    if (src.device().is_cuda() && src.device() != d) CUDA_CHECK(cudaStreamSynchronize(cuda::stream(src.device().index)));
    cudaStream_t stream = cuda::stream(d.index);
    CUDA_CHECK(cudaMemcpyAsync(byte_ptr(dst), byte_ptr(src), bytes, cudaMemcpyDefault, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace normtape::detail
