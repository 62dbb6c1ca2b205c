// tests/test_adamw.cpp: AdamW (nn/optim/adamw.h) against its formula on the cpu and its
// multi-tensor CUDA step against the cpu's, step_if_finite, the refusals of a parameter in two groups
// or of a gradient that does not fit, and gradient clipping (the double and the tensor variants, on
// both devices). The CUDA cases skip with a message where no GPU is visible. Modules and their
// checkpoints: tests/test_nn.cpp.
#include <cmath>
#include <vector>

#include "optim_test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// Each gradient of `a` and of `b` is grads[i] * (max_norm / (norm + 1e-6)), bit for bit, as mul_
// makes it: what clip_grad_norm_ and clip_grad_norm_tensor_ promise.
void check_clipped_as_mul(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::vector<Tensor>& grads,
                          double norm, double max_norm) {
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        Tensor expected = grads[i].clone();
        expected.mul_(max_norm / (norm + 1e-6));
        CHECK(same_bits(a[i].grad(), expected));
        CHECK(same_bits(b[i].grad(), expected));
    }
}

// AdamW's formula in double for one parameter, step by step (Loshchilov & Hutter 2019).
struct AdamWReference {
    std::vector<double> w, m, v;
    void step(const std::vector<double>& g, const AdamWOptions& o, double weight_decay, int t) {
        for (size_t k = 0; k < w.size(); ++k) {
            w[k] *= 1 - o.lr * weight_decay;
            m[k] = o.beta1 * m[k] + (1 - o.beta1) * g[k];
            v[k] = o.beta2 * v[k] + (1 - o.beta2) * g[k] * g[k];
            double mh = m[k] / (1 - std::pow(o.beta1, t)), vh = v[k] / (1 - std::pow(o.beta2, t));
            w[k] -= o.lr * mh / (std::sqrt(vh) + o.eps);
        }
    }
};

AdamWOptions test_adamw_options() {
    AdamWOptions o;
    o.lr = 0.01;
    o.beta1 = 0.9;
    o.beta2 = 0.95;
    o.eps = 1e-8;
    return o;
}

// Parameters of every dtype and of sizes that leave tails of every kind: 1, 7, 4097, and (with
// `large`) more than one 65536-element chunk, with and without a tail. Values: standard normals.
std::vector<Tensor> mixed_parameters(bool large) {
    std::vector<int64_t> sizes = {1, 7, 4097};
    if (large) sizes.insert(sizes.end(), {65536 + 3, 2 * 65536, 2 * 65536 + 9});
    std::vector<Tensor> params;
    for (DType dtype : {DType::F32, DType::BF16, DType::F64})
        for (int64_t n : sizes) params.push_back(randn({n}).to(dtype).requires_grad_(true));
    return params;
}

// Copies of params on `device`, requiring grad.
std::vector<Tensor> copies_on(const std::vector<Tensor>& params, Device device) {
    std::vector<Tensor> out;
    for (const Tensor& p : params) out.push_back(p.detach().to(device).clone().requires_grad_(true));
    return out;
}

// Two groups over params: even indices with weight decay 0.1, odd ones without.
std::vector<ParamGroup> two_groups(const std::vector<Tensor>& params) {
    std::vector<ParamGroup> groups = {{{}, 0.1}, {{}, 0.0}};
    for (size_t i = 0; i < params.size(); ++i) groups[i % 2].params.push_back(params[i]);
    return groups;
}

}  // namespace

TEST_SUITE("nn") {

TEST_CASE("nn: AdamW follows its formula, with decoupled weight decay and bias correction") {
    Tensor p = from_vector(std::vector<double>{1.0, -2.0}).requires_grad_(true);
    AdamWOptions o;
    o.lr = 0.1;
    o.beta1 = 0.9;
    o.beta2 = 0.99;
    o.eps = 1e-8;
    o.weight_decay = 0.5;
    AdamW opt({p}, o);
    std::vector<double> ref = {1.0, -2.0}, m = {0, 0}, v = {0, 0};
    for (int t = 1; t <= 3; ++t) {
        std::vector<double> g = {0.3 * t, -0.7};
        opt.zero_grad();
        sum(mul(p, from_vector(g))).backward();  // grad = g
        opt.step();
        for (int k = 0; k < 2; ++k) {
            ref[k] *= 1 - o.lr * o.weight_decay;
            m[k] = o.beta1 * m[k] + (1 - o.beta1) * g[k];
            v[k] = o.beta2 * v[k] + (1 - o.beta2) * g[k] * g[k];
            double mh = m[k] / (1 - std::pow(o.beta1, t)), vh = v[k] / (1 - std::pow(o.beta2, t));
            ref[k] -= o.lr * mh / (std::sqrt(vh) + o.eps);
        }
    }
    CHECK_CLOSE(p, from_vector(ref), tolerance(DType::F64));
    CHECK(opt.step_count() == 3);
}

TEST_CASE("nn: clip_grad_norm_ scales gradients to the maximum norm and returns the old norm") {
    Tensor a = from_vector(std::vector<double>{0, 0}).requires_grad_(true);
    Tensor b = from_vector(std::vector<double>{0}).requires_grad_(true);
    add(sum(mul(a, from_vector(std::vector<double>{3, 0}))), sum(mul(b, from_vector(std::vector<double>{4})))).backward();
    double norm = clip_grad_norm_({a, b}, 1.0);
    CHECK(norm == doctest::Approx(5.0));
    CHECK(a.grad().to_vector<double>()[0] == doctest::Approx(0.6).epsilon(1e-6));
    CHECK(b.grad().to_vector<double>()[0] == doctest::Approx(0.8).epsilon(1e-6));
    CHECK(clip_grad_norm_({a, b}, 10.0) == doctest::Approx(1.0).epsilon(1e-5));  // below the limit: unchanged
    CHECK_THROWS_KIND_WITH(clip_grad_norm_({a}, 0.0), Error, "max_norm > 0");
}

TEST_CASE("nn: AdamW follows its formula in every dtype, over sizes with odd tails and several steps") {
    manual_seed(11);
    std::vector<Tensor> params = mixed_parameters(false);
    AdamWOptions o = test_adamw_options();
    AdamW opt(two_groups(params), o);
    std::vector<AdamWReference> ref;
    for (const Tensor& p : params) {
        std::vector<double> w = host_values(p);
        ref.push_back({w, std::vector<double>(w.size(), 0.0), std::vector<double>(w.size(), 0.0)});
    }
    for (int t = 1; t <= 4; ++t) {
        for (size_t i = 0; i < params.size(); ++i) {
            Tensor g = randn(params[i].shape()).to(params[i].dtype());
            set_grad(params[i], g);
            ref[i].step(host_values(g), o, i % 2 == 0 ? 0.1 : 0.0, t);
        }
        opt.step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
        const Tensor& p = params[i];
        CAPTURE(dtype_name(p.dtype()));
        CAPTURE(p.numel());
        const AdamW::ParamState& st = opt.state(p);
        DType stat = stat_dtype(p.dtype());
        CHECK_CLOSE(st.m, from_vector(ref[i].m).to(stat), tolerance(stat));
        CHECK_CLOSE(st.v, from_vector(ref[i].v).to(stat), tolerance(stat));
        if (p.dtype() == DType::BF16) {
            CHECK_CLOSE(st.master, from_vector(ref[i].w).to(DType::F32), tolerance(DType::F32));
            CHECK(same_bits(p, st.master.to(DType::BF16)));  // the parameter is its master copy, rounded
        } else {
            CHECK_CLOSE(p, from_vector(ref[i].w).to(p.dtype()), tolerance(p.dtype()));
        }
    }
    CHECK(opt.step_count() == 4);
}

TEST_CASE("nn: clip_grad_norm_tensor_ returns clip_grad_norm_'s norm and clips the gradients as mul_ does") {
    manual_seed(12);
    std::vector<Tensor> a = mixed_parameters(false);
    std::vector<Tensor> b = copies_on(a, Device::CPU);
    std::vector<Tensor> grads;
    double sum_squares = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        Tensor g = randn(a[i].shape()).to(a[i].dtype());
        for (double x : host_values(g)) sum_squares += x * x;
        grads.push_back(g);
        set_grad(a[i], g);
        set_grad(b[i], g);
    }
    const double max_norm = 1.0;
    double norm = clip_grad_norm_(a, max_norm);
    Tensor norm_t = clip_grad_norm_tensor_(b, max_norm);
    CHECK(norm_t.dim() == 0);
    CHECK(norm_t.dtype() == DType::F64);
    CHECK(norm_t.device() == Device::CPU);
    CHECK(norm_t.item<double>() == norm);  // bit for bit
    CHECK(norm == doctest::Approx(std::sqrt(sum_squares)).epsilon(1e-12));
    REQUIRE(norm > max_norm);
    check_clipped_as_mul(a, b, grads, norm, max_norm);
    // Below the limit nothing changes; a parameter without a gradient is skipped.
    b[0].zero_grad();
    std::vector<Tensor> before;
    for (const Tensor& p : b) before.push_back(p.grad().defined() ? p.grad().clone() : Tensor());
    CHECK(clip_grad_norm_tensor_(b, 10.0).item<double>() < 1.01);
    CHECK_FALSE(b[0].grad().defined());
    for (size_t i = 1; i < b.size(); ++i) CHECK(same_bits(b[i].grad(), before[i]));
    CHECK(clip_grad_norm_tensor_({}, 1.0).item<double>() == 0.0);
    CHECK_THROWS_KIND_WITH(clip_grad_norm_tensor_(b, -1.0), Error, "max_norm > 0");
}

TEST_CASE("nn: clip_grad_norm_ with a NaN gradient scales nothing, with an infinite one scales by 0") {
    Tensor p = zeros({3}).requires_grad_(true), q = zeros({2}).requires_grad_(true);
    set_grad(p, from_vector(std::vector<float>{1, NAN, 2}));
    set_grad(q, from_vector(std::vector<float>{3, 4}));
    CHECK(std::isnan(clip_grad_norm_tensor_({p, q}, 1.0).item<double>()));
    CHECK(q.grad().to_vector<float>() == std::vector<float>{3, 4});
    set_grad(p, from_vector(std::vector<float>{1, INFINITY, 2}));
    CHECK(std::isinf(clip_grad_norm_({p, q}, 1.0)));
    CHECK(q.grad().to_vector<float>() == std::vector<float>{0, 0});
}

TEST_CASE("nn: AdamW::step_if_finite steps on a finite norm and changes nothing on a NaN or infinite one") {
    manual_seed(13);
    std::vector<Tensor> a = mixed_parameters(false), b = copies_on(a, Device::CPU);
    AdamWOptions o = test_adamw_options();
    AdamW opt_a(two_groups(a), o), opt_b(two_groups(b), o);
    for (size_t i = 0; i < a.size(); ++i) {
        Tensor g = randn(a[i].shape()).to(a[i].dtype());
        set_grad(a[i], g);
        set_grad(b[i], g);
    }
    opt_a.step();
    opt_b.step_if_finite(full({}, 2.5, TensorOptions().dtype(DType::F64)));
    for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
    for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
        CAPTURE(bad);
        std::vector<Tensor> before = copies_on(b, Device::CPU);
        opt_b.step_if_finite(full({1}, bad));  // f32, one element
        for (size_t i = 0; i < b.size(); ++i) {
            CHECK(same_bits(b[i], before[i]));
            CHECK(same_bits(opt_b.state(b[i]).m, opt_a.state(a[i]).m));
        }
    }
    CHECK(opt_b.step_count() == 4);  // skipped steps count
    CHECK_THROWS_KIND_WITH(opt_b.step_if_finite(zeros({2})), ShapeError, "step_if_finite", "one-element", "[2]");
    CHECK_THROWS_KIND_WITH(opt_b.step_if_finite(Tensor()), Error, "step_if_finite", "undefined");
}

TEST_CASE("nn: the multi-tensor CUDA AdamW step matches the cpu step in every dtype, size and launch split") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(14);
    // mixed_parameters(true): chunks with and without tails; 900 more small tensors: more than one
    // launch's worth of gradients of a dtype (kAdamWGradsPerLaunch is 400).
    std::vector<Tensor> cpu = mixed_parameters(true);
    for (int i = 0; i < 900; ++i)
        cpu.push_back(randn({1 + i % 5}).to(i % 3 == 0 ? DType::BF16 : DType::F32).requires_grad_(true));
    std::vector<Tensor> gpu = copies_on(cpu, Device::CUDA);
    AdamWOptions o = test_adamw_options();
    AdamW opt_cpu(two_groups(cpu), o), opt_gpu(two_groups(gpu), o);
    for (int t = 1; t <= 4; ++t) {
        for (size_t i = 0; i < cpu.size(); ++i) {
            if (t == 2 && i % 7 == 3) {  // another set of parameters with a gradient: the table is rebuilt
                cpu[i].zero_grad();
                gpu[i].zero_grad();
                continue;
            }
            Tensor g = randn(cpu[i].shape()).to(cpu[i].dtype());
            set_grad(cpu[i], g);
            set_grad(gpu[i], g.to(Device::CUDA));
        }
        opt_cpu.step();
        opt_gpu.step();
    }
    for (size_t i = 0; i < cpu.size(); ++i) {
        CAPTURE(i);
        CAPTURE(dtype_name(cpu[i].dtype()));
        CAPTURE(cpu[i].numel());
        const AdamW::ParamState &sc = opt_cpu.state(cpu[i]), &sg = opt_gpu.state(gpu[i]);
        REQUIRE(gpu[i].device() == Device::CUDA);
        DType stat = stat_dtype(cpu[i].dtype());
        CHECK_CLOSE(sg.m.to(Device::CPU), sc.m, tolerance(stat));
        CHECK_CLOSE(sg.v.to(Device::CPU), sc.v, tolerance(stat));
        if (cpu[i].dtype() == DType::BF16) {
            CHECK_CLOSE(sg.master.to(Device::CPU), sc.master, tolerance(DType::F32));
            CHECK(same_bits(gpu[i], sg.master.to(DType::BF16)));
        }
        CHECK_CLOSE(gpu[i].to(Device::CPU), cpu[i], tolerance(cpu[i].dtype()));
    }
}

TEST_CASE("nn: the CUDA AdamW step gives the same bits whether a tensor's data is 16-byte aligned or not") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(15);
    for (DType dtype : {DType::F32, DType::BF16, DType::F64}) {
        CAPTURE(dtype_name(dtype));
        for (int64_t n : {int64_t(7), int64_t(4097), int64_t(65536 + 9)}) {
            CAPTURE(n);
            Tensor values = randn({n}).to(dtype).to(Device::CUDA);
            Tensor aligned = values.clone().requires_grad_(true);
            Tensor base = zeros({n + 1}, TensorOptions().dtype(dtype).device(Device::CUDA));
            base.narrow(0, 1, n).copy_(values);
            // One element past the allocator's 512-byte alignment: no 16-byte vectors.
            Tensor shifted = base.narrow(0, 1, n).detach().requires_grad_(true);
            AdamWOptions o = test_adamw_options();
            AdamW opt_a({aligned}, o), opt_s({shifted}, o);
            for (int t = 0; t < 3; ++t) {
                Tensor g = randn({n}).to(dtype).to(Device::CUDA);
                set_grad(aligned, g);
                set_grad(shifted, g);
                opt_a.step();
                opt_s.step();
            }
            CHECK(same_bits(aligned, shifted));
            CHECK(same_bits(opt_a.state(aligned).m, opt_s.state(shifted).m));
            CHECK(same_bits(opt_a.state(aligned).v, opt_s.state(shifted).v));
        }
    }
}

TEST_CASE("nn: clip_grad_norm_tensor_ on CUDA equals clip_grad_norm_ and the cpu, and clips as mul_ does") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(16);
    std::vector<Tensor> cpu = mixed_parameters(true);
    // 400 more small tensors: more than one list of gradients per dtype (kGradListTensors is 192).
    for (int i = 0; i < 400; ++i)
        cpu.push_back(randn({1 + i % 3}).to(i % 2 ? DType::BF16 : DType::F32).requires_grad_(true));
    std::vector<Tensor> a = copies_on(cpu, Device::CUDA), b = copies_on(cpu, Device::CUDA);
    std::vector<Tensor> grads;
    for (size_t i = 0; i < cpu.size(); ++i) {
        Tensor g = randn(cpu[i].shape()).to(cpu[i].dtype());
        grads.push_back(g.to(Device::CUDA));
        set_grad(cpu[i], g);
        set_grad(a[i], grads.back());
        set_grad(b[i], grads.back());
    }
    const double max_norm = 1.0;
    Tensor norm_t = clip_grad_norm_tensor_(a, max_norm);
    CHECK(norm_t.device() == Device::CUDA);
    CHECK(norm_t.dim() == 0);
    double norm = clip_grad_norm_(b, max_norm);
    CHECK(norm_t.item<double>() == norm);  // bit for bit, and deterministic
    CHECK(norm == doctest::Approx(clip_grad_norm_(cpu, max_norm)).epsilon(1e-12));
    check_clipped_as_mul(a, b, grads, norm, max_norm);
    // Below the limit the gradients keep their bits; NaN: no scaling, and step_if_finite skips.
    std::vector<Tensor> before;
    for (const Tensor& p : a) before.push_back(p.grad().clone());
    CHECK(clip_grad_norm_tensor_(a, 10.0).item<double>() == doctest::Approx(max_norm).epsilon(1e-3));
    for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i].grad(), before[i]));
    Tensor p = zeros({3}, TensorOptions().device(Device::CUDA)).requires_grad_(true);
    set_grad(p, from_vector(std::vector<float>{1, NAN, 2}).to(Device::CUDA));
    Tensor nan_norm = clip_grad_norm_tensor_({p}, 1.0);
    CHECK(std::isnan(nan_norm.item<double>()));
    CHECK(same_bits(p.grad(), from_vector(std::vector<float>{1, NAN, 2})));
    // Gradients on two devices, and a norm on another device than the parameters.
    Tensor c = zeros({2}).requires_grad_(true);
    set_grad(c, ones({2}));
    CHECK_THROWS_KIND_WITH(clip_grad_norm_tensor_({p, c}, 1.0), DeviceError, "clip_grad_norm_", "every gradient");
    AdamW opt({p}, AdamWOptions());
    CHECK_THROWS_KIND_WITH(opt.step_if_finite(full({}, 1.0)), DeviceError, "step_if_finite", "expected the norm on");
    CHECK(opt.step_count() == 0);
}

TEST_CASE("nn: AdamW::step_if_finite on CUDA skips on the device, and steps as step() on a finite norm") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(17);
    std::vector<Tensor> a = copies_on(mixed_parameters(true), Device::CUDA), b = copies_on(a, Device::CUDA);
    AdamWOptions o = test_adamw_options();
    AdamW opt_a(two_groups(a), o), opt_b(two_groups(b), o);
    for (size_t i = 0; i < a.size(); ++i) {
        Tensor g = randn(a[i].shape(), TensorOptions().dtype(a[i].dtype()).device(Device::CUDA));
        set_grad(a[i], g);
        set_grad(b[i], g);
    }
    opt_a.step();
    opt_b.step_if_finite(clip_grad_norm_tensor_(b, 1e30));  // finite, above nothing: no clipping
    for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
    set_grad(b[0], full(b[0].shape(), NAN, TensorOptions().dtype(b[0].dtype()).device(Device::CUDA)));
    std::vector<Tensor> before = copies_on(b, Device::CUDA);
    opt_b.step_if_finite(clip_grad_norm_tensor_(b, 1.0));
    for (size_t i = 0; i < b.size(); ++i) {
        CAPTURE(i);
        CHECK(same_bits(b[i], before[i]));
        CHECK(same_bits(opt_b.state(b[i]).m, opt_a.state(a[i]).m));
        CHECK(same_bits(opt_b.state(b[i]).v, opt_a.state(a[i]).v));
    }
    CHECK(opt_b.step_count() == 2);
}

TEST_CASE("nn: AdamW refuses a tensor in two groups and updates a tensor listed twice in one group once") {
    Tensor w = from_vector<double>({1.0, -2.0}).requires_grad_(true), b = from_vector<double>({0.5}).requires_grad_(true);
    CHECK_THROWS_KIND_WITH(AdamW(std::vector<ParamGroup>{{{b, w}, 0.1}, {{w}, 0.0}}, AdamWOptions()), Error, "AdamW",
                           "parameter 0 of group 1", "parameter 1 of group 0", "more than one parameter group");
    // Listed twice in one group: kept once (its first place), so one step moves it as one update does.
    Tensor once = from_vector<double>({1.0, -2.0}).requires_grad_(true);
    AdamW twice({w, b, w}, AdamWOptions()), single({once}, AdamWOptions());
    CHECK(twice.groups()[0].params.size() == 2);
    CHECK(&twice.groups()[0].params[0].impl() == &w.impl());
    set_grad(w, from_vector<double>({0.25, -1.0}));
    set_grad(once, from_vector<double>({0.25, -1.0}));
    twice.step();
    single.step();
    CHECK(w.to_vector<double>() == once.to_vector<double>());
}

TEST_CASE("nn: AdamW refuses a gradient of another dtype, device or shape, naming the parameter, before anything changes") {
    // A gradient can be set directly (as data parallelism does); the cpu step read it with the
    // parameter's element type and size: past its end, differently from run to run.
    Tensor w = zeros({4, 3}, opts(DType::F64)).requires_grad_(true), b = zeros({3}, opts(DType::F64)).requires_grad_(true);
    AdamW opt(std::vector<ParamGroup>{{{b}, 0.0}, {{w}, 0.1}}, AdamWOptions());
    set_grad(b, from_vector<double>({1.0, 2.0, 3.0}));
    const std::vector<double> b_before = host_values(b);
    auto unchanged = [&] {
        CHECK(opt.step_count() == 0);
        CHECK(host_values(b) == b_before);
        CHECK(host_values(w) == std::vector<double>(12, 0.0));
        CHECK(host_values(opt.state(b).m) == std::vector<double>(3, 0.0));
    };
    w.impl().grad = ones({4, 3}, opts(DType::F32)).impl_ptr();
    CHECK_THROWS_KIND_WITH(opt.step(), DTypeError, "AdamW: parameter 0 of group 1",
                           "expected a gradient of the parameter's dtype f64, got f32");
    unchanged();
    w.impl().grad = ones({2, 3}, opts(DType::F64)).impl_ptr();
    CHECK_THROWS_KIND_WITH(opt.step(), ShapeError, "AdamW: parameter 0 of group 1",
                           "contiguous gradient of the parameter's shape [4, 3], got [2, 3]");
    unchanged();
    w.impl().grad = ones({3, 4}, opts(DType::F64)).transpose(0, 1).impl_ptr();
    CHECK_THROWS_KIND_WITH(opt.step(), ShapeError, "AdamW: parameter 0 of group 1", "[4, 3] (not contiguous)");
    unchanged();
    if (cuda_is_available()) {
        w.impl().grad = ones({4, 3}, opts(DType::F64)).to(Device::CUDA).impl_ptr();
        CHECK_THROWS_KIND_WITH(opt.step(), DeviceError, "AdamW: parameter 0 of group 1",
                               "expected a gradient on the parameter's device cpu");
        unchanged();
    }
    w.impl().grad = ones({4, 3}, opts(DType::F64)).impl_ptr();
    opt.step();
    CHECK(opt.step_count() == 1);
    CHECK(host_values(w) != std::vector<double>(12, 0.0));
}

}  // TEST_SUITE
