// tests/test_cross_entropy.cpp: cross_entropy (ops/cross_entropy.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls. Then the backward that
// writes the gradient over logits nothing else holds (Note [Cross-entropy writes its gradient over
// its logits], ops/cross_entropy.cpp): the allocator's peak, the gradients, a caller's logits left
// intact, retain_graph; the logit softcap (forward by hand, gradcheck, softcap 0 bit for bit the
// op without it, the same saved bytes, bad values); and the CUDA kernels against the cpu over row
// lengths, offsets and softcaps.
#include <algorithm>
#include <cmath>
#include <functional>
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

// d/dlogits of the mean cross-entropy, (softmax(row) - onehot(target)) / M, in f64.
std::vector<double> naive_cross_entropy_grad(const std::vector<double>& logits, const std::vector<int64_t>& targets,
                                             int64_t V) {
    int64_t M = static_cast<int64_t>(targets.size());
    std::vector<double> d(logits.size());
    for (int64_t i = 0; i < M; ++i) {
        double m = logits[i * V];
        for (int64_t v = 1; v < V; ++v) m = std::max(m, logits[i * V + v]);
        double z = 0.0;
        for (int64_t v = 0; v < V; ++v) z += std::exp(logits[i * V + v] - m);
        for (int64_t v = 0; v < V; ++v)
            d[i * V + v] = (std::exp(logits[i * V + v] - m) / z - (v == targets[i] ? 1.0 : 0.0)) / double(M);
    }
    return d;
}

// The same with the logits capped first, each one on its own: z = softcap * tanh(logit / softcap).
double naive_softcap_cross_entropy(const std::vector<double>& logits, const std::vector<int64_t>& targets, int64_t V,
                                   double softcap) {
    std::vector<double> z(logits.size());
    for (size_t k = 0; k < logits.size(); ++k) z[k] = softcap * std::tanh(logits[k] / softcap);
    return naive_cross_entropy(z, targets, V);
}

// Targets i * 7 + 3 mod V for M rows, on `device`.
Tensor spread_targets(int64_t M, int64_t V, Device device = Device::CPU) {
    std::vector<int64_t> t(M);
    for (int64_t i = 0; i < M; ++i) t[i] = (i * 7 + 3) % V;
    return ids(t, {M}).to(device);
}

// One backward of cross_entropy(f(inputs), targets) on the cpu, the logits (f's output, a storage
// of their own) kept by the caller or dropped: the inputs' gradients, and the allocator's peak
// during backward above the bytes live when it began.
struct BackwardRun {
    std::vector<std::vector<double>> grads;
    int64_t peak_above = 0;
    bool logits_intact = true;  // kept: the caller's logits read the same after the backward
};
BackwardRun backward_run(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                         const Tensor& targets, bool keep_logits) {
    for (Tensor& x : inputs) x.zero_grad();
    Tensor kept, loss;
    {
        Tensor logits = f(inputs);
        loss = cross_entropy(logits, targets);
        if (keep_logits) kept = logits;
    }
    std::vector<double> kept_before = keep_logits ? as_f64(kept) : std::vector<double>();
    reset_peak_memory_stats(Device::CPU);
    const int64_t before = cpu_allocated();
    loss.backward();
    BackwardRun r;
    r.peak_above = memory_stats(Device::CPU).peak_allocated_bytes - before;
    for (Tensor& x : inputs) r.grads.push_back(as_f64(x.grad()));
    if (keep_logits) r.logits_intact = as_f64(kept) == kept_before;
    return r;
}

constexpr DType kAllFloatTypes[] = {DType::F64, DType::F32, DType::BF16};

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

    TEST_CASE("cross_entropy: backward writes dlogits over dropped logits: one [M, V] buffer less at the peak") {
        // logits = h @ W^T as in a GPT's head, C small: linear's backward allocates far less than
        // an [M, V] buffer, so the peak of the backward is where dlogits is made.
        const int64_t M = 24, V = 50, C = 3;
        Tensor targets = spread_targets(M, V);
        auto head = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
        for (DType dt : kAllFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            manual_seed(103);
            std::vector<Tensor> in{leaf({M, C}, 1.0, dt), leaf({V, C}, 1.0, dt)};
            BackwardRun kept = backward_run(head, in, targets, true), dropped = backward_run(head, in, targets, false);
            const int64_t buffer = M * V * static_cast<int64_t>(element_size(dt));
            // Kept: the logits and dlogits; dropped: dlogits in the logits' storage, whose bytes
            // were live before the backward began.
            CHECK(kept.peak_above - dropped.peak_above == buffer);
            // No second [M, V] buffer at all (not bf16: its cpu products copy dlogits to f32).
            if (dt != DType::BF16) CHECK(dropped.peak_above < buffer);
            CHECK(kept.logits_intact);
            CHECK(kept.grads == dropped.grads);
        }
    }

    TEST_CASE("cross_entropy: the gradient written over dropped logits is the one by hand, as when they are kept") {
        const int64_t M = 24, V = 50;
        Tensor targets = spread_targets(M, V);
        std::vector<int64_t> vt(M);
        for (int64_t i = 0; i < M; ++i) vt[i] = (i * 7 + 3) % V;
        // x's gradient through scale(x, 1) is dlogits itself.
        auto identity = [](const std::vector<Tensor>& in) { return scale(in[0], 1.0); };
        for (DType dt : kAllFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            manual_seed(104);
            std::vector<Tensor> in{leaf({M, V}, 2.0, dt)};
            BackwardRun kept = backward_run(identity, in, targets, true);
            BackwardRun dropped = backward_run(identity, in, targets, false);
            CHECK(kept.logits_intact);
            CHECK(kept.grads == dropped.grads);
            Tensor by_hand = expected(naive_cross_entropy_grad(as_f64(in[0]), vt, V), {M, V});
            CHECK_CLOSE(from_vector<double>(dropped.grads[0], {M, V}), by_hand, tolerance(dt));
        }
    }

    TEST_CASE("cross_entropy: a view of the logits kept by the caller is not written over") {
        const int64_t M = 6, V = 9;
        manual_seed(108);
        Tensor x = leaf({M, V}, 2.0), targets = spread_targets(M, V), view;
        Tensor loss;
        {
            Tensor logits = scale(x, 1.0);
            view = logits.view({M * V});  // the logits' storage, under another handle
            loss = cross_entropy(logits, targets);
        }
        std::vector<double> before = as_f64(view);
        loss.backward();
        CHECK(as_f64(view) == before);
    }

    TEST_CASE("cross_entropy: gradcheck through logits that the backward writes over") {
        manual_seed(105);
        Tensor targets = ids({1, 1, 3, 1, 0, 3}, {2, 3});
        // scale's output is held by nothing but cross_entropy's node: the in-place backward.
        auto f = [&](const std::vector<Tensor>& in) { return cross_entropy(scale(in[0], 1.5), targets); };
        std::vector<Tensor> in{leaf({2, 3, 4}, 2.0)};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("cross_entropy: retain_graph, then a second backward, gives the same gradient") {
        const int64_t M = 12, V = 33;
        Tensor targets = spread_targets(M, V);
        for (DType dt : kAllFloatTypes)
            for (bool keep : {false, true}) {
                INFO("dtype ", std::string(dtype_name(dt)), keep ? ", logits kept" : ", logits dropped");
                manual_seed(106);
                Tensor x = leaf({M, V}, 2.0, dt), kept, loss;
                {
                    Tensor logits = scale(x, 1.0);
                    loss = cross_entropy(logits, targets);
                    if (keep) kept = logits;
                }
                loss.backward(Tensor(), /*retain_graph=*/true);
                std::vector<double> first = as_f64(x.grad());
                x.zero_grad();
                loss.backward(Tensor(), /*retain_graph=*/true);
                CHECK(as_f64(x.grad()) == first);
                // Another output gradient: the first gradient times 3, to the dtype's rounding.
                x.zero_grad();
                Tensor three = full({}, 3.0, opts(dt));
                loss.backward(three);
                std::vector<double> tripled = first;
                for (double& g : tripled) g *= 3.0;
                CHECK_CLOSE(x.grad(), from_vector<double>(tripled, {M, V}), tolerance(dt));
                // The graph is released now.
                CHECK_THROWS_KIND_WITH(loss.backward(), normtape::Error, "retain_graph");
            }
    }

    TEST_CASE("cross_entropy: softcap forward matches tanh then logsumexp by hand") {
        manual_seed(109);
        const int64_t V = 7;
        std::vector<int64_t> vt{6, 0, 2, 2, 1, 5};
        Tensor targets = ids(vt, {2, 3});
        for (DType dt : kFloatTypes)
            for (double softcap : {15.0, 2.0, 0.5}) {
                INFO("dtype ", std::string(dtype_name(dt)), ", softcap ", softcap);
                // Logits of about +-20: a cap of 2 or 0.5 bends nearly all of them, 15 the large ones.
                Tensor logits = input({2, 3, V}, dt, 20.0);
                Tensor loss = cross_entropy(logits, targets, softcap);
                CHECK(loss.dim() == 0);
                CHECK(loss.dtype() == dt);
                double by_hand = naive_softcap_cross_entropy(as_f64(logits), vt, V, softcap);
                CHECK_CLOSE(loss, expected({by_hand}, {1}).view({}), tolerance(dt));
                // The cap changes the loss (it is not the uncapped op under another name).
                CHECK(std::abs(by_hand - naive_cross_entropy(as_f64(logits), vt, V)) > 1e-3);
            }
        // Logits of +-inf are capped to +-softcap: a finite loss.
        std::vector<double> vl{INFINITY, 0.0, -INFINITY};
        Tensor inf_row = from_vector<double>(vl, {1, 3});
        for (int64_t t : {0, 1, 2}) {
            CAPTURE(t);
            std::vector<double> z{15.0, 0.0, -15.0};
            CHECK(cross_entropy(inf_row, ids({t}, {1}), 15.0).item<double>() ==
                  doctest::Approx(naive_cross_entropy(z, {t}, 3)).epsilon(1e-12));
        }
    }

    TEST_CASE("cross_entropy: gradcheck with a softcap, kept and written-over logits") {
        Tensor targets = ids({1, 1, 3, 1, 0, 3}, {2, 3});
        for (double softcap : {15.0, 1.5}) {
            CAPTURE(softcap);
            manual_seed(110);
            // Logits of about +-6: tanh(logits / 1.5) far from linear, near its saturation.
            auto kept = [&](const std::vector<Tensor>& in) { return cross_entropy(in[0], targets, softcap); };
            std::vector<Tensor> in{leaf({2, 3, 4}, 6.0)};
            CHECK_GRADCHECK(kept, in);
            // scale's output is held by nothing but the node: the backward writes over it.
            auto over = [&](const std::vector<Tensor>& x) { return cross_entropy(scale(x[0], 1.5), targets, softcap); };
            CHECK_GRADCHECK(over, in);
        }
    }

    TEST_CASE("cross_entropy: with a softcap, the gradient written over dropped logits is the one kept logits get") {
        const int64_t M = 24, V = 50;
        Tensor targets = spread_targets(M, V);
        for (DType dt : kAllFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            manual_seed(111);
            std::vector<Tensor> in{leaf({M, V}, 10.0, dt)};
            auto capped = [&](bool keep) {
                in[0].zero_grad();
                Tensor kept, loss;
                {
                    Tensor logits = scale(in[0], 1.0);
                    loss = cross_entropy(logits, targets, 15.0);
                    if (keep) kept = logits;
                }
                std::vector<double> before = keep ? as_f64(kept) : std::vector<double>();
                loss.backward();
                if (keep) CHECK(as_f64(kept) == before);
                return as_f64(in[0].grad());
            };
            CHECK(capped(true) == capped(false));
        }
    }

    TEST_CASE("cross_entropy: softcap 0 is the op without a cap, bit for bit, forward and backward") {
        const int64_t M = 12, V = 33;
        Tensor targets = spread_targets(M, V);
        for (DType dt : kAllFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            manual_seed(112);
            Tensor x = leaf({M, V}, 3.0, dt);
            std::vector<double> losses[2], grads[2];
            for (int k = 0; k < 2; ++k) {
                x.zero_grad();
                Tensor logits = scale(x, 1.0);
                Tensor loss = k == 0 ? cross_entropy(logits, targets) : cross_entropy(logits, targets, 0.0);
                loss.backward();
                losses[k] = as_f64(loss);
                grads[k] = as_f64(x.grad());
            }
            CHECK(losses[0] == losses[1]);
            CHECK(grads[0] == grads[1]);
        }
    }

    TEST_CASE("cross_entropy: a softcap saves the same bytes as no cap: the logits and lse") {
        const int64_t M = 10, V = 17;
        Tensor targets = spread_targets(M, V);
        for (DType dt : kAllFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor x = leaf({M, V}, 2.0, dt);
            int64_t held[2];
            const double softcaps[2] = {0.0, 15.0};
            for (int k = 0; k < 2; ++k) {
                const int64_t before = saved_bytes();
                Tensor loss = cross_entropy(scale(x, 1.0), targets, softcaps[k]);
                held[k] = saved_bytes() - before;
                loss.backward();
                CHECK(saved_bytes() == before);
            }
            CHECK(held[1] == held[0]);
            // The logits [M, V], lse [M] of the statistics' dtype and the targets [M] i64.
            const int64_t stat = dt == DType::F64 ? 8 : 4;
            CHECK(held[1] == M * V * static_cast<int64_t>(element_size(dt)) + M * stat + M * 8);
        }
    }

    TEST_CASE("cross_entropy: a negative, NaN or infinite softcap is refused, naming the value") {
        Tensor logits = zeros({2, 5}), t = ids({0, 4}, {2});
        int64_t before = cpu_allocated();
        const char* op = "cross_entropy";
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t, -1.0), normtape::Error, op, "softcap >= 0", "got -1");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t, -0.25), normtape::Error, op, "softcap", "-0.25");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t, std::nan("")), normtape::Error, op, "softcap", "nan");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t, INFINITY), normtape::Error, op, "finite", "got inf");
        CHECK_THROWS_KIND_WITH(cross_entropy(logits, t, -INFINITY), normtape::Error, op, "finite", "got -inf");
        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("cross_entropy: cuda kernels match the cpu over row lengths, offsets, dtypes, in place or not") {
        REQUIRE_CUDA_OR_SKIP();
        manual_seed(107);
        // V: below a vector, odd, a warp's rows (up to 256 vectors), just past them (2056 bf16
        // and f32: a block per row), odd and long, the GPT vocabulary. Offsets 0 and 1 element:
        // rows off 16-byte boundaries, in place (same offset) or not (dlogits at offset 0).
        // Softcap 0 (the kernels without a cap) and 2 (logits of about +-3: tanh far from linear).
        const int64_t sizes[][2] = {{7, 5}, {33, 37}, {16, 256}, {9, 1000}, {5, 2048}, {5, 2056}, {3, 4099}, {2, 32768}};
        for (DType dt : kAllFloatTypes)
            for (const auto& mv : sizes)
                for (int64_t offset : {0, 1})
                    for (bool keep : {false, true})
                        for (double softcap : {0.0, 2.0}) {
                            const int64_t M = mv[0], V = mv[1];
                            CAPTURE(M);
                            CAPTURE(V);
                            CAPTURE(offset);
                            CAPTURE(keep);
                            CAPTURE(softcap);
                            INFO("dtype ", std::string(dtype_name(dt)));
                            Tensor values = input({M * V + 1}, DType::F64, 3.0).to(dt);
                            Tensor losses[2], grads[2];
                            for (int d = 0; d < 2; ++d) {
                                Device device = d == 0 ? Device::CPU : Device::CUDA;
                                Tensor x = values.to(device), kept;
                                x.requires_grad_(true);
                                {
                                    // A storage of its own (scale's output), seen from `offset` on.
                                    Tensor logits = scale(x, 1.0).narrow(0, offset, M * V).view({M, V});
                                    losses[d] = cross_entropy(logits, spread_targets(M, V, device), softcap);
                                    if (keep) kept = logits;
                                }
                                losses[d].backward();
                                grads[d] = x.grad();
                            }
                            CHECK_NORMWISE(losses[1], losses[0], normwise_tolerance(dt));
                            CHECK_NORMWISE(grads[1], grads[0], normwise_tolerance(dt));
                        }
    }
}
