// ops/activation.cpp: relu_squared and swiglu: checks, dispatch, CPU kernels (chunks on parallel
// threads, core/parallel.h), nodes, and the recipes of recompute_output. The CUDA kernels are in
// ops/activation.cu.
#include "ops/activation.h"

#include <algorithm>
#include <cmath>
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
using detail::kGrain;
using detail::parallel_for;

// Rows per chunk of swiglu's cpu loops: about kGrain / 4 elements (each costs an exp).
int64_t swiglu_grain(int64_t H) { return std::max<int64_t>(1, kGrain / 4 / H); }

TensorOptions like(const Tensor& t) { return TensorOptions().dtype(t.dtype()).device(t.device()); }

// relu(v) with NaN kept (v < 0 is false for NaN), as torch.relu; the same expression as
// ops/activation.cu's.
template <class A>
A relu(A v) {
    return v < A(0) ? A(0) : v;
}

// dh = g * 2 relu(h); g and h of one shape, h contiguous.
Tensor relu_squared_backward(const Tensor& grad, const Tensor& h) {
    Tensor g = grad.contiguous();
    Tensor dh = empty(h.shape(), like(h));
    dispatch_floating(h.dtype(), "relu_squared", [&](auto tag) {
        using T = decltype(tag);
        if (h.device().is_cuda()) {
            NT_CUDA(detail::relu_squared_backward_cuda<T>(device_ptr<T>(dh), device_ptr<T>(g), device_ptr<T>(h),
                                                          h.numel(), h.device().index));
            return;
        }
        using A = acc_t<T>;
        const T *ph = h.data_ptr<T>(), *pg = g.data_ptr<T>();
        T* pd = dh.data_ptr<T>();
        parallel_for(0, h.numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) pd[i] = static_cast<T>(A(pg[i]) * (A(2) * relu(A(ph[i]))));
        });
    });
    return dh;
}

// dh = [dgate | dup] [rows, 2H] from g [rows, H] and h = [gate | up] [rows, 2H] (contiguous):
// with e = exp(-gate), s = 1 / (1 + e): dgate = g * up * s (1 + gate (1 - s)), dup = g * gate / (1 + e).
Tensor swiglu_backward(const Tensor& grad, const Tensor& h) {
    Tensor g = grad.contiguous();
    Tensor dh = empty(h.shape(), like(h));
    const int64_t H = h.size(-1) / 2, rows = h.numel() / (2 * H);
    dispatch_floating(h.dtype(), "swiglu", [&](auto tag) {
        using T = decltype(tag);
        if (h.device().is_cuda()) {
            NT_CUDA(detail::swiglu_backward_cuda<T>(device_ptr<T>(dh), device_ptr<T>(g), device_ptr<T>(h), rows, H,
                                                    h.device().index));
            return;
        }
        using A = acc_t<T>;
        const T *ph = h.data_ptr<T>(), *pg = g.data_ptr<T>();
        T* pd = dh.data_ptr<T>();
        parallel_for(0, rows, swiglu_grain(H), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                const T *gate = ph + r * 2 * H, *up = gate + H, *gr = pg + r * H;
                T *dgate = pd + r * 2 * H, *dup = dgate + H;
                for (int64_t j = 0; j < H; ++j) {
                    const A x = gate[j], u = up[j], gj = gr[j];
                    const A d = A(1) + std::exp(-x), s = A(1) / d;
                    dgate[j] = static_cast<T>(gj * u * (s * (A(1) + x * (A(1) - s))));
                    dup[j] = static_cast<T>(gj * (x / d));
                }
            }
        });
    });
    return dh;
}

struct ReluSquaredBackward : Node {
    SavedTensor h;
    explicit ReluSquaredBackward(const Tensor& h_) : h(h_) {}
    const char* name() const override { return "ReluSquaredBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"h", &h}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {relu_squared_backward(grad_output, h.unpack(name()))};
    }
};

struct SwigluBackward : Node {
    SavedTensor h;
    explicit SwigluBackward(const Tensor& h_) : h(h_) {}
    const char* name() const override { return "SwigluBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"h", &h}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {swiglu_backward(grad_output, h.unpack(name()))};
    }
};

}  // namespace

Tensor detail::relu_squared_forward(const Tensor& h) {
    Tensor out = empty(h.shape(), like(h));
    dispatch_floating(h.dtype(), "relu_squared", [&](auto tag) {
        using T = decltype(tag);
        if (h.device().is_cuda()) {
            NT_CUDA(detail::relu_squared_forward_cuda<T>(device_ptr<T>(out), device_ptr<T>(h), h.numel(),
                                                         h.device().index));
            return;
        }
        using A = acc_t<T>;
        const T* ph = h.data_ptr<T>();
        T* po = out.data_ptr<T>();
        parallel_for(0, h.numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                const A r = relu(A(ph[i]));
                po[i] = static_cast<T>(r * r);
            }
        });
    });
    return out;
}

Tensor detail::swiglu_forward(const Tensor& h) {
    const int64_t H = h.size(-1) / 2, rows = h.numel() / (2 * H);
    Shape shape = h.shape();
    shape.back() = H;
    Tensor out = empty(shape, like(h));
    dispatch_floating(h.dtype(), "swiglu", [&](auto tag) {
        using T = decltype(tag);
        if (h.device().is_cuda()) {
            NT_CUDA(detail::swiglu_forward_cuda<T>(device_ptr<T>(out), device_ptr<T>(h), rows, H, h.device().index));
            return;
        }
        using A = acc_t<T>;
        const T* ph = h.data_ptr<T>();
        T* po = out.data_ptr<T>();
        parallel_for(0, rows, swiglu_grain(H), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                const T *gate = ph + r * 2 * H, *up = gate + H;
                T* o = po + r * H;
                for (int64_t j = 0; j < H; ++j) {
                    const A x = gate[j];
                    o[j] = static_cast<T>(x / (A(1) + std::exp(-x)) * A(up[j]));
                }
            }
        });
    });
    return out;
}

Tensor relu_squared(const Tensor& h_in, bool recompute_output) {
    detail::check_floating_input("relu_squared", "h", h_in);
    Tensor h = h_in.contiguous();
    Tensor out = detail::relu_squared_forward(h);
    if (should_record(h)) {
        record(std::make_shared<ReluSquaredBackward>(h), out, h);
        if (recompute_output)
            set_recipe(out, "relu_squared", {h},
                       [](const std::vector<Tensor>& in) { return detail::relu_squared_forward(in[0]); });
    }
    detail::check_forward_anomaly("relu_squared", "out", out, {{"h", h}});
    return out;
}

Tensor swiglu(const Tensor& h_in, bool recompute_output) {
    detail::check_floating_input("swiglu", "h", h_in);
    NT_CHECK_AS(ShapeError, h_in.dim() >= 1, "swiglu: expected h of shape [..., 2H], got a scalar (shape [])");
    NT_CHECK_AS(ShapeError, h_in.size(-1) % 2 == 0,
                "swiglu: expected h of shape [..., 2H] ([gate | up]), an even last dimension, got ",
                shape_str(h_in.shape()));
    Tensor h = h_in.contiguous();
    Tensor out = detail::swiglu_forward(h);
    if (should_record(h)) {
        record(std::make_shared<SwigluBackward>(h), out, h);
        if (recompute_output)
            set_recipe(out, "swiglu", {h}, [](const std::vector<Tensor>& in) { return detail::swiglu_forward(in[0]); });
    }
    detail::check_forward_anomaly("swiglu", "out", out, {{"h", h}});
    return out;
}

}  // namespace normtape
