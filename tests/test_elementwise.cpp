// tests/test_elementwise.cpp: add, mul, scale and gelu (ops/elementwise.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls.
#include <cmath>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

const double kSqrt2OverPi = std::sqrt(2.0 / M_PI);

double gelu_by_hand(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x))); }

}  // namespace

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

        CHECK_THROWS_KIND_WITH(add(Tensor(), b), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(a, Tensor()), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(empty04, empty04), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(a, empty04), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(i, i), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(a, i), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(i, a), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(a, a64), normtape::Error, "add", "f64");
        CHECK_THROWS_KIND_WITH(add(a64, a), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(a, wrong), normtape::Error, "add", "[3, 2]", "[2, 3]");
        // b larger than a, and b a prefix (not a suffix) of a's shape.
        CHECK_THROWS_KIND_WITH(add(small, big), normtape::Error, "add");
        CHECK_THROWS_KIND_WITH(add(a, prefix), normtape::Error, "add", "[2]");

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

        CHECK_THROWS_KIND_WITH(mul(Tensor(), a), normtape::Error, "mul");
        CHECK_THROWS_KIND_WITH(mul(a, Tensor()), normtape::Error, "mul");
        CHECK_THROWS_KIND_WITH(mul(empty04, empty04), normtape::Error, "mul");
        CHECK_THROWS_KIND_WITH(mul(i, i), normtape::Error, "mul");
        CHECK_THROWS_KIND_WITH(mul(a, i), normtape::Error, "mul");
        CHECK_THROWS_KIND_WITH(mul(a, a64), normtape::Error, "mul");
        // mul does not broadcast.
        CHECK_THROWS_KIND_WITH(mul(a, row), normtape::Error, "mul");
        CHECK_THROWS_KIND_WITH(mul(a, wrong), normtape::Error, "mul", "[3, 2]");

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
        CHECK_THROWS_KIND_WITH(scale(Tensor(), 2.0), normtape::Error, "scale");
        CHECK_THROWS_KIND_WITH(scale(empty04, 2.0), normtape::Error, "scale");
        CHECK_THROWS_KIND_WITH(scale(i, 2.0), normtape::Error, "scale", "i64");
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
        CHECK_THROWS_KIND_WITH(gelu(Tensor()), normtape::Error, "gelu");
        CHECK_THROWS_KIND_WITH(gelu(empty04), normtape::Error, "gelu");
        CHECK_THROWS_KIND_WITH(gelu(i), normtape::Error, "gelu");
        CHECK(cpu_allocated() == before);
    }
}
