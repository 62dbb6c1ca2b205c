// tests/test_lr_scheduler.cpp: the learning-rate schedules (nn/optim/lr_scheduler.h) at the points their
// formulas pin down (warm-up ends, the cosine's midpoint, decay ends, each StepLR boundary), the
// cosine's monotone decay, and each bad argument's error.
#include <cmath>
#include <numbers>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

TEST_CASE("lr_scheduler: ConstantLR is its rate at every step") {
    ConstantLR s(3e-4);
    for (int64_t step : {int64_t(0), int64_t(1), int64_t(999), int64_t(1) << 40}) CHECK(s.lr(step) == 3e-4);
    CHECK_THROWS_KIND_WITH(ConstantLR(-1.0), Error, "ConstantLR", "lr >= 0");
    CHECK_THROWS_KIND_WITH(ConstantLR(std::nan("")), Error, "ConstantLR", "finite");
    CHECK_THROWS_KIND_WITH(s.lr(-1), Error, "ConstantLR", "step >= 0", "-1");
}

TEST_CASE("lr_scheduler: WarmupCosineLR rises linearly, falls as a half cosine, then holds min_lr") {
    const double max_lr = 1e-3, min_lr = 1e-4;
    WarmupCosineLR s(max_lr, 100, 5000, min_lr);
    CHECK(s.lr(0) == doctest::Approx(max_lr / 100));
    CHECK(s.lr(49) == doctest::Approx(max_lr / 2));
    CHECK(s.lr(99) == doctest::Approx(max_lr));  // the warm-up's last step
    CHECK(s.lr(100) == doctest::Approx(max_lr));  // the cosine at p = 0
    CHECK(s.lr(2550) == doctest::Approx((max_lr + min_lr) / 2));  // p = 1/2
    const double p = 1000.0 / 4900.0;  // an arbitrary point, against the formula
    CHECK(s.lr(1100) == doctest::Approx(min_lr + (max_lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * p))));
    CHECK(s.lr(4999) == doctest::Approx(min_lr).epsilon(1e-6));
    CHECK(s.lr(5000) == min_lr);
    CHECK(s.lr(int64_t(1) << 40) == min_lr);
    for (int64_t step = 100; step < 5000; ++step) REQUIRE(s.lr(step + 1) <= s.lr(step));
    WarmupCosineLR no_warmup(max_lr, 0, 10, 0.0);
    CHECK(no_warmup.lr(0) == max_lr);
    CHECK(no_warmup.lr(10) == 0.0);
}

TEST_CASE("lr_scheduler: WarmupCosineLR refuses a schedule that cannot be drawn") {
    CHECK_THROWS_KIND_WITH(WarmupCosineLR(1e-3, 10, 100, 2e-3), Error, "WarmupCosineLR", "min_lr <= max_lr");
    CHECK_THROWS_KIND_WITH(WarmupCosineLR(1e-3, 100, 100, 0.0), Error, "WarmupCosineLR", "decay_steps > warmup_steps");
    CHECK_THROWS_KIND_WITH(WarmupCosineLR(1e-3, -1, 100, 0.0), Error, "WarmupCosineLR", "warmup_steps >= 0");
    CHECK_THROWS_KIND_WITH(WarmupCosineLR(INFINITY, 1, 100, 0.0), Error, "WarmupCosineLR", "max_lr", "finite");
    CHECK_THROWS_KIND_WITH(WarmupCosineLR(1e-3, 1, 100, -1.0), Error, "WarmupCosineLR", "min_lr");
    CHECK_THROWS_KIND_WITH(WarmupCosineLR(1e-3, 1, 100, 0.0).lr(-5), Error, "WarmupCosineLR", "step >= 0");
}

TEST_CASE("lr_scheduler: StepLR multiplies by gamma every step_size steps") {
    StepLR s(0.1, 30, 0.5);
    CHECK(s.lr(0) == 0.1);
    CHECK(s.lr(29) == 0.1);
    CHECK(s.lr(30) == doctest::Approx(0.05));
    CHECK(s.lr(95) == doctest::Approx(0.1 * 0.125));
    CHECK_THROWS_KIND_WITH(StepLR(0.1, 0, 0.5), Error, "StepLR", "step_size >= 1", "0");
    CHECK_THROWS_KIND_WITH(StepLR(0.1, 1, -0.5), Error, "StepLR", "gamma");
    CHECK_THROWS_KIND_WITH(s.lr(-1), Error, "StepLR", "step >= 0");
}
