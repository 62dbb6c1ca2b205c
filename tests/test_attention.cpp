// tests/test_attention.cpp: causal_self_attention (ops/attention.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention_cudnn.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

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

}  // namespace

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

    TEST_CASE("causal_self_attention: saves qkv, out and the row log-sum-exp, nothing T x T") {
        manual_seed(85);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            for (int64_t T : {7, 64, 130}) {
                INFO("T = ", T);
                const int64_t B = 2, C = 16, nh = 4;
                Tensor qkv = leaf({B, T, 3 * C}, 1.0, dt);
                int64_t before = saved_bytes();
                Tensor out = causal_self_attention(qkv, nh);
                const int64_t es = static_cast<int64_t>(element_size(dt));
                const int64_t stat = static_cast<int64_t>(element_size(stat_dtype(dt)));
                // qkv is a leaf that requires grad: a parameter-like input, not counted.
                CHECK(saved_bytes() - before == B * T * C * es + B * nh * T * stat);
                Tensor g = randn(out.shape()).to(dt);
                sum(mul(out, g)).backward();
                CHECK(saved_bytes() == before);
                CHECK(qkv.grad().defined());
            }
        }
    }

    TEST_CASE("causal_self_attention: gradients against the naive attention at larger T") {
        manual_seed(86);
        // f(qkv) = sum(out * u) through the naive attention, differentiated by central differences
        // in f64 on a few coordinates of each of q, k and v, against the backward's.
        const int64_t B = 1, T = 40, C = 8, nh = 2;
        Tensor qkv = leaf({B, T, 3 * C});
        Tensor u = randn({B, T, C}, TensorOptions().dtype(DType::F64));
        sum(mul(causal_self_attention(qkv, nh), u)).backward();
        std::vector<double> x = as_f64(qkv), uu = u.to_vector<double>(), grad = qkv.grad().to_vector<double>();
        auto f = [&](const std::vector<double>& v) {
            std::vector<double> y = naive_attention(v, B, T, C, nh);
            double total = 0.0;
            for (size_t i = 0; i < y.size(); ++i) total += y[i] * uu[i];
            return total;
        };
        for (int64_t t : {0, 17, 39})
            for (int64_t j : {int64_t(1), C + 5, 2 * C + 7}) {
                INFO("t = ", t, ", column ", j);
                const int64_t i = t * 3 * C + j;
                std::vector<double> plus = x, minus = x;
                plus[i] += 1e-6, minus[i] -= 1e-6;
                CHECK(grad[i] == doctest::Approx((f(plus) - f(minus)) / 2e-6).epsilon(1e-6));
            }
    }

    TEST_CASE("causal_self_attention: scores too large to round to 1 still give finite gradients") {
        // |q . k| ~ 1e10: the recomputed probabilities' exponent is off by whole units; p stays <= 1.
        manual_seed(87);
        for (DType dt : {DType::F32, DType::BF16}) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor qkv = leaf({1, 8, 48}, 1e5, dt);
            Tensor g = randn({1, 8, 16}).to(dt);
            g.mul_(1e5);
            Tensor out = causal_self_attention(qkv, 2);
            sum(mul(out, g)).backward();
            for (float v : qkv.grad().to(DType::F32).to_vector<float>()) REQUIRE(std::isfinite(v));
        }
    }

    TEST_CASE("attention_backend: cuDNN where the library has it, else normtape's kernels, which can be chosen") {
        const AttentionBackend before = attention_backend();
        CHECK(before == (detail::cudnn_attention_built() ? AttentionBackend::Cudnn : AttentionBackend::Kernels));
        set_attention_backend(AttentionBackend::Kernels);
        CHECK(attention_backend() == AttentionBackend::Kernels);
        CHECK(std::string(attention_backend_name(AttentionBackend::Kernels)) == "kernels");
        if (detail::cudnn_attention_built()) {
            set_attention_backend(AttentionBackend::Cudnn);
            CHECK(attention_backend() == AttentionBackend::Cudnn);
        } else {
            CHECK_THROWS_KIND_WITH(set_attention_backend(AttentionBackend::Cudnn), normtape::Error,
                                   "set_attention_backend", "without cuDNN");
            CHECK(attention_backend() == AttentionBackend::Kernels);
        }
        set_attention_backend(before);
    }

    TEST_CASE("causal_self_attention: bad input") {
        Tensor ok = zeros({2, 5, 24}), i = zeros({2, 5, 24}, opts(DType::I64)), empty = zeros({2, 0, 24});
        Tensor two_d = zeros({5, 24}), four_d = zeros({1, 2, 5, 24}), not3c = zeros({2, 5, 25});
        int64_t before = cpu_allocated();
        const char* op = "causal_self_attention";

        CHECK_THROWS_KIND_WITH(causal_self_attention(Tensor(), 2), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(empty, 2), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(i, 2), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(two_d, 2), normtape::Error, op, "[5, 24]");
        CHECK_THROWS_KIND_WITH(causal_self_attention(four_d, 2), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(not3c, 1), normtape::Error, op, "[2, 5, 25]");
        // C = 8 is not divisible by 3 (nor by 16).
        CHECK_THROWS_KIND_WITH(causal_self_attention(ok, 3), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(ok, 16), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(ok, 0), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_self_attention(ok, -2), normtape::Error, op);

        CHECK(cpu_allocated() == before);
    }
}

namespace {

// GPT-2's packed qkv [B, T, 3 * NH * hs] from separate q [B, T, NH, hs] and k, v [B, T, NKV, hs],
// each key/value head repeated for the NH / NKV query heads of its group: grouped-query attention
// written as the multi-head attention it equals.
std::vector<double> packed_repeated(const Tensor& q, const Tensor& k, const Tensor& v) {
    const int64_t B = q.size(0), T = q.size(1), NH = q.size(2), NKV = k.size(2), hs = q.size(3), C = NH * hs;
    std::vector<double> vq = as_f64(q), vk = as_f64(k), vv = as_f64(v), qkv(B * T * 3 * C);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < NH; ++h)
                for (int64_t d = 0; d < hs; ++d) {
                    const int64_t row = (b * T + t) * 3 * C, g = h / (NH / NKV);
                    qkv[row + h * hs + d] = vq[((b * T + t) * NH + h) * hs + d];
                    qkv[row + C + h * hs + d] = vk[((b * T + t) * NKV + g) * hs + d];
                    qkv[row + 2 * C + h * hs + d] = vv[((b * T + t) * NKV + g) * hs + d];
                }
    return qkv;
}

}  // namespace

TEST_SUITE("causal_attention") {
    TEST_CASE("causal_attention: forward matches the naive attention with key/value heads repeated") {
        manual_seed(91);
        const int64_t B = 2, T = 6, hs = 4;
        for (DType dt : kFloatTypes)
            for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {4, 1}, {6, 2}}) {
                INFO("dtype ", std::string(dtype_name(dt)), ", n_head ", NH, ", n_kv_head ", NKV);
                Tensor q = input({B, T, NH, hs}, dt), k = input({B, T, NKV, hs}, dt), v = input({B, T, NKV, hs}, dt);
                Tensor out = causal_attention(q, k, v);
                REQUIRE(out.shape() == q.shape());
                CHECK_CLOSE(out, expected(naive_attention(packed_repeated(q, k, v), B, T, NH * hs, NH), {B, T, NH, hs}),
                            tolerance(dt));
            }
    }

    TEST_CASE("causal_attention: with n_kv_head == n_head it is causal_self_attention, bit for bit, gradients too") {
        manual_seed(92);
        const int64_t B = 2, T = 9, NH = 3, hs = 4, C = NH * hs;
        for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor qkv = leaf({B, T, 3 * C}, 1.0, dt);
            Tensor g = input({B, T, C}, dt);
            Tensor packed = causal_self_attention(qkv, NH);
            sum(mul(packed, g)).backward();
            Tensor q = qkv.detach().narrow(2, 0, C).contiguous().view({B, T, NH, hs});
            Tensor k = qkv.detach().narrow(2, C, C).contiguous().view({B, T, NH, hs});
            Tensor v = qkv.detach().narrow(2, 2 * C, C).contiguous().view({B, T, NH, hs});
            for (Tensor* x : {&q, &k, &v}) x->requires_grad_(true);
            Tensor out = causal_attention(q, k, v);
            sum(mul(out.view({B, T, C}), g)).backward();
            CHECK(as_f64(out) == as_f64(packed));
            Tensor dqkv = qkv.grad();
            CHECK(as_f64(q.grad()) == as_f64(dqkv.narrow(2, 0, C).contiguous()));
            CHECK(as_f64(k.grad()) == as_f64(dqkv.narrow(2, C, C).contiguous()));
            CHECK(as_f64(v.grad()) == as_f64(dqkv.narrow(2, 2 * C, C).contiguous()));
        }
    }

    TEST_CASE("causal_attention: gradcheck of q, k and v, grouped and not") {
        manual_seed(93);
        for (auto [NH, NKV] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}}) {
            INFO("n_head ", NH, ", n_kv_head ", NKV);
            auto f = [](const std::vector<Tensor>& in) { return causal_attention(in[0], in[1], in[2]); };
            std::vector<Tensor> in{leaf({2, 5, NH, 4}), leaf({2, 5, NKV, 4}), leaf({2, 5, NKV, 4})};
            CHECK_GRADCHECK(f, in);
        }
    }

    TEST_CASE("causal_attention: dk and dv are the repeated heads' gradients summed over each group") {
        manual_seed(94);
        const int64_t B = 1, T = 70, NH = 4, NKV = 2, hs = 8, C = NH * hs;
        Tensor q = leaf({B, T, NH, hs}), k = leaf({B, T, NKV, hs}), v = leaf({B, T, NKV, hs});
        Tensor g = input({B, T, NH, hs}, DType::F64);
        sum(mul(causal_attention(q, k, v), g)).backward();
        Tensor qkv = from_vector<double>(packed_repeated(q, k, v), {B, T, 3 * C});
        qkv.requires_grad_(true);
        sum(mul(causal_self_attention(qkv, NH), g.view({B, T, C}))).backward();
        std::vector<double> dqkv = qkv.grad().to_vector<double>(), dq(B * T * C), dk(B * T * NKV * hs, 0.0), dv = dk;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < NH; ++h)
                for (int64_t d = 0; d < hs; ++d) {
                    const int64_t row = t * 3 * C, kv = (t * NKV + h / (NH / NKV)) * hs + d;
                    dq[(t * NH + h) * hs + d] = dqkv[row + h * hs + d];
                    dk[kv] += dqkv[row + C + h * hs + d];
                    dv[kv] += dqkv[row + 2 * C + h * hs + d];
                }
        const Tolerance tol = tolerance(DType::F64);
        CHECK_CLOSE(q.grad(), expected(dq, q.shape()), tol);
        CHECK_CLOSE(k.grad(), expected(dk, k.shape()), tol);
        CHECK_CLOSE(v.grad(), expected(dv, v.shape()), tol);
    }

    TEST_CASE("causal_attention: saves q, k, v, out and the row log-sum-exp") {
        manual_seed(95);
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            const int64_t B = 2, T = 33, NH = 4, NKV = 2, hs = 8;
            Tensor q0 = leaf({B, T, NH, hs}, 1.0, dt), k0 = leaf({B, T, NKV, hs}, 1.0, dt),
                   v0 = leaf({B, T, NKV, hs}, 1.0, dt);
            // Non-leaf inputs (scaled copies), so that saved_bytes() counts them.
            Tensor q = scale(q0, 1.0), k = scale(k0, 1.0), v = scale(v0, 1.0);
            int64_t before = saved_bytes();
            Tensor out = causal_attention(q, k, v);
            const int64_t es = static_cast<int64_t>(element_size(dt)), stat = static_cast<int64_t>(element_size(stat_dtype(dt)));
            CHECK(saved_bytes() - before == B * T * hs * (2 * NH + 2 * NKV) * es + B * NH * T * stat);
            sum(mul(out, input(out.shape(), dt))).backward();
            CHECK(saved_bytes() == before);
            CHECK(k0.grad().defined());
        }
    }

    TEST_CASE("causal_attention_rows: the last rows of causal_attention, bit for bit") {
        manual_seed(96);
        const int64_t B = 2, T = 11, NH = 4, NKV = 2, hs = 4;
        for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor q = input({B, T, NH, hs}, dt), k = input({B, T, NKV, hs}, dt), v = input({B, T, NKV, hs}, dt);
            Tensor full = causal_attention(q, k, v);
            for (int64_t first : {0, 5, 10}) {
                INFO("first row ", first);
                Tensor rows = causal_attention_rows(q.narrow(1, first, T - first), k, v);
                CHECK(as_f64(rows) == as_f64(full.narrow(1, first, T - first).contiguous()));
            }
        }
    }

    TEST_CASE("causal_attention: bad input") {
        Tensor q = zeros({2, 5, 4, 8}), kv = zeros({2, 5, 2, 8}), i = zeros({2, 5, 4, 8}, opts(DType::I64));
        Tensor kv3 = zeros({2, 5, 3, 8}), kv_hs = zeros({2, 5, 2, 4}), kv_b = zeros({1, 5, 2, 8}), kv_t = zeros({2, 6, 2, 8});
        Tensor three_d = zeros({2, 5, 32}), f64 = zeros({2, 5, 2, 8}, opts(DType::F64)), empty = zeros({2, 0, 4, 8});
        Tensor needs_grad = zeros({2, 1, 4, 8});
        needs_grad.requires_grad_(true);
        int64_t before = cpu_allocated();
        const char* op = "causal_attention";
        CHECK_THROWS_KIND_WITH(causal_attention(Tensor(), kv, kv), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_attention(q, Tensor(), kv), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(causal_attention(i, kv, kv), normtape::DTypeError, op);
        CHECK_THROWS_KIND_WITH(causal_attention(q, f64, kv), normtape::DTypeError, op);
        CHECK_THROWS_KIND_WITH(causal_attention(empty, kv, kv), normtape::ShapeError, op);
        CHECK_THROWS_KIND_WITH(causal_attention(three_d, kv, kv), normtape::ShapeError, op, "[2, 5, 32]");
        CHECK_THROWS_KIND_WITH(causal_attention(q, kv3, kv3), normtape::ShapeError, op, "divide");
        CHECK_THROWS_KIND_WITH(causal_attention(q, kv, kv3), normtape::ShapeError, op, "[2, 5, 3, 8]");
        CHECK_THROWS_KIND_WITH(causal_attention(q, kv_hs, kv_hs), normtape::ShapeError, op, "[2, 5, 2, 4]");
        CHECK_THROWS_KIND_WITH(causal_attention(q, kv_b, kv_b), normtape::ShapeError, op);
        CHECK_THROWS_KIND_WITH(causal_attention(q, kv_t, kv_t), normtape::ShapeError, op, "one length");
        CHECK_THROWS_KIND_WITH(causal_attention(q, kv, kv, 1.0), normtape::Error, op, "dropout");
        const char* rows = "causal_attention_rows";
        CHECK_THROWS_KIND_WITH(causal_attention_rows(zeros({2, 7, 4, 8}), kv, kv), normtape::ShapeError, rows);
        CHECK_THROWS_KIND_WITH(causal_attention_rows(needs_grad, kv, kv), normtape::Error, rows, "NoGradGuard");
        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("causal_attention: zero key/value heads and empty inputs are ShapeErrors, as the header says") {
        // Zero key/value heads once divided by zero (SIGFPE): run in a child process.
        Tensor q = zeros({2, 5, 4, 8}), none = zeros({2, 5, 0, 8});
        for (const char* op : {"causal_attention", "causal_attention_rows"}) {
            INFO(op);
            const bool rows = std::string(op) == "causal_attention_rows";
            check_throws_in_child<normtape::ShapeError>(
                [&] {
                    NoGradGuard no_grad;
                    rows ? causal_attention_rows(q, none, none) : causal_attention(q, none, none);
                },
                {op, "n_kv_head >= 1 to divide n_head", "[2, 5, 0, 8]"});
        }
        // B 0, T 0, no heads or hs 0: the documented refusal of an empty q.
        for (const Shape& shape : {Shape{0, 5, 4, 8}, Shape{2, 0, 4, 8}, Shape{2, 5, 0, 8}, Shape{2, 5, 4, 0}}) {
            INFO(shape_str(shape));
            Shape kv_shape = shape;
            kv_shape[2] = shape[2] == 0 ? 1 : 2;
            Tensor kv = zeros(kv_shape);
            CHECK_THROWS_KIND_WITH(causal_attention(zeros(shape), kv, kv), normtape::ShapeError, "causal_attention",
                                   "expected a non-empty q", shape_str(shape));
        }
    }
}
