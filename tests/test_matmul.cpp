// tests/test_matmul.cpp: matmul, linear and linear_gelu (ops/matmul.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls.
#include <cmath>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// a [M, K] @ b [K, N], row-major, the textbook triple loop.
std::vector<double> naive_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t K,
                                 int64_t N) {
    std::vector<double> out(M * N, 0.0);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
            for (int64_t k = 0; k < K; ++k) out[i * N + j] += a[i * K + k] * b[k * N + j];
    return out;
}

// x [M, K], weight [N, K], bias [N] or empty: out[i, j] = sum_k x[i, k] weight[j, k] + bias[j].
std::vector<double> naive_linear(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& bias, int64_t M, int64_t K, int64_t N) {
    std::vector<double> out(M * N, 0.0);
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double s = bias.empty() ? 0.0 : bias[j];
            for (int64_t k = 0; k < K; ++k) s += x[i * K + k] * w[j * K + k];
            out[i * N + j] = s;
        }
    return out;
}

}  // namespace

TEST_SUITE("matmul") {
    TEST_CASE("matmul: forward matches a naive triple loop") {
        manual_seed(61);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            {
                INFO("2-D a");
                Tensor a = input({3, 4}, dt), b = input({4, 5}, dt);
                Tensor y = matmul(a, b);
                CHECK(y.dtype() == dt);
                CHECK_CLOSE(y, expected(naive_matmul(as_f64(a), as_f64(b), 3, 4, 5), {3, 5}), tolerance(dt));
            }
            {
                INFO("3-D a: leading dims are rows");
                Tensor a = input({2, 3, 4}, dt), b = input({4, 5}, dt);
                CHECK_CLOSE(matmul(a, b), expected(naive_matmul(as_f64(a), as_f64(b), 6, 4, 5), {2, 3, 5}),
                            tolerance(dt));
            }
            {
                INFO("non-contiguous b");
                Tensor a = input({3, 4}, dt), bt = input({5, 4}, dt);
                Tensor b = bt.transpose(0, 1);  // [4, 5]
                CHECK_CLOSE(matmul(a, b), expected(naive_matmul(as_f64(a), as_f64(b), 3, 4, 5), {3, 5}),
                            tolerance(dt));
            }
        }
    }

    TEST_CASE("matmul: gradcheck of a and b") {
        manual_seed(62);
        auto f = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
        std::vector<Tensor> in{leaf({2, 3, 4}), leaf({4, 5})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("matmul: bad input") {
        Tensor a = zeros({3, 4}), b = zeros({4, 5}), b64 = zeros({4, 5}, opts(DType::F64));
        Tensor ai = zeros({3, 4}, opts(DType::I64)), bi = zeros({4, 5}, opts(DType::I64));
        Tensor empty04 = zeros({0, 4}), b_empty = zeros({4, 0}), b_wrong = zeros({5, 4}), b3 = zeros({1, 4, 5});
        int64_t before = cpu_allocated();

        CHECK_THROWS_KIND_WITH(matmul(Tensor(), b), normtape::Error, "matmul");
        CHECK_THROWS_KIND_WITH(matmul(a, Tensor()), normtape::Error, "matmul");
        CHECK_THROWS_KIND_WITH(matmul(empty04, b), normtape::Error, "matmul");
        CHECK_THROWS_KIND_WITH(matmul(a, b_empty), normtape::Error, "matmul");
        CHECK_THROWS_KIND_WITH(matmul(ai, b), normtape::Error, "matmul");
        CHECK_THROWS_KIND_WITH(matmul(a, bi), normtape::Error, "matmul");
        CHECK_THROWS_KIND_WITH(matmul(a, b64), normtape::Error, "matmul");
        // Inner dimensions differ: both shapes in the message.
        CHECK_THROWS_KIND_WITH(matmul(a, b_wrong), normtape::Error, "matmul", "[3, 4]", "[5, 4]");
        CHECK_THROWS_KIND_WITH(matmul(a, b3), normtape::Error, "matmul");

        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("matmul: a 0-dim a is refused with an error naming matmul") {
        // A scalar has no inner dimension; the header promises errors that name the op.
        Tensor s = ones({}), b = ones({1, 3});
        CHECK_THROWS_KIND_WITH(matmul(s, b), normtape::Error, "matmul");
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("linear") {
    TEST_CASE("linear: forward matches a naive loop, with and without bias") {
        manual_seed(71);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            const int64_t K = 4, N = 5;
            Tensor x = input({2, 3, K}, dt), w = input({N, K}, dt), bias = input({N}, dt);
            Tensor y = linear(x, w, bias);
            CHECK(y.shape() == Shape{2, 3, N});
            CHECK(y.dtype() == dt);
            CHECK_CLOSE(y, expected(naive_linear(as_f64(x), as_f64(w), as_f64(bias), 6, K, N), {2, 3, N}),
                        tolerance(dt));
            CHECK_CLOSE(linear(x, w), expected(naive_linear(as_f64(x), as_f64(w), {}, 6, K, N), {2, 3, N}),
                        tolerance(dt));
        }
    }

    TEST_CASE("linear: gradcheck with bias") {
        manual_seed(72);
        auto f = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
        std::vector<Tensor> in{leaf({2, 3, 4}), leaf({5, 4}), leaf({5})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("linear: gradcheck without bias") {
        manual_seed(73);
        auto f = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
        std::vector<Tensor> in{leaf({3, 4}), leaf({2, 4})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("linear: bad input") {
        Tensor x = zeros({3, 4}), w = zeros({5, 4}), bias = zeros({5});
        Tensor x64 = zeros({3, 4}, opts(DType::F64)), w64 = zeros({5, 4}, opts(DType::F64));
        Tensor xi = zeros({3, 4}, opts(DType::I64)), bias64 = zeros({5}, opts(DType::F64));
        Tensor biasi = zeros({5}, opts(DType::I64));
        Tensor empty04 = zeros({0, 4}), w_empty = zeros({0, 4}), w_wrong = zeros({5, 3}), w1 = zeros({4});
        Tensor bias_wrong = zeros({4}), bias2 = zeros({1, 5});
        int64_t before = cpu_allocated();

        CHECK_THROWS_KIND_WITH(linear(Tensor(), w, bias), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x, Tensor(), bias), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(empty04, w, bias), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x, w_empty), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(xi, w), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x, w64), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x64, w), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x64, w64, bias), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x, w, bias64), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x, w, biasi), normtape::Error, "linear");
        // weight's in-features differ from x's last dim: both shapes in the message.
        CHECK_THROWS_KIND_WITH(linear(x, w_wrong), normtape::Error, "linear", "[5, 3]", "[3, 4]");
        CHECK_THROWS_KIND_WITH(linear(x, w1), normtape::Error, "linear");
        CHECK_THROWS_KIND_WITH(linear(x, w, bias_wrong), normtape::Error, "linear", "[4]");
        CHECK_THROWS_KIND_WITH(linear(x, w, bias2), normtape::Error, "linear");

        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("linear: a 0-dim x is refused with an error naming linear") {
        Tensor s = ones({}), w = ones({3, 1});
        CHECK_THROWS_KIND_WITH(linear(s, w), normtape::Error, "linear");
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("linear_gelu") {
    TEST_CASE("linear_gelu: forward matches the tanh GELU of a naive linear") {
        manual_seed(74);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            const int64_t K = 6, N = 8;
            Tensor x = input({2, 3, K}, dt), w = input({N, K}, dt), bias = input({N}, dt);
            std::vector<double> h = naive_linear(as_f64(x), as_f64(w), as_f64(bias), 6, K, N);
            for (double& v : h) v = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
            Tensor y = linear_gelu(x, w, bias);
            CHECK(y.shape() == Shape{2, 3, N});
            CHECK(y.dtype() == dt);
            CHECK_CLOSE(y, expected(h, {2, 3, N}), tolerance(dt));
        }
    }

    TEST_CASE("linear_gelu: gradcheck") {
        manual_seed(75);
        auto f = [](const std::vector<Tensor>& in) { return linear_gelu(in[0], in[1], in[2]); };
        std::vector<Tensor> in{leaf({2, 3, 4}), leaf({5, 4}), leaf({5})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("linear_gelu: saves the bytes of linear followed by gelu") {
        manual_seed(76);
        Tensor x = leaf({7, 4}, 1.0, DType::F32), w = leaf({6, 4}, 1.0, DType::F32), bias = leaf({6}, 1.0, DType::F32);
        int64_t fused = 0, separate = 0;
        {
            Tensor y = linear_gelu(x, w, bias);
            fused = saved_bytes();
        }
        {
            Tensor y = gelu(linear(x, w, bias));
            separate = saved_bytes();
        }
        CHECK(fused == separate);
        CHECK(fused == 7 * 6 * 4);  // h, f32; x and weight are leaves that require grad, not counted
    }

    TEST_CASE("linear_gelu: bad input names linear_gelu") {
        Tensor x = zeros({3, 4}), w = zeros({5, 4}), bias = zeros({5});
        int64_t before = cpu_allocated();
        CHECK_THROWS_KIND_WITH(linear_gelu(x, w, Tensor()), normtape::Error, "linear_gelu", "bias");
        CHECK_THROWS_KIND_WITH(linear_gelu(x, zeros({5, 3}), bias), normtape::ShapeError, "linear_gelu", "[5, 3]");
        CHECK_THROWS_KIND_WITH(linear_gelu(x, w, zeros({4})), normtape::ShapeError, "linear_gelu", "[4]");
        CHECK_THROWS_KIND_WITH(linear_gelu(x, w, zeros({5}, opts(DType::F64))), normtape::DTypeError, "linear_gelu");
        CHECK_THROWS_KIND_WITH(linear_gelu(ones({}), w, bias), normtape::ShapeError, "linear_gelu");
        CHECK(cpu_allocated() == before);
    }
}
