// tests/test_rms_norm.cpp: rms_norm against a plain reference, finite differences, the two
// policies against each other, weights near zero, saved bytes, and every argument error.
#include "norm_test_cases.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

const NormUnderTest kRMSNorm{"rms_norm", false,
                             [](const Tensor& x, const Tensor& w, const Tensor&, double eps, SavePolicy p) {
                                 return rms_norm(x, w, eps, p);
                             }};

// y = x / sqrt(mean(x^2) + eps) * w, written out independently of ops/norm/norm.cpp.
std::vector<double> rms_norm_reference(const std::vector<double>& x, const std::vector<double>& w, int64_t N,
                                       double eps) {
    std::vector<double> y(x.size());
    for (size_t r = 0; r < x.size() / N; ++r) {
        double ms = 0;
        for (int64_t j = 0; j < N; ++j) ms += x[r * N + j] * x[r * N + j] / N;
        for (int64_t j = 0; j < N; ++j) y[r * N + j] = x[r * N + j] / std::sqrt(ms + eps) * w[j];
    }
    return y;
}

}  // namespace

TEST_SUITE("rms_norm") {

TEST_CASE("rms_norm: forward matches the formula in f64 and f32, with unit root mean square before the weight") {
    manual_seed(30);
    for (DType dtype : {DType::F64, DType::F32}) {
        CAPTURE(dtype_name(dtype));
        TensorOptions o = TensorOptions().dtype(dtype);
        const int64_t N = 29;
        Tensor x = add(scale(randn({5, N}, o), 2.0), full({N}, 1.0, o));
        Tensor w = randn({N}, o);
        Tensor y = rms_norm(x, w, 1e-5);
        std::vector<double> ref = rms_norm_reference(as_f64(x), as_f64(w), N, 1e-5);
        CHECK_CLOSE(y, from_vector(ref, x.shape()), (dtype == DType::F64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-5}));
        std::vector<double> plain = as_f64(rms_norm(x, Tensor(), 1e-5));
        double sq = 0;
        for (int64_t j = 0; j < N; ++j) sq += plain[j] * plain[j] / N;
        CHECK(std::abs(sq - 1.0) < 1e-3);
    }
}

TEST_CASE("rms_norm: gradients match finite differences in f64 under both policies") {
    check_norm_gradcheck(kRMSNorm);
}

TEST_CASE("rms_norm: SavePolicy::Output and Normalized give the outputs and gradients of SavePolicy::Input") {
    check_policies_agree(kRMSNorm);
}

TEST_CASE("rms_norm: weights near zero under SavePolicy::Output") { check_weights_near_zero(kRMSNorm); }

TEST_CASE("rms_norm: SavePolicy::Normalized is as exact as Input at any weight, in bf16") {
    check_normalized_at_any_weight(kRMSNorm, Device::CPU);
}

TEST_CASE("rms_norm: saved bytes: x + rstd under Input, y + rstd under Output") {
    check_saved_bytes(kRMSNorm, false);
}

TEST_CASE("rms_norm: argument errors name the op, the expectation and what was found") {
    check_norm_errors(kRMSNorm);
}

}  // TEST_SUITE
