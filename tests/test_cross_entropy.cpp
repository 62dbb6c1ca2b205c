// tests/test_cross_entropy.cpp: cross_entropy (ops/cross_entropy.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls.
#include <algorithm>
#include <cmath>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

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

    TEST_CASE("cross_entropy: uniform logits give log V, and huge logits stay finite") {
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

        CHECK_THROWS_KIND_WITH(cross_entropy(Tensor(), t), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, Tensor()), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(cross_entropy(logits_i, t), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(cross_entropy(empty04, t_empty), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_empty), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_f), normtape::Error, op, "i64");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_wrong), normtape::Error, op, "[2, 3]", "[3, 2]");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_flat), normtape::Error, op);
        // Targets out of [0, V): the message gives the value.
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_neg), normtape::Error, op, "-1");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_v), normtape::Error, op);
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t_big), normtape::Error, op, "9");

        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("cross_entropy: 0-dim logits are refused with an error naming cross_entropy") {
        // A scalar has no class dimension V.
        Tensor s = ones({}), t = ids({0}, {1}).view({});
        CHECK_THROWS_KIND_WITH(cross_entropy(s, t), normtape::Error, "cross_entropy");
    }
}
