// tests/test_activation.cpp: relu_squared and swiglu (ops/activation.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain loop written here (f64, f32, bf16); (b) f64 finite-difference
// gradcheck; (c) recompute_output: the saved bytes of h -> act -> linear fall by exactly the
// output's bytes, the recipe makes the output's bits, and every gradient keeps its bits; nothing
// changes where nothing records; (d) the same bits at 1 and 3 threads; (e) every error path of the
// header, each naming the op, no bytes leaked; (f) CUDA against the cpu (f64, f32, bf16; swiglu's
// vector and one-element kernels), skipped without a GPU.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/device_ptr.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

using ActFn = std::function<Tensor(const Tensor&, bool)>;

// The raw bytes of a tensor (copied to the cpu), to compare bit for bit.
std::string bytes_of(const Tensor& t) {
    Tensor c = t.to(Device::CPU).contiguous();
    return std::string(detail::byte_ptr(c), static_cast<size_t>(c.nbytes()));
}

double relu_squared_by_hand(double x) { return x > 0 ? x * x : 0.0; }
double silu_by_hand(double x) { return x / (1.0 + std::exp(-x)); }

// swiglu by hand: h [rows, 2H] row-major -> [rows, H].
std::vector<double> swiglu_by_hand(const std::vector<double>& h, int64_t rows, int64_t H) {
    std::vector<double> out(rows * H);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < H; ++j) out[r * H + j] = silu_by_hand(h[r * 2 * H + j]) * h[r * 2 * H + H + j];
    return out;
}

// The saved slot of `node` that keeps a recipe, or nullptr.
SavedTensor* recipe_slot(const std::shared_ptr<Node>& node) {
    for (SavedSlot s : node->saved_tensors())
        if (s.tensor->recipe()) return s.tensor;
    return nullptr;
}

// The MLP's pattern h = linear(x, w1) -> a = act(h) -> out = linear(a, w2), on `device` in
// `dtype`; what the tape holds right after the forward, and the gradients of w1 and w2 (and of x)
// after out.backward(u). `width` is act's input width, `act_width` its output's.
struct MlpRun {
    int64_t saved = 0, act_bytes = 0;
    std::string recipe_name, remade, act, dw1, dw2, dx;
};
MlpRun run_mlp(const ActFn& act, bool recompute, DType dtype, Device device, int64_t width, int64_t act_width) {
    manual_seed(7);
    TensorOptions o = TensorOptions().dtype(dtype).device(device);
    const int64_t rows = 6, K = 8, M = 5;
    Tensor x = randn({rows, K}, o).requires_grad_(true);
    Tensor w1 = scale(randn({width, K}, o), 0.5).requires_grad_(true);
    Tensor w2 = randn({M, act_width}, o).requires_grad_(true);
    Tensor u = randn({rows, M}, o);
    MlpRun r;
    {
        Tensor h = linear(x, w1);
        Tensor a = act(h, recompute);
        Tensor out = linear(a, w2);
        r.saved = saved_bytes();
        r.act_bytes = a.nbytes();
        r.act = bytes_of(a);
        if (SavedTensor* slot = recipe_slot(out.grad_fn())) {
            r.recipe_name = slot->recipe()->name;
            r.remade = bytes_of(slot->unpack("test"));
        }
        out.backward(u);
    }
    r.dw1 = bytes_of(w1.grad());
    r.dw2 = bytes_of(w2.grad());
    r.dx = bytes_of(x.grad());
    return r;
}

void check_recompute_output(const ActFn& act, const char* name, Device device, int64_t width, int64_t act_width) {
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(device_name(device));
        MlpRun kept = run_mlp(act, false, dt, device, width, act_width);
        MlpRun remade = run_mlp(act, true, dt, device, width, act_width);
        CHECK(kept.recipe_name.empty());
        CHECK(remade.recipe_name == name);
        CHECK(remade.remade == remade.act);  // the recipe makes the forward's bits
        CHECK(kept.act == remade.act);
        CHECK(kept.saved - remade.saved == kept.act_bytes);
        CHECK(kept.act_bytes == 6 * act_width * static_cast<int64_t>(element_size(dt)));
        CHECK(kept.dw1 == remade.dw1);
        CHECK(kept.dw2 == remade.dw2);
        CHECK(kept.dx == remade.dx);
    }
}

// With nothing recording, recompute_output sets no recipe and returns the same bits.
void check_recompute_without_recording(const ActFn& act, const Shape& shape) {
    manual_seed(8);
    Tensor h = randn(shape), leafh = randn(shape).requires_grad_(true);
    CHECK(act(h, true).impl().recipe == nullptr);  // h needs no gradient
    CHECK(bytes_of(act(h, true)) == bytes_of(act(h, false)));
    NoGradGuard no_grad;
    Tensor a = act(leafh, true);
    CHECK(a.impl().recipe == nullptr);
    CHECK(a.grad_fn() == nullptr);
}

// Forward and backward bytes at 1 and at 3 threads agree.
void check_thread_bits(const ActFn& act, const Shape& shape) {
    ThreadCountGuard guard;
    auto run = [&] {
        manual_seed(9);
        std::string all;
        for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
            Tensor h = leaf(shape, 2.0, dt);
            Tensor y = act(h, false);
            y.backward(randn(y.shape()).to(dt));
            all += bytes_of(y) + bytes_of(h.grad());
        }
        return all;
    };
    set_num_threads(1);
    const std::string one = run();
    set_num_threads(3);
    CHECK(run() == one);
}

// act on the cpu and on CUDA from the same `h` (any dtype, on the cpu; it may be a strided or
// offset view, which goes to the GPU as the same view of a copy of its base), forward and backward.
void check_cuda_matches_cpu(const ActFn& act, const Tensor& base, const std::function<Tensor(const Tensor&)>& view) {
    DType dt = base.dtype();
    CAPTURE(dtype_name(dt));
    CAPTURE(shape_str(base.shape()));
    Tensor bc = base.clone().requires_grad_(true), bg = base.to(Device::CUDA).requires_grad_(true);
    Tensor yc = act(view(bc), false), yg = act(view(bg), false);
    REQUIRE(yg.device() == Device::CUDA);
    CHECK_NORMWISE(yg, yc, normwise_tolerance(dt));
    Tensor u = randn(yc.shape()).to(dt);
    yc.backward(u);
    yg.backward(u.to(Device::CUDA));
    CHECK_NORMWISE(bg.grad(), bc.grad(), normwise_tolerance(dt));
}

const ActFn kReluSquared = [](const Tensor& h, bool recompute) { return relu_squared(h, recompute); };
const ActFn kSwiglu = [](const Tensor& h, bool recompute) { return swiglu(h, recompute); };

}  // namespace

TEST_SUITE("relu_squared") {

TEST_CASE("relu_squared: forward matches a plain loop (f64, f32, bf16), and NaN stays NaN") {
    manual_seed(201);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dt));
        Tensor h = input({3, 4, 7}, dt, 2.0);
        std::vector<double> vh = as_f64(h), want(vh.size());
        for (size_t i = 0; i < vh.size(); ++i) want[i] = relu_squared_by_hand(vh[i]);
        Tensor y = relu_squared(h);
        CHECK(y.dtype() == dt);
        CHECK(y.shape() == h.shape());
        CHECK(y.is_contiguous());
        CHECK_CLOSE(y, expected(want, {3, 4, 7}), tolerance(dt));
    }
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> y = relu_squared(from_vector<double>({-3.0, 0.0, 1.5, nan, 3.0})).to_vector<double>();
    CHECK(y[0] == 0.0);
    CHECK(y[1] == 0.0);
    CHECK(y[2] == 2.25);
    CHECK(std::isnan(y[3]));
    CHECK(y[4] == 9.0);
    // a scalar is an elementwise input like any other
    CHECK(relu_squared(full({}, -2.0, opts(DType::F64))).item<double>() == 0.0);
    CHECK(relu_squared(full({}, 2.0, opts(DType::F64))).item<double>() == 4.0);
}

TEST_CASE("relu_squared: gradcheck, contiguous and strided h") {
    manual_seed(202);
    SUBCASE("contiguous") {
        auto f = [](const std::vector<Tensor>& in) { return relu_squared(in[0]); };
        std::vector<Tensor> in{leaf({3, 5}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("transposed") {
        auto f = [](const std::vector<Tensor>& in) { return relu_squared(in[0].transpose(0, 1)); };
        std::vector<Tensor> in{leaf({4, 3}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
}

TEST_CASE("relu_squared: saves h, and recompute_output saves the output's bytes, gradients keep their bits") {
    manual_seed(203);
    Tensor h = leaf({2, 3});
    Tensor y = relu_squared(h);
    REQUIRE(y.grad_fn() != nullptr);
    CHECK(std::string(y.grad_fn()->name()) == "ReluSquaredBackward");
    REQUIRE(y.grad_fn()->saved_tensors().size() == 1);
    CHECK(std::string(y.grad_fn()->saved_tensors()[0].name) == "h");
    check_recompute_output(kReluSquared, "relu_squared", Device::CPU, 12, 12);
    check_recompute_without_recording(kReluSquared, {4, 6});
}

TEST_CASE("relu_squared: the same bits at 1 and 3 threads") { check_thread_bits(kReluSquared, {70, 1001}); }

TEST_CASE("relu_squared: bad input") {
    Tensor i = zeros({2, 3}, opts(DType::I64)), empty04 = zeros({0, 4});
    int64_t before = cpu_allocated();
    check_throws<Error>([&] { (void)relu_squared(Tensor()); }, {"relu_squared", "undefined"}, KindMatch::Exactly);
    check_throws<DTypeError>([&] { (void)relu_squared(i); }, {"relu_squared", "i64"});
    check_throws<ShapeError>([&] { (void)relu_squared(empty04); }, {"relu_squared", "[0, 4]"});
    check_throws<ShapeError>([&] { (void)relu_squared(empty04, true); }, {"relu_squared"});
    CHECK(cpu_allocated() == before);
}

TEST_CASE("relu_squared: CUDA matches the cpu (f64, f32, bf16), whole vectors and a tail") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(204);
    auto same = [](const Tensor& t) { return t; };
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        check_cuda_matches_cpu(kReluSquared, input({64, 96}, dt, 2.0), same);
        check_cuda_matches_cpu(kReluSquared, input({1003}, dt, 2.0), same);
        check_cuda_matches_cpu(kReluSquared, input({17, 12}, dt, 2.0),
                               [](const Tensor& t) { return t.transpose(0, 1); });
    }
    check_recompute_output(kReluSquared, "relu_squared", Device::CUDA, 16, 16);
}

}  // TEST_SUITE

// ---------------------------------------------------------------------------------------------
TEST_SUITE("swiglu") {

TEST_CASE("swiglu: forward matches a plain loop (f64, f32, bf16), even and odd H") {
    manual_seed(211);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        for (int64_t H : {1, 5, 8}) {
            CAPTURE(dtype_name(dt));
            CAPTURE(H);
            Tensor h = input({2, 3, 2 * H}, dt, 2.0);
            Tensor y = swiglu(h);
            CHECK(y.dtype() == dt);
            CHECK(y.shape() == Shape{2, 3, H});
            CHECK(y.is_contiguous());
            CHECK_CLOSE(y, expected(swiglu_by_hand(as_f64(h), 6, H), {2, 3, H}), tolerance(dt));
        }
    }
    // a 1-D h is one row
    Tensor h = from_vector<double>({0.0, 1.0, -30.0, 2.0, 3.0, -1.0});
    std::vector<double> y = swiglu(h).to_vector<double>();
    CHECK(y[0] == 0.0);
    CHECK(y[1] == doctest::Approx(silu_by_hand(1.0) * 3.0).epsilon(1e-15));
    CHECK(y[2] == doctest::Approx(silu_by_hand(-30.0) * -1.0).epsilon(1e-15));
}

TEST_CASE("swiglu: gradcheck, 1-D to 3-D and a strided h") {
    manual_seed(212);
    auto f = [](const std::vector<Tensor>& in) { return swiglu(in[0]); };
    SUBCASE("[2, 3, 8]") {
        std::vector<Tensor> in{leaf({2, 3, 8}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("[5, 6]") {
        std::vector<Tensor> in{leaf({5, 6}, 3.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("[4]") {
        std::vector<Tensor> in{leaf({4}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("transposed [6, 3] -> [3, 6]") {
        auto g = [](const std::vector<Tensor>& in) { return swiglu(in[0].transpose(0, 1)); };
        std::vector<Tensor> in{leaf({6, 3}, 2.0)};
        CHECK_GRADCHECK(g, in);
    }
}

TEST_CASE("swiglu: the gradient by hand: dgate = g up silu'(gate), dup = g silu(gate)") {
    manual_seed(213);
    const int64_t rows = 3, H = 4;
    Tensor h = leaf({rows, 2 * H}, 2.0);
    Tensor g = input({rows, H}, DType::F64);
    swiglu(h).backward(g);
    std::vector<double> vh = as_f64(h), vg = as_f64(g), want(rows * 2 * H);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < H; ++j) {
            const double x = vh[r * 2 * H + j], u = vh[r * 2 * H + H + j], s = 1.0 / (1.0 + std::exp(-x));
            want[r * 2 * H + j] = vg[r * H + j] * u * s * (1.0 + x * (1.0 - s));
            want[r * 2 * H + H + j] = vg[r * H + j] * x * s;
        }
    CHECK_CLOSE(h.grad(), expected(want, {rows, 2 * H}), tolerance(DType::F64));
}

TEST_CASE("swiglu: saves h, and recompute_output saves the output's bytes, gradients keep their bits") {
    manual_seed(214);
    Tensor h = leaf({2, 6});
    Tensor y = swiglu(h);
    REQUIRE(y.grad_fn() != nullptr);
    CHECK(std::string(y.grad_fn()->name()) == "SwigluBackward");
    REQUIRE(y.grad_fn()->saved_tensors().size() == 1);
    CHECK(std::string(y.grad_fn()->saved_tensors()[0].name) == "h");
    check_recompute_output(kSwiglu, "swiglu", Device::CPU, 2 * 12, 12);
    check_recompute_without_recording(kSwiglu, {4, 6});
}

TEST_CASE("swiglu: the same bits at 1 and 3 threads") { check_thread_bits(kSwiglu, {300, 2 * 301}); }

TEST_CASE("swiglu: bad input") {
    Tensor i = zeros({2, 4}, opts(DType::I64)), empty04 = zeros({0, 4}), scalar = full({}, 1.0);
    Tensor odd = zeros({2, 5}), zero_width = zeros({3, 0});
    int64_t before = cpu_allocated();
    check_throws<Error>([&] { (void)swiglu(Tensor()); }, {"swiglu", "undefined"}, KindMatch::Exactly);
    check_throws<DTypeError>([&] { (void)swiglu(i); }, {"swiglu", "i64"});
    check_throws<ShapeError>([&] { (void)swiglu(empty04); }, {"swiglu", "[0, 4]"});
    check_throws<ShapeError>([&] { (void)swiglu(zero_width); }, {"swiglu", "[3, 0]"});
    check_throws<ShapeError>([&] { (void)swiglu(scalar); }, {"swiglu", "scalar"});
    check_throws<ShapeError>([&] { (void)swiglu(odd); }, {"swiglu", "[..., 2H]", "[2, 5]"});
    check_throws<ShapeError>([&] { (void)swiglu(odd, true); }, {"swiglu"});
    CHECK(cpu_allocated() == before);
}

TEST_CASE("swiglu: CUDA matches the cpu (f64, f32, bf16): vectors, one element a thread, misaligned rows") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(215);
    auto same = [](const Tensor& t) { return t; };
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        check_cuda_matches_cpu(kSwiglu, input({4, 33, 2 * 64}, dt, 2.0), same);  // vectors (f32, bf16)
        check_cuda_matches_cpu(kSwiglu, input({7, 2 * 13}, dt, 2.0), same);      // H not a multiple of a vector
        check_cuda_matches_cpu(kSwiglu, input({2 * 4}, dt, 2.0), same);           // one row
        // H a multiple of the vector, but h starts one element into its storage: not 16-byte aligned.
        check_cuda_matches_cpu(kSwiglu, input({1 + 9 * 2 * 16}, dt, 2.0),
                               [](const Tensor& t) { return t.narrow(0, 1, 9 * 2 * 16).view({9, 2 * 16}); });
        // a strided h
        check_cuda_matches_cpu(kSwiglu, input({2 * 8, 5}, dt, 2.0), [](const Tensor& t) { return t.transpose(0, 1); });
    }
    check_recompute_output(kSwiglu, "swiglu", Device::CUDA, 2 * 16, 16);
}

}  // TEST_SUITE
