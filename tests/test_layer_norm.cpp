// tests/test_layer_norm.cpp: layer_norm against a plain reference, finite differences, the two
// policies against each other, weights near zero, saved bytes, and every argument error.
#include "norm_test_cases.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

const NormUnderTest kLayerNorm{"layer_norm", true,
                               [](const Tensor& x, const Tensor& w, const Tensor& b, double eps, SavePolicy p) {
                                   return layer_norm(x, w, b, eps, p);
                               }};

// The textbook formula, written out independently of ops/norm/norm.cpp.
std::vector<double> layer_norm_reference(const std::vector<double>& x, const std::vector<double>& w,
                                         const std::vector<double>& b, int64_t N, double eps) {
    std::vector<double> y(x.size());
    for (size_t r = 0; r < x.size() / N; ++r) {
        double mu = 0, var = 0;
        for (int64_t j = 0; j < N; ++j) mu += x[r * N + j] / N;
        for (int64_t j = 0; j < N; ++j) var += (x[r * N + j] - mu) * (x[r * N + j] - mu) / N;
        for (int64_t j = 0; j < N; ++j) y[r * N + j] = (x[r * N + j] - mu) / std::sqrt(var + eps) * w[j] + b[j];
    }
    return y;
}

}  // namespace

TEST_SUITE("layer_norm") {

TEST_CASE("layer_norm: forward matches the formula in f64 and f32, with mean 0 and variance 1 before the affine") {
    manual_seed(20);
    for (DType dtype : {DType::F64, DType::F32}) {
        CAPTURE(dtype_name(dtype));
        TensorOptions o = TensorOptions().dtype(dtype);
        const int64_t N = 37;
        Tensor x = add(scale(randn({3, 4, N}, o), 3.0), full({N}, 5.0, o));
        Tensor w = randn({N}, o), b = randn({N}, o);
        Tensor y = layer_norm(x, w, b, 1e-5);
        std::vector<double> ref = layer_norm_reference(as_f64(x), as_f64(w), as_f64(b), N, 1e-5);
        CHECK_CLOSE(y, from_vector(ref, x.shape()), (dtype == DType::F64 ? Tolerance{1e-12, 1e-12} : Tolerance{1e-5, 1e-5}));
        std::vector<double> plain = as_f64(layer_norm(x, Tensor(), Tensor(), 1e-5));
        double mu = 0, sq = 0;
        for (int64_t j = 0; j < N; ++j) {
            mu += plain[j] / N;
            sq += plain[j] * plain[j] / N;
        }
        CHECK(std::abs(mu) < 1e-5);
        CHECK(std::abs(sq - 1.0) < 1e-3);
    }
}

TEST_CASE("layer_norm: gradients match finite differences in f64 under both policies") {
    check_norm_gradcheck(kLayerNorm);
}

TEST_CASE("layer_norm: SavePolicy::Output and Normalized give the outputs and gradients of SavePolicy::Input") {
    check_policies_agree(kLayerNorm);
}

TEST_CASE("layer_norm: weights near zero under SavePolicy::Output") { check_weights_near_zero(kLayerNorm); }

TEST_CASE("layer_norm: SavePolicy::Normalized is as exact as Input at any weight, in bf16") {
    check_normalized_at_any_weight(kLayerNorm, Device::CPU);
}

TEST_CASE("layer_norm: saved bytes: x + mean + rstd under Input, y + rstd under Output") {
    check_saved_bytes(kLayerNorm, true);
}

TEST_CASE("layer_norm: argument errors name the op, the expectation and what was found") {
    check_norm_errors(kLayerNorm);
}

}  // TEST_SUITE
