// tests/test_linear_cross_entropy.cpp: linear_cross_entropy (ops/linear_cross_entropy.h). (a) The
// loss against a plain f64 computation written here, with softcap, label smoothing and ignored
// rows; (b) f64 finite-difference gradcheck of x and weight over several chunks; (c) the op
// against linear + cross_entropy, in f32 and bf16, with the saved bytes less exactly the logits;
// (d) the true class at p > 0.999 with V = 128k keeps its gradient; (e) dweight's sum over chunks
// is f32 (a bf16 sum of the same chunks would be off by half); (f) every error path; (g) CUDA
// against the cpu.
#include <cmath>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// The loss by hand in f64 from x [M, C], weight [V, C] (row-major), as the header's formula.
double naive_loss(const std::vector<double>& x, const std::vector<double>& w, const std::vector<int64_t>& targets,
                  int64_t C, int64_t V, const LinearCrossEntropyOptions& o) {
    const int64_t M = static_cast<int64_t>(targets.size());
    double total = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < M; ++i) {
        if (targets[i] == o.ignore_index) continue;
        ++counted;
        std::vector<double> z(V);
        for (int64_t v = 0; v < V; ++v) {
            double dot = 0.0;
            for (int64_t k = 0; k < C; ++k) dot += x[i * C + k] * w[v * C + k];
            z[v] = o.softcap > 0 ? o.softcap * std::tanh(dot / o.softcap) : dot;
        }
        double m = z[0], sum = 0.0, zsum = 0.0;
        for (double zv : z) m = std::max(m, zv);
        for (double zv : z) {
            sum += std::exp(zv - m);
            zsum += zv;
        }
        const double lse = m + std::log(sum);
        total += (1 - o.label_smoothing) * (lse - z[targets[i]]) + o.label_smoothing * (lse - zsum / double(V));
    }
    return total / double(counted);
}

struct Grads {
    Tensor loss, dx, dweight;
};
// The loss and the gradients of x and weight, from fresh leaves with x's and weight's values.
Grads run(const Tensor& x0, const Tensor& w0, const Tensor& targets, const LinearCrossEntropyOptions& o,
          bool fused = true) {
    Tensor x = x0.clone(), w = w0.clone();
    x.requires_grad_(true);
    w.requires_grad_(true);
    Tensor loss = fused ? linear_cross_entropy(x, w, targets, o) : cross_entropy(linear(x, w), targets, o.softcap);
    loss.backward();
    return {loss.detach(), x.grad(), w.grad()};
}

// The same targets for every test: row i takes (7 i + 3) mod V, and the rows in `ignored` the ignore index.
Tensor targets_for(int64_t M, int64_t V, std::vector<int64_t> ignored = {}, int64_t ignore_index = -100) {
    std::vector<int64_t> t(M);
    for (int64_t i = 0; i < M; ++i) t[i] = (7 * i + 3) % V;
    for (int64_t i : ignored) t[i] = ignore_index;
    return ids(t, {M});
}

double max_abs(const Tensor& t) {
    double m = 0;
    for (double v : as_f64(t)) m = std::max(m, std::abs(v));
    return m;
}

}  // namespace

TEST_SUITE("linear_cross_entropy") {

TEST_CASE("linear_cross_entropy: the loss is the plain f64 formula, with softcap, label smoothing and ignored rows") {
    manual_seed(1);
    const int64_t M = 9, C = 5, V = 11;
    Tensor x = input({M, C}, DType::F64), w = input({V, C}, DType::F64, 0.7);
    for (double softcap : {0.0, 2.0})
        for (double smoothing : {0.0, 0.1, 1.0})
            for (int64_t chunk : {0, 1, 4, 9, 20}) {
                LinearCrossEntropyOptions o;
                o.softcap = softcap;
                o.label_smoothing = smoothing;
                o.chunk_rows = chunk;
                Tensor t = targets_for(M, V, {2, 5});
                INFO("softcap ", softcap, " smoothing ", smoothing, " chunk_rows ", chunk);
                const double expect = naive_loss(as_f64(x), as_f64(w), t.to_vector<int64_t>(), C, V, o);
                CHECK(linear_cross_entropy(x, w, t, o).item<double>() == doctest::Approx(expect).epsilon(1e-13));
            }
    // Every row ignored: a mean over no rows, NaN as PyTorch's; nothing flows back.
    Tensor all_ignored = targets_for(M, V, {0, 1, 2, 3, 4, 5, 6, 7, 8});
    Grads g = run(x, w, all_ignored, {});
    CHECK(std::isnan(g.loss.item<double>()));
    CHECK(max_abs(g.dx) == 0.0);
    CHECK(max_abs(g.dweight) == 0.0);
}

TEST_CASE("linear_cross_entropy: gradcheck of x and weight in f64 over several chunks") {
    manual_seed(2);
    const int64_t C = 4, V = 7;
    for (double softcap : {0.0, 1.5})
        for (double smoothing : {0.0, 0.2}) {
            LinearCrossEntropyOptions o;
            o.softcap = softcap;
            o.label_smoothing = smoothing;
            o.chunk_rows = 2;
            o.ignore_index = 5;  // an index inside [0, V): rows with target 5 are ignored
            Tensor t = ids({0, 5, 3, 6, 1}, {5});
            INFO("softcap ", softcap, " smoothing ", smoothing);
            auto f = [&](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], t, o); };
            CHECK_GRADCHECK(f, (std::vector<Tensor>{leaf({5, C}), leaf({V, C}, 0.8)}));
        }
    // A batch of rows [B, T, C] with targets [B, T].
    Tensor t = ids({1, 2, 3, 4, 0, 6}, {2, 3});
    auto f = [&](const std::vector<Tensor>& in) { return linear_cross_entropy(in[0], in[1], t, {}); };
    CHECK_GRADCHECK(f, (std::vector<Tensor>{leaf({2, 3, C}), leaf({V, C})}));
}

TEST_CASE("linear_cross_entropy: equal to linear + cross_entropy in f32 and bf16, saving the logits' bytes less") {
    manual_seed(3);
    const int64_t M = 48, C = 32, V = 200;
    for (DType dtype : {DType::F32, DType::BF16})
        for (double softcap : {0.0, 15.0}) {
            INFO(dtype_name(dtype), " softcap ", softcap);
            Tensor x = input({M, C}, dtype), w = input({V, C}, dtype, 0.3), t = targets_for(M, V);
            LinearCrossEntropyOptions o;
            o.softcap = softcap;
            o.chunk_rows = 7;  // chunks that do not divide M
            Grads fused = run(x, w, t, o), plain = run(x, w, t, o, false);
            // f32: summation order only. bf16: both make the same bf16 logits and the same bf16
            // dlogits; dweight differs by the f32 order of its sum before one rounding to bf16, so
            // by at most one bf16 rounding (relative 2^-8) of the larger: 2^-7 with margin.
            const Tolerance tol = dtype == DType::BF16 ? Tolerance{1.0 / 128, 1e-6} : Tolerance{1e-5, 1e-7};
            CHECK_CLOSE(fused.loss, plain.loss, tol);
            CHECK_CLOSE(fused.dx, plain.dx, tol);
            CHECK_CLOSE(fused.dweight, plain.dweight, tol);

            // Saved: x, lse and targets (weight too: here a leaf, not a parameter); the unfused pair
            // saves the same plus the logits [M, V].
            Tensor xs = x.clone(), ws = w.clone();
            xs.requires_grad_(true);
            ws.requires_grad_(true);
            Tensor l1 = linear_cross_entropy(xs, ws, t, o);
            const int64_t fused_saved = saved_bytes();
            l1 = Tensor();
            Tensor l2 = cross_entropy(linear(xs, ws), t, softcap);
            CHECK(saved_bytes() - fused_saved == M * V * static_cast<int64_t>(element_size(dtype)));
        }
}

TEST_CASE("linear_cross_entropy: the true class at p > 0.999 with V = 128k keeps its gradient, in bf16") {
    manual_seed(4);
    const int64_t M = 4, C = 8, V = 131072;
    Tensor x = input({M, C}, DType::BF16), w = input({V, C}, DType::BF16, 0.01), t = targets_for(M, V);
    // Each row's target weight row is 19.5 x[i] / |x[i]|^2: its logit is 19.5, the others about 0,
    // so p(target) = e^19.5 / (e^19.5 + V) = 0.99955: 1 - p = 4.5e-4, which the f32 lse (ulp 2e-6
    // at 19.5) resolves to 0.5%. (At 1 - p near 1e-6 no f32 lse can: PyTorch's neither.)
    const std::vector<double> xv = as_f64(x);
    std::vector<double> wv = as_f64(w);
    const std::vector<int64_t> tv = t.to_vector<int64_t>();
    for (int64_t i = 0; i < M; ++i) {
        double n2 = 0;
        for (int64_t k = 0; k < C; ++k) n2 += xv[i * C + k] * xv[i * C + k];
        for (int64_t k = 0; k < C; ++k) wv[tv[i] * C + k] = 19.5 * xv[i * C + k] / n2;
    }
    w = from_vector<double>(wv, {V, C}).to(DType::BF16);
    Grads fused = run(x, w, t, {}), plain = run(x, w, t, {}, false);
    // The reference: the gradient formed in f64 from the same bf16 logits (rounding the logits
    // themselves moves 1 - p by up to 3% at a logit of 19.5, for both paths alike), then the products in f64.
    Tensor logits = linear(x, w).to(DType::F64);
    logits.requires_grad_(true);
    Tensor ce = cross_entropy(logits, t);
    ce.backward();
    const double p = std::exp(-ce.item<double>());  // every row's p is about the same
    INFO("p(target) about ", p);
    CHECK(p > 0.999);
    Tensor dx_ref = matmul(logits.grad(), w.to(DType::F64));
    Tensor dweight_ref = matmul(logits.grad().transpose(0, 1).contiguous(), x.to(DType::F64));
    // The target rows of dweight hold (p - 1) x[i] / M, about 1e-4 of x: within bf16 rounding of the
    // reference and of the unfused pair (a p rounded to 1 in bf16 would make them 0).
    for (int64_t i = 0; i < M; ++i) {
        INFO("row ", i, " target ", tv[i]);
        Tensor got = fused.dweight.narrow(0, tv[i], 1);
        CHECK(max_abs(got) > 0);
        CHECK_CLOSE(got, dweight_ref.narrow(0, tv[i], 1), (Tolerance{1.0 / 64, 0.0}));
        CHECK_CLOSE(got, plain.dweight.narrow(0, tv[i], 1), (Tolerance{1.0 / 128, 0.0}));
    }
    CHECK_NORMWISE(fused.dx, dx_ref, 1.0 / 64);
    CHECK_NORMWISE(fused.dx, plain.dx, 1.0 / 128);
}

TEST_CASE("linear_cross_entropy: dweight sums its chunks in f32, where a bf16 sum would lose half of it") {
    // x all ones, weight zero: every logit is 0, p = 1/V, and each of the M one-row chunks adds
    // dz[i, v] x[i] = (1/V - [v == 0]) / M to dweight[v, :], M = 512 contributions of 2^-11
    // (v > 0): exactly 1/V = 0.25 in f32, while a bf16 running sum stops at 256 of them (2^-3):
    // the next 2^-11 is half an ulp of 2^-3 and rounds away, to even.
    const int64_t M = 512, C = 4, V = 4;
    Tensor x = ones({M, C}, opts(DType::BF16)), w = zeros({V, C}, opts(DType::BF16));
    Tensor t = zeros({M}, TensorOptions().dtype(DType::I64));
    LinearCrossEntropyOptions o;
    o.chunk_rows = 1;
    Grads g = run(x, w, t, o);
    std::vector<double> dw = as_f64(g.dweight);
    for (int64_t v = 0; v < V; ++v)
        for (int64_t k = 0; k < C; ++k) CHECK(dw[v * C + k] == (v == 0 ? -0.75 : 0.25));
    // What the bf16 running sum of the same contributions gives: the test above can fail.
    bf16 running = 0.0f;
    for (int64_t i = 0; i < M; ++i) running = bf16(float(running) + 1.0f / 2048);
    CHECK(float(running) == 0.125f);
}

TEST_CASE("linear_cross_entropy: bad inputs throw naming the op, the expectation and what was found") {
    Tensor x = zeros({3, 4}, opts(DType::F32)), w = zeros({5, 4}, opts(DType::F32)), t = ids({0, 1, 2}, {3});
    const int64_t before = cpu_allocated();
    auto with = [](auto set) {
        LinearCrossEntropyOptions o;
        set(o);
        return o;
    };
    check_throws<Error>([&] { linear_cross_entropy(Tensor(), w, t); }, {"linear_cross_entropy", "undefined"});
    check_throws<Error>([&] { linear_cross_entropy(x, w, t, with([](auto& o) { o.softcap = -1; })); },
                        {"linear_cross_entropy", "softcap", "-1"});
    check_throws<Error>([&] { linear_cross_entropy(x, w, t, with([](auto& o) { o.softcap = NAN; })); },
                        {"linear_cross_entropy", "softcap"});
    check_throws<Error>([&] { linear_cross_entropy(x, w, t, with([](auto& o) { o.label_smoothing = 1.5; })); },
                        {"linear_cross_entropy", "label_smoothing", "1.5"});
    check_throws<Error>([&] { linear_cross_entropy(x, w, t, with([](auto& o) { o.chunk_rows = -2; })); },
                        {"linear_cross_entropy", "chunk_rows", "-2"});
    check_throws<Error>([&] { linear_cross_entropy(x, w, ids({0, 5, 1}, {3})); },
                        {"linear_cross_entropy", "[0, 5)", "got 5", "position 1"});
    check_throws<Error>([&] { linear_cross_entropy(x, w, ids({0, -100, -1}, {3})); },
                        {"linear_cross_entropy", "got -1", "position 2"});
    check_throws<DTypeError>([&] { linear_cross_entropy(ids({1, 2, 3}, {3}), w, t); },
                             {"linear_cross_entropy", "x", "i64"});
    check_throws<DTypeError>([&] { linear_cross_entropy(x, w.to(DType::F64), t); },
                             {"linear_cross_entropy", "weight", "f32", "f64"});
    check_throws<DTypeError>([&] { linear_cross_entropy(x, w, t.to(DType::F32)); },
                             {"linear_cross_entropy", "targets", "i64", "f32"});
    check_throws<ShapeError>([&] { linear_cross_entropy(zeros({}, opts(DType::F32)), w, t); },
                             {"linear_cross_entropy", "scalar"});
    check_throws<ShapeError>([&] { linear_cross_entropy(x, zeros({5, 3}, opts(DType::F32)), t); },
                             {"linear_cross_entropy", "[V, 4]", "[5, 3]"});
    check_throws<ShapeError>([&] { linear_cross_entropy(x, w, ids({0, 1}, {2})); },
                             {"linear_cross_entropy", "[3]", "[2]"});
    // Empty inputs, refused as the header says: no rows, C 0, V 0.
    check_throws<ShapeError>([&] { linear_cross_entropy(zeros({0, 4}, opts(DType::F32)), w, zeros({0}, opts(DType::I64))); },
                             {"linear_cross_entropy", "non-empty x", "[0, 4]"});
    check_throws<ShapeError>([&] {
        linear_cross_entropy(zeros({3, 0}, opts(DType::F32)), zeros({5, 0}, opts(DType::F32)), t);
    }, {"linear_cross_entropy", "non-empty x", "[3, 0]"});
    check_throws<ShapeError>([&] { linear_cross_entropy(x, zeros({0, 4}, opts(DType::F32)), t); },
                             {"linear_cross_entropy", "[V, 4]", "[0, 4]"});
    CHECK(cpu_allocated() == before);
}

TEST_CASE("linear_cross_entropy: on cuda, equal to the cpu in f32 and bf16, with softcap, smoothing and ignored rows") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(5);
    for (DType dtype : {DType::F32, DType::BF16})
        for (int64_t V : {int64_t{1}, int64_t{255}, int64_t{4099}}) {
            const int64_t M = 37, C = 24;
            Tensor x = input({M, C}, dtype), w = input({V, C}, dtype, 0.5), t = targets_for(M, V, {3, 30});
            LinearCrossEntropyOptions o;
            o.softcap = V == 255 ? 15.0 : 0.0;
            o.label_smoothing = V == 4099 ? 0.1 : 0.0;
            o.chunk_rows = 10;
            INFO(dtype_name(dtype), " V ", V);
            Grads cpu = run(x, w, t, o);
            Grads gpu = run(x.to(Device::CUDA), w.to(Device::CUDA), t.to(Device::CUDA), o);
            const double tol = normwise_tolerance(dtype);
            CHECK_NORMWISE(gpu.loss, cpu.loss, tol);
            CHECK_NORMWISE(gpu.dx, cpu.dx, tol);
            CHECK_NORMWISE(gpu.dweight, cpu.dweight, tol);
        }
}

}  // TEST_SUITE
