// tests/test_softmax.cpp: softmax over the last dimension (ops/softmax.h). (a) forward against a
// plain f64 loop written here (f64, f32), 1-D to 3-D, N = 1, a strided x; (b) bf16 against f32;
// (c) rows of large values (1000, 1001) and very negative ones, which overflow a naive exp;
// (d) f64 finite-difference gradcheck, and the gradient by hand; (e) what it saves: y, not x, and a
// y modified in place is refused by the backward; (f) the same bits at 1 and 3 threads; (g) every
// error path of the header, each naming softmax, no bytes leaked; (h) CUDA against the cpu
// (f64, f32, bf16; rows shorter and longer than a block), skipped without a GPU.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/device_ptr.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// softmax by hand, in f64: x [rows, N] row-major.
std::vector<double> softmax_by_hand(const std::vector<double>& x, int64_t rows, int64_t N) {
    std::vector<double> y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
        const double* xr = x.data() + r * N;
        double m = xr[0];
        for (int64_t j = 1; j < N; ++j) m = std::max(m, xr[j]);
        double s = 0.0;
        for (int64_t j = 0; j < N; ++j) s += std::exp(xr[j] - m);
        for (int64_t j = 0; j < N; ++j) y[r * N + j] = std::exp(xr[j] - m) / s;
    }
    return y;
}

// The raw bytes of a tensor (copied to the cpu), to compare bit for bit.
std::string bytes_of(const Tensor& t) {
    Tensor c = t.to(Device::CPU).contiguous();
    return std::string(detail::byte_ptr(c), static_cast<size_t>(c.nbytes()));
}

// softmax on the cpu and on CUDA from the same x (on the cpu; `transpose`: of x.transpose(0, 1)),
// forward and backward, compared normwise.
void check_cuda_matches_cpu(const Tensor& base, bool transpose = false) {
    DType dt = base.dtype();
    CAPTURE(dtype_name(dt));
    CAPTURE(shape_str(base.shape()));
    CAPTURE(transpose);
    Tensor bc = base.clone().requires_grad_(true), bg = base.to(Device::CUDA).requires_grad_(true);
    Tensor yc = softmax(transpose ? bc.transpose(0, 1) : bc), yg = softmax(transpose ? bg.transpose(0, 1) : bg);
    REQUIRE(yg.device() == Device::CUDA);
    CHECK(yg.dtype() == dt);
    CHECK_NORMWISE(yg, yc, normwise_tolerance(dt));
    Tensor u = randn(yc.shape()).to(dt);
    yc.backward(u);
    yg.backward(u.to(Device::CUDA));
    CHECK_NORMWISE(bg.grad(), bc.grad(), normwise_tolerance(dt));
}

}  // namespace

TEST_SUITE("softmax") {

TEST_CASE("softmax: forward matches a plain f64 loop (f64, f32), 1-D to 3-D, N = 1, a strided x") {
    manual_seed(301);
    for (DType dt : kFloatTypes) {
        CAPTURE(dtype_name(dt));
        for (Shape shape : {Shape{3, 4, 7}, Shape{5, 300}, Shape{6}, Shape{4, 1}}) {
            CAPTURE(shape_str(shape));
            Tensor x = input(shape, dt, 3.0);
            const int64_t N = shape.back(), rows = x.numel() / N;
            Tensor y = softmax(x);
            CHECK(y.dtype() == dt);
            CHECK(y.shape() == shape);
            CHECK(y.is_contiguous());
            CHECK_CLOSE(y, expected(softmax_by_hand(as_f64(x), rows, N), shape), tolerance(dt));
        }
        // N = 1: every y is exactly 1
        for (double v : as_f64(softmax(input({5, 1}, dt, 10.0)))) CHECK(v == 1.0);
        // a transposed x is read through a contiguous copy: rows are the transposed rows
        Tensor base = input({7, 3}, dt, 2.0);
        Tensor xt = base.transpose(0, 1);
        CHECK_CLOSE(softmax(xt), expected(softmax_by_hand(as_f64(xt.contiguous()), 3, 7), {3, 7}), tolerance(dt));
    }
    // a hand-checked row: softmax(0, ln 2, ln 5) = (1, 2, 5) / 8
    std::vector<double> y = softmax(from_vector<double>({0.0, std::log(2.0), std::log(5.0)})).to_vector<double>();
    CHECK(y[0] == doctest::Approx(0.125).epsilon(1e-15));
    CHECK(y[1] == doctest::Approx(0.25).epsilon(1e-15));
    CHECK(y[2] == doctest::Approx(0.625).epsilon(1e-15));
}

TEST_CASE("softmax: bf16 is f32's softmax of the same values, rounded once") {
    manual_seed(302);
    for (Shape shape : {Shape{4, 33}, Shape{2, 3, 512}}) {
        CAPTURE(shape_str(shape));
        Tensor x = input(shape, DType::BF16, 4.0);
        Tensor y = softmax(x);
        CHECK(y.dtype() == DType::BF16);
        CHECK(y.shape() == shape);
        Tensor want = softmax(x.to(DType::F32));  // the same (bf16) values, in f32
        CHECK_CLOSE(y, want, tolerance(DType::BF16));
        CHECK_NORMWISE(y, want, normwise_tolerance(DType::BF16));
        // on the cpu the arithmetic is f32's, step for step: y is f32's result rounded once, bit for bit
        CHECK(bytes_of(y) == bytes_of(want.to(DType::BF16)));
    }
}

TEST_CASE("softmax: rows of large values do not overflow (1000, 1001), nor very negative ones underflow to 0/0") {
    const double a = 1.0 / (1.0 + std::exp(1.0));  // softmax(1000, 1001) = (a, 1 - a), a = 0.2689...
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dt));
        // bf16 holds 1000 and 1004, not 1001: its rows use values it can hold
        const double hi = dt == DType::BF16 ? 1004.0 : 1001.0;
        Tensor x = from_vector<double>({1000.0, hi, -1000.0, -hi, 1000.0, 1000.0, 88.0, 89.0}, {4, 2}).to(dt);
        Tensor y = softmax(x);
        std::vector<double> v = as_f64(y);
        for (double e : v) CHECK(std::isfinite(e));
        CHECK_CLOSE(y, expected(softmax_by_hand(as_f64(x), 4, 2), {4, 2}), tolerance(dt));
        if (dt != DType::BF16) {
            CHECK(v[0] == doctest::Approx(a).epsilon(1e-6));
            CHECK(v[1] == doctest::Approx(1.0 - a).epsilon(1e-6));
            CHECK(v[2] == doctest::Approx(1.0 - a).epsilon(1e-6));
        }
        CHECK(v[4] == 0.5);
        CHECK(v[5] == 0.5);
        // and the backward is finite too
        Tensor leafx = x.clone().requires_grad_(true);
        softmax(leafx).backward(ones({4, 2}, opts(dt)));
        for (double g : as_f64(leafx.grad())) CHECK(std::isfinite(g));
    }
    // -inf is a probability of 0; a NaN makes its row NaN
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> y = softmax(from_vector<double>({0.0, -inf, 0.0, 1.0, nan, 2.0}, {2, 3})).to_vector<double>();
    CHECK(y[0] == 0.5);
    CHECK(y[1] == 0.0);
    CHECK(y[2] == 0.5);
    for (int j = 3; j < 6; ++j) CHECK(std::isnan(y[j]));
}

TEST_CASE("softmax: gradcheck, 1-D to 3-D, N = 1 and a strided x") {
    manual_seed(303);
    auto f = [](const std::vector<Tensor>& in) { return softmax(in[0]); };
    SUBCASE("[2, 3, 5]") {
        std::vector<Tensor> in{leaf({2, 3, 5}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("[4, 9]") {
        std::vector<Tensor> in{leaf({4, 9}, 3.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("[6]") {
        std::vector<Tensor> in{leaf({6}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("[3, 1]: y = 1, dx = 0") {
        std::vector<Tensor> in{leaf({3, 1}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("transposed [5, 3] -> [3, 5]") {
        auto g = [](const std::vector<Tensor>& in) { return softmax(in[0].transpose(0, 1)); };
        std::vector<Tensor> in{leaf({5, 3}, 2.0)};
        CHECK_GRADCHECK(g, in);
    }
}

TEST_CASE("softmax: the gradient by hand: dx = y * (g - sum(g * y))") {
    manual_seed(304);
    const int64_t rows = 3, N = 6;
    Tensor x = leaf({rows, N}, 2.0);
    Tensor g = input({rows, N}, DType::F64);
    softmax(x).backward(g);
    std::vector<double> vy = softmax_by_hand(as_f64(x), rows, N), vg = as_f64(g), want(rows * N);
    for (int64_t r = 0; r < rows; ++r) {
        double dot = 0.0;
        for (int64_t j = 0; j < N; ++j) dot += vg[r * N + j] * vy[r * N + j];
        for (int64_t j = 0; j < N; ++j) want[r * N + j] = vy[r * N + j] * (vg[r * N + j] - dot);
    }
    CHECK_CLOSE(x.grad(), expected(want, {rows, N}), tolerance(DType::F64));
}

TEST_CASE("softmax: saves its output y (shared storage, not a copy), not x, and refuses a y modified in place") {
    manual_seed(305);
    Tensor w = leaf({4, 5});
    {
        Tensor x = scale(w, 2.0);  // not a leaf: only what the tape saves keeps it alive
        Tensor y = softmax(x);
        REQUIRE(y.grad_fn() != nullptr);
        CHECK(std::string(y.grad_fn()->name()) == "SoftmaxBackward");
        std::vector<SavedSlot> slots = y.grad_fn()->saved_tensors();
        REQUIRE(slots.size() == 1);
        CHECK(std::string(slots[0].name) == "y");
        CHECK(slots[0].tensor->data().storage() == y.storage());
        CHECK(slots[0].tensor->data().grad_fn() == nullptr);  // Note [Saved outputs and cycles]
        CHECK(saved_bytes() == y.nbytes());                     // y alone: scale saves nothing
    }
    CHECK(saved_bytes() == 0);  // dropping y frees the graph: the node held no cycle
    // In place on y after the forward: the backward would read the new values; it refuses, naming the node.
    Tensor y = softmax(w);
    {
        NoGradGuard no_grad;
        y.mul_(2.0);
    }
    check_throws<Error>([&] { y.backward(ones({4, 5}, opts(DType::F64))); }, {"SoftmaxBackward"});
    // Nothing records without grad.
    NoGradGuard no_grad;
    CHECK(softmax(w).grad_fn() == nullptr);
}

TEST_CASE("softmax: the same bits at 1 and 3 threads") {
    ThreadCountGuard guard;
    auto run = [] {
        manual_seed(306);
        std::string all;
        for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
            Tensor x = leaf({300, 257}, 3.0, dt);
            Tensor y = softmax(x);
            y.backward(randn(y.shape()).to(dt));
            all += bytes_of(y) + bytes_of(x.grad());
        }
        return all;
    };
    set_num_threads(1);
    const std::string one = run();
    set_num_threads(3);
    CHECK(run() == one);
}

TEST_CASE("softmax: bad input") {
    Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4}), empty30 = zeros({3, 0}),
           scalar = full({}, 1.0);
    int64_t before = cpu_allocated();
    check_throws<Error>([&] { (void)softmax(Tensor()); }, {"softmax", "undefined"}, KindMatch::Exactly);
    check_throws<DTypeError>([&] { (void)softmax(i); }, {"softmax", "i64"});
    check_throws<ShapeError>([&] { (void)softmax(empty04); }, {"softmax", "[0, 4]"});
    check_throws<ShapeError>([&] { (void)softmax(empty30); }, {"softmax", "[3, 0]"});
    check_throws<ShapeError>([&] { (void)softmax(scalar); }, {"softmax", "scalar"});
    CHECK(cpu_allocated() == before);
    // a non-finite y under anomaly detection: the NaN was already in x
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Tensor bad = from_vector<double>({1.0, nan, 2.0, 3.0}, {2, 2});
    CHECK(std::isnan(softmax(bad).to_vector<double>()[0]));  // silent without the guard
    DetectAnomalyGuard anomaly;
    check_throws<AnomalyError>([&] { (void)softmax(bad); }, {"softmax", "output y", "input x"});
    CHECK_NOTHROW((void)softmax(from_vector<double>({1.0, 2.0}, {1, 2})));
}

TEST_CASE("softmax: CUDA matches the cpu (f64, f32, bf16): rows shorter and longer than a block, strided x") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(307);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        check_cuda_matches_cpu(input({64, 96}, dt, 3.0));
        check_cuda_matches_cpu(input({7, 1000}, dt, 3.0));  // a block walks the row 4 times
        check_cuda_matches_cpu(input({2, 3, 33}, dt, 3.0));
        check_cuda_matches_cpu(input({5, 1}, dt, 3.0));
        check_cuda_matches_cpu(input({9}, dt, 3.0));
        check_cuda_matches_cpu(input({17, 12}, dt, 3.0), true);
    }
    // large values and a row of -inf on the GPU, as on the cpu
    const double inf = std::numeric_limits<double>::infinity();
    Tensor x = from_vector<double>({1000.0, 1001.0, -1000.0, -1001.0, 0.0, -inf}, {3, 2});
    CHECK_CLOSE(softmax(x.to(Device::CUDA)).to(Device::CPU), softmax(x), tolerance(DType::F64));
    // bf16 on the GPU is f32's softmax rounded once, as on the cpu
    Tensor xb = input({8, 300}, DType::BF16, 4.0);
    CHECK_CLOSE(softmax(xb.to(Device::CUDA)), softmax(xb.to(DType::F32)), tolerance(DType::BF16));
}

}  // TEST_SUITE
