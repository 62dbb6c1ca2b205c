// tests/test_util.h: what every test file shares: tolerances named per dtype, allclose with the
// largest difference in the message, a finite-difference gradient check in f64, seeded inputs.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "normtape.h"

namespace normtape::testing {

// Tolerances, one place (STYLE.md habit 22). rtol/atol for comparing two computations of the
// same value in a dtype; gradcheck's step and tolerance for f64 central differences.
struct Tolerance {
    double rtol, atol;
};
inline Tolerance tolerance(DType dtype) {
    if (dtype == DType::F64) return {1e-10, 1e-12};
    if (dtype == DType::BF16) return {1e-2, 1e-2};
    return {1e-5, 1e-6};
}

// Normwise relative error ||a - b|| / ||b|| allowed between two implementations of one op (CUDA
// against the cpu reference, normtape against PyTorch) in each dtype: f32 and f64 differ only by
// summation order; bf16 rounds every stored value to 8 bits of mantissa (unit roundoff 3.9e-3).
inline double normwise_tolerance(DType dtype) {
    if (dtype == DType::F64) return 1e-12;
    if (dtype == DType::BF16) return 1e-2;
    return 1e-5;
}
constexpr double kGradcheckStep = 1e-6;    // h in (f(x + h) - f(x - h)) / 2h
constexpr double kGradcheckRtol = 1e-6;    // |analytic - numeric| <= atol + rtol * |numeric|
constexpr double kGradcheckAtol = 1e-8;

inline std::vector<double> as_f64(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

// Skips the rest of a test case, with a message, where no CUDA GPU is visible.
#define REQUIRE_CUDA_OR_SKIP()                                                                 \
    do {                                                                                       \
        if (!::normtape::cuda_is_available()) {                                                \
            MESSAGE("skipped: no CUDA GPU is visible (CUDA backend built: "                    \
                    << (::normtape::cuda_is_built() ? "yes" : "no") << ")");                   \
            return;                                                                            \
        }                                                                                      \
    } while (0)

// Largest |a - b| and whether every element passes |a - b| <= atol + rtol * |b|.
struct Comparison {
    bool ok = true;
    double max_abs_diff = 0.0;
    std::string message;
};
inline Comparison compare(const Tensor& a, const Tensor& b, Tolerance tol) {
    Comparison c;
    if (a.shape() != b.shape()) {
        c.ok = false;
        c.message = "shapes differ: " + shape_str(a.shape()) + " vs " + shape_str(b.shape());
        return c;
    }
    std::vector<double> va = as_f64(a), vb = as_f64(b);
    size_t worst = 0;
    for (size_t i = 0; i < va.size(); ++i) {
        double d = std::abs(va[i] - vb[i]);
        if (!(d <= tol.atol + tol.rtol * std::abs(vb[i]))) c.ok = false;
        if (d > c.max_abs_diff || std::isnan(d)) {
            c.max_abs_diff = d;
            worst = i;
        }
    }
    std::ostringstream ss;
    ss.precision(17);
    ss << "max |a - b| = " << c.max_abs_diff;
    if (!va.empty()) ss << " at flat index " << worst << " (a = " << va[worst] << ", b = " << vb[worst] << ")";
    c.message = ss.str();
    return c;
}

// ||a - b|| / ||b|| over all elements (a and b on any device, any floating dtype); infinity when
// the shapes differ or a value is NaN.
inline double normwise_error(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape()) return INFINITY;
    std::vector<double> va = as_f64(a.to(Device::CPU)), vb = as_f64(b.to(Device::CPU));
    double diff = 0, ref = 0;
    for (size_t i = 0; i < va.size(); ++i) {
        diff += (va[i] - vb[i]) * (va[i] - vb[i]);
        ref += vb[i] * vb[i];
    }
    double e = std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
    return std::isnan(e) ? INFINITY : e;
}

#define CHECK_NORMWISE(a, b, tol)                                      \
    do {                                                               \
        double err_ = ::normtape::testing::normwise_error((a), (b));   \
        INFO("normwise error " << err_ << " (tolerance " << (tol) << ")"); \
        CHECK(err_ <= (tol));                                          \
    } while (0)

#define CHECK_CLOSE(a, b, tol)                                         \
    do {                                                               \
        auto cmp_ = ::normtape::testing::compare((a), (b), (tol));     \
        INFO(cmp_.message);                                            \
        CHECK(cmp_.ok);                                                \
    } while (0)

// A leaf f64 tensor of standard normals (scaled), requiring grad.
inline Tensor leaf(const Shape& shape, double scale = 1.0, DType dtype = DType::F64) {
    Tensor t = randn(shape, TensorOptions().dtype(dtype));
    t.mul_(scale);
    t.requires_grad_(true);
    return t;
}

// Finite-difference gradient check (the field's standard, as torch.autograd.gradcheck):
// for L = sum(f(inputs) * u) with a fixed random u, compares every input's backward gradient
// with (L(x + h e_i) - L(x - h e_i)) / 2h. Inputs must be f64 leaves that require grad.
// Returns the worst violation as a message; empty when every element passes.
inline std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs) {
    Tensor out = f(inputs);
    Tensor u = randn(out.shape(), TensorOptions().dtype(DType::F64));
    for (Tensor& x : inputs) x.zero_grad();
    out.backward(u);
    auto loss_at = [&]() {
        NoGradGuard no_grad;
        Tensor o = f(inputs).contiguous();
        const double* po = o.data_ptr<double>();
        const double* pu = u.data_ptr<double>();
        double s = 0.0;
        for (int64_t i = 0; i < o.numel(); ++i) s += po[i] * pu[i];
        return s;
    };
    std::ostringstream worst;
    double worst_excess = 0.0;
    for (size_t k = 0; k < inputs.size(); ++k) {
        Tensor x = inputs[k];
        Tensor g = x.grad();
        if (!g.defined()) return "input " + std::to_string(k) + " got no gradient";
        double* px = x.data_ptr<double>();
        const double* pg = g.data_ptr<double>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            double saved = px[i];
            px[i] = saved + kGradcheckStep;
            double lp = loss_at();
            px[i] = saved - kGradcheckStep;
            double lm = loss_at();
            px[i] = saved;
            double numeric = (lp - lm) / (2 * kGradcheckStep);
            double excess = std::abs(pg[i] - numeric) - (kGradcheckAtol + kGradcheckRtol * std::abs(numeric));
            if (excess > worst_excess || std::isnan(excess)) {
                worst_excess = std::isnan(excess) ? INFINITY : excess;
                worst.str("");
                worst.precision(12);
                worst << "input " << k << " element " << i << ": analytic " << pg[i] << ", numeric " << numeric;
            }
        }
    }
    return worst.str();
}

#define CHECK_GRADCHECK(f, inputs)                                     \
    do {                                                               \
        std::string why_ = ::normtape::testing::gradcheck((f), (inputs)); \
        INFO(why_);                                                    \
        CHECK(why_.empty());                                           \
    } while (0)

// Path of the shared real text, or "" when absent (tests that need it skip with a message).
inline std::string shakespeare_path() {
    std::string p = std::string(NORMTAPE_SOURCE_DIR) + "/../shared/data/tinyshakespeare.txt";
    std::FILE* f = std::fopen(p.c_str(), "rb");
    if (!f) return "";
    std::fclose(f);
    return p;
}

}  // namespace normtape::testing
