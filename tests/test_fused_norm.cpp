// tests/test_fused_norm.cpp: layer_norm_fn and rms_norm_fn (Note [The fused norm],
// ops/norm/fused_norm.h): the norm of s = dropout(x) + dropout(x1) + residual, and s itself with
// prenorm, a second affine output y1 with weight1, and zero-centered weights, against the unfused
// dropout, add and norm, f64 finite differences under each policy, what each policy saves, the
// gradient that reaches s alone, argument errors, an f32 stream for a bf16 x (an f32 residual,
// residual_in_fp32) and out_dtype against their composition with the cast op, rowscale against a
// multiply by its rows, CUDA against the cpu,
// and the fused CUDA kernels against the unfused add and norm, bit for bit.
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

constexpr SavePolicy kPolicies[] = {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized};

// One of the two fused norms with its unfused twin; bias is ignored by the RMS pair.
struct FusedNormUnderTest {
    const char* op;
    bool centered;
    FusedNormOutputs fused(const Tensor& x, const Tensor& w, const Tensor& b, const FusedNormOptions& o) const {
        return centered ? layer_norm_fn(x, w, b, o) : rms_norm_fn(x, w, o);
    }
    Tensor unfused(const Tensor& s, const Tensor& w, const Tensor& b, SavePolicy policy) const {
        return centered ? layer_norm(s, w, b, 1e-5, policy) : rms_norm(s, w, 1e-5, policy);
    }
};
const FusedNormUnderTest kNorms[] = {{"layer_norm_fn", true}, {"rms_norm_fn", false}};

FusedNormOptions options(const Tensor& residual, bool prenorm, SavePolicy policy, const Tensor& x1 = Tensor(),
                         double dropout_p = 0.0) {
    FusedNormOptions o;
    o.residual = residual;
    o.x1 = x1;
    o.dropout_p = dropout_p;
    o.prenorm = prenorm;
    o.policy = policy;
    return o;
}

// FusedNormOptions with a second affine output.
FusedNormOptions parallel(FusedNormOptions o, const Tensor& weight1, const Tensor& bias1) {
    o.weight1 = weight1;
    o.bias1 = bias1;
    return o;
}

// What a norm of M f32 rows saves beside its row tensor: rstd, and the mean too for a LayerNorm under
// Input (ops/norm/norm_policy.h).
int64_t statistics_bytes(int64_t M, SavePolicy policy, bool centered) {
    return M * 4 + (policy == SavePolicy::Input && centered ? M * 4 : 0);
}

// Weights away from zero (the Output policy divides by them): 1 + 0.2 * randn.
Tensor weight_of(int64_t N, TensorOptions o) { return add(full({N}, 1.0, o), scale(randn({N}, o), 0.2)); }

}  // namespace

TEST_SUITE("fused_norm") {

TEST_CASE("fused_norm: y and residual_out are the unfused norm of add(x, residual) and the add, bit for bit") {
    manual_seed(1);
    for (const FusedNormUnderTest& n : kNorms)
        for (DType dtype : {DType::F64, DType::F32, DType::BF16})
            for (SavePolicy policy : kPolicies) {
                CAPTURE(n.op);
                CAPTURE(dtype_name(dtype));
                CAPTURE(policy_name(policy));
                TensorOptions o = opts(dtype);
                Tensor x = randn({2, 3, 40}, o).requires_grad_(true), r = randn({2, 3, 40}, o).requires_grad_(true);
                Tensor w = weight_of(40, o).requires_grad_(true), b = scale(randn({40}, o), 0.1).requires_grad_(true);
                FusedNormOutputs out = n.fused(x, w, b, options(r, true, policy));
                Tensor s = add(x, r);
                CHECK_CLOSE(out.residual_out, s, (Tolerance{0, 0}));
                CHECK_CLOSE(out.y, n.unfused(s, w, b, policy), (Tolerance{0, 0}));
                CHECK_FALSE(n.fused(x, w, b, options(r, false, policy)).residual_out.defined());
                // Without a residual: the plain norm, and residual_out is x itself.
                FusedNormOutputs plain = n.fused(x, w, b, options(Tensor(), true, policy));
                CHECK(plain.residual_out.impl_ptr() == x.impl_ptr());
                CHECK_CLOSE(plain.y, n.unfused(x, w, b, policy), (Tolerance{0, 0}));
            }
}

TEST_CASE("fused_norm: with dropout_p and x1, the masks, outputs and gradients of dropout, add, norm") {
    for (const FusedNormUnderTest& n : kNorms)
        for (DType dtype : {DType::F32, DType::BF16})
            for (SavePolicy policy : kPolicies)
                for (int terms = 0; terms < 8; ++terms) {  // each of residual, x1 and dropout on or off
                    const bool with_residual = terms & 1, with_x1 = terms & 2;
                    const double p = terms & 4 ? 0.3 : 0.0;
                    CAPTURE(n.op);
                    CAPTURE(dtype_name(dtype));
                    CAPTURE(policy_name(policy));
                    CAPTURE(with_residual);
                    CAPTURE(with_x1);
                    CAPTURE(p);
                    TensorOptions o = opts(dtype);
                    manual_seed(11);
                    Tensor x0 = randn({6, 48}, o), x10 = randn({6, 48}, o), r0 = randn({6, 48}, o),
                           w0 = weight_of(48, o), b0 = scale(randn({48}, o), 0.1), u = randn({6, 48}, o),
                           v = randn({6, 48}, o);
                    auto run = [&](bool fused) {
                        Tensor x = x0.clone().requires_grad_(true), x1 = x10.clone().requires_grad_(true);
                        Tensor r = r0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
                        Tensor b = b0.clone().requires_grad_(true);
                        Tensor rr = with_residual ? r : Tensor(), xx1 = with_x1 ? x1 : Tensor();
                        manual_seed(12);  // the same dropout stream for both
                        Tensor y, s;
                        if (fused) {
                            FusedNormOutputs out = n.fused(x, w, b, options(rr, true, policy, xx1, p));
                            y = out.y;
                            s = out.residual_out;
                            CHECK_FALSE(n.fused(x, w, b, options(rr, false, policy, xx1, p)).residual_out.defined());
                        } else {  // FlashAttention's layer_norm_ref's order: x's mask, then x1's
                            s = p > 0 ? dropout(x, p) : x;
                            if (with_x1) s = add(s, p > 0 ? dropout(x1, p) : x1);
                            if (with_residual) s = add(s, r);
                            y = n.unfused(s, w, b, policy);
                        }
                        add(sum(mul(y, u)), sum(mul(s, v))).backward();
                        return std::vector<Tensor>{y, s, x.grad(), with_x1 ? x1.grad() : x.grad(),
                                                   with_residual ? r.grad() : x.grad(), w.grad(),
                                                   n.centered ? b.grad() : w.grad()};
                    };
                    std::vector<Tensor> f = run(true), g = run(false);
                    CHECK_CLOSE(f[0], g[0], (Tolerance{0, 0}));
                    CHECK_CLOSE(f[1], g[1], (Tolerance{0, 0}));
                    for (size_t i = 2; i < f.size(); ++i) {
                        CAPTURE(i);
                        REQUIRE(f[i].defined());
                        CHECK_CLOSE(f[i], g[i], tolerance(dtype));
                    }
                    if (p > 0) {  // x's gradient is zero exactly where its mask, drawn first, dropped
                        manual_seed(12);
                        Tensor mask = dropout(ones({6, 48}, opts(DType::F64)), p);
                        Tensor dx = f[2].to(DType::F64).contiguous();
                        int64_t dropped = 0, agree = 0;
                        for (int64_t i = 0; i < dx.numel(); ++i) {
                            const bool off = mask.data_ptr<double>()[i] == 0.0;
                            dropped += off;
                            agree += off == (dx.data_ptr<double>()[i] == 0.0);
                        }
                        CHECK(dropped > 0);
                        CHECK(agree == dx.numel());
                    }
                }
}

TEST_CASE("fused_norm: gradients match finite differences in f64 under each policy, through y and s") {
    manual_seed(2);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            Tensor x = leaf({3, 7}, 2.0), r = leaf({3, 7}), b = leaf({7}, 0.3);
            Tensor w = weight_of(7, opts(DType::F64)).requires_grad_(true);
            // y and s both used, s weighted apart so that its own gradient shows.
            auto both = [&](const std::vector<Tensor>& in) {
                FusedNormOutputs out = n.fused(in[0], in[2], n.centered ? in[3] : Tensor(), options(in[1], true, policy));
                return add(out.y, scale(out.residual_out, 0.7));
            };
            std::vector<Tensor> inputs = n.centered ? std::vector<Tensor>{x, r, w, b} : std::vector<Tensor>{x, r, w};
            CHECK_GRADCHECK(both, inputs);
            auto y_only = [&](const std::vector<Tensor>& in) {
                return n.fused(in[0], in[2], n.centered ? in[3] : Tensor(), options(in[1], false, policy)).y;
            };
            CHECK_GRADCHECK(y_only, inputs);
            Tensor w_fixed = w.detach();
            auto s_only = [&](const std::vector<Tensor>& in) {  // y unused: s's gradient alone
                return n.fused(in[0], w_fixed, Tensor(), options(in[1], true, policy)).residual_out;
            };
            CHECK_GRADCHECK(s_only, (std::vector<Tensor>{leaf({3, 7}), leaf({3, 7})}));
            // With x1 and dropout: the same masks at every evaluation (the stream reseeded).
            auto dropped = [&](const std::vector<Tensor>& in) {
                manual_seed(13);
                FusedNormOutputs out = n.fused(in[0], w_fixed, Tensor(), options(in[1], true, policy, in[2], 0.25));
                return add(out.y, scale(out.residual_out, 0.7));
            };
            CHECK_GRADCHECK(dropped, (std::vector<Tensor>{leaf({3, 7}), leaf({3, 7}), leaf({3, 7})}));
        }
}

TEST_CASE("fused_norm: x and residual get the unfused composition's gradients, the same for both") {
    manual_seed(3);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            TensorOptions o = opts(DType::F32);
            Tensor x0 = randn({5, 64}, o), r0 = randn({5, 64}, o), w0 = weight_of(64, o), u = randn({5, 64}, o),
                   v = randn({5, 64}, o);
            auto grads = [&](bool fused) {
                Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
                Tensor w = w0.clone().requires_grad_(true);
                Tensor y, s;
                if (fused) {
                    FusedNormOutputs out = n.fused(x, w, Tensor(), options(r, true, policy));
                    y = out.y;
                    s = out.residual_out;
                } else {
                    s = add(x, r);
                    y = n.unfused(s, w, Tensor(), policy);
                }
                add(sum(mul(y, u)), sum(mul(s, v))).backward();
                return std::vector<Tensor>{x.grad(), r.grad(), w.grad()};
            };
            std::vector<Tensor> f = grads(true), g = grads(false);
            CHECK_CLOSE(f[0], g[0], tolerance(DType::F32));
            CHECK_CLOSE(f[1], f[0], (Tolerance{0, 0}));
            CHECK_CLOSE(f[2], g[2], tolerance(DType::F32));
        }
}

TEST_CASE("fused_norm: residual gets its gradient when x needs none, and x when residual needs none") {
    manual_seed(5);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            TensorOptions o = opts(DType::F64);
            Tensor x0 = randn({4, 9}, o), r0 = randn({4, 9}, o), w = weight_of(9, o), u = randn({4, 9}, o);
            Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
            sum(mul(n.fused(x, w, Tensor(), options(r, false, policy)).y, u)).backward();
            for (bool residual_needs : {true, false}) {
                CAPTURE(residual_needs);
                Tensor xi = residual_needs ? x0 : x0.clone().requires_grad_(true);
                Tensor ri = residual_needs ? r0.clone().requires_grad_(true) : r0;
                sum(mul(n.fused(xi, w, Tensor(), options(ri, false, policy)).y, u)).backward();
                const Tensor& g = residual_needs ? ri.grad() : xi.grad();
                REQUIRE(g.defined());
                CHECK_CLOSE(g, x.grad(), tolerance(DType::F64));
            }
        }
}

TEST_CASE("fused_norm: saves s (Input), y (Output) or x_hat (Normalized) with rstd, never x, x1 or residual") {
    const int64_t M = 6, N = 16;
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies)
            for (bool prenorm : {false, true})
                for (bool dropped : {false, true}) {  // with x1 and dropout: the same bytes
                    CAPTURE(n.op);
                    CAPTURE(policy_name(policy));
                    CAPTURE(prenorm);
                    CAPTURE(dropped);
                    Tensor w = ones({N}).requires_grad_(true);
                    Tensor h = scale(randn({M, N}).requires_grad_(true), 1.0);  // non-leaf inputs, as in a model
                    Tensor r = scale(randn({M, N}).requires_grad_(true), 1.0);
                    Tensor x1 = dropped ? scale(randn({M, N}).requires_grad_(true), 1.0) : Tensor();
                    int64_t saved_before = saved_bytes();
                    int64_t allocated_before = cpu_allocated();
                    FusedNormOutputs out = n.fused(h, w, Tensor(), options(r, prenorm, policy, x1, dropped ? 0.5 : 0.0));
                    int64_t stats = statistics_bytes(M, policy, n.centered);
                    CHECK(saved_bytes() - saved_before == M * N * 4 + stats);
                    // Live now: y, the saved rows (s under Input, y under Output, x_hat under
                    // Normalized), the statistics, and s where it is returned.
                    int64_t rows = policy == SavePolicy::Output ? 1 : 2;
                    if (policy == SavePolicy::Normalized && prenorm) rows = 3;
                    if (policy == SavePolicy::Output && prenorm) rows = 2;
                    CHECK(cpu_allocated() - allocated_before == rows * M * N * 4 + stats);
                    // Dropping x, x1 and residual frees them: the graph holds none of them.
                    int64_t inputs_live = cpu_allocated();
                    h = Tensor();
                    r = Tensor();
                    x1 = Tensor();
                    CHECK(inputs_live - cpu_allocated() == (dropped ? 3 : 2) * M * N * 4);
                }
}

TEST_CASE("fused_norm: a residual or x1 unlike x, or dropout_p out of range, is refused, naming the op, and leaks nothing") {
    int64_t before = cpu_allocated();
    for (const FusedNormUnderTest& n : kNorms) {
        Tensor x = randn({4, 8}), w = ones({8});
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), options(randn({4, 9}), true, SavePolicy::Input)), ShapeError,
                               n.op, "residual of x's shape [4, 8]", "got [4, 9]");
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), options(randn({8}), false, SavePolicy::Output)), ShapeError,
                               n.op, "residual of x's shape");
        CHECK_THROWS_KIND_WITH(
            n.fused(x, w, Tensor(), options(randn({4, 8}, opts(DType::F64)), true, SavePolicy::Input)), DTypeError,
            n.op, "residual");
        FusedNormOptions bad_eps = options(randn({4, 8}), true, SavePolicy::Input);
        bad_eps.eps = 0.0;
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), bad_eps), Error, n.op, "eps > 0");
        CHECK_THROWS_KIND_WITH(n.fused(Tensor(), w, Tensor(), options(Tensor(), false, SavePolicy::Input)), Error,
                               n.op, "undefined");
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), options(Tensor(), true, SavePolicy::Input, randn({4, 7}))),
                               ShapeError, n.op, "x1 of x's shape [4, 8]", "got [4, 7]");
        CHECK_THROWS_KIND_WITH(
            n.fused(x, w, Tensor(), options(Tensor(), true, SavePolicy::Input, randn({4, 8}, opts(DType::BF16)))),
            DTypeError, n.op, "x1");
        for (double p : {-0.1, 1.0, std::nan("")})
            CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), options(Tensor(), true, SavePolicy::Input, Tensor(), p)),
                                   Error, n.op, "dropout_p in [0, 1)");
    }
    CHECK(cpu_allocated() == before);
}

TEST_CASE("fused_norm: weight1 and bias1 make y1 = norm(s) * weight1 + bias1 beside y, with f64 finite differences") {
    manual_seed(6);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies)
            for (bool with_residual : {false, true}) {
                CAPTURE(n.op);
                CAPTURE(policy_name(policy));
                CAPTURE(with_residual);
                TensorOptions o = opts(DType::F64);
                Tensor x = leaf({3, 7}, 2.0), r = leaf({3, 7}), b = leaf({7}, 0.3), b1 = leaf({7}, 0.3);
                Tensor w = weight_of(7, o).requires_grad_(true), w1 = weight_of(7, o).requires_grad_(true);
                // The inputs that take part, in order: x, r (with a residual), w and b (with y in the
                // loss), w1, b1 (b and b1 for LayerNorm); the others are constants.
                auto inputs = [&](bool with_y) {
                    std::vector<Tensor> in{x};
                    if (with_residual) in.push_back(r);
                    if (with_y) in.push_back(w);
                    if (with_y && n.centered) in.push_back(b);
                    in.push_back(w1);
                    if (n.centered) in.push_back(b1);
                    return in;
                };
                auto fused = [&](const std::vector<Tensor>& in, bool with_y) {
                    size_t k = 1;
                    auto next = [&](bool used, const Tensor& constant) { return used ? in[k++] : constant.detach(); };
                    const Tensor rr = with_residual ? in[k++] : Tensor();
                    const Tensor ww = next(with_y, w), bb = n.centered ? next(with_y, b) : Tensor();
                    const Tensor ww1 = in[k++], bb1 = n.centered ? in[k++] : Tensor();
                    return n.fused(in[0], ww, bb, parallel(options(rr, true, policy), ww1, bb1));
                };
                // The outputs: y and y1 are the norm of s with each affine.
                FusedNormOutputs out = fused(inputs(true), true);
                Tensor s = with_residual ? add(x, r) : x;
                CHECK_CLOSE(out.y, n.unfused(s, w, b, SavePolicy::Input), tolerance(DType::F64));
                CHECK_CLOSE(out.y1, n.unfused(s, w1, b1, SavePolicy::Input), tolerance(DType::F64));
                CHECK_FALSE(n.fused(x, w, b, options(r, true, policy)).y1.defined());
                // Every input through y, y1 and s; then y1 and s alone, y unused.
                auto all = [&](const std::vector<Tensor>& in) {
                    FusedNormOutputs f = fused(in, true);
                    return add(add(f.y, scale(f.y1, 0.6)), scale(f.residual_out, 0.7));
                };
                CHECK_GRADCHECK(all, inputs(true));
                auto without_y = [&](const std::vector<Tensor>& in) {
                    FusedNormOutputs f = fused(in, false);
                    return add(f.y1, scale(f.residual_out, 0.7));
                };
                CHECK_GRADCHECK(without_y, inputs(false));
                // y alone, y1 unused (weight1 and bias1 constants).
                auto y_only = [&](const std::vector<Tensor>& in) {
                    const Tensor rr = with_residual ? in[1] : Tensor();
                    const size_t k = with_residual ? 2 : 1;
                    return n.fused(in[0], in[k], n.centered ? in[k + 1] : Tensor(),
                                   parallel(options(rr, false, policy), w1.detach(), n.centered ? b1.detach() : Tensor()))
                        .y;
                };
                std::vector<Tensor> y_inputs{x};
                if (with_residual) y_inputs.push_back(r);
                y_inputs.push_back(w);
                if (n.centered) y_inputs.push_back(b);
                CHECK_GRADCHECK(y_only, y_inputs);
                // Only weight1 needing a gradient: the one it gets when everything needs one.
                Tensor u1 = randn({3, 7}, o), w1_alone = w1.detach().requires_grad_(true);
                Tensor w1_all = w1.detach().requires_grad_(true), x_all = x.detach().requires_grad_(true);
                for (Tensor* w1_run : {&w1_alone, &w1_all}) {
                    const Tensor xx = w1_run == &w1_all ? x_all : x.detach();
                    FusedNormOutputs f = n.fused(xx, w.detach(), n.centered ? b.detach() : Tensor(),
                                                 parallel(options(with_residual ? r.detach() : Tensor(), false, policy),
                                                          *w1_run, Tensor()));
                    add(sum(mul(f.y, u1)), sum(mul(f.y1, u1))).backward();
                }
                REQUIRE(w1_alone.grad().defined());
                CHECK_CLOSE(w1_alone.grad(), w1_all.grad(), (Tolerance{0, 0}));
            }
}

TEST_CASE("fused_norm: with weight1, one saved row tensor and rstd under each policy (Output saves x_hat)") {
    const int64_t M = 6, N = 16;
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            Tensor w = ones({N}).requires_grad_(true), w1 = ones({N}).requires_grad_(true);
            Tensor b1 = n.centered ? zeros({N}).requires_grad_(true) : Tensor();
            Tensor h = scale(randn({M, N}).requires_grad_(true), 1.0);
            Tensor r = scale(randn({M, N}).requires_grad_(true), 1.0);
            int64_t saved_before = saved_bytes();
            FusedNormOutputs out = n.fused(h, w, Tensor(), parallel(options(r, true, policy), w1, b1));
            int64_t stats = statistics_bytes(M, policy, n.centered);
            CHECK(saved_bytes() - saved_before == M * N * 4 + stats);
            REQUIRE(out.y1.defined());
            // What is saved under Output and Normalized is x_hat, not y: y is then made again from it.
            if (policy != SavePolicy::Input) {
                const Tensor x_hat = n.unfused(add(h, r).detach(), Tensor(), Tensor(), SavePolicy::Input);
                std::vector<SavedSlot> slots = out.y.grad_fn()->saved_tensors();
                REQUIRE(std::string(slots[0].name) == "x_hat");
                CHECK_CLOSE(slots[0].tensor->unpack("test"), x_hat, (Tolerance{0, 0}));
            }
        }
}

TEST_CASE("fused_norm: zero_centered_weight is the norm with weight + 1 (and weight1 + 1), saving those N elements") {
    manual_seed(8);
    const int64_t M = 5, N = 9;
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            TensorOptions o = opts(DType::F64);
            Tensor x0 = randn({M, N}, o), r0 = randn({M, N}, o), w0 = scale(randn({N}, o), 0.2),
                   w10 = scale(randn({N}, o), 0.2), b0 = scale(randn({N}, o), 0.1), u = randn({M, N}, o),
                   u1 = randn({M, N}, o);
            // Ours with zero-centered weights against the norm given weight + 1 itself.
            auto run = [&](bool zero_centered) {
                Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
                Tensor b = b0.clone().requires_grad_(true);
                Tensor w = (zero_centered ? w0 : add(w0, full({N}, 1.0, o))).clone().requires_grad_(true);
                Tensor w1 = (zero_centered ? w10 : add(w10, full({N}, 1.0, o))).clone().requires_grad_(true);
                FusedNormOptions fo = parallel(options(r, true, policy), w1, Tensor());
                fo.zero_centered_weight = zero_centered;
                FusedNormOutputs out = n.fused(x, w, b, fo);
                add(sum(mul(out.y, u)), sum(mul(out.y1, u1))).backward();
                return std::vector<Tensor>{out.y, out.y1, x.grad(), r.grad(), w.grad(), w1.grad(),
                                           n.centered ? b.grad() : w.grad()};
            };
            std::vector<Tensor> zc = run(true), plus_one = run(false);
            for (size_t i = 0; i < zc.size(); ++i) {
                CAPTURE(i);
                CHECK_CLOSE(zc[i], plus_one[i], (Tolerance{0, 0}));
            }
            // f64 finite differences through the weight itself, near zero.
            auto y_of = [&](const std::vector<Tensor>& in) {
                FusedNormOptions fo = options(in[1], false, policy);
                fo.zero_centered_weight = true;
                return n.fused(in[0], in[2], Tensor(), fo).y;
            };
            CHECK_GRADCHECK(y_of, (std::vector<Tensor>{leaf({M, N}), leaf({M, N}), leaf({N}, 0.2)}));
            // What is saved: the norm's rows and statistics, and weight + 1.
            Tensor w = scale(randn({N}), 0.2).requires_grad_(true);
            Tensor h = scale(randn({M, N}).requires_grad_(true), 1.0);
            int64_t saved_before = saved_bytes();
            FusedNormOptions fo = options(Tensor(), false, policy);
            fo.zero_centered_weight = true;
            Tensor y = n.fused(h, w, Tensor(), fo).y;
            int64_t stats = statistics_bytes(M, policy, n.centered);
            CHECK(saved_bytes() - saved_before == M * N * 4 + stats + N * 4);
        }
}

TEST_CASE("fused_norm: weight1 or bias1 unlike weight, bias1 alone or on RMSNorm, zero-centering no weight: refused") {
    int64_t before = cpu_allocated();
    for (const FusedNormUnderTest& n : kNorms) {
        Tensor x = randn({4, 8}), w = ones({8});
        FusedNormOptions base = options(Tensor(), false, SavePolicy::Input);
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), parallel(base, ones({9}), Tensor())), ShapeError, n.op,
                               "weight1 of shape [8]", "got [9]");
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), parallel(base, ones({8}, opts(DType::F64)), Tensor())),
                               DTypeError, n.op, "weight1");
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), parallel(base, Tensor(), zeros({8}))), Error, n.op,
                               n.centered ? "expected weight1 with bias1" : "expected no bias1");
        FusedNormOptions zero_centered = base;
        zero_centered.zero_centered_weight = true;
        CHECK_THROWS_KIND_WITH(n.fused(x, Tensor(), Tensor(), zero_centered), Error, n.op,
                               "expected a weight with zero_centered_weight");
        if (n.centered)
            CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), parallel(base, ones({8}), zeros({3}))), ShapeError, n.op,
                                   "bias1 of shape [8]");
        else
            CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), parallel(base, ones({8}), zeros({8}))), Error, n.op,
                                   "expected no bias1 (RMSNorm has no bias)");
    }
    CHECK(cpu_allocated() == before);
}

// The fused norm of a bf16 x over an f32 stream against its composition: cast x and the weights to
// f32, add, norm in f32, cast y back. Returns y, s and every gradient of loss = y . u + s . v.
std::vector<Tensor> widened_outputs(const FusedNormUnderTest& n, SavePolicy policy, bool fused, const Tensor& x0,
                                    const Tensor& r0, const Tensor& w0, const Tensor& b0, const Tensor& u,
                                    const Tensor& v) {
    Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
    Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    Tensor y, s;
    if (fused) {
        FusedNormOutputs out = n.fused(x, w, b, options(r, true, policy));
        y = out.y, s = out.residual_out;
    } else {
        s = add(cast(x, DType::F32), r);
        // y is cast, so the fused norm's Output is Normalized (Note [The fused norm]).
        SavePolicy saved_as = policy == SavePolicy::Output ? SavePolicy::Normalized : policy;
        y = cast(n.unfused(s, cast(w, DType::F32), cast(b, DType::F32), saved_as), DType::BF16);
    }
    add(cast(sum(mul(y, u)), DType::F32), sum(mul(s, v))).backward();
    return {y, s, x.grad(), r.grad(), w.grad(), n.centered ? b.grad() : w.grad()};
}

TEST_CASE("fused_norm: an f32 residual beside a bf16 x is cast, add and norm in f32, y cast back, bit for bit") {
    manual_seed(6);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            TensorOptions o = opts(DType::BF16);
            Tensor x = randn({2, 3, 40}, o), r = randn({2, 3, 40});
            Tensor w = weight_of(40, o), b = scale(randn({40}, o), 0.1);
            Tensor u = randn({2, 3, 40}, o), v = randn({2, 3, 40});
            std::vector<Tensor> fused = widened_outputs(n, policy, true, x, r, w, b, u, v);
            std::vector<Tensor> composed = widened_outputs(n, policy, false, x, r, w, b, u, v);
            CHECK(fused[0].dtype() == DType::BF16);
            CHECK(fused[1].dtype() == DType::F32);
            CHECK(fused[2].dtype() == DType::BF16);
            CHECK(fused[3].dtype() == DType::F32);
            for (size_t i = 0; i < fused.size(); ++i) {
                CAPTURE(i);
                CHECK_CLOSE(fused[i], composed[i], (Tolerance{0, 0}));
            }
        }
}

TEST_CASE("fused_norm: residual_in_fp32 keeps s in f32 for a bf16 x unless the residual is bf16, f32 and f64 x alone") {
    manual_seed(7);
    for (const FusedNormUnderTest& n : kNorms) {
        CAPTURE(n.op);
        TensorOptions o = opts(DType::BF16);
        Tensor x = randn({4, 24}, o), w = weight_of(24, o), b = scale(randn({24}, o), 0.1);
        FusedNormOptions fp32 = options(Tensor(), true, SavePolicy::Input);
        fp32.residual_in_fp32 = true;
        FusedNormOutputs out = n.fused(x, w, b, fp32);
        CHECK(out.residual_out.dtype() == DType::F32);
        CHECK(as_f64(out.residual_out) == as_f64(x));
        Tensor composed = cast(n.unfused(cast(x, DType::F32), cast(w, DType::F32), cast(b, DType::F32),
                                         SavePolicy::Input), DType::BF16);
        CHECK_CLOSE(out.y, composed, (Tolerance{0, 0}));
        // A bf16 residual: s in bf16, as without the flag.
        Tensor r = randn({4, 24}, o);
        fp32.residual = r;
        FusedNormOutputs bf = n.fused(x, w, b, fp32), plain = n.fused(x, w, b, options(r, true, SavePolicy::Input));
        CHECK(bf.residual_out.dtype() == DType::BF16);
        CHECK_CLOSE(bf.y, plain.y, (Tolerance{0, 0}));
        CHECK_CLOSE(bf.residual_out, plain.residual_out, (Tolerance{0, 0}));
        for (DType wide : {DType::F32, DType::F64}) {
            CAPTURE(dtype_name(wide));
            Tensor xw = x.to(wide), ww = w.to(wide), bw = b.to(wide), rw = r.to(wide);
            FusedNormOptions flagged = options(rw, true, SavePolicy::Input);
            flagged.residual_in_fp32 = true;
            FusedNormOutputs a = n.fused(xw, ww, bw, flagged);
            FusedNormOutputs c = n.fused(xw, ww, bw, options(rw, true, SavePolicy::Input));
            CHECK(a.residual_out.dtype() == wide);
            CHECK_CLOSE(a.y, c.y, (Tolerance{0, 0}));
        }
    }
}

TEST_CASE("fused_norm: out_dtype casts y and y1, gradients through the cast, and Normalized's recipe makes y in it") {
    manual_seed(8);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies)
            for (DType out_dtype : {DType::BF16, DType::F64}) {
                CAPTURE(n.op);
                CAPTURE(policy_name(policy));
                CAPTURE(dtype_name(out_dtype));
                Tensor x0 = randn({5, 16}), r0 = randn({5, 16}), w0 = weight_of(16, opts(DType::F32));
                Tensor w10 = weight_of(16, opts(DType::F32)), u = randn({5, 16}, opts(out_dtype));
                auto run = [&](bool fused) {
                    Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
                    Tensor w = w0.clone().requires_grad_(true), w1 = w10.clone().requires_grad_(true);
                    FusedNormOptions fo = parallel(options(r, false, policy), w1, Tensor());
                    if (fused) fo.out_dtype = out_dtype;
                    FusedNormOutputs out = n.fused(x, w, Tensor(), fo);
                    Tensor y = fused ? out.y : cast(out.y, out_dtype), y1 = fused ? out.y1 : cast(out.y1, out_dtype);
                    add(sum(mul(y, u)), sum(mul(y1, u))).backward();
                    return std::vector<Tensor>{y, y1, x.grad(), r.grad(), w.grad(), w1.grad()};
                };
                std::vector<Tensor> fused = run(true), composed = run(false);
                CHECK(fused[0].dtype() == out_dtype);
                CHECK(fused[1].dtype() == out_dtype);
                for (size_t i = 0; i < fused.size(); ++i) {
                    CAPTURE(i);
                    CHECK_CLOSE(fused[i], composed[i], (Tolerance{0, 0}));
                }
            }
}

TEST_CASE("fused_norm: a cast y and y1 are made again by their recipes bit for bit, under Output as under Normalized") {
    // A Linear after the norm saves y (and y1) as a recipe: x_hat's affine, then the cast. Under Output
    // too, which becomes Normalized when y is cast. f32 x cast to bf16; bf16 x over an f32 stream.
    manual_seed(9);
    for (SavePolicy policy : {SavePolicy::Output, SavePolicy::Normalized})
        for (bool widened : {false, true})
            for (bool with_y1 : {false, true}) {
                CAPTURE(policy_name(policy));
                CAPTURE(widened);
                CAPTURE(with_y1);
                DType dtype = widened ? DType::BF16 : DType::F32;
                Tensor x = randn({6, 32}, opts(dtype)).requires_grad_(true);
                Tensor w = weight_of(32, opts(dtype)).requires_grad_(true), w1 = weight_of(32, opts(dtype));
                Tensor lw = randn({8, 32}, opts(DType::BF16)).requires_grad_(true);
                FusedNormOptions fo = options(widened ? randn({6, 32}) : Tensor(), false, policy);
                if (with_y1) fo = parallel(fo, w1, Tensor());
                fo.out_dtype = DType::BF16;
                FusedNormOutputs out = layer_norm_fn(x, w, Tensor(), fo);
                for (const Tensor& y : with_y1 ? std::vector<Tensor>{out.y, out.y1} : std::vector<Tensor>{out.y}) {
                    Tensor z = linear(y, lw);
                    SavedTensor* held = nullptr;
                    for (SavedSlot slot : z.grad_fn()->saved_tensors())
                        if (slot.tensor->recipe()) held = slot.tensor;
                    REQUIRE(held != nullptr);
                    CHECK(std::string(held->recipe()->name) == "norm affine");
                    CHECK_FALSE(held->holds_data());
                    CHECK_CLOSE(held->unpack("test"), y, (Tolerance{0, 0}));
                }
            }
}

TEST_CASE("fused_norm: an f32 stream for a bf16 x with x1 and dropout is dropout, add, cast, add and norm, bit for bit") {
    manual_seed(13);
    for (const FusedNormUnderTest& n : kNorms) {
        CAPTURE(n.op);
        TensorOptions o = opts(DType::BF16);
        Tensor x0 = randn({4, 24}, o), x10 = randn({4, 24}, o), r0 = randn({4, 24}), w0 = weight_of(24, o);
        Tensor u = randn({4, 24}), v = randn({4, 24});
        auto run = [&](bool fused) {
            Tensor x = x0.clone().requires_grad_(true), x1 = x10.clone().requires_grad_(true);
            Tensor r = r0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
            manual_seed(18);
            Tensor y, s;
            if (fused) {
                FusedNormOutputs out = n.fused(x, w, Tensor(), options(r, true, SavePolicy::Input, x1, 0.3));
                y = out.y, s = out.residual_out;
            } else {
                Tensor dx = dropout(x, 0.3);  // x's mask first
                Tensor dropped = add(dx, dropout(x1, 0.3));
                s = add(cast(dropped, DType::F32), r);
                y = cast(n.unfused(s, cast(w, DType::F32), Tensor(), SavePolicy::Input), DType::BF16);
            }
            add(sum(mul(cast(y, DType::F32), u)), sum(mul(s, v))).backward();
            return std::vector<Tensor>{y, s, x.grad(), x1.grad(), r.grad(), w.grad()};
        };
        std::vector<Tensor> fused = run(true), composed = run(false);
        for (size_t i = 0; i < fused.size(); ++i) {
            CAPTURE(i);
            CHECK_CLOSE(fused[i], composed[i], (Tolerance{0, 0}));
        }
    }
}

TEST_CASE("fused_norm: over an f32 stream, saves s, y or x_hat in f32 with the weight cast to f32 (N x 4 bytes)") {
    const int64_t M = 6, N = 16;
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            Tensor w = ones({N}, opts(DType::BF16)).requires_grad_(true);
            Tensor h = scale(randn({M, N}, opts(DType::BF16)).requires_grad_(true), 1.0);
            Tensor r = scale(randn({M, N}).requires_grad_(true), 1.0);
            int64_t before = saved_bytes();
            FusedNormOutputs out = n.fused(h, w, Tensor(), options(r, true, policy));
            int64_t stats = statistics_bytes(M, policy, n.centered);
            CHECK(saved_bytes() - before == M * N * 4 + stats + N * 4);
        }
}

TEST_CASE("fused_norm: a residual of another dtype than x or f32 beside bf16, or an i64 out_dtype, is refused") {
    int64_t before = cpu_allocated();
    for (const FusedNormUnderTest& n : kNorms) {
        Tensor x = randn({4, 8}), w = ones({8});
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), options(randn({4, 8}, opts(DType::BF16)), true,
                                                               SavePolicy::Input)),
                               DTypeError, n.op, "residual of dtype f32 (as x)", "got bf16");
        Tensor x16 = randn({4, 8}, opts(DType::BF16)), w16 = ones({8}, opts(DType::BF16));
        CHECK_THROWS_KIND_WITH(n.fused(x16, w16, Tensor(), options(randn({4, 8}, opts(DType::F64)), true,
                                                                   SavePolicy::Input)),
                               DTypeError, n.op, "residual of dtype bf16 (as x)", "got f64");
        FusedNormOptions bad = options(Tensor(), false, SavePolicy::Input);
        bad.out_dtype = DType::I64;
        CHECK_THROWS_KIND_WITH(n.fused(x, w, Tensor(), bad), DTypeError, n.op, "out_dtype f32, f64 or bf16", "i64");
    }
    CHECK(cpu_allocated() == before);
}

TEST_CASE("fused_norm: on CUDA, an f32 stream for a bf16 x is its composition bit for bit and the cpu's") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(9);
    for (const FusedNormUnderTest& n : kNorms)
        for (int64_t N : {200, 1002})
            for (SavePolicy policy : kPolicies) {
                CAPTURE(n.op);
                CAPTURE(N);
                CAPTURE(policy_name(policy));
                TensorOptions o = opts(DType::BF16);
                Tensor x = randn({37, N}, o), r = randn({37, N}), w = weight_of(N, o), b = scale(randn({N}, o), 0.1);
                Tensor u = randn({37, N}, o), v = randn({37, N});
                auto on = [](const Tensor& t) { return t.to(Device::CUDA); };
                std::vector<Tensor> fused = widened_outputs(n, policy, true, on(x), on(r), on(w), on(b), on(u), on(v));
                std::vector<Tensor> composed =
                    widened_outputs(n, policy, false, on(x), on(r), on(w), on(b), on(u), on(v));
                std::vector<Tensor> cpu = widened_outputs(n, policy, true, x, r, w, b, u, v);
                for (size_t i = 0; i < fused.size(); ++i) {
                    CAPTURE(i);
                    CHECK_CLOSE(fused[i], composed[i], (Tolerance{0, 0}));
                    CHECK_NORMWISE(fused[i].to(Device::CPU), cpu[i], normwise_tolerance(DType::BF16));
                }
            }
}

// rowscale's reference: x * rowscale[..., None] as mul by a [M, N] constant written out here.
Tensor rows_times(const Tensor& x, const Tensor& rowscale) {
    const int64_t N = x.size(-1);
    std::vector<double> scales = as_f64(rowscale), full_rows;
    for (double v : scales) full_rows.insert(full_rows.end(), N, v);
    return mul(x, expected(full_rows, x.shape()).to(x.dtype()).to(x.device()));
}

TEST_CASE("fused_norm: rowscale is x * rowscale[..., None] before the dropout, bit for bit, gradients as mul's") {
    manual_seed(10);
    for (const FusedNormUnderTest& n : kNorms)
        for (DType dtype : {DType::F64, DType::F32, DType::BF16})
            for (SavePolicy policy : kPolicies)
                for (double p : {0.0, 0.3}) {
                    CAPTURE(n.op);
                    CAPTURE(dtype_name(dtype));
                    CAPTURE(policy_name(policy));
                    CAPTURE(p);
                    TensorOptions o = opts(dtype);
                    Tensor x0 = randn({2, 3, 24}, o), r0 = randn({2, 3, 24}), w0 = weight_of(24, o);
                    // Scales that round in every dtype, one row dropped (0), as stochastic depth has.
                    Tensor rowscale = add(full({2, 3}, 1.0, o), scale(randn({2, 3}, o), 0.3));
                    rowscale = mul(rowscale, from_vector<double>({1, 0, 1, 1, 1, 1}, {2, 3}).to(dtype));
                    Tensor u = randn({2, 3, 24}, o), v = randn({2, 3, 24}, o);
                    auto run = [&](bool fused) {
                        Tensor x = x0.clone().requires_grad_(true), r = r0.to(dtype).requires_grad_(true);
                        Tensor w = w0.clone().requires_grad_(true);
                        manual_seed(15);
                        FusedNormOptions fo = options(r, true, policy, Tensor(), p);
                        Tensor y, s;
                        if (fused) {
                            fo.rowscale = rowscale;
                            FusedNormOutputs out = n.fused(x, w, Tensor(), fo);
                            y = out.y, s = out.residual_out;
                        } else {
                            FusedNormOutputs out = n.fused(rows_times(x, rowscale), w, Tensor(), fo);
                            y = out.y, s = out.residual_out;
                        }
                        add(sum(mul(y, u)), sum(mul(s, v))).backward();
                        return std::vector<Tensor>{y, s, x.grad(), r.grad(), w.grad()};
                    };
                    std::vector<Tensor> fused = run(true), composed = run(false);
                    for (size_t i = 0; i < fused.size(); ++i) {
                        CAPTURE(i);
                        CHECK_CLOSE(fused[i], composed[i], (Tolerance{0, 0}));
                    }
                }
}

TEST_CASE("fused_norm: with rowscale, gradients match finite differences in f64, and rowscale is saved (M elements)") {
    manual_seed(11);
    for (const FusedNormUnderTest& n : kNorms)
        for (SavePolicy policy : kPolicies) {
            CAPTURE(n.op);
            CAPTURE(policy_name(policy));
            Tensor rowscale = add(full({3}, 1.0, opts(DType::F64)), scale(randn({3}, opts(DType::F64)), 0.3));
            Tensor w = weight_of(7, opts(DType::F64)).requires_grad_(true);
            auto f = [&](const std::vector<Tensor>& in) {
                manual_seed(16);
                FusedNormOptions fo = options(in[1], true, policy, Tensor(), 0.25);
                fo.rowscale = rowscale;
                FusedNormOutputs out = n.fused(in[0], in[2], Tensor(), fo);
                return add(out.y, scale(out.residual_out, 0.7));
            };
            CHECK_GRADCHECK(f, (std::vector<Tensor>{leaf({3, 7}, 2.0), leaf({3, 7}), w}));
            // Saved: the norm's (as without rowscale) and rowscale's 3 f64 elements.
            Tensor h = scale(randn({3, 7}, opts(DType::F64)).requires_grad_(true), 1.0);
            Tensor r = scale(randn({3, 7}, opts(DType::F64)).requires_grad_(true), 1.0);
            int64_t before = saved_bytes();
            FusedNormOutputs plain = n.fused(h, w, Tensor(), options(r, true, policy));
            int64_t norm_bytes = saved_bytes() - before;
            FusedNormOptions fo = options(r, true, policy);
            fo.rowscale = rowscale;
            FusedNormOutputs scaled = n.fused(h, w, Tensor(), fo);
            CHECK(saved_bytes() - before - norm_bytes == norm_bytes + 3 * 8);
        }
}

TEST_CASE("fused_norm: a rowscale of the wrong shape or dtype, requiring grad, or beside x1 is refused") {
    int64_t before = cpu_allocated();
    for (const FusedNormUnderTest& n : kNorms) {
        Tensor x = randn({2, 4, 8}), w = ones({8});
        auto with_rowscale = [&](const Tensor& rowscale, const Tensor& x1 = Tensor()) {
            FusedNormOptions fo = options(Tensor(), false, SavePolicy::Input, x1);
            fo.rowscale = rowscale;
            return n.fused(x, w, Tensor(), fo);
        };
        CHECK_THROWS_KIND_WITH(with_rowscale(ones({8})), ShapeError, n.op, "rowscale of shape [2, 4]", "got [8]");
        CHECK_THROWS_KIND_WITH(with_rowscale(ones({2, 4, 1})), ShapeError, n.op, "rowscale of shape [2, 4]");
        CHECK_THROWS_KIND_WITH(with_rowscale(ones({2, 4}, opts(DType::F64))), DTypeError, n.op, "rowscale", "f64");
        CHECK_THROWS_KIND_WITH(with_rowscale(ones({2, 4}).requires_grad_(true)), Error, n.op,
                               "rowscale that requires no gradient");
        CHECK_THROWS_KIND_WITH(with_rowscale(ones({2, 4}), randn({2, 4, 8})), Error, n.op, "rowscale or x1");
    }
    CHECK(cpu_allocated() == before);
}

TEST_CASE("fused_norm: on CUDA, rowscale with dropout gives the cpu's outputs and gradients") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(12);
    for (const FusedNormUnderTest& n : kNorms)
        for (DType dtype : {DType::F32, DType::BF16}) {
            CAPTURE(n.op);
            CAPTURE(dtype_name(dtype));
            TensorOptions o = opts(dtype);
            Tensor x0 = randn({33, 200}, o), r0 = randn({33, 200}, o), w0 = weight_of(200, o), u = randn({33, 200}, o);
            Tensor rowscale0 = add(full({33}, 1.0, o), scale(randn({33}, o), 0.3));
            auto run = [&](Device d) {
                Tensor x = x0.to(d).requires_grad_(true), r = r0.to(d).requires_grad_(true);
                Tensor w = w0.to(d).requires_grad_(true);
                manual_seed(17);
                FusedNormOptions fo = options(r, true, SavePolicy::Input, Tensor(), 0.2);
                fo.rowscale = rowscale0.to(d);
                FusedNormOutputs out = n.fused(x, w, Tensor(), fo);
                add(sum(mul(out.y, u.to(d))), sum(out.residual_out)).backward();
                return std::vector<Tensor>{out.y, out.residual_out, x.grad(), r.grad(), w.grad()};
            };
            std::vector<Tensor> cpu = run(Device::CPU), gpu = run(Device::CUDA);
            for (size_t i = 0; i < cpu.size(); ++i) {
                CAPTURE(i);
                CHECK_NORMWISE(gpu[i], cpu[i], normwise_tolerance(dtype));
            }
        }
}

TEST_CASE("fused_norm: on CUDA, equal to the cpu in f32 and bf16 with dropout and weight1, outputs and gradients") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(4);
    for (const FusedNormUnderTest& n : kNorms)
        for (DType dtype : {DType::F32, DType::BF16})
            for (SavePolicy policy : kPolicies) {
                CAPTURE(n.op);
                CAPTURE(dtype_name(dtype));
                CAPTURE(policy_name(policy));
                TensorOptions o = opts(dtype);
                Tensor x0 = randn({33, 200}, o), r0 = randn({33, 200}, o), w0 = weight_of(200, o),
                       b0 = scale(randn({200}, o), 0.1), u = randn({33, 200}, o), v = randn({33, 200}, o);
                Tensor x10 = randn({33, 200}, o), w10 = weight_of(200, o), b10 = scale(randn({200}, o), 0.1),
                       u1 = randn({33, 200}, o);
                // With x1 and dropout the masks are the same: one stream, reseeded, on either device. With
                // weight1, y1 and the gradients of weight1 and bias1 besides.
                auto run = [&](Device d, double p, bool with_y1) {
                    Tensor x = x0.to(d).requires_grad_(true), r = r0.to(d).requires_grad_(true);
                    Tensor x1 = x10.to(d).requires_grad_(true), w1 = w10.to(d).requires_grad_(true);
                    Tensor w = w0.to(d).requires_grad_(true), b = b0.to(d).requires_grad_(true);
                    Tensor b1 = b10.to(d).requires_grad_(true);
                    manual_seed(14);
                    FusedNormOptions fo = options(r, true, policy, p > 0 ? x1 : Tensor(), p);
                    if (with_y1) fo = parallel(fo, w1, n.centered ? b1 : Tensor());
                    FusedNormOutputs out = n.fused(x, w, b, fo);
                    Tensor loss = add(sum(mul(out.y, u.to(d))), sum(mul(out.residual_out, v.to(d))));
                    if (with_y1) loss = add(loss, sum(mul(out.y1, u1.to(d))));
                    loss.backward();
                    std::vector<Tensor> got{out.y, out.residual_out, x.grad(), r.grad(), w.grad(),
                                            n.centered ? b.grad() : w.grad(), p > 0 ? x1.grad() : x.grad()};
                    if (with_y1) got.insert(got.end(), {out.y1, w1.grad(), n.centered ? b1.grad() : w1.grad()});
                    return got;
                };
                for (auto [p, with_y1] : {std::pair{0.0, false}, {0.2, false}, {0.0, true}}) {
                    CAPTURE(p);
                    CAPTURE(with_y1);
                    std::vector<Tensor> cpu = run(Device::CPU, p, with_y1), gpu = run(Device::CUDA, p, with_y1);
                    for (size_t i = 0; i < cpu.size(); ++i) {
                        CAPTURE(i);
                        CHECK_NORMWISE(gpu[i], cpu[i], normwise_tolerance(dtype));
                    }
                }
            }
}

TEST_CASE("fused_norm: on CUDA, the fused kernels give the unfused add and norm bit for bit, outputs and gradients") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(5);
    // Widths of each kernel: 200 (the fast kernels of one warp), 4096 (f32's backward with s's gradient
    // loaded ahead, in a block of its own), 12288 (bf16's forward with the next row in registers; f32's
    // backward over a cluster of two blocks where the GPU has them) and 1002 (no 16-byte vectors:
    // add_forward_cuda, then the reference kernels); f64 takes the reference.
    for (const FusedNormUnderTest& n : kNorms)
        for (DType dtype : {DType::F32, DType::BF16, DType::F64})
            for (int64_t N : {200, 4096, 12288, 1002})
                for (SavePolicy policy : kPolicies) {
                    CAPTURE(n.op);
                    CAPTURE(dtype_name(dtype));
                    CAPTURE(N);
                    CAPTURE(policy_name(policy));
                    TensorOptions o = opts(dtype).device(Device::CUDA);
                    Tensor x0 = randn({37, N}, o), r0 = randn({37, N}, o), w0 = weight_of(N, o),
                           b0 = scale(randn({N}, o), 0.1), u = randn({37, N}, o), v = randn({37, N}, o);
                    auto run = [&](bool fused) {
                        Tensor x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
                        Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
                        Tensor y, s;
                        if (fused) {
                            FusedNormOutputs out = n.fused(x, w, b, options(r, true, policy));
                            y = out.y, s = out.residual_out;
                        } else {
                            s = add(x, r);
                            y = n.unfused(s, w, b, policy);
                        }
                        add(sum(mul(y, u)), sum(mul(s, v))).backward();
                        return std::vector<Tensor>{y, s, x.grad(), r.grad(), w.grad(), n.centered ? b.grad() : w.grad()};
                    };
                    std::vector<Tensor> fused = run(true), unfused = run(false);
                    for (size_t i = 0; i < fused.size(); ++i) {
                        CAPTURE(i);
                        CHECK_CLOSE(fused[i], unfused[i], (Tolerance{0, 0}));
                    }
                }
}

}  // TEST_SUITE
