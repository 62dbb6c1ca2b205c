// tests/test_rotary.cpp: rotary_embedding (ops/rotary.h). (a) forward against a plain double loop
// written here (f64), and against transformers' f32 recipe (f32 to the bit on the cpu, bf16 to
// its tolerance); (b) f64 finite-difference gradcheck, contiguous and strided input; (c) the
// position offset: rotary(x[:, t0:], t0) has the bits of rotary(x)[:, t0:]; (d) each pair keeps its
// norm; (e) nothing saved for backward; (f) the same bits at 1 and 3 threads; (g) every error path,
// each naming the op, no bytes leaked; (h) CUDA against the cpu (f64, f32, bf16), skipped without
// a GPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/device_ptr.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// The raw bytes of a tensor (copied to the cpu), to compare bit for bit.
std::string bytes_of(const Tensor& t) {
    Tensor c = t.to(Device::CPU).contiguous();
    return std::string(detail::byte_ptr(c), static_cast<size_t>(c.nbytes()));
}

// rotary_embedding by hand in double: x [B, T, H, hs] row-major values.
std::vector<double> rotary_by_hand(const std::vector<double>& x, const Shape& s, int64_t offset, double theta) {
    const int64_t B = s[0], T = s[1], H = s[2], hs = s[3], half = hs / 2;
    std::vector<double> out(x.size());
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h)
                for (int64_t d = 0; d < half; ++d) {
                    const double inv_freq = 1.0 / std::pow(theta, 2.0 * double(d) / double(hs));
                    const double angle = double(offset + t) * inv_freq;
                    const int64_t i = ((b * T + t) * H + h) * hs + d;
                    out[i] = x[i] * std::cos(angle) - x[i + half] * std::sin(angle);
                    out[i + half] = x[i + half] * std::cos(angle) + x[i] * std::sin(angle);
                }
    return out;
}

// transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb in f32, op by op:
//   inv_freq = 1.0 / (theta ** (arange(0, hs, 2).float() / hs))   (the power correctly rounded,
//   here from long double), freqs = position.float() * inv_freq, cos = freqs.cos(), sin = freqs.sin(),
//   q_embed = (q * cos) + (rotate_half(q) * sin), every product and sum rounded to f32 (volatile:
//   no multiply-add). Returns float values of x's shape; x given as floats.
std::vector<float> rotary_as_transformers(const std::vector<float>& x, const Shape& s, int64_t offset, double theta) {
    const int64_t B = s[0], T = s[1], H = s[2], hs = s[3], half = hs / 2;
    std::vector<float> out(x.size());
    for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < half; ++d) {
            const float exponent = float(2 * d) / float(hs);
            const long double base = float(theta);
            const float power = static_cast<float>(std::pow(base, static_cast<long double>(exponent)));
            const float inv_freq = 1.0f / power;
            const float freq = float(offset + t) * inv_freq;
            const float c = std::cos(freq), sn = std::sin(freq);
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < H; ++h) {
                    const int64_t i = ((b * T + t) * H + h) * hs + d;
                    volatile float a1 = x[i] * c, b1 = -x[i + half] * sn;  // rotate_half: [-x2, x1]
                    volatile float a2 = x[i + half] * c, b2 = x[i] * sn;
                    out[i] = a1 + b1;
                    out[i + half] = a2 + b2;
                }
        }
    return out;
}

}  // namespace

TEST_SUITE("rotary_embedding") {

TEST_CASE("rotary_embedding: forward matches a plain double loop (f64), offsets and thetas") {
    manual_seed(101);
    const Shape s{2, 5, 3, 8};
    Tensor x = input(s, DType::F64);
    std::vector<double> vx = as_f64(x);
    for (int64_t offset : {int64_t(0), int64_t(7), int64_t(4000)})
        for (double theta : {10000.0, 500000.0, 2.5}) {
            CAPTURE(offset);
            CAPTURE(theta);
            Tensor y = rotary_embedding(x, offset, theta);
            CHECK(y.dtype() == DType::F64);
            CHECK(y.shape() == s);
            CHECK(y.is_contiguous());
            CHECK_CLOSE(y, expected(rotary_by_hand(vx, s, offset, theta), s), tolerance(DType::F64));
        }
    // The defaults are offset 0 and theta 10000.
    CHECK(bytes_of(rotary_embedding(x)) == bytes_of(rotary_embedding(x, 0, 10000.0)));
}

TEST_CASE("rotary_embedding: f32 follows transformers' f32 recipe to the bit, and bf16 to its tolerance") {
    manual_seed(102);
    const Shape s{2, 6, 2, 16};
    for (int64_t offset : {int64_t(0), int64_t(3), int64_t(2047)})
        for (double theta : {10000.0, 500000.0}) {
            CAPTURE(offset);
            CAPTURE(theta);
            Tensor x = input(s, DType::F32);
            std::vector<float> want = rotary_as_transformers(x.to_vector<float>(), s, offset, theta);
            Tensor y = rotary_embedding(x, offset, theta);
            CHECK(y.dtype() == DType::F32);
            CHECK(bytes_of(y) == bytes_of(from_vector<float>(want, s)));

            Tensor xb = x.to(DType::BF16);  // bf16: exact in f32, rounded once at the end
            std::vector<float> vb = xb.to(DType::F32).to_vector<float>();
            std::vector<float> wb = rotary_as_transformers(vb, s, offset, theta);
            Tensor yb = rotary_embedding(xb, offset, theta);
            CHECK(yb.dtype() == DType::BF16);
            CHECK_CLOSE(yb, from_vector<float>(wb, s), tolerance(DType::BF16));
            // and each element is the f32 result rounded once to bf16
            CHECK(bytes_of(yb) == bytes_of(from_vector<float>(wb, s).to(DType::BF16)));
        }
}

TEST_CASE("rotary_embedding: position 0 leaves a row as it is") {
    manual_seed(103);
    Tensor x = input({2, 1, 3, 8}, DType::F32);
    CHECK(bytes_of(rotary_embedding(x, 0)) == bytes_of(x));
}

TEST_CASE("rotary_embedding: rotary(x[:, t0:], t0) has the bits of rotary(x)[:, t0:]") {
    manual_seed(104);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dt));
        const int64_t T = 9;
        Tensor x = input({2, T, 3, 8}, dt);
        for (int64_t base : {int64_t(0), int64_t(100)}) {
            Tensor full = rotary_embedding(x, base);
            for (int64_t t0 : {1, 4, 8}) {
                CAPTURE(base);
                CAPTURE(t0);
                Tensor part = rotary_embedding(x.narrow(1, t0, T - t0), base + t0);  // x.narrow: strided
                CHECK(bytes_of(part) == bytes_of(full.narrow(1, t0, T - t0)));
            }
        }
    }
}

TEST_CASE("rotary_embedding: every pair keeps its norm") {
    manual_seed(105);
    const Shape s{2, 7, 2, 10};
    for (DType dt : {DType::F64, DType::F32}) {
        CAPTURE(dtype_name(dt));
        Tensor x = input(s, dt);
        for (int64_t offset : {int64_t(0), int64_t(12345)}) {
            std::vector<double> vx = as_f64(x), vy = as_f64(rotary_embedding(x, offset));
            const double rtol = dt == DType::F64 ? 1e-14 : 1e-6;
            const int64_t hs = s[3], half = hs / 2;
            double worst = 0;
            for (size_t r = 0; r < vx.size(); r += hs)
                for (int64_t d = 0; d < half; ++d) {
                    const double before = std::hypot(vx[r + d], vx[r + d + half]);
                    const double after = std::hypot(vy[r + d], vy[r + d + half]);
                    worst = std::max(worst, std::abs(after - before) / before);
                }
            CAPTURE(offset);
            CHECK(worst <= rtol);
        }
    }
}

TEST_CASE("rotary_embedding: gradcheck, contiguous and strided x, offsets") {
    manual_seed(106);
    SUBCASE("contiguous, offset 0, theta 10000") {
        auto f = [](const std::vector<Tensor>& in) { return rotary_embedding(in[0]); };
        std::vector<Tensor> in{leaf({2, 3, 2, 6})};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("contiguous, offset 5, theta 100") {
        auto f = [](const std::vector<Tensor>& in) { return rotary_embedding(in[0], 5, 100.0); };
        std::vector<Tensor> in{leaf({1, 4, 3, 4})};
        CHECK_GRADCHECK(f, in);
    }
    SUBCASE("strided x (heads and positions transposed), offset 11") {
        auto f = [](const std::vector<Tensor>& in) { return rotary_embedding(in[0].transpose(1, 2), 11, 50.0); };
        std::vector<Tensor> in{leaf({2, 3, 4, 6})};  // [B, H, T, hs] -> [B, T, H, hs]
        CHECK_GRADCHECK(f, in);
    }
}

TEST_CASE("rotary_embedding: the backward is the inverse rotation: rotary(x) then its gradient gives x back") {
    manual_seed(107);
    Tensor x = leaf({2, 5, 3, 8});
    Tensor y = rotary_embedding(x, 9);
    // L = sum(y * y'), y' = rotary(u): dL/dx = R^T R u = u, R orthogonal.
    Tensor u = input({2, 5, 3, 8}, DType::F64);
    y.backward(rotary_embedding(u, 9));
    CHECK_CLOSE(x.grad(), u, tolerance(DType::F64));
}

TEST_CASE("rotary_embedding: saves nothing for backward") {
    manual_seed(108);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dt));
        Tensor w = leaf({2, 5, 3, 8}, 1.0, dt);
        Tensor x = scale(w, 2.0);  // not a leaf: its storage would be counted if it were saved
        const int64_t before = saved_bytes();
        Tensor y = rotary_embedding(x, 3);
        REQUIRE(y.grad_fn() != nullptr);
        CHECK(std::string(y.grad_fn()->name()) == "RotaryEmbeddingBackward");
        CHECK(y.grad_fn()->saved_tensors().empty());
        CHECK(saved_bytes() == before);
        // The measure sees a saved tensor where there is one: mul saves y.
        Tensor z = mul(y, y);
        CHECK(saved_bytes() == before + y.nbytes());
        sum(z).backward();
        CHECK(w.grad().defined());
        CHECK(saved_bytes() == 0);
    }
}

TEST_CASE("rotary_embedding: the same bits at 1 and 3 threads, forward and backward") {
    ThreadCountGuard guard;
    auto run = [] {
        manual_seed(109);
        Tensor x = leaf({3, 40, 4, 64}, 1.0, DType::F32);  // several chunks of rows
        Tensor y = rotary_embedding(x, 17);
        y.backward(randn(y.shape()));
        return bytes_of(y) + bytes_of(x.grad());
    };
    set_num_threads(1);
    const std::string one = run();
    set_num_threads(3);
    CHECK(run() == one);
}

TEST_CASE("rotary_embedding: bad input") {
    Tensor x = zeros({1, 2, 3, 4});
    Tensor three_d = zeros({2, 3, 4}), five_d = zeros({1, 2, 3, 4, 2}), odd = zeros({1, 2, 3, 5});
    Tensor empty = zeros({1, 0, 3, 4}), i = zeros({1, 2, 3, 4}, opts(DType::I64));
    const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
    int64_t before = cpu_allocated();

    check_throws<Error>([&] { (void)rotary_embedding(Tensor()); }, {"rotary_embedding", "undefined"},
                        KindMatch::Exactly);
    check_throws<Error>([&] { (void)rotary_embedding(x, -1); }, {"rotary_embedding", "position_offset", "-1"},
                        KindMatch::Exactly);
    check_throws<Error>([&] { (void)rotary_embedding(x, std::numeric_limits<int64_t>::max()); },
                        {"rotary_embedding", "position_offset"}, KindMatch::Exactly);
    for (double theta : {0.0, -2.0, inf, -inf, nan}) {
        CAPTURE(theta);
        check_throws<Error>([&] { (void)rotary_embedding(x, 0, theta); }, {"rotary_embedding", "theta"},
                            KindMatch::Exactly);
    }
    check_throws<ShapeError>([&] { (void)rotary_embedding(three_d); },
                             {"rotary_embedding", "[B, T, H, hs]", "[2, 3, 4]"});
    check_throws<ShapeError>([&] { (void)rotary_embedding(five_d); }, {"rotary_embedding", "[1, 2, 3, 4, 2]"});
    check_throws<ShapeError>([&] { (void)rotary_embedding(empty); }, {"rotary_embedding", "[1, 0, 3, 4]"});
    check_throws<ShapeError>([&] { (void)rotary_embedding(odd); }, {"rotary_embedding", "even", "5"});
    check_throws<DTypeError>([&] { (void)rotary_embedding(i); }, {"rotary_embedding", "i64"});

    CHECK(cpu_allocated() == before);
}

TEST_CASE("rotary_embedding: CUDA matches the cpu, forward and backward (f64, f32, bf16), at large positions") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(110);
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
        for (int64_t offset : {int64_t(0), int64_t(4093)}) {
            for (Shape s : {Shape{2, 7, 3, 64}, Shape{1, 5, 2, 6}, Shape{3, 33, 4, 128}}) {
                CAPTURE(dtype_name(dt));
                CAPTURE(offset);
                CAPTURE(shape_str(s));
                Tensor base = randn(s).to(dt);
                Tensor xc = base.clone().requires_grad_(true), xg = base.to(Device::CUDA).requires_grad_(true);
                Tensor yc = rotary_embedding(xc, offset, 500000.0), yg = rotary_embedding(xg, offset, 500000.0);
                REQUIRE(yg.device() == Device::CUDA);
                CHECK_NORMWISE(yg, yc, normwise_tolerance(dt));
                Tensor u = randn(s).to(dt);
                yc.backward(u);
                yg.backward(u.to(Device::CUDA));
                CHECK_NORMWISE(xg.grad(), xc.grad(), normwise_tolerance(dt));
            }
        }
        // A strided CUDA input (heads and positions transposed) as the cpu's.
        Tensor base = randn({2, 4, 5, 16}).to(dt);
        CHECK_NORMWISE(rotary_embedding(base.to(Device::CUDA).transpose(1, 2), 7),
                       rotary_embedding(base.transpose(1, 2), 7), normwise_tolerance(dt));
    }
}

}  // TEST_SUITE
