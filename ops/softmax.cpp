// ops/softmax.cpp: softmax over the last dimension: checks, dispatch, CPU kernels (chunks of rows
// on parallel threads, core/parallel.h), node. The CUDA kernels are in ops/softmax.cu.
// Every tensor the op and its backward allocate is allocated before dispatch_floating; the kernels
// (and every read of tensor data) run only inside its lambda.
#include "ops/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

using detail::device_ptr;
using detail::parallel_for;

// Rows per chunk of the cpu loops: about kGrain / 4 elements (each costs an exp).
int64_t rows_grain(int64_t N) { return std::max<int64_t>(1, detail::kGrain / 4 / N); }

TensorOptions like(const Tensor& t) { return TensorOptions().dtype(t.dtype()).device(t.device()); }

// y [rows, N] from x [rows, N], one row at a time: m = max, s = sum exp(x - m), y = exp(x - m) / s,
// in A = acc_t<T>. A NaN never wins the max (v > m is false) but makes s NaN, so its row is NaN.
template <class T>
void softmax_forward_cpu(T* y, const T* x, int64_t rows, int64_t N) {
    using A = acc_t<T>;
    parallel_for(0, rows, rows_grain(N), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T* xr = x + r * N;
            T* yr = y + r * N;
            A m = -std::numeric_limits<A>::infinity();
            for (int64_t j = 0; j < N; ++j) m = A(xr[j]) > m ? A(xr[j]) : m;
            A s = 0;
            for (int64_t j = 0; j < N; ++j) s += std::exp(A(xr[j]) - m);
            for (int64_t j = 0; j < N; ++j) yr[j] = static_cast<T>(std::exp(A(xr[j]) - m) / s);
        }
    });
}

// dx [rows, N] = y * (dy - sum(dy * y)) row by row, in A = acc_t<T>.
template <class T>
void softmax_backward_cpu(T* dx, const T* dy, const T* y, int64_t rows, int64_t N) {
    using A = acc_t<T>;
    parallel_for(0, rows, rows_grain(N), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const T *gr = dy + r * N, *yr = y + r * N;
            T* dr = dx + r * N;
            A dot = 0;
            for (int64_t j = 0; j < N; ++j) dot += A(gr[j]) * A(yr[j]);
            for (int64_t j = 0; j < N; ++j) dr[j] = static_cast<T>(A(yr[j]) * (A(gr[j]) - dot));
        }
    });
}

// dx from the output gradient and the saved y (contiguous, [..., N]).
Tensor softmax_backward(const Tensor& grad, const Tensor& y) {
    Tensor g = grad.contiguous();
    Tensor dx = empty(y.shape(), like(y));
    const int64_t N = y.size(-1), rows = y.numel() / N;
    dispatch_floating(y.dtype(), "softmax", [&](auto tag) {
        using T = decltype(tag);
        if (y.device().is_cuda()) {
            NT_CUDA(detail::softmax_backward_cuda<T>(device_ptr<T>(dx), device_ptr<T>(g), device_ptr<T>(y), rows, N,
                                                     y.device().index));
            return;
        }
        softmax_backward_cpu<T>(device_ptr<T>(dx), device_ptr<T>(g), device_ptr<T>(y), rows, N);
    });
    return dx;
}

// Saves the output y [..., N] (Note [Saved outputs and cycles], core/autograd.h: no grad_fn, so no
// cycle). dx = y * (g - sum(g * y)), fresh (=).
struct SoftmaxBackward : Node {
    SavedTensor y;
    explicit SoftmaxBackward(const Tensor& y_) : y(y_) {}
    const char* name() const override { return "SoftmaxBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"y", &y}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {softmax_backward(grad_output, y.unpack(name()))};
    }
};

}  // namespace

Tensor softmax(const Tensor& x_in) {
    detail::check_floating_input("softmax", "x", x_in);
    NT_CHECK_AS(ShapeError, x_in.dim() >= 1, "softmax: expected x of shape [..., N], got a scalar (shape [])");
    Tensor x = x_in.contiguous();
    Tensor y = empty(x.shape(), like(x));
    const int64_t N = x.size(-1), rows = x.numel() / N;
    dispatch_floating(x.dtype(), "softmax", [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::softmax_forward_cuda<T>(device_ptr<T>(y), device_ptr<T>(x), rows, N, x.device().index));
            return;
        }
        softmax_forward_cpu<T>(device_ptr<T>(y), device_ptr<T>(x), rows, N);
    });
    if (should_record(x)) record(std::make_shared<SoftmaxBackward>(y), y, x);
    detail::check_forward_anomaly("softmax", "y", y, {{"x", x}});
    return y;
}

}  // namespace normtape
