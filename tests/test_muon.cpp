// tests/test_muon.cpp: Muon (nn/optim/muon.h) and its Newton-Schulz orthogonalization against references
// written here, in f64 plain loops: newton_schulz on the cpu (f32, f64) and on CUDA (bf16, f32,
// f64), Muon's step semantics on the cpu in f64 (momentum, Nesterov, weight decay, lr_scale, the
// tall-matrix scale, ns_steps, 3-D parameters, skipped parameters, step_if_finite, bf16 masters),
// the CUDA step against the cpu step, every error path of nn/optim/muon.h, param_groups_for_muon on each
// GPT preset, and a cross-check with PyTorch (tests/muon_reference.py: KellerJordan/Muon's
// algorithm with torch ops, and torch.optim.Muon where the interpreter's torch has it).
// The CUDA cases skip where no GPU is visible; the PyTorch case where torch cannot be imported.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace fs = std::filesystem;
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

// The values of t on the host, converted exactly to f64.
std::vector<double> host_values(const Tensor& t) { return t.to(Device::CPU).to(DType::F64).to_vector<double>(); }

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

// Sets p's gradient to g (same shape, dtype and device): backward of sum(p * g), exact in every dtype.
void set_grad(Tensor p, const Tensor& g) {
    p.zero_grad();
    sum(mul(p, g)).backward();
}

// Whether a and b hold the same values bit for bit (NaNs equal to NaNs), whatever their device.
bool same_bits(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
    std::vector<double> va = host_values(a), vb = host_values(b);
    for (size_t i = 0; i < va.size(); ++i)
        if (!(va[i] == vb[i] || (std::isnan(va[i]) && std::isnan(vb[i]))) || std::signbit(va[i]) != std::signbit(vb[i]))
            return false;
    return true;
}

// a - b elementwise in f64 on the cpu: a step's update, compared normwise (the parameter itself
// would hide the update's error behind its much larger values).
Tensor difference(const Tensor& a, const Tensor& b) {
    std::vector<double> va = host_values(a), vb = host_values(b);
    for (size_t i = 0; i < va.size(); ++i) va[i] -= vb[i];
    return from_vector(va, a.shape());
}
Tensor difference(const std::vector<double>& a, const std::vector<double>& b, const Shape& shape) {
    std::vector<double> d(a.size());
    for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
    return from_vector(d, shape);
}

// Copies of params, detached, on `device` in `dtype`, requiring grad.
std::vector<Tensor> copies(const std::vector<Tensor>& params, Device device, std::optional<DType> dtype = {}) {
    std::vector<Tensor> out;
    for (const Tensor& p : params)
        out.push_back(p.detach().to(dtype.value_or(p.dtype())).to(device).clone().requires_grad_(true));
    return out;
}

// fn() must throw exactly Kind with every one of `words` in its message, and leave the cpu
// allocator's bytes where they were (tests/test_errors.cpp's rule).
template <class Kind, class F>
void check_error(F&& fn, const std::vector<std::string>& words,
                 std::source_location where = std::source_location::current()) {
    const int64_t before = memory_stats(Device::CPU).allocated_bytes;
    check_throws<Kind>(fn, words, KindMatch::Exactly, where);
    CHECK(memory_stats(Device::CPU).allocated_bytes == before);
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

// Normwise tolerances of newton_schulz against newton_schulz_reference (measured worst in the
// comments of the test cases): the cpu computes in f32 (f64 for f64) through Eigen; CUDA in bf16
// products with f32 accumulation, every iterate rounded to bf16 (f64 for f64). Five bf16
// iterations, which amplify the small singular directions, leave a few percent: on an H200,
// newton_schulz 2.2e-2 and a Muon update 2.7e-2 at worst (the small matrices, [8, 12] and [4, 6]);
// a simulation of nn/optim/muon.cu's roundings in PyTorch over 20 seeds per shape gave up to 3.5e-2
// ([24, 6]), and KellerJordan/Muon's own bf16 iteration up to 7e-2 ([4, 6]).
constexpr double kNewtonSchulzF32 = 1e-5;
constexpr double kNewtonSchulzF64 = 1e-12;
constexpr double kNewtonSchulzBF16 = 4e-2;
// Two bf16 orthogonalizations that round at different points (ours on CUDA against PyTorch's in
// bf16): measured worst 3.5e-2 on an H200.
constexpr double kTwoNewtonSchulzBF16 = 6e-2;

// The matrices of the newton_schulz tests: wide, tall, square, and batches [n, rows, cols] of
// wide and tall matrices.
const std::vector<Shape> kNewtonSchulzShapes = {{16, 48}, {40, 12}, {24, 24}, {3, 10, 20}, {2, 20, 6}};

// ---------------------------------------------------------------- PyTorch

std::string number(double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
}

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

// ---------------------------------------------------------------- errors

TEST_CASE("muon: every option and group value out of range is refused, naming Muon, the value and the range") {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    Tensor p = ones({3, 2}).requires_grad_(true);
    for (double lr : {-1.0, inf, nan}) {
        MuonOptions o;
        o.lr = lr;
        check_error<Error>([&] { Muon({p}, o); }, {"Muon: expected lr >= 0 and finite, got lr"});
    }
    for (double momentum : {-0.1, 1.0, nan}) {
        MuonOptions o;
        o.momentum = momentum;
        check_error<Error>([&] { Muon({p}, o); }, {"Muon: expected momentum in [0, 1), got momentum"});
    }
    for (int64_t steps : {int64_t(0), int64_t(101), int64_t(-3)}) {
        MuonOptions o;
        o.ns_steps = steps;
        check_error<Error>([&] { Muon({p}, o); },
                           {"Muon: expected ns_steps in [1, 100], got ns_steps " + std::to_string(steps)});
    }
    for (double wd : {-0.1, inf, nan}) {
        MuonOptions o;
        o.weight_decay = wd;
        check_error<Error>([&] { Muon({p}, o); }, {"Muon: expected weight_decay >= 0 and finite, got weight_decay"});
        check_error<Error>([&] { Muon(std::vector<ParamGroup>{{{p}, 0.0}, {{}, wd}}, MuonOptions()); },
                           {"Muon: expected group 1's weight_decay >= 0 and finite, got weight_decay"});
    }
    for (double scale : {-1.0, inf, nan})
        check_error<Error>([&] { Muon(std::vector<ParamGroup>{{{p}, 0.0, scale}}, MuonOptions()); },
                           {"Muon: expected group 0's lr_scale >= 0 and finite, got lr_scale"});
    // The edges allowed: lr 0, momentum 0, ns_steps 1 and 100, lr_scale 0.
    MuonOptions edge;
    edge.lr = 0.0;
    edge.momentum = 0.0;
    edge.ns_steps = 1;
    CHECK_NOTHROW(Muon(std::vector<ParamGroup>{{{p}, 0.0, 0.0}}, edge));
    edge.ns_steps = 100;
    CHECK_NOTHROW(Muon({p}, edge));
    // set_lr by the constructor's rule; the lr is left as it was.
    Muon opt({p}, MuonOptions());
    for (double lr : {-1.0, inf, nan}) check_error<Error>([&] { opt.set_lr(lr); }, {"Muon::set_lr: expected lr >= 0 and finite, got lr"});
    CHECK(opt.lr() == MuonOptions().lr);
    check_error<Error>([&] { opt.set_step_count(-1); }, {"Muon::set_step_count", "t >= 0", "got -1"});
    CHECK(opt.step_count() == 0);
}

TEST_CASE("muon: parameters that are not matrices, leaves requiring grad, or that sit in two groups are refused") {
    Tensor p = ones({3, 2}).requires_grad_(true);
    check_error<Error>([&] { Muon({ones({3}).requires_grad_(true)}, MuonOptions()); },
                       {"Muon", "at least 2 dimensions", "vectors and scalars belong to AdamW",
                        "parameter 0 of group 0 of shape [3]"});
    check_error<Error>([&] { Muon({p, full({}, 1.0).requires_grad_(true)}, MuonOptions()); },
                       {"Muon", "at least 2 dimensions", "parameter 1 of group 0 of shape []"});
    check_error<Error>([&] { Muon({mul(p, p)}, MuonOptions()); }, {"Muon", "leaf", "got a non-leaf"});
    check_error<Error>([&] { Muon({ones({3, 2})}, MuonOptions()); }, {"Muon", "require grad", "got one that does not"});
    check_error<Error>([&] { Muon({Tensor()}, MuonOptions()); }, {"Muon", "got an undefined tensor"});
    Tensor transposed = ones({2, 3}).transpose(0, 1).requires_grad_(true);
    check_error<Error>([&] { Muon({transposed}, MuonOptions()); }, {"Muon", "contiguous", "got a non-contiguous one"});
    Tensor q = ones({2, 2}).requires_grad_(true);
    check_error<Error>([&] { Muon(std::vector<ParamGroup>{{{q, p}, 0.1}, {{p}, 0.0}}, MuonOptions()); },
                       {"Muon", "parameter 0 of group 1", "parameter 1 of group 0", "more than one parameter group"});
    // Listed twice in one group: kept once, at its first place.
    Muon twice({p, q, p}, MuonOptions());
    REQUIRE(twice.groups()[0].params.size() == 2);
    CHECK(&twice.groups()[0].params[0].impl() == &p.impl());
    // state() of a tensor that is not a parameter (an equal copy is not one either).
    check_error<Error>([&] { twice.state(p.detach().clone()); }, {"Muon::state", "[3, 2]", "not a parameter of this optimizer"});
    check_error<Error>([&] { twice.state(Tensor()); }, {"Muon::state", "undefined"});
}

TEST_CASE("muon: a step with a changed parameter, a gradient of another shape or a bad norm throws and changes nothing") {
    manual_seed(112);
    Linear first(3, 4, false), second(4, 5, false);  // weights [4, 3] and [5, 4]
    MuonOptions o;
    o.weight_decay = 0.1;
    Muon opt(std::vector<ParamGroup>{{{first.weight}, 0.1}, {{second.weight}, 0.0}}, o);
    set_grad(first.weight, randn({4, 3}));
    const std::vector<double> before = host_values(first.weight);
    const uint64_t version = first.weight.storage()->version();
    auto unchanged = [&] {
        CHECK(host_values(first.weight) == before);
        CHECK(first.weight.storage()->version() == version);
        CHECK(same_bits(opt.state(first.weight).momentum_buffer, zeros({4, 3})));
        CHECK(opt.step_count() == 0);
    };
    // A gradient of another shape (set directly: backward cannot make one).
    second.weight.impl().grad = randn({4, 5}).impl_ptr();
    check_error<ShapeError>([&] { opt.step(); },
                            {"Muon: parameter 0 of group 1", "gradient of the parameter's shape [5, 4]", "got [4, 5]"});
    unchanged();
    // A gradient of another dtype: the step read it with the parameter's element type.
    second.weight.impl().grad = randn({5, 4}, opts(DType::F64)).impl_ptr();
    check_error<DTypeError>([&] { opt.step(); },
                            {"Muon: parameter 0 of group 1", "gradient of the parameter's dtype f32, got f64"});
    unchanged();
    // Bad norms: undefined, two elements, integer.
    second.weight.zero_grad();
    check_error<Error>([&] { opt.step_if_finite(Tensor()); }, {"Muon::step_if_finite", "expected a gradient norm", "undefined"});
    check_error<ShapeError>([&] { opt.step_if_finite(zeros({2})); }, {"Muon::step_if_finite", "one-element norm", "[2]"});
    check_error<DTypeError>([&] { opt.step_if_finite(from_vector<int64_t>({1})); },
                            {"Muon::step_if_finite", "floating norm", "got i64"});
    unchanged();
    // A parameter converted after the optimizer was built: its f32 state no longer fits.
    second.to(Device::CPU, DType::F64);
    set_grad(second.weight, randn({5, 4}, opts(DType::F64)));
    check_error<DTypeError>([&] { opt.step(); }, {"Muon", "dtype it had when the optimizer was built", "(state f32)",
                                                  "got f64", "after Module::to"});
    unchanged();
}

TEST_CASE("muon: an empty matrix is left as it is, and the others step") {
    // [0, N] divided by zero in its matrix shape (SIGFPE): run in a child process.
    for (const Shape& shape : {Shape{0, 4}, Shape{4, 0}, Shape{0, 2, 3}}) {
        INFO(shape_str(shape));
        const ChildOutcome o = outcome_in_child([&] {
            Tensor empty_p = zeros(shape).requires_grad_(true), w = ones({3, 2}).requires_grad_(true);
            Muon opt({empty_p, w}, MuonOptions());
            empty_p.impl().grad = zeros(shape).impl_ptr();
            w.impl().grad = ones({3, 2}).impl_ptr();
            opt.step();
            if (empty_p.numel() != 0 || opt.step_count() != 1) throw Error("the empty parameter changed");
            if (w.to_vector<float>() == std::vector<float>(6, 1.0f)) throw Error("the matrix beside it did not step");
        });
        CAPTURE(o.message);
        CHECK(o.how == ChildOutcome::Returned);
    }
}

TEST_CASE("muon: a parameter moved to another device after the optimizer was built is refused") {
    REQUIRE_CUDA_OR_SKIP();
    Linear layer(3, 4, false);
    Muon opt({layer.weight}, MuonOptions());
    layer.to(Device::CUDA, DType::F32);
    set_grad(layer.weight, randn({4, 3}).to(Device::CUDA));
    check_throws<DeviceError>([&] { opt.step(); }, {"Muon", "expected the parameter on cpu", "moved after the optimizer was built"},
                              KindMatch::Exactly);
    CHECK(opt.step_count() == 0);
    // And a norm elsewhere than the parameters.
    Linear gpu_layer(3, 4, false);
    gpu_layer.to(Device::CUDA, DType::F32);
    Muon gpu_opt({gpu_layer.weight}, MuonOptions());
    set_grad(gpu_layer.weight, randn({4, 3}).to(Device::CUDA));
    check_throws<DeviceError>([&] { gpu_opt.step_if_finite(full({}, 1.0)); }, {"Muon::step_if_finite", "expected the norm on"},
                              KindMatch::Exactly);
    CHECK(gpu_opt.step_count() == 0);
}

TEST_CASE("muon: newton_schulz refuses inputs that are not matrices, not floating, or a step count out of range") {
    check_error<Error>([&] { newton_schulz(Tensor()); }, {"newton_schulz", "undefined"});
    check_error<ShapeError>([&] { newton_schulz(ones({3})); }, {"newton_schulz", "[rows, cols] or [n, rows, cols]", "got shape [3]"});
    check_error<ShapeError>([&] { newton_schulz(ones({2, 2, 2, 2})); }, {"newton_schulz", "got shape [2, 2, 2, 2]"});
    check_error<ShapeError>([&] { newton_schulz(ones({0, 3})); }, {"newton_schulz", "non-empty", "got shape [0, 3]"});
    check_error<ShapeError>([&] { newton_schulz(ones({2, 3, 0})); }, {"newton_schulz", "non-empty", "got shape [2, 3, 0]"});
    check_error<DTypeError>([&] { newton_schulz(from_vector<int64_t>({1, 2, 3, 4}, {2, 2})); },
                            {"newton_schulz", "floating tensor", "got i64"});
    for (int64_t steps : {int64_t(0), int64_t(101)})
        check_error<Error>([&] { newton_schulz(ones({2, 3}), steps); },
                           {"newton_schulz", "steps in [1, 100]", "got " + std::to_string(steps)});
}

// ---------------------------------------------------------------- param_groups_for_muon

TEST_CASE("muon: param_groups_for_muon splits each GPT preset's parameters as nanochat does") {
    // Every parameter in exactly one list, each list in named_parameters() order; matrices: the
    // parameters of 2 or more dimensions named "h.*"; embeddings: wte (and wpe with learned
    // positions); head: lm_head.weight unless tied; vectors: the rest, all 1-D. Muon takes the
    // matrices and AdamW the rest, one step each.
    struct Preset {
        const char* arch;
        bool tie;
    };
    for (const Preset& preset : {Preset{"gpt2", false}, Preset{"gpt2", true}, Preset{"nanochat", false},
                                 Preset{"llama", false}}) {
        CAPTURE(preset.arch);
        CAPTURE(preset.tie);
        GPTConfig config = gpt_config(preset.arch);
        config.n_layer = 2;
        config.n_embd = 32;
        config.n_head = 4;
        config.block_size = 16;
        config.tie_embeddings = preset.tie;
        config.zero_init_proj = false;  // nanochat's zero c_proj would leave the blocks' other matrices without gradient
        manual_seed(113);
        GPT model(config);
        const NamedTensors named = model.named_parameters();
        const MuonParamSplit split = param_groups_for_muon(model);
        std::vector<std::string> matrices, embeddings, head, vectors;
        for (const auto& [name, p] : named) {
            const bool block = name.rfind("h.", 0) == 0;
            if (block && p.dim() >= 2) matrices.push_back(name);
            else if (name == "wte.weight" || name == "wpe.weight") embeddings.push_back(name);
            else if (name == "lm_head.weight") head.push_back(name);
            else vectors.push_back(name);
        }
        // The names of a list, by identity with the named parameters; "?" for a stranger.
        auto names_of = [&](const std::vector<Tensor>& list) {
            std::vector<std::string> names;
            for (const Tensor& t : list) {
                std::string found = "?";
                for (const auto& [name, p] : named)
                    if (&p.impl() == &t.impl()) found = name;
                names.push_back(found);
            }
            return names;
        };
        CHECK(names_of(split.matrices) == matrices);
        CHECK(names_of(split.embeddings) == embeddings);
        CHECK(names_of(split.head) == head);
        CHECK(names_of(split.vectors) == vectors);
        CHECK(split.matrices.size() + split.embeddings.size() + split.head.size() + split.vectors.size() == named.size());
        // What each preset has: 2-D blocks, wpe only with learned positions, a separate head only untied.
        CHECK(matrices.size() >= 4 * static_cast<size_t>(config.n_layer));
        CHECK(embeddings.size() == (config.pos_embedding == PosEmbedding::Learned ? 2u : 1u));
        CHECK(head.size() == (preset.tie ? 0u : 1u));
        for (const Tensor& v : split.vectors) CHECK(v.dim() == 1);
        // The two optimizers take their lists.
        Muon muon(split.matrices, MuonOptions());
        std::vector<ParamGroup> adamw_groups = {{split.embeddings, 0.0, 5.0}, {split.vectors, 0.0}};
        if (!split.head.empty()) adamw_groups.push_back({split.head, 0.0, 0.2});
        AdamW adamw(adamw_groups, AdamWOptions());
        TokenBatch batch = token_batch(config, 2, 8);
        model.loss(batch.idx, batch.targets).backward();
        std::vector<Tensor> before;
        for (const auto& [name, p] : named) before.push_back(p.detach().clone());
        muon.step();
        adamw.step();
        for (size_t i = 0; i < named.size(); ++i) {
            CAPTURE(named[i].first);
            CHECK_FALSE(same_bits(named[i].second, before[i]));  // every parameter moved
        }
    }
}

// ---------------------------------------------------------------- PyTorch

TEST_CASE("muon: three steps match KellerJordan/Muon's algorithm in PyTorch, and torch.optim.Muon where torch has it") {
    if (!torch_available()) SKIP_TEST(python() << " cannot import torch (Debian: apt-get install python3-torch)");
    // tests/muon_reference.py runs the reference algorithm with torch ops on the same parameters
    // and gradients: f32 on the cpu (Newton-Schulz in f32, as ours), two option sets; on a GPU both
    // see, f32 and bf16 parameters with Newton-Schulz in bf16. Compared normwise: the parameters
    // (a bf16 parameter's f32 master) after every step, and the updates (parameter minus its
    // start) after the last; the momentum buffers. torch.optim.Muon (torch >= 2.9) always
    // orthogonalizes in bf16 and divides by max(||g||, eps) instead of ||g|| + eps: its updates
    // are compared within kNewtonSchulzBF16 against our f32 cpu steps, kTwoNewtonSchulzBF16
    // against our bf16 CUDA steps.
    struct Case {
        Case(std::string l, DType d, Device dev, MuonOptions o, std::string ns)
            : label(std::move(l)), dtype(d), device(dev), options(o), ns_dtype(std::move(ns)) {}
        std::string label;
        DType dtype;
        Device device;
        MuonOptions options;
        std::string ns_dtype;  // muon_reference.py's --ns-dtype
        std::vector<std::pair<std::string, Tensor>> params;  // ours, by name
        std::vector<Tensor> initial;
        std::vector<std::vector<Tensor>> after;  // [step][parameter]: the parameter (bf16: its master)
        std::vector<Tensor> buffers;
        fs::path in, out, log, rc;
    };
    MuonOptions first;
    first.lr = 0.02;
    first.momentum = 0.95;
    first.weight_decay = 0.1;
    MuonOptions second;
    second.lr = 0.05;
    second.momentum = 0.9;
    second.nesterov = false;
    second.ns_steps = 3;
    std::vector<Case> cases;
    cases.emplace_back("f32/cpu", DType::F32, Device::CPU, first, "f32");
    cases.emplace_back("f32/cpu/no-nesterov", DType::F32, Device::CPU, second, "f32");
    if (torch_cuda_available()) {
        cases.emplace_back("f32/cuda", DType::F32, Device::CUDA, first, "bf16");
        cases.emplace_back("bf16/cuda", DType::BF16, Device::CUDA, first, "bf16");
    } else {
        MESSAGE("the CUDA cases: skipped (no GPU visible to both normtape and torch)");
    }
    const int steps = 3;
    TempDir dir("muon_torch");
    std::string command;
    for (size_t c = 0; c < cases.size(); ++c) {
        Case& k = cases[c];
        manual_seed(120 + c);
        const std::string stem = "case" + std::to_string(c);
        k.in = dir.path / (stem + ".in.safetensors");
        k.out = dir.path / (stem + ".out.safetensors");
        k.log = dir.path / (stem + ".log");
        k.rc = dir.path / (stem + ".rc");
        NamedTensors file;
        std::vector<Tensor> params;
        const std::vector<std::pair<std::string, Shape>> shapes = {{"wide", {8, 20}}, {"tall", {24, 6}}, {"square", {12, 12}}};
        for (const auto& [name, shape] : shapes) {
            Tensor p = randn(shape).to(k.dtype).to(k.device).requires_grad_(true);
            k.params.emplace_back(name, p);
            params.push_back(p);
            k.initial.push_back(p.detach().to(DType::F32).to(Device::CPU));
            file.emplace_back("param." + name, p.detach().to(Device::CPU));
        }
        Muon opt(params, k.options);
        for (int t = 1; t <= steps; ++t) {
            k.after.emplace_back();
            for (const auto& [name, p] : k.params) {
                Tensor g = randn(p.shape()).to(k.dtype);
                file.emplace_back("grad" + std::to_string(t) + "." + name, g);
                set_grad(p, g.to(k.device));
            }
            opt.step();
            for (const auto& [name, p] : k.params)
                k.after.back().push_back((k.dtype == DType::BF16 ? opt.state(p).master : p).detach().to(Device::CPU).clone());
        }
        for (const auto& [name, p] : k.params) k.buffers.push_back(opt.state(p).momentum_buffer.to(Device::CPU));
        save_safetensors(k.in.string(), file);
        const MuonOptions& o = k.options;
        command += "( OMP_NUM_THREADS=1 " + python() + " " +
                   shell_quote(fs::path(NORMTAPE_SOURCE_DIR) / "tests" / "muon_reference.py") + " --in " +
                   shell_quote(k.in) + " --out " + shell_quote(k.out) + " --steps " + std::to_string(steps) +
                   " --lr " + number(o.lr) + " --momentum " + number(o.momentum) + (o.nesterov ? "" : " --no-nesterov") +
                   " --weight-decay " + number(o.weight_decay) + " --ns-steps " + std::to_string(o.ns_steps) +
                   " --ns-dtype " + k.ns_dtype + " --device " + device_name(k.device) + " > " + shell_quote(k.log) +
                   " 2>&1; echo $? > " + shell_quote(k.rc) + " ) & ";
    }
    command += "wait";
    REQUIRE(std::system(command.c_str()) == 0);

    std::ostringstream summary;
    summary.precision(2);
    summary << std::scientific << "Muon against PyTorch, normwise (the parameters, worst step; the updates; torch.optim.Muon's updates):";
    for (const Case& k : cases) {
        INFO(k.label);
        std::string rc = slurp(k.rc.string());
        INFO("muon_reference.py exit status " << rc << ", output:\n" << slurp(k.log.string()));
        REQUIRE(rc == "0\n");
        NamedTensors loaded = load_safetensors(k.out.string());
        std::map<std::string, Tensor> theirs(loaded.begin(), loaded.end());
        // f32 on the cpu: the same iteration in the same dtype (measured worst 9.9e-8 on the
        // parameters; 7.9e-6 on the updates, which also carry the f32 rounding of parameters about
        // 50 times larger than an update, so their bound is 3e-5). bf16 Newton-Schulz on both
        // sides rounds at other points (measured worst on an H200: 6.9e-4 on the parameters,
        // 3.5e-2 on the updates); torch.optim.Muon 1.1e-2 against f32 on the cpu, 2.6e-2 on CUDA.
        const bool bf16 = k.ns_dtype == "bf16";
        const double param_tol = bf16 ? 2e-3 : 1e-5, update_tol = bf16 ? kTwoNewtonSchulzBF16 : 3e-5;
        const double optim_tol = bf16 ? kTwoNewtonSchulzBF16 : kNewtonSchulzBF16;
        double worst_param = 0.0, worst_update = 0.0, worst_optim = -1.0;
        auto find = [&](const std::string& key) -> std::optional<Tensor> {
            auto it = theirs.find(key);
            CHECK_MESSAGE(it != theirs.end(), "no ", key, " from muon_reference.py");
            if (it == theirs.end()) return std::nullopt;
            return it->second;
        };
        for (size_t i = 0; i < k.params.size(); ++i) {
            const std::string& name = k.params[i].first;
            CAPTURE(name);
            for (int t = 1; t <= steps; ++t) {
                std::optional<Tensor> p = find("step" + std::to_string(t) + "." + name);
                if (!p) continue;
                const double e = normwise_error(k.after[t - 1][i], *p);
                worst_param = std::max(worst_param, e);
                CHECK_NORMWISE(k.after[t - 1][i], *p, param_tol);
            }
            if (std::optional<Tensor> p = find("step" + std::to_string(steps) + "." + name)) {
                Tensor ours = difference(k.after.back()[i], k.initial[i]), ref = difference(*p, k.initial[i]);
                worst_update = std::max(worst_update, normwise_error(ours, ref));
                CHECK_NORMWISE(ours, ref, update_tol);
            }
            if (std::optional<Tensor> b = find("buf." + name)) CHECK_NORMWISE(k.buffers[i], *b, 1e-6);
            auto optim = theirs.find("optim.step" + std::to_string(steps) + "." + name);
            if (optim != theirs.end()) {
                Tensor ours = difference(k.after.back()[i], k.initial[i]), ref = difference(optim->second, k.initial[i]);
                worst_optim = std::max(worst_optim, normwise_error(ours, ref));
                CHECK_NORMWISE(ours, ref, optim_tol);
            }
        }
        summary << "\n  " << k.label << ": " << worst_param << ", " << worst_update << ", ";
        if (worst_optim < 0) summary << "not run (torch has no torch.optim.Muon)";
        else summary << worst_optim;
    }
    MESSAGE(summary.str());
}

}  // TEST_SUITE("muon")
