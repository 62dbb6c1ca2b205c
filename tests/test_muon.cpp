// tests/test_muon.cpp: Muon (nn/optim/muon.h) and its Newton-Schulz orthogonalization against references
// written here, in f64 plain loops: newton_schulz on the cpu (f32, f64) and on CUDA (bf16, f32,
// f64), Muon's step semantics on the cpu in f64 (momentum, Nesterov, weight decay, lr_scale, the
// tall-matrix scale, ns_steps, 3-D parameters, skipped parameters, step_if_finite, bf16 masters),
// and the CUDA step against the cpu step. The CUDA cases skip where no GPU is visible. Every error
// path, param_groups_for_muon and the cross-check with PyTorch: tests/test_muon_api.cpp.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "optim_test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// ---------------------------------------------------------------- references, in f64

// KellerJordan/Muon's zeropower_via_newtonschulz5 written out in double for one row-major matrix
// g [rows, cols] (nn/optim/muon.h): X = g / (||g||_F + 1e-7), transposed when rows > cols; `steps`
// times A = X X^T, B = b A + c A A, X = a X + B X; returned in g's orientation.
std::vector<double> newton_schulz_reference(const std::vector<double>& g, int64_t rows, int64_t cols, int64_t steps) {
    const double a = 3.4445, b = -4.7750, c = 2.0315;
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, n = tall ? rows : cols;  // X is [m, n], m <= n
    double norm = 0.0;
    for (double v : g) norm += v * v;
    norm = std::sqrt(norm) + 1e-7;
    std::vector<double> x(m * n), gram(m * m), poly(m * m), next(m * n);
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) x[i * n + j] = (tall ? g[j * cols + i] : g[i * cols + j]) / norm;
    for (int64_t s = 0; s < steps; ++s) {
        for (int64_t i = 0; i < m; ++i)  // gram = X X^T
            for (int64_t k = 0; k < m; ++k) {
                double acc = 0.0;
                for (int64_t j = 0; j < n; ++j) acc += x[i * n + j] * x[k * n + j];
                gram[i * m + k] = acc;
            }
        for (int64_t i = 0; i < m; ++i)  // poly = b gram + c gram gram
            for (int64_t k = 0; k < m; ++k) {
                double acc = 0.0;
                for (int64_t j = 0; j < m; ++j) acc += gram[i * m + j] * gram[j * m + k];
                poly[i * m + k] = b * gram[i * m + k] + c * acc;
            }
        for (int64_t i = 0; i < m; ++i)  // X = a X + poly X
            for (int64_t j = 0; j < n; ++j) {
                double acc = 0.0;
                for (int64_t k = 0; k < m; ++k) acc += poly[i * m + k] * x[k * n + j];
                next[i * n + j] = a * x[i * n + j] + acc;
            }
        std::swap(x, next);
    }
    std::vector<double> out(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = 0; col < cols; ++col) out[r * cols + col] = tall ? x[col * n + r] : x[r * cols + col];
    return out;
}

// newton_schulz_reference of g [rows, cols] or of each matrix of g [n, rows, cols], from g's
// exact values; f64 on the cpu, g's shape.
Tensor newton_schulz_reference(const Tensor& g, int64_t steps) {
    const int64_t count = g.dim() == 3 ? g.size(0) : 1, rows = g.size(-2), cols = g.size(-1);
    std::vector<double> values = host_values(g), out;
    for (int64_t k = 0; k < count; ++k) {
        std::vector<double> one(values.begin() + k * rows * cols, values.begin() + (k + 1) * rows * cols);
        std::vector<double> o = newton_schulz_reference(one, rows, cols, steps);
        out.insert(out.end(), o.begin(), o.end());
    }
    return from_vector(out, g.shape());
}

// Muon's step (nn/optim/muon.h) in double for one parameter taken as the matrix [rows, cols], written
// as torch writes it: buf.lerp_(g, 1 - momentum); u = g.lerp(buf, momentum) or buf;
// p = p (1 - lr_g wd) - lr_g max(1, rows / cols)^0.5 newton_schulz(u).
struct MuonReference {
    std::vector<double> w, buf;
    int64_t rows, cols;
    MuonReference(const Tensor& p) : w(host_values(p)), buf(w.size(), 0.0), rows(p.size(0)), cols(p.numel() / p.size(0)) {}
    void step(const std::vector<double>& g, const MuonOptions& o, double lr, double weight_decay) {
        std::vector<double> u(w.size());
        for (size_t k = 0; k < w.size(); ++k) {
            buf[k] += (1 - o.momentum) * (g[k] - buf[k]);
            u[k] = o.nesterov ? g[k] + o.momentum * (buf[k] - g[k]) : buf[k];
        }
        std::vector<double> orth = newton_schulz_reference(u, rows, cols, o.ns_steps);
        const double scale = std::sqrt(std::max(1.0, double(rows) / double(cols)));
        for (size_t k = 0; k < w.size(); ++k) w[k] = w[k] * (1 - lr * weight_decay) - lr * scale * orth[k];
    }
};

// ---------------------------------------------------------------- helpers

// Copies of params, detached, on `device` in `dtype`, requiring grad.
std::vector<Tensor> copies(const std::vector<Tensor>& params, Device device, std::optional<DType> dtype = {}) {
    std::vector<Tensor> out;
    for (const Tensor& p : params)
        out.push_back(p.detach().to(dtype.value_or(p.dtype())).to(device).clone().requires_grad_(true));
    return out;
}

// The worst normwise error seen by a test case, for its closing message.
struct WorstError {
    double error = 0.0;
    std::string where;
    void see(double e, const std::string& label) {
        if (!(e <= error)) {
            error = e;
            where = label;
        }
    }
};

// The matrices of the newton_schulz tests: wide, tall, square, and batches [n, rows, cols] of
// wide and tall matrices.
const std::vector<Shape> kNewtonSchulzShapes = {{16, 48}, {40, 12}, {24, 24}, {3, 10, 20}, {2, 20, 6}};

}  // namespace

TEST_SUITE("muon") {

// ---------------------------------------------------------------- newton_schulz on the cpu

TEST_CASE("muon: newton_schulz on the cpu matches the f64 reference iteration, in f32 and f64") {
    // Measured worst normwise errors (x86-64, -march=native): f32 8.4e-7 ([40, 12]), f64 1.8e-15;
    // the bounds are kNewtonSchulzF32 and kNewtonSchulzF64.
    manual_seed(101);
    WorstError worst32, worst64;
    for (const Shape& shape : kNewtonSchulzShapes)
        for (DType dtype : {DType::F32, DType::F64}) {
            CAPTURE(shape_str(shape));
            CAPTURE(std::string(dtype_name(dtype)));
            Tensor g = randn(shape, opts(dtype));
            Tensor out = newton_schulz(g);
            CHECK(out.shape() == g.shape());
            CHECK(out.dtype() == dtype);
            CHECK(out.device() == Device::CPU);
            const double error = normwise_error(out, newton_schulz_reference(g, 5));
            (dtype == DType::F32 ? worst32 : worst64).see(error, shape_str(shape));
            CHECK_NORMWISE(out, newton_schulz_reference(g, 5), dtype == DType::F32 ? kNewtonSchulzF32 : kNewtonSchulzF64);
            // Other step counts follow the same iteration.
            CHECK_NORMWISE(newton_schulz(g, 2), newton_schulz_reference(g, 2),
                           dtype == DType::F32 ? kNewtonSchulzF32 : kNewtonSchulzF64);
        }
    MESSAGE("newton_schulz on the cpu, worst normwise error: f32 " << worst32.error << " (" << worst32.where
                                                                    << "), f64 " << worst64.error << " ("
                                                                    << worst64.where << ")");
}

TEST_CASE("muon: newton_schulz orthogonalizes each matrix of a batch alone, on any thread count, outside the graph") {
    manual_seed(102);
    for (const Shape& shape : {Shape{3, 10, 20}, Shape{2, 20, 6}}) {
        CAPTURE(shape_str(shape));
        Tensor g = randn(shape);
        Tensor batch;
        {
            ThreadCountGuard threads(2);
            batch = newton_schulz(g);
        }
        {
            ThreadCountGuard threads(1);  // the matrices split over threads or not: the same bits
            CHECK(same_bits(newton_schulz(g), batch));
        }
        for (int64_t k = 0; k < shape[0]; ++k) {
            Tensor one = g.narrow(0, k, 1).reshape({shape[1], shape[2]});
            CHECK(same_bits(newton_schulz(one), batch.narrow(0, k, 1).reshape({shape[1], shape[2]})));
        }
    }
    // A bf16 input is computed in f32 and rounded once.
    Tensor g = randn({12, 20}).to(DType::BF16);
    Tensor out = newton_schulz(g);
    CHECK(out.dtype() == DType::BF16);
    CHECK(same_bits(out, newton_schulz(g.to(DType::F32)).to(DType::BF16)));
    // A non-contiguous input (a transposed view) is read as the matrix it shows.
    Tensor wide = randn({8, 14});
    CHECK(same_bits(newton_schulz(wide.transpose(0, 1)), newton_schulz(wide.transpose(0, 1).contiguous())));
    // A leaf that requires grad: the result is not connected to the graph, the input unchanged.
    Tensor leaf_g = randn({6, 9}).requires_grad_(true);
    std::vector<double> before = host_values(leaf_g);
    Tensor o = newton_schulz(leaf_g);
    CHECK_FALSE(o.requires_grad());
    CHECK(o.grad_fn() == nullptr);
    CHECK(host_values(leaf_g) == before);
}

TEST_CASE("muon: newton_schulz keeps the input's singular vectors and brings its singular values near 1") {
    // g = U S V^T gives X = U f(S) V^T with f the quintic applied 5 times, so g^T X = V S f(S) V^T
    // and X g^T = U f(S) S U^T are symmetric. For x = sigma / ||g||_F >= 0.002, f^5(x) lies in
    // [0.68, 1.21] (the quintic's band, computed from the coefficients); a random 16 x 48 matrix has
    // every sigma above 0.05 ||g||_F, so the diagonal of X X^T = U f(S)^2 U^T, a weighted average
    // of the f(sigma)^2, lies in [0.68^2, 1.21^2].
    manual_seed(103);
    Tensor g = randn({16, 48}, opts(DType::F64));
    Tensor x = newton_schulz(g);
    Tensor gtx = matmul(g.transpose(0, 1), x), xgt = matmul(x, g.transpose(0, 1));
    CHECK_NORMWISE(gtx, gtx.transpose(0, 1).contiguous(), 1e-12);
    CHECK_NORMWISE(xgt, xgt.transpose(0, 1).contiguous(), 1e-12);
    std::vector<double> xxt = host_values(matmul(x, x.transpose(0, 1)));
    double lowest = INFINITY, highest = 0.0;
    for (int64_t i = 0; i < 16; ++i) {
        lowest = std::min(lowest, xxt[i * 16 + i]);
        highest = std::max(highest, xxt[i * 16 + i]);
    }
    INFO("diagonal of X X^T in [" << lowest << ", " << highest << "]");
    CHECK(lowest >= 0.68 * 0.68);
    CHECK(highest <= 1.21 * 1.21);
}

// ---------------------------------------------------------------- newton_schulz on CUDA

TEST_CASE("muon: newton_schulz on CUDA matches the f64 reference in bf16, f32 and f64") {
    REQUIRE_CUDA_OR_SKIP();
    // bf16 and f32 inputs both iterate in bf16 products (f32 accumulation), so both get
    // kNewtonSchulzBF16; f64 iterates in f64. Measured worst normwise errors on an H200: bf16
    // 2.1e-2, f32 2.2e-2 (both [70, 8, 12]), f64 1.0e-14 ([200, 72]); MESSAGE prints them.
    manual_seed(104);
    std::vector<Shape> shapes = kNewtonSchulzShapes;
    shapes.push_back({70, 8, 12});  // more matrices than one launch takes (kMuonMatricesPerLaunch, 64)
    shapes.push_back({96, 80});     // more than one 4096-element chunk, with a tail
    shapes.push_back({200, 72});    // tall, several chunks
    WorstError worst[3];
    const DType dtypes[] = {DType::BF16, DType::F32, DType::F64};
    for (const Shape& shape : shapes)
        for (int d = 0; d < 3; ++d) {
            const DType dtype = dtypes[d];
            CAPTURE(shape_str(shape));
            CAPTURE(std::string(dtype_name(dtype)));
            Tensor g = randn(shape).to(dtype);
            Tensor out = newton_schulz(g.to(Device::CUDA));
            CHECK(out.device() == Device::CUDA);
            CHECK(out.dtype() == dtype);
            CHECK(out.shape() == shape);
            Tensor ref = newton_schulz_reference(g, 5);
            worst[d].see(normwise_error(out, ref), shape_str(shape));
            CHECK_NORMWISE(out, ref, dtype == DType::F64 ? kNewtonSchulzF64 : kNewtonSchulzBF16);
            if (dtype == DType::F64) CHECK_NORMWISE(newton_schulz(g.to(Device::CUDA), 3), newton_schulz_reference(g, 3), kNewtonSchulzF64);
        }
    // A non-contiguous CUDA input is read as the matrix it shows.
    Tensor wide = randn({8, 14}).to(Device::CUDA);
    CHECK(same_bits(newton_schulz(wide.transpose(0, 1)), newton_schulz(wide.transpose(0, 1).contiguous())));
    MESSAGE("newton_schulz on CUDA, worst normwise error: bf16 " << worst[0].error << " (" << worst[0].where
                                                                  << "), f32 " << worst[1].error << " ("
                                                                  << worst[1].where << "), f64 " << worst[2].error
                                                                  << " (" << worst[2].where << ")");
}

// ---------------------------------------------------------------- the step on the cpu, in f64

TEST_CASE("muon: the step follows its formulas in f64: momentum, Nesterov, weight decay, lr_scale, shapes") {
    // Against MuonReference, four steps, Nesterov on and off: a wide and a square matrix in a group
    // with weight decay, a tall one (scale max(1, rows / cols)^0.5 = sqrt(3)) and a 3-D one (taken
    // as [3, 8]) in a group with lr_scale 0.5 and no decay, ns_steps 3, set_lr between steps; a
    // parameter never given a gradient, and one without a gradient at the third step, are skipped.
    // The updates within kNewtonSchulzF64 normwise (measured worst 2.8e-15).
    for (bool nesterov : {true, false}) {
        CAPTURE(nesterov);
        manual_seed(nesterov ? 105 : 106);
        MuonOptions o;
        o.lr = 0.05;
        o.momentum = 0.9;
        o.nesterov = nesterov;
        o.ns_steps = 3;
        Tensor wide = randn({3, 5}, opts(DType::F64)).requires_grad_(true);
        Tensor square = randn({4, 4}, opts(DType::F64)).requires_grad_(true);
        Tensor idle = randn({2, 3}, opts(DType::F64)).requires_grad_(true);
        Tensor tall = randn({6, 2}, opts(DType::F64)).requires_grad_(true);
        Tensor cube = randn({3, 2, 4}, opts(DType::F64)).requires_grad_(true);
        std::vector<Tensor> params = {wide, square, idle, tall, cube};
        const double weight_decay[] = {0.1, 0.1, 0.1, 0.0, 0.0}, lr_scale[] = {1.0, 1.0, 1.0, 0.5, 0.5};
        Muon opt(std::vector<ParamGroup>{{{wide, square, idle}, 0.1}, {{tall, cube}, 0.0, 0.5}}, o);
        CHECK(opt.groups().size() == 2);
        CHECK(opt.groups()[1].lr_scale == 0.5);
        std::vector<MuonReference> ref(params.begin(), params.end());
        std::vector<Tensor> initial;
        for (const Tensor& p : params) initial.push_back(p.detach().clone());
        const std::vector<double> idle_before = host_values(idle);
        for (int t = 1; t <= 4; ++t) {
            if (t == 4) opt.set_lr(0.02);
            std::vector<uint64_t> versions;
            for (size_t i = 0; i < params.size(); ++i) {
                const bool skipped = i == 2 || (t == 3 && i == 1);
                versions.push_back(params[i].storage()->version());
                if (skipped) {
                    params[i].zero_grad();
                    continue;
                }
                Tensor g = randn(params[i].shape(), opts(DType::F64));
                set_grad(params[i], g);
                ref[i].step(host_values(g), o, opt.lr() * lr_scale[i], weight_decay[i]);
            }
            std::vector<double> square_before = host_values(square), square_buf = host_values(opt.state(square).momentum_buffer);
            opt.step();
            CHECK(opt.step_count() == t);
            for (size_t i = 0; i < params.size(); ++i) {
                const bool skipped = i == 2 || (t == 3 && i == 1);
                CAPTURE(i);
                CHECK((params[i].storage()->version() > versions[i]) == !skipped);  // in place, bumped
            }
            if (t == 3) {  // square had no gradient: unchanged, and so is its buffer
                CHECK(host_values(square) == square_before);
                CHECK(host_values(opt.state(square).momentum_buffer) == square_buf);
            }
        }
        CHECK(opt.lr() == 0.02);
        for (size_t i = 0; i < params.size(); ++i) {
            CAPTURE(i);
            CAPTURE(shape_str(params[i].shape()));
            const Muon::ParamState& st = opt.state(params[i]);
            CHECK(st.momentum_buffer.dtype() == DType::F64);
            CHECK(st.momentum_buffer.shape() == params[i].shape());
            CHECK_FALSE(st.master.defined());
            CHECK_CLOSE(st.momentum_buffer, from_vector(ref[i].buf, params[i].shape()), tolerance(DType::F64));
            // The updates, normwise: the parameters' own values would hide the orthogonalization's error.
            if (i != 2)
                CHECK_NORMWISE(difference(params[i], initial[i]),
                               difference(ref[i].w, host_values(initial[i]), params[i].shape()), kNewtonSchulzF64);
            CHECK_CLOSE(params[i], from_vector(ref[i].w, params[i].shape()), tolerance(DType::F64));
        }
        CHECK(host_values(idle) == idle_before);
        CHECK(host_values(opt.state(idle).momentum_buffer) == std::vector<double>(6, 0.0));
    }
}

TEST_CASE("muon: a bf16 parameter keeps an f32 master copy that is updated, and is its rounding") {
    // The master against MuonReference run from the bf16 parameter's and gradients' exact values:
    // the cpu orthogonalizes in f32, so the updates (master minus its start) within
    // kNewtonSchulzF32 normwise (measured worst 1.0e-6); the f32 buffer within tolerance(f32).
    manual_seed(107);
    MuonOptions o;
    o.lr = 0.1;
    o.weight_decay = 0.05;
    Tensor wide = randn({8, 12}).to(DType::BF16).requires_grad_(true);
    Tensor tall = randn({12, 4}).to(DType::BF16).requires_grad_(true);
    const std::vector<Tensor> params = {wide, tall};
    Muon opt(params, o);  // one group of the options' weight decay, lr_scale 1
    CHECK(opt.groups()[0].weight_decay == 0.05);
    CHECK(opt.groups()[0].lr_scale == 1.0);
    std::vector<MuonReference> ref(params.begin(), params.end());
    for (const Tensor& p : params) {
        const Muon::ParamState& st = opt.state(p);
        REQUIRE(st.master.defined());
        CHECK(st.master.dtype() == DType::F32);
        CHECK(st.momentum_buffer.dtype() == DType::F32);
        CHECK(same_bits(st.master, p.to(DType::F32)));  // the master starts as the parameter, exactly
    }
    std::vector<Tensor> initial = copies(params, Device::CPU, DType::F32);
    for (int t = 1; t <= 3; ++t) {
        for (size_t i = 0; i < params.size(); ++i) {
            Tensor g = randn(params[i].shape()).to(DType::BF16);
            set_grad(params[i], g);
            ref[i].step(host_values(g), o, o.lr, o.weight_decay);
        }
        opt.step();
    }
    for (size_t i = 0; i < params.size(); ++i) {
        CAPTURE(shape_str(params[i].shape()));
        const Muon::ParamState& st = opt.state(params[i]);
        CHECK(params[i].dtype() == DType::BF16);
        CHECK(same_bits(params[i], st.master.to(DType::BF16)));  // the parameter is its master, rounded
        CHECK_CLOSE(st.momentum_buffer, from_vector(ref[i].buf, params[i].shape()).to(DType::F32), tolerance(DType::F32));
        CHECK_NORMWISE(difference(st.master, initial[i]), difference(ref[i].w, host_values(initial[i]), params[i].shape()),
                       kNewtonSchulzF32);
    }
}

TEST_CASE("muon: step_if_finite steps as step() on a finite norm and changes nothing on a NaN or infinite one") {
    manual_seed(108);
    std::vector<Tensor> a = {randn({6, 10}, opts(DType::F64)).requires_grad_(true),
                             randn({10, 4}).requires_grad_(true),
                             randn({5, 5}).to(DType::BF16).requires_grad_(true)};
    std::vector<Tensor> b = copies(a, Device::CPU);
    MuonOptions o;
    o.weight_decay = 0.1;
    Muon opt_a(a, o), opt_b(b, o);
    for (size_t i = 0; i < a.size(); ++i) {
        Tensor g = randn(a[i].shape()).to(a[i].dtype());
        set_grad(a[i], g);
        set_grad(b[i], g);
    }
    opt_a.step();
    opt_b.step_if_finite(full({}, 2.5, opts(DType::F64)));
    for (size_t i = 0; i < a.size(); ++i) {
        CAPTURE(i);
        CHECK(same_bits(a[i], b[i]));
        CHECK(same_bits(opt_a.state(a[i]).momentum_buffer, opt_b.state(b[i]).momentum_buffer));
    }
    for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
        CAPTURE(bad);
        std::vector<Tensor> before = copies(b, Device::CPU);
        std::vector<uint64_t> versions;
        for (const Tensor& p : b) versions.push_back(p.storage()->version());
        opt_b.step_if_finite(full({1}, bad));  // f32, one element
        for (size_t i = 0; i < b.size(); ++i) {
            CAPTURE(i);
            const Muon::ParamState &sa = opt_a.state(a[i]), &sb = opt_b.state(b[i]);
            CHECK(same_bits(b[i], before[i]));
            CHECK(same_bits(sb.momentum_buffer, sa.momentum_buffer));
            if (sa.master.defined()) CHECK(same_bits(sb.master, sa.master));
        }
    }
    CHECK(opt_b.step_count() == 4);  // skipped steps count, as AdamW::step_if_finite's
    // A finite norm after the skips steps again, as step() does.
    opt_a.step();
    opt_b.step_if_finite(full({1, 1}, 1e30, opts(DType::BF16)));
    for (size_t i = 0; i < a.size(); ++i) CHECK(same_bits(a[i], b[i]));
}

TEST_CASE("muon: zero_grad drops every gradient, and a step without gradients changes nothing") {
    manual_seed(109);
    Tensor p = randn({4, 6}).requires_grad_(true), q = randn({6, 4}).requires_grad_(true);
    Muon opt(std::vector<ParamGroup>{{{p}, 0.1}, {{q}, 0.0, 2.0}}, MuonOptions());
    set_grad(p, randn({4, 6}));
    set_grad(q, randn({6, 4}));
    opt.zero_grad();
    CHECK_FALSE(p.grad().defined());
    CHECK_FALSE(q.grad().defined());
    Tensor p0 = p.detach().clone(), q0 = q.detach().clone();
    const uint64_t version = p.storage()->version();
    opt.step();
    CHECK(same_bits(p, p0));
    CHECK(same_bits(q, q0));
    CHECK(p.storage()->version() == version);
    CHECK(same_bits(opt.state(p).momentum_buffer, zeros({4, 6})));
    CHECK(opt.step_count() == 1);
    opt.set_step_count(41);  // what a checkpoint restores
    CHECK(opt.step_count() == 41);
}

// ---------------------------------------------------------------- the step on CUDA

TEST_CASE("muon: the CUDA step matches the cpu f32 step for f32 and bf16 parameters, and the f64 step in f64") {
    REQUIRE_CUDA_OR_SKIP();
    // Parameters of several classes (Note [Muon on CUDA]): 70 matrices [4, 6] in one group (two
    // launches of kMuonMatricesPerLaunch), a wide [24, 40] and a tall [96, 20] matrix (several
    // 4096-element chunks), a 3-D [6, 4, 5] one (as [6, 20]); in two groups (weight decay 0.1;
    // none and lr_scale 0.5). Three steps; the cpu steps f32 copies (f64 for f64) of the same
    // values with the same gradients. The updates (parameter minus its start) compared normwise:
    // f32 and bf16 parameters orthogonalize in bf16 on CUDA (kNewtonSchulzBF16; measured worst on
    // an H200 2.7e-2 for f32, 2.2e-2 for bf16, both [4, 6]), f64 in f64 (4.8e-15).
    // The momentum buffers are elementwise, as on the cpu (tolerance of their dtype).
    std::vector<Shape> shapes(70, Shape{4, 6});
    shapes.insert(shapes.end(), {{24, 40}, {96, 20}, {6, 4, 5}, {24, 40}});
    WorstError worst[3];
    const DType dtypes[] = {DType::F32, DType::BF16, DType::F64};
    for (int d = 0; d < 3; ++d) {
        const DType dtype = dtypes[d];
        CAPTURE(std::string(dtype_name(dtype)));
        manual_seed(110 + d);
        std::vector<Tensor> gpu;
        for (const Shape& s : shapes) gpu.push_back(randn(s).to(dtype).to(Device::CUDA).requires_grad_(true));
        const DType cpu_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
        std::vector<Tensor> cpu = copies(gpu, Device::CPU, cpu_dtype);
        std::vector<Tensor> initial = copies(cpu, Device::CPU);
        auto groups = [](const std::vector<Tensor>& ps) {
            std::vector<ParamGroup> g = {{{}, 0.1}, {{}, 0.0, 0.5}};
            for (size_t i = 0; i < ps.size(); ++i) g[i < 70 ? 0 : i % 2].params.push_back(ps[i]);
            return g;
        };
        MuonOptions o;
        o.lr = 0.05;
        Muon opt_gpu(groups(gpu), o), opt_cpu(groups(cpu), o);
        for (int t = 0; t < 3; ++t) {
            for (size_t i = 0; i < gpu.size(); ++i) {
                Tensor g = randn(gpu[i].shape()).to(dtype);  // exact in the cpu copy's dtype too
                set_grad(gpu[i], g.to(Device::CUDA));
                set_grad(cpu[i], g.to(cpu_dtype));
            }
            opt_gpu.step();
            opt_cpu.step();
        }
        const double tol = dtype == DType::F64 ? kNewtonSchulzF64 : kNewtonSchulzBF16;
        for (size_t i = 0; i < gpu.size(); ++i) {
            CAPTURE(i);
            CAPTURE(shape_str(gpu[i].shape()));
            const Muon::ParamState &sg = opt_gpu.state(gpu[i]), &sc = opt_cpu.state(cpu[i]);
            REQUIRE(gpu[i].device() == Device::CUDA);
            CHECK(sg.momentum_buffer.device() == Device::CUDA);
            CHECK_CLOSE(sg.momentum_buffer.to(Device::CPU), sc.momentum_buffer, tolerance(cpu_dtype));
            Tensor value = gpu[i];
            if (dtype == DType::BF16) {
                CHECK(same_bits(gpu[i], sg.master.to(DType::BF16)));
                value = sg.master;
            }
            const double error = normwise_error(difference(value, initial[i]), difference(cpu[i], initial[i]));
            worst[d].see(error, shape_str(gpu[i].shape()));
            CHECK_NORMWISE(difference(value, initial[i]), difference(cpu[i], initial[i]), tol);
        }
        // A NaN norm on the device: no parameter, master or buffer moves; the count advances.
        std::vector<Tensor> before = copies(gpu, Device::CUDA), buffers, masters;
        for (const Tensor& p : gpu) {
            buffers.push_back(opt_gpu.state(p).momentum_buffer.clone());
            if (dtype == DType::BF16) masters.push_back(opt_gpu.state(p).master.clone());
        }
        for (size_t i = 0; i < gpu.size(); ++i) set_grad(gpu[i], randn(gpu[i].shape()).to(dtype).to(Device::CUDA));
        opt_gpu.step_if_finite(full({}, NAN, TensorOptions().device(Device::CUDA)));
        for (size_t i = 0; i < gpu.size(); ++i) {
            CAPTURE(i);
            CHECK(same_bits(gpu[i], before[i]));
            CHECK(same_bits(opt_gpu.state(gpu[i]).momentum_buffer, buffers[i]));
            if (dtype == DType::BF16) CHECK(same_bits(opt_gpu.state(gpu[i]).master, masters[i]));
        }
        CHECK(opt_gpu.step_count() == 4);
    }
    MESSAGE("Muon on CUDA against the cpu, worst normwise error of the updates: f32 "
            << worst[0].error << " (" << worst[0].where << "), bf16 " << worst[1].error << " (" << worst[1].where
            << "), f64 " << worst[2].error << " (" << worst[2].where << ")");
}

}  // TEST_SUITE("muon")
