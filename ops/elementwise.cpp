// ops/elementwise.cpp: add, mul, scale, gelu: checks, dispatch, CPU kernels (chunks on parallel
// threads, core/parallel.h), nodes. The CUDA kernels are in ops/elementwise.cu.
#include "ops/elementwise.h"

#include <algorithm>
#include <bit>
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

using detail::kGrain;
using detail::parallel_for;

bool is_suffix(const Shape& b, const Shape& a) {
    if (b.size() > a.size()) return false;
    return std::equal(b.begin(), b.end(), a.end() - static_cast<std::ptrdiff_t>(b.size()));
}

// da = g; db = g summed over the leading dimensions that b was broadcast over.
struct AddBackward : Node {
    Shape b_shape;
    explicit AddBackward(Shape s) : b_shape(std::move(s)) {}
    const char* name() const override { return "AddBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor g = grad_output.contiguous();
        Tensor db;
        if (needs_input_grad(1)) {
            if (g.shape() == b_shape) {
                db = g;
            } else {
                db = empty(b_shape, TensorOptions().dtype(g.dtype()).device(g.device()));
                dispatch_floating(g.dtype(), name(), [&](auto tag) {
                    using T = decltype(tag);
                    int64_t n = db.numel(), rows = g.numel() / n;
                    if (g.device().is_cuda()) {
                        NT_CUDA(detail::column_sum_cuda<T, T>(detail::device_ptr<T>(db), detail::device_ptr<T>(g), rows,
                                                              n, g.device().index));
                        return;
                    }
                    const T* pg = g.data_ptr<T>();
                    std::vector<double> acc(n);  // by chunks of rows, added in chunk order
                    auto rows_sum = [&](int64_t r0, int64_t r1, double* a) {
                        for (int64_t r = r0; r < r1; ++r)
                            for (int64_t j = 0; j < n; ++j) a[j] += pg[r * n + j];
                    };
                    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1));
                    detail::parallel_reduce(0, rows, grain, n, acc.data(), rows_sum);
                    T* pb = db.data_ptr<T>();
                    for (int64_t j = 0; j < n; ++j) pb[j] = static_cast<T>(acc[j]);
                });
            }
        }
        return {needs_input_grad(0) ? g : Tensor(), db};
    }
};

// da = g * b, db = g * a.
struct MulBackward : Node {
    SavedTensor a, b;
    MulBackward(const Tensor& a_, const Tensor& b_) : a(a_), b(b_) {}
    const char* name() const override { return "MulBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"self", &a}, {"other", &b}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor g = grad_output.contiguous();
        Tensor da = needs_input_grad(0) ? mul(g, b.unpack(name())) : Tensor();
        Tensor db = needs_input_grad(1) ? mul(g, a.unpack(name())) : Tensor();
        return {da, db};
    }
};

// da = g * s.
struct ScaleBackward : Node {
    double s;
    explicit ScaleBackward(double s_) : s(s_) {}
    const char* name() const override { return "ScaleBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override { return {scale(grad_output, s)}; }
};

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

// Elements per chunk of gelu's cpu loops (each element costs a tanh).
constexpr int64_t kGeluGrain = kGrain / 4;

// tanh(u) in float, at most 2 ulp from the correctly rounded value over every float (checked
// against double tanh), NaN for NaN, +-1 for +-inf. Written without branches or libm calls so that
// gelu's loops vectorize, and an element gets the same bits wherever it sits in the loop:
//   |u| < 0.55:  u + u^3 q(u^2), q a degree-4 fit of (tanh(u) - u) / u^3 (Chebyshev nodes);
//   otherwise:   1 - 2 / (exp(2|u|) + 1), with the sign of u, and exp(x) = 2^n e^r,
//                x = n ln 2 + r, |r| <= ln(2) / 2, e^r a degree-6 fit, x clamped to 88.
// The two cases are chosen by integer compares on the bits of |u| (their order is that of the
// values; NaN's bits lie above inf's), as float compares would keep GCC from vectorizing.
[[gnu::always_inline]] inline float tanh_f32(float u) {
    const float a = std::fabs(u);
    const int32_t a_bits = std::bit_cast<int32_t>(a);
    const float x = std::bit_cast<float>(std::min(std::bit_cast<int32_t>(2.0f * a), std::bit_cast<int32_t>(88.0f)));
    const float t = x * 1.44269504f + 0x1.8p23f;  // n = round(x / ln 2), in t's low mantissa bits
    const float n = t - 0x1.8p23f;
    // ln 2 in two parts, the first with 15 bits so that n times it is exact (n < 128).
    const float r = (x - n * 0.693145751953125f) - n * 1.42860677e-6f;
    float p = 0.00139411084f;
    p = p * r + 0.00837512640f;
    p = p * r + 0.0416663529f;
    p = p * r + 0.166664155f;
    p = p * r + 0.500000005f;
    p = p * r + 1.00000004f;
    p = p * r + 1.0f;
    const int32_t n_bits = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(0x1.8p23f);  // n itself
    const float two_n = std::bit_cast<float>((n_bits + 127) << 23);
    const float large = 1.0f - 2.0f / (p * two_n + 1.0f);
    const float s = a * a;
    float q = -0.00661022783f;
    q = q * s + 0.0213093887f;
    q = q * s - 0.0539094288f;
    q = q * s + 0.133331137f;
    q = q * s - 0.333333320f;
    const float small = a + a * s * q;
    // large where 0.55 <= |u| <= inf (one unsigned compare), small below and for NaN; a bit mask
    // rather than ?:, which GCC turns into a branch.
    const int32_t lo = std::bit_cast<int32_t>(0.55f), inf = 0x7f800000;
    const bool use_large = static_cast<uint32_t>(a_bits - lo) <= static_cast<uint32_t>(inf - lo);
    const uint32_t mask = 0u - static_cast<uint32_t>(use_large);
    const uint32_t bits = (std::bit_cast<uint32_t>(large) & mask) | (std::bit_cast<uint32_t>(small) & ~mask);
    return std::copysign(std::bit_cast<float>(bits), u);
}

// gelu's tanh: tanh_f32 for f32 and bf16 (whose arithmetic is f32), libm's in f64.
[[gnu::always_inline]] inline float gelu_tanh(float u) { return tanh_f32(u); }
inline double gelu_tanh(double u) { return std::tanh(u); }

struct GeluBackward : Node {
    SavedTensor x;
    explicit GeluBackward(const Tensor& x_) : x(x_) {}
    const char* name() const override { return "GeluBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"self", &x}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {detail::gelu_backward(grad_output, x.unpack(name()))};
    }
};

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
    detail::check_floating_input("add", "a", a_in);
    detail::check_floating_input("add", "b", b_in);
    detail::check_like("add", "b", b_in, "a", a_in);
    NT_CHECK_AS(ShapeError, is_suffix(b_in.shape(), a_in.shape()), "add: expected b of shape ", shape_str(a_in.shape()),
                " or a suffix of it, got ", shape_str(b_in.shape()));
    Tensor a = a_in.contiguous(), b = b_in.contiguous();
    Tensor out = empty(a.shape(), TensorOptions().dtype(a.dtype()).device(a.device()));
    dispatch_floating(a.dtype(), "add", [&](auto tag) {
        using T = decltype(tag);
        if (a.device().is_cuda()) {
            NT_CUDA(detail::add_forward_cuda<T>(detail::device_ptr<T>(out), detail::device_ptr<T>(a),
                                                detail::device_ptr<T>(b), a.numel(), b.numel(), a.device().index));
            return;
        }
        const T *pa = a.data_ptr<T>(), *pb = b.data_ptr<T>();
        T* po = out.data_ptr<T>();
        int64_t n = b.numel();  // b repeats every n elements of a
        parallel_for(0, a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0, len; i < i1; i += len) {  // the run of a that meets pb[j0 ..] in order
                const int64_t j0 = i % n;
                len = std::min(i1 - i, n - j0);
                for (int64_t j = 0; j < len; ++j)
                    po[i + j] = static_cast<T>(acc_t<T>(pa[i + j]) + acc_t<T>(pb[j0 + j]));
            }
        });
    });
    if (should_record(a, b)) record(std::make_shared<AddBackward>(b.shape()), out, a, b);
    detail::check_forward_anomaly("add", "out", out, {{"a", a}, {"b", b}});
    return out;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
    detail::check_floating_input("mul", "a", a_in);
    detail::check_floating_input("mul", "b", b_in);
    detail::check_like("mul", "b", b_in, "a", a_in);
    NT_CHECK_AS(ShapeError, a_in.shape() == b_in.shape(), "mul: expected b of shape ", shape_str(a_in.shape()),
                " (as a), got ", shape_str(b_in.shape()));
    Tensor a = a_in.contiguous(), b = b_in.contiguous();
    Tensor out = empty(a.shape(), TensorOptions().dtype(a.dtype()).device(a.device()));
    dispatch_floating(a.dtype(), "mul", [&](auto tag) {
        using T = decltype(tag);
        if (a.device().is_cuda()) {
            NT_CUDA(detail::mul_forward_cuda<T>(detail::device_ptr<T>(out), detail::device_ptr<T>(a),
                                                detail::device_ptr<T>(b), a.numel(), a.device().index));
            return;
        }
        const T *pa = a.data_ptr<T>(), *pb = b.data_ptr<T>();
        T* po = out.data_ptr<T>();
        parallel_for(0, a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) po[i] = static_cast<T>(acc_t<T>(pa[i]) * acc_t<T>(pb[i]));
        });
    });
    if (should_record(a, b)) {
        auto node = std::make_shared<MulBackward>(b.requires_grad() ? a : Tensor(), a.requires_grad() ? b : Tensor());
        record(node, out, a, b);
    }
    detail::check_forward_anomaly("mul", "out", out, {{"a", a}, {"b", b}});
    return out;
}

Tensor scale(const Tensor& a_in, double s) {
    detail::check_floating_input("scale", "a", a_in);
    Tensor a = a_in.contiguous();
    Tensor out = empty(a.shape(), TensorOptions().dtype(a.dtype()).device(a.device()));
    dispatch_floating(a.dtype(), "scale", [&](auto tag) {
        using T = decltype(tag);
        if (a.device().is_cuda()) {
            NT_CUDA(detail::scale_forward_cuda<T>(detail::device_ptr<T>(out), detail::device_ptr<T>(a), s, a.numel(),
                                                  a.device().index));
            return;
        }
        const T* pa = a.data_ptr<T>();
        T* po = out.data_ptr<T>();
        parallel_for(0, a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) po[i] = static_cast<T>(acc_t<T>(pa[i]) * acc_t<T>(s));
        });
    });
    if (should_record(a)) record(std::make_shared<ScaleBackward>(s), out, a);
    detail::check_forward_anomaly("scale", "out", out, {{"a", a}});
    return out;
}

// dx = g * d/dx gelu(x), with u = sqrt(2/pi) (x + 0.044715 x^3):
//   d/dx gelu = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
Tensor detail::gelu_backward(const Tensor& grad, const Tensor& x) {
    Tensor g = grad.contiguous();
    Tensor dx = empty(x.shape(), TensorOptions().dtype(x.dtype()).device(x.device()));
    dispatch_floating(x.dtype(), "gelu", [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::gelu_backward_cuda<T>(detail::device_ptr<T>(dx), detail::device_ptr<T>(g),
                                                  detail::device_ptr<T>(x), x.numel(), x.device().index));
            return;
        }
        const T *px = x.data_ptr<T>(), *pg = g.data_ptr<T>();
        T* pd = dx.data_ptr<T>();
        using A = acc_t<T>;
        parallel_for(0, x.numel(), kGeluGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                A v = px[i];
                A th = gelu_tanh(A(kSqrt2OverPi) * (v + A(kGeluCoeff) * v * v * v));
                A d = A(0.5) * (1 + th) +
                      A(0.5) * v * (1 - th * th) * A(kSqrt2OverPi) * (1 + A(3 * kGeluCoeff) * v * v);
                pd[i] = static_cast<T>(A(pg[i]) * d);
            }
        });
    });
    return dx;
}

Tensor detail::gelu_forward(const Tensor& x) {
    Tensor out = empty(x.shape(), TensorOptions().dtype(x.dtype()).device(x.device()));
    dispatch_floating(x.dtype(), "gelu", [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::gelu_forward_cuda<T>(detail::device_ptr<T>(out), detail::device_ptr<T>(x), x.numel(),
                                                 x.device().index));
            return;
        }
        const T* px = x.data_ptr<T>();
        T* po = out.data_ptr<T>();
        using A = acc_t<T>;
        parallel_for(0, x.numel(), kGeluGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) {
                A v = px[i];
                po[i] = static_cast<T>(A(0.5) * v * (1 + gelu_tanh(A(kSqrt2OverPi) * (v + A(kGeluCoeff) * v * v * v))));
            }
        });
    });
    return out;
}

Tensor gelu(const Tensor& x_in) {
    detail::check_floating_input("gelu", "x", x_in);
    Tensor x = x_in.contiguous();
    Tensor out = detail::gelu_forward(x);
    if (should_record(x)) record(std::make_shared<GeluBackward>(x), out, x);
    detail::check_forward_anomaly("gelu", "out", out, {{"x", x}});
    return out;
}

}  // namespace normtape
