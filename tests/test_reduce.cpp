// tests/test_reduce.cpp: sum and mean (ops/reduce.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls.
#include <cmath>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

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
        CHECK_THROWS_KIND_WITH(sum(Tensor()), normtape::Error, "sum");
        CHECK_THROWS_KIND_WITH(sum(empty04), normtape::Error, "sum", "[0, 4]");
        CHECK_THROWS_KIND_WITH(sum(i), normtape::Error, "sum");
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
        CHECK_THROWS_KIND_WITH(mean(Tensor()), normtape::Error, "mean");
        CHECK_THROWS_KIND_WITH(mean(empty04), normtape::Error, "mean");
        CHECK_THROWS_KIND_WITH(mean(i), normtape::Error, "mean");
        CHECK(cpu_allocated() == before);
    }
}
