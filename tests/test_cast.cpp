// tests/test_cast.cpp: cast (ops/cast.h): values against conversions written here (C++'s f64 ->
// f32, bf16's round to nearest even by hand), x itself for its own dtype, the gradient converted
// back to x's dtype, every error path, and CUDA against the cpu.
#include <bit>
#include <cstdint>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// f32 -> bf16 by hand: the top 16 bits rounded to nearest, ties to even (finite values).
double bf16_by_hand(double value) {
    uint32_t u = std::bit_cast<uint32_t>(static_cast<float>(value));
    u += 0x7fffu + ((u >> 16) & 1u);
    return std::bit_cast<float>(u & 0xffff0000u);
}

}  // namespace

TEST_SUITE("cast") {
    TEST_CASE("cast: f64 to f32 rounds as C++ does, f32 to bf16 to nearest even, widening is exact") {
        manual_seed(1);
        Tensor x64 = randn({5, 7}, opts(DType::F64));
        std::vector<double> v = as_f64(x64), got = as_f64(cast(x64, DType::F32));
        for (size_t i = 0; i < v.size(); ++i) CHECK(got[i] == static_cast<double>(static_cast<float>(v[i])));
        Tensor x32 = randn({5, 7});
        // Ties, exactly: 1 + 2^-8 lies halfway between two bf16 values and rounds to the even one (1).
        Tensor ties = from_vector<float>({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f}, {3});
        for (const Tensor& t : {x32, ties}) {
            std::vector<double> w = as_f64(t), bf = as_f64(cast(t, DType::BF16));
            for (size_t i = 0; i < w.size(); ++i) CHECK(bf[i] == bf16_by_hand(w[i]));
        }
        CHECK(as_f64(cast(ties, DType::BF16)) == std::vector<double>{1.0, 1.0 + 4 * 0x1p-8, -1.0});
        Tensor b = cast(x32, DType::BF16);
        CHECK(as_f64(cast(b, DType::F32)) == as_f64(b));
        CHECK(as_f64(cast(b, DType::F64)) == as_f64(b));
        CHECK(cast(b, DType::F64).is_contiguous());
    }

    TEST_CASE("cast: to x's own dtype returns x itself and records nothing") {
        Tensor x = randn({3, 4}).requires_grad_(true);
        Tensor y = cast(x, DType::F32);
        CHECK(y.impl_ptr() == x.impl_ptr());
        CHECK(y.grad_fn() == nullptr);
    }

    TEST_CASE("cast: the gradient is the output's gradient converted to x's dtype") {
        manual_seed(2);
        Tensor x = randn({4, 6}).requires_grad_(true);
        Tensor u = randn({4, 6}, opts(DType::BF16));
        Tensor y = cast(x, DType::BF16);
        CHECK(y.dtype() == DType::BF16);
        REQUIRE(y.grad_fn() != nullptr);
        CHECK(std::string(y.grad_fn()->name()) == "CastBackward");
        sum(mul(y, u)).backward();
        CHECK(x.grad().dtype() == DType::F32);
        CHECK(as_f64(x.grad()) == as_f64(u));  // bf16 widens to f32 exactly
        // Narrowing back: f64 x through f32, each gradient rounded as C++ rounds f64 to f32.
        Tensor x64 = randn({3, 5}, opts(DType::F64)).requires_grad_(true);
        Tensor g64 = randn({3, 5}, opts(DType::F64));
        Tensor z = cast(cast(x64, DType::F32), DType::F64);
        sum(mul(z, g64)).backward();
        std::vector<double> g = as_f64(g64), got = as_f64(x64.grad());
        for (size_t i = 0; i < g.size(); ++i) CHECK(got[i] == static_cast<double>(static_cast<float>(g[i])));
    }

    TEST_CASE("cast: an undefined, empty or i64 x, or an i64 dtype, is refused naming cast, leaking nothing") {
        int64_t before = cpu_allocated();
        CHECK_THROWS_KIND_WITH(cast(Tensor(), DType::F32), Error, "cast", "undefined");
        CHECK_THROWS_KIND_WITH(cast(ids({1, 2}, {2}), DType::F32), DTypeError, "cast", "floating", "i64");
        CHECK_THROWS_KIND_WITH(cast(randn({2}), DType::I64), DTypeError, "cast", "floating dtype", "Tensor::to");
        CHECK_THROWS_KIND_WITH(cast(empty({0, 3}), DType::F64), ShapeError, "cast", "non-empty");
        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("cast: on CUDA, the cpu's values and gradients, bit for bit") {
        REQUIRE_CUDA_OR_SKIP();
        manual_seed(3);
        Tensor x0 = randn({33, 40}), u0 = randn({33, 40}, opts(DType::BF16));
        auto run = [&](Device d) {
            Tensor x = x0.to(d).requires_grad_(true);
            Tensor y = cast(x, DType::BF16);
            sum(mul(y, u0.to(d))).backward();
            return std::pair{as_f64(y.to(Device::CPU)), as_f64(x.grad().to(Device::CPU))};
        };
        CHECK(run(Device::CUDA) == run(Device::CPU));
    }
}
