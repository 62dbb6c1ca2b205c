// tests/test_ops.cpp: the ops other than the norms (add, mul, scale, gelu, sum, mean, matmul,
// linear, causal_self_attention, embedding, cross_entropy), one TEST_SUITE each.
//
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls. Not here: layer_norm and
// rms_norm (tests/test_layer_norm.cpp, tests/test_rms_norm.cpp), the engine (test_autograd.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

const DType kFloatTypes[] = {DType::F64, DType::F32};

int64_t cpu_allocated() { return memory_stats(Device::CPU).allocated_bytes; }

TensorOptions opts(DType dtype) { return TensorOptions().dtype(dtype); }

// Standard normals of `dtype`, times `scale`; no gradient.
Tensor input(const Shape& shape, DType dtype, double scale = 1.0) {
    Tensor t = randn(shape, opts(dtype));
    t.mul_(scale);
    return t;
}

// The expected result, in f64.
Tensor expected(const std::vector<double>& values, const Shape& shape) { return from_vector<double>(values, shape); }

Tensor ids(const std::vector<int64_t>& values, const Shape& shape) { return from_vector<int64_t>(values, shape); }

const double kSqrt2OverPi = std::sqrt(2.0 / M_PI);

double gelu_by_hand(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }

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

// Attention written the long way: a full T x T score matrix per (b, h), -inf above the diagonal,
// softmax over every column, then a weighted sum over every position.
std::vector<double> naive_attention(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
    int64_t hs = C / NH;
    auto at = [&](int64_t b, int64_t t, int64_t j) { return qkv[(b * T + t) * 3 * C + j]; };
    std::vector<double> out(B * T * C, 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h) {
            std::vector<std::vector<double>> score(T, std::vector<double>(T));
            for (int64_t t = 0; t < T; ++t)
                for (int64_t s = 0; s < T; ++s) {
                    if (s > t) {
                        score[t][s] = -std::numeric_limits<double>::infinity();
                        continue;
                    }
                    double dot = 0.0;
                    for (int64_t d = 0; d < hs; ++d) dot += at(b, t, h * hs + d) * at(b, s, C + h * hs + d);
                    score[t][s] = dot / std::sqrt(static_cast<double>(hs));
                }
            for (int64_t t = 0; t < T; ++t) {
                double m = -std::numeric_limits<double>::infinity();
                for (int64_t s = 0; s < T; ++s) m = std::max(m, score[t][s]);
                double z = 0.0;
                for (int64_t s = 0; s < T; ++s) z += std::exp(score[t][s] - m);
                for (int64_t d = 0; d < hs; ++d) {
                    double o = 0.0;
                    for (int64_t s = 0; s < T; ++s) o += std::exp(score[t][s] - m) / z * at(b, s, 2 * C + h * hs + d);
                    out[(b * T + t) * C + h * hs + d] = o;
                }
            }
        }
    return out;
}

// mean over rows of logsumexp(row) - row[target], logsumexp with the max taken out by hand.
double naive_cross_entropy(const std::vector<double>& logits, const std::vector<int64_t>& targets, int64_t V) {
    int64_t M = static_cast<int64_t>(targets.size());
    double total = 0.0;
    for (int64_t i = 0; i < M; ++i) {
        double m = logits[i * V];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, logits[i * V + v]);
        double z = 0.0;
        for (int64_t v = 0; v < V; ++v) z += std::exp(logits[i * V + v] - m);
        total += m + std::log(z) - logits[i * V + targets[i]];
    }
    return total / static_cast<double>(M);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_SUITE("add") {
    TEST_CASE("add: forward matches a plain loop: same shape and both broadcasts") {
        manual_seed(1);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            const int64_t B = 2, T = 3, C = 4;
            Tensor a = input({B, T, C}, dt);
            std::vector<double> va = as_f64(a);

            Tensor same = input({B, T, C}, dt), row = input({C}, dt), pos = input({T, C}, dt);
            std::vector<double> vs = as_f64(same), vr = as_f64(row), vp = as_f64(pos);
            std::vector<double> out_same(B * T * C), out_row(B * T * C), out_pos(B * T * C);
            for (int64_t b = 0; b < B; ++b)
                for (int64_t t = 0; t < T; ++t)
                    for (int64_t c = 0; c < C; ++c) {
                        int64_t i = (b * T + t) * C + c;
                        out_same[i] = va[i] + vs[i];
                        out_row[i] = va[i] + vr[c];
                        out_pos[i] = va[i] + vp[t * C + c];
                    }
            Tensor y = add(a, same);
            CHECK(y.dtype() == dt);
            CHECK(y.is_contiguous());
            CHECK_CLOSE(y, expected(out_same, {B, T, C}), tolerance(dt));
            CHECK_CLOSE(add(a, row), expected(out_row, {B, T, C}), tolerance(dt));
            CHECK_CLOSE(add(a, pos), expected(out_pos, {B, T, C}), tolerance(dt));
        }
    }

    TEST_CASE("add: forward on a non-contiguous a") {
        manual_seed(2);
        Tensor base = input({3, 2}, DType::F64);
        Tensor a = base.transpose(0, 1);  // [2, 3], not contiguous
        Tensor b = input({3}, DType::F64);
        std::vector<double> vb = as_f64(base), bb = as_f64(b), out(6);
        for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 3; ++j) out[i * 3 + j] = vb[j * 2 + i] + bb[j];
        CHECK_CLOSE(add(a, b), expected(out, {2, 3}), tolerance(DType::F64));
    }

    TEST_CASE("add: gradcheck: same shape, b = [N] onto [2, 3, N], b = [T, C] onto [B, T, C]") {
        manual_seed(3);
        auto f = [](const std::vector<Tensor>& in) { return add(in[0], in[1]); };
        SUBCASE("same shape") {
            std::vector<Tensor> in{leaf({2, 3, 4}), leaf({2, 3, 4})};
            CHECK_GRADCHECK(f, in);
        }
        SUBCASE("b = [N] onto [2, 3, N]") {
            std::vector<Tensor> in{leaf({2, 3, 4}), leaf({4})};
            CHECK_GRADCHECK(f, in);
            CHECK(in[1].grad().shape() == Shape{4});
        }
        SUBCASE("b = [T, C] onto [B, T, C]") {
            std::vector<Tensor> in{leaf({2, 5, 3}), leaf({5, 3})};
            CHECK_GRADCHECK(f, in);
            CHECK(in[1].grad().shape() == Shape{5, 3});
        }
    }

    TEST_CASE("add: x + x accumulates a gradient of 2") {
        manual_seed(4);
        Tensor x = leaf({2, 3});
        Tensor u = input({2, 3}, DType::F64);
        add(x, x).backward(u);
        std::vector<double> vu = as_f64(u), want(6);
        for (size_t i = 0; i < 6; ++i) want[i] = 2.0 * vu[i];
        REQUIRE(x.grad().defined());
        CHECK_CLOSE(x.grad(), expected(want, {2, 3}), tolerance(DType::F64));
    }

    TEST_CASE("add: bad input") {
        Tensor a = zeros({2, 3}), b = zeros({2, 3}), a64 = zeros({2, 3}, opts(DType::F64));
        Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4}), wrong = zeros({3, 2});
        Tensor big = zeros({2, 3, 4}), small = zeros({4}), prefix = zeros({2});
        int64_t before = cpu_allocated();

        CHECK_THROWS_WITH_AS(add(Tensor(), b), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, Tensor()), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(empty04, empty04), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, empty04), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(i, i), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, i), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(i, a), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, a64), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, a64), doctest::Contains("f64"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a64, a), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, wrong), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, wrong), doctest::Contains("[3, 2]"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, wrong), doctest::Contains("[2, 3]"), normtape::Error);
        // b larger than a, and b a prefix (not a suffix) of a's shape.
        CHECK_THROWS_WITH_AS(add(small, big), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, prefix), doctest::Contains("add"), normtape::Error);
        CHECK_THROWS_WITH_AS(add(a, prefix), doctest::Contains("[2]"), normtape::Error);

        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("mul") {
    TEST_CASE("mul: forward matches a plain loop") {
        manual_seed(11);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor a = input({2, 3, 4}, dt), b = input({2, 3, 4}, dt);
            std::vector<double> va = as_f64(a), vb = as_f64(b), want(va.size());
            for (size_t i = 0; i < va.size(); ++i) want[i] = va[i] * vb[i];
            Tensor y = mul(a, b);
            CHECK(y.dtype() == dt);
            CHECK_CLOSE(y, expected(want, {2, 3, 4}), tolerance(dt));
        }
    }

    TEST_CASE("mul: gradcheck of both inputs") {
        manual_seed(12);
        auto f = [](const std::vector<Tensor>& in) { return mul(in[0], in[1]); };
        std::vector<Tensor> in{leaf({3, 4}), leaf({3, 4})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("mul: only one input requires grad: its gradient is g * the other") {
        manual_seed(13);
        Tensor a = leaf({2, 3});
        Tensor b = input({2, 3}, DType::F64);  // a constant
        Tensor u = input({2, 3}, DType::F64);
        mul(b, a).backward(u);
        std::vector<double> vb = as_f64(b), vu = as_f64(u), want(6);
        for (size_t i = 0; i < 6; ++i) want[i] = vu[i] * vb[i];
        REQUIRE(a.grad().defined());
        CHECK_CLOSE(a.grad(), expected(want, {2, 3}), tolerance(DType::F64));
    }

    TEST_CASE("mul: mul(x, x) has gradient 2x") {
        manual_seed(14);
        Tensor x = leaf({2, 3});
        Tensor u = input({2, 3}, DType::F64);
        mul(x, x).backward(u);
        std::vector<double> vx = as_f64(x), vu = as_f64(u), want(6);
        for (size_t i = 0; i < 6; ++i) want[i] = 2.0 * vx[i] * vu[i];
        REQUIRE(x.grad().defined());
        CHECK_CLOSE(x.grad(), expected(want, {2, 3}), tolerance(DType::F64));
    }

    TEST_CASE("mul: bad input") {
        Tensor a = zeros({2, 3}), a64 = zeros({2, 3}, opts(DType::F64)), i = zeros({2, 3}, opts(DType::I64));
        Tensor empty04 = zeros({0, 4}), row = zeros({3}), wrong = zeros({3, 2});
        int64_t before = cpu_allocated();

        CHECK_THROWS_WITH_AS(mul(Tensor(), a), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(a, Tensor()), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(empty04, empty04), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(i, i), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(a, i), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(a, a64), doctest::Contains("mul"), normtape::Error);
        // mul does not broadcast.
        CHECK_THROWS_WITH_AS(mul(a, row), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(a, wrong), doctest::Contains("mul"), normtape::Error);
        CHECK_THROWS_WITH_AS(mul(a, wrong), doctest::Contains("[3, 2]"), normtape::Error);

        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("scale") {
    TEST_CASE("scale: forward matches a plain loop") {
        manual_seed(21);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor a = input({3, 5}, dt);
            std::vector<double> va = as_f64(a);
            for (double s : {-1.75, 0.0, 3.0}) {
                INFO("s = ", s);
                std::vector<double> want(va.size());
                for (size_t i = 0; i < va.size(); ++i) want[i] = va[i] * s;
                Tensor y = scale(a, s);
                CHECK(y.dtype() == dt);
                CHECK_CLOSE(y, expected(want, {3, 5}), tolerance(dt));
            }
        }
    }

    TEST_CASE("scale: gradcheck") {
        manual_seed(22);
        auto f = [](const std::vector<Tensor>& in) { return scale(in[0], -2.5); };
        std::vector<Tensor> in{leaf({3, 4})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("scale: bad input") {
        Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4});
        int64_t before = cpu_allocated();
        CHECK_THROWS_WITH_AS(scale(Tensor(), 2.0), doctest::Contains("scale"), normtape::Error);
        CHECK_THROWS_WITH_AS(scale(empty04, 2.0), doctest::Contains("scale"), normtape::Error);
        CHECK_THROWS_WITH_AS(scale(i, 2.0), doctest::Contains("scale"), normtape::Error);
        CHECK_THROWS_WITH_AS(scale(i, 2.0), doctest::Contains("i64"), normtape::Error);
        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("gelu") {
    TEST_CASE("gelu: forward matches the tanh formula by hand") {
        manual_seed(31);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor x = input({4, 6}, dt, 2.0);
            std::vector<double> vx = as_f64(x), want(vx.size());
            for (size_t i = 0; i < vx.size(); ++i) want[i] = gelu_by_hand(vx[i]);
            Tensor y = gelu(x);
            CHECK(y.dtype() == dt);
            CHECK_CLOSE(y, expected(want, {4, 6}), tolerance(dt));
        }
    }

    TEST_CASE("gelu: known values: 0 at 0, x for large x, 0 for very negative x") {
        Tensor x = from_vector<double>({0.0, 10.0, -10.0, 1.0});
        std::vector<double> y = gelu(x).to_vector<double>();
        CHECK(y[0] == 0.0);
        CHECK(y[1] == doctest::Approx(10.0).epsilon(1e-12));
        CHECK(std::abs(y[2]) < 1e-12);
        // 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)), to 6 digits as torch gives it.
        CHECK(y[3] == doctest::Approx(0.841192).epsilon(1e-5));
    }

    TEST_CASE("gelu: gradcheck") {
        manual_seed(32);
        auto f = [](const std::vector<Tensor>& in) { return gelu(in[0]); };
        std::vector<Tensor> in{leaf({3, 5}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("gelu: bad input") {
        Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4});
        int64_t before = cpu_allocated();
        CHECK_THROWS_WITH_AS(gelu(Tensor()), doctest::Contains("gelu"), normtape::Error);
        CHECK_THROWS_WITH_AS(gelu(empty04), doctest::Contains("gelu"), normtape::Error);
        CHECK_THROWS_WITH_AS(gelu(i), doctest::Contains("gelu"), normtape::Error);
        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("sum") {
    TEST_CASE("sum: forward matches a plain loop and is 0-dim") {
        manual_seed(41);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor x = input({3, 4, 5}, dt);
            double want = 0.0;
            for (double v : as_f64(x)) want += v;
            Tensor y = sum(x);
            CHECK(y.dim() == 0);
            CHECK(y.dtype() == dt);
            CHECK_CLOSE(y, expected({want}, {1}).view({}), tolerance(dt));
        }
    }

    TEST_CASE("sum: f32 input is accumulated in double") {
        // 10^6 copies of 0.1f: a float accumulator drifts by about 1%, a double one does not.
        const int64_t n = 1000000;
        Tensor x = full({n}, 0.1);
        double want = static_cast<double>(n) * static_cast<double>(0.1f);
        CHECK(sum(x).item<float>() == doctest::Approx(want).epsilon(1e-6));
    }

    TEST_CASE("sum: forward on a non-contiguous input") {
        Tensor x = arange(6, opts(DType::F64)).view({2, 3}).transpose(0, 1);
        CHECK(sum(x).item<double>() == 15.0);
    }

    TEST_CASE("sum: gradcheck") {
        manual_seed(42);
        auto f = [](const std::vector<Tensor>& in) { return sum(in[0]); };
        std::vector<Tensor> in{leaf({3, 4})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("sum: bad input") {
        Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4});
        int64_t before = cpu_allocated();
        CHECK_THROWS_WITH_AS(sum(Tensor()), doctest::Contains("sum"), normtape::Error);
        CHECK_THROWS_WITH_AS(sum(empty04), doctest::Contains("sum"), normtape::Error);
        CHECK_THROWS_WITH_AS(sum(empty04), doctest::Contains("[0, 4]"), normtape::Error);
        CHECK_THROWS_WITH_AS(sum(i), doctest::Contains("sum"), normtape::Error);
        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("mean") {
    TEST_CASE("mean: forward matches a plain loop and is 0-dim") {
        manual_seed(51);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor x = input({3, 4, 5}, dt);
            double want = 0.0;
            for (double v : as_f64(x)) want += v;
            want /= 60.0;
            Tensor y = mean(x);
            CHECK(y.dim() == 0);
            CHECK(y.dtype() == dt);
            CHECK_CLOSE(y, expected({want}, {1}).view({}), tolerance(dt));
        }
    }

    TEST_CASE("mean: gradcheck") {
        manual_seed(52);
        auto f = [](const std::vector<Tensor>& in) { return mean(in[0]); };
        std::vector<Tensor> in{leaf({3, 4})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("mean: bad input") {
        Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4});
        int64_t before = cpu_allocated();
        CHECK_THROWS_WITH_AS(mean(Tensor()), doctest::Contains("mean"), normtape::Error);
        CHECK_THROWS_WITH_AS(mean(empty04), doctest::Contains("mean"), normtape::Error);
        CHECK_THROWS_WITH_AS(mean(i), doctest::Contains("mean"), normtape::Error);
        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
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

        CHECK_THROWS_WITH_AS(matmul(Tensor(), b), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, Tensor()), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(empty04, b), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, b_empty), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(ai, b), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, bi), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, b64), doctest::Contains("matmul"), normtape::Error);
        // Inner dimensions differ: both shapes in the message.
        CHECK_THROWS_WITH_AS(matmul(a, b_wrong), doctest::Contains("matmul"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, b_wrong), doctest::Contains("[3, 4]"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, b_wrong), doctest::Contains("[5, 4]"), normtape::Error);
        CHECK_THROWS_WITH_AS(matmul(a, b3), doctest::Contains("matmul"), normtape::Error);

        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("matmul: a 0-dim a is refused with an error naming matmul") {
        // A scalar has no inner dimension; the header promises errors that name the op.
        Tensor s = ones({}), b = ones({1, 3});
        CHECK_THROWS_WITH_AS(matmul(s, b), doctest::Contains("matmul"), normtape::Error);
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

        CHECK_THROWS_WITH_AS(linear(Tensor(), w, bias), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, Tensor(), bias), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(empty04, w, bias), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w_empty), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(xi, w), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w64), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x64, w), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x64, w64, bias), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w, bias64), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w, biasi), doctest::Contains("linear"), normtape::Error);
        // weight's in-features differ from x's last dim: both shapes in the message.
        CHECK_THROWS_WITH_AS(linear(x, w_wrong), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w_wrong), doctest::Contains("[5, 3]"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w_wrong), doctest::Contains("[3, 4]"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w1), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w, bias_wrong), doctest::Contains("linear"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w, bias_wrong), doctest::Contains("[4]"), normtape::Error);
        CHECK_THROWS_WITH_AS(linear(x, w, bias2), doctest::Contains("linear"), normtape::Error);

        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("linear: a 0-dim x is refused with an error naming linear") {
        Tensor s = ones({}), w = ones({3, 1});
        CHECK_THROWS_WITH_AS(linear(s, w), doctest::Contains("linear"), normtape::Error);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("causal_self_attention") {
    TEST_CASE("causal_self_attention: forward matches a naive masked attention, B=2 T=5 C=8 n_head=2") {
        manual_seed(81);
        const int64_t B = 2, T = 5, C = 8;
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor qkv = input({B, T, 3 * C}, dt);
            for (int64_t nh : {2, 1, 4}) {
                INFO("n_head = ", nh);
                Tensor y = causal_self_attention(qkv, nh);
                CHECK(y.shape() == Shape{B, T, C});
                CHECK(y.dtype() == dt);
                CHECK_CLOSE(y, expected(naive_attention(as_f64(qkv), B, T, C, nh), {B, T, C}), tolerance(dt));
            }
        }
    }

    TEST_CASE("causal_self_attention: causal: changing the last position leaves earlier outputs unchanged") {
        manual_seed(82);
        const int64_t T = 5, C = 8;
        Tensor qkv = input({1, T, 3 * C}, DType::F64);
        Tensor changed = qkv.clone();
        double* p = changed.data_ptr<double>();
        for (int64_t j = 0; j < 3 * C; ++j) p[(T - 1) * 3 * C + j] += 1.0;
        std::vector<double> y0 = causal_self_attention(qkv, 2).to_vector<double>();
        std::vector<double> y1 = causal_self_attention(changed, 2).to_vector<double>();
        for (int64_t i = 0; i < (T - 1) * C; ++i) CHECK(y0[i] == y1[i]);
        bool last_differs = false;
        for (int64_t i = (T - 1) * C; i < T * C; ++i) last_differs = last_differs || y0[i] != y1[i];
        CHECK(last_differs);
    }

    TEST_CASE("causal_self_attention: the first position attends only to itself: out = v") {
        manual_seed(83);
        const int64_t C = 8;
        Tensor qkv = input({2, 3, 3 * C}, DType::F64);
        std::vector<double> vq = as_f64(qkv), y = causal_self_attention(qkv, 2).to_vector<double>();
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t c = 0; c < C; ++c)
                CHECK(y[(b * 3) * C + c] == doctest::Approx(vq[(b * 3) * 3 * C + 2 * C + c]));
    }

    TEST_CASE("causal_self_attention: gradcheck on a small input") {
        manual_seed(84);
        auto f = [](const std::vector<Tensor>& in) { return causal_self_attention(in[0], 2); };
        std::vector<Tensor> in{leaf({2, 5, 3 * 8})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("causal_self_attention: bad input") {
        Tensor ok = zeros({2, 5, 24}), i = zeros({2, 5, 24}, opts(DType::I64)), empty = zeros({2, 0, 24});
        Tensor two_d = zeros({5, 24}), four_d = zeros({1, 2, 5, 24}), not3c = zeros({2, 5, 25});
        int64_t before = cpu_allocated();
        const char* op = "causal_self_attention";

        CHECK_THROWS_WITH_AS(causal_self_attention(Tensor(), 2), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(empty, 2), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(i, 2), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(two_d, 2), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(two_d, 2), doctest::Contains("[5, 24]"), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(four_d, 2), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(not3c, 1), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(not3c, 1), doctest::Contains("[2, 5, 25]"), normtape::Error);
        // C = 8 is not divisible by 3 (nor by 16).
        CHECK_THROWS_WITH_AS(causal_self_attention(ok, 3), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(ok, 16), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(ok, 0), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(causal_self_attention(ok, -2), doctest::Contains(op), normtape::Error);

        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("embedding") {
    TEST_CASE("embedding: forward copies the rows looked up") {
        manual_seed(91);
        const int64_t V = 5, C = 4;
        std::vector<int64_t> vi{3, 0, 3, 4, 1, 3};
        Tensor idx = ids(vi, {2, 3});
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor w = input({V, C}, dt);
            std::vector<double> vw = as_f64(w), want;
            for (int64_t id : vi)
                for (int64_t c = 0; c < C; ++c) want.push_back(vw[id * C + c]);
            Tensor y = embedding(idx, w);
            CHECK(y.shape() == Shape{2, 3, C});
            CHECK(y.dtype() == dt);
            // A lookup is a copy: exact in every dtype.
            CHECK_CLOSE(y, expected(want, {2, 3, C}), (Tolerance{0.0, 0.0}));
        }
    }

    TEST_CASE("embedding: gradcheck of weight, repeated ids accumulate") {
        manual_seed(92);
        Tensor idx = ids({2, 2, 0, 2, 4, 0}, {3, 2});
        auto f = [&](const std::vector<Tensor>& in) { return embedding(idx, in[0]); };
        std::vector<Tensor> in{leaf({6, 3})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("embedding: dweight row = number of occurrences for an upstream gradient of ones") {
        Tensor w = leaf({4, 2});
        Tensor idx = ids({1, 1, 3, 1}, {4});
        embedding(idx, w).backward(ones({4, 2}, opts(DType::F64)));
        REQUIRE(w.grad().defined());
        CHECK(w.grad().to_vector<double>() == std::vector<double>{0, 0, 3, 3, 0, 0, 1, 1});
    }

    TEST_CASE("embedding: bad input") {
        Tensor w = zeros({5, 4}), wi = zeros({5, 4}, opts(DType::I64)), w1 = zeros({5}), w3 = zeros({5, 4, 1});
        Tensor w_empty = zeros({0, 4});
        Tensor idx = ids({0, 1, 2}, {3}), idx_f = zeros({3}), idx_empty = zeros({0}, opts(DType::I64));
        Tensor idx_neg = ids({0, -1, 2}, {3}), idx_v = ids({0, 1, 5}, {3});
        Tensor idx_big = ids({0, 1, 2, 3, 4, 17}, {2, 3});
        Tensor w11 = zeros({11, 4});
        int64_t before = cpu_allocated();

        CHECK_THROWS_WITH_AS(embedding(Tensor(), w), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx, Tensor()), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_f, w), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_f, w), doctest::Contains("i64"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_empty, w), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx, w_empty), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx, wi), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx, w1), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx, w3), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx, w3), doctest::Contains("[5, 4, 1]"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_neg, w), doctest::Contains("embedding"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_neg, w), doctest::Contains("-1"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_v, w), doctest::Contains("embedding"), normtape::Error);
        // The message gives the id, its position and V.
        CHECK_THROWS_WITH_AS(embedding(idx_big, w11), doctest::Contains("17"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_big, w11), doctest::Contains("11"), normtape::Error);
        CHECK_THROWS_WITH_AS(embedding(idx_big, w11), doctest::Contains("5"), normtape::Error);

        CHECK(cpu_allocated() == before);
    }
}

// ---------------------------------------------------------------------------------------------
TEST_SUITE("cross_entropy") {
    TEST_CASE("cross_entropy: forward matches logsumexp by hand") {
        manual_seed(101);
        const int64_t V = 5;
        std::vector<int64_t> vt{4, 0, 2, 2, 1, 4};
        Tensor targets = ids(vt, {2, 3});
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor logits = input({2, 3, V}, dt, 2.0);
            Tensor loss = cross_entropy(logits, targets);
            CHECK(loss.dim() == 0);
            CHECK(loss.dtype() == dt);
            CHECK_CLOSE(loss, expected({naive_cross_entropy(as_f64(logits), vt, V)}, {1}).view({}), tolerance(dt));
            // The same rows as a 2-D [M, V] input.
            CHECK_CLOSE(cross_entropy(logits.view({6, V}), targets.view({6})), loss, tolerance(dt));
        }
    }

    TEST_CASE("cross_entropy: uniform logits give log V; huge logits stay finite") {
        Tensor zero = zeros({3, 7}, opts(DType::F64));
        CHECK(cross_entropy(zero, ids({0, 3, 6}, {3})).item<double>() == doctest::Approx(std::log(7.0)));
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            std::vector<double> vl{1000.0, 0.0, -1000.0, 1000.0, 1000.0, 0.0};
            Tensor logits = from_vector<double>(vl, {2, 3}).to(dt);
            // Row 0: target 0 is the max by 1000, loss 0; row 1: two tied maxima, loss log 2.
            Tensor loss = cross_entropy(logits, ids({0, 1}, {2}));
            CHECK(std::isfinite(as_f64(loss)[0]));
            // f32 keeps lse = 1000.69... to the float spacing near 1000 (6e-5).
            double tol = dt == DType::F64 ? 1e-10 : 2e-4;
            CHECK(std::abs(as_f64(loss)[0] - std::log(2.0) / 2.0) <= tol);
        }
    }

    TEST_CASE("cross_entropy: 1-D logits with 0-dim targets") {
        std::vector<double> vl{0.5, -1.0, 2.0};
        Tensor logits = from_vector<double>(vl);
        Tensor target = ids({2}, {1}).view({});
        CHECK(cross_entropy(logits, target).item<double>() == doctest::Approx(naive_cross_entropy(vl, {2}, 3)));
    }

    TEST_CASE("cross_entropy: gradcheck of logits, repeated targets") {
        manual_seed(102);
        Tensor targets = ids({1, 1, 3, 1, 0, 3}, {2, 3});
        auto f = [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets); };
        std::vector<Tensor> in{leaf({2, 3, 4}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("cross_entropy: bad input") {
        Tensor logits = zeros({2, 3, 5}), logits_i = zeros({2, 3, 5}, opts(DType::I64)), empty04 = zeros({0, 4});
        Tensor t = ids({0, 1, 2, 3, 4, 0}, {2, 3}), t_f = zeros({2, 3}), t_wrong = ids({0, 1, 2, 3, 4, 0}, {3, 2});
        Tensor t_flat = ids({0, 1, 2, 3, 4, 0}, {6}), t_empty = zeros({0}, opts(DType::I64));
        Tensor t_neg = ids({0, 1, 2, -1, 4, 0}, {2, 3}), t_v = ids({0, 1, 2, 3, 5, 0}, {2, 3});
        Tensor t_big = ids({0, 1, 2, 3, 4, 9}, {2, 3});
        int64_t before = cpu_allocated();
        const char* op = "cross_entropy";

        CHECK_THROWS_WITH_AS(cross_entropy(Tensor(), t), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, Tensor()), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits_i, t), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(empty04, t_empty), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_empty), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_f), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_f), doctest::Contains("i64"), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_wrong), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_wrong), doctest::Contains("[2, 3]"), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_wrong), doctest::Contains("[3, 2]"), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_flat), doctest::Contains(op), normtape::Error);
        // Targets out of [0, V): the message gives the value.
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_neg), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_neg), doctest::Contains("-1"), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_v), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_big), doctest::Contains(op), normtape::Error);
        CHECK_THROWS_WITH_AS(cross_entropy(logits, t_big), doctest::Contains("9"), normtape::Error);

        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("cross_entropy: 0-dim logits are refused with an error naming cross_entropy") {
        // A scalar has no class dimension V.
        Tensor s = ones({}), t = ids({0}, {1}).view({});
        CHECK_THROWS_WITH_AS(cross_entropy(s, t), doctest::Contains("cross_entropy"), normtape::Error);
    }
}
