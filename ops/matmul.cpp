// ops/matmul.cpp: matmul and linear. Every product goes through gemm(): Eigen maps of row-major
// data on the cpu (bf16 through f32 copies: Eigen has no bf16 kernels), cuBLAS on CUDA.
#include "ops/matmul.h"

// Eigen's own threads stay off (EIGEN_DONT_PARALLELIZE, CMakeLists.txt); gemm() runs fixed blocks
// on our threads instead.
#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/dry_run.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace normtape {

namespace {

template <class T>
using MatrixMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using ConstMatrixMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// t viewed as a row-major [rows, cols] matrix, cols = its last dimension.
template <class T>
ConstMatrixMap<T> as_matrix(const Tensor& t) {
    int64_t cols = t.size(-1);
    return ConstMatrixMap<T>(t.data_ptr<T>(), t.numel() / cols, cols);
}

using detail::device_ptr;
using detail::kGrain;
using detail::parallel_for;
using detail::parallel_reduce;

// The length of the blocks that a cpu product cuts its output into along `length` (its rows, or
// its columns where it has more of them): about 16 blocks, from 96 to 480 long, a multiple of 48
// (a multiple of Eigen's block of rows in registers). A function of the shape alone (Note
// [Deterministic parallel cpu kernels], core/parallel.h). Each block packs the whole other operand
// again, so blocks shorter than 96 cost a single thread more than 10%.
int64_t gemm_block(int64_t length) {
    const int64_t b = (length + 15) / 16;
    return std::clamp<int64_t>((b + 47) / 48 * 48, 96, 480);
}

// o = A @ B (o += A @ B with accumulate) on the cpu, A [M, K] and B [K, N] Eigen expressions
// (maps, or their transposes): one single-threaded Eigen product per block of o's rows (M >= N) or
// columns, blocks in parallel.
template <class O, class LhsT, class RhsT>
void gemm_blocks(O& o, const LhsT& A, const RhsT& B, bool accumulate) {
    const int64_t M = o.rows(), N = o.cols();
    if (M >= N) {
        parallel_for(0, M, gemm_block(M), [&](int64_t r0, int64_t r1) {
            if (accumulate) o.middleRows(r0, r1 - r0).noalias() += A.middleRows(r0, r1 - r0) * B;
            else o.middleRows(r0, r1 - r0).noalias() = A.middleRows(r0, r1 - r0) * B;
        });
    } else {
        parallel_for(0, N, gemm_block(N), [&](int64_t c0, int64_t c1) {
            if (accumulate) o.middleCols(c0, c1 - c0).noalias() += A * B.middleCols(c0, c1 - c0);
            else o.middleCols(c0, c1 - c0).noalias() = A * B.middleCols(c0, c1 - c0);
        });
    }
}

// The cpu product of f32 or f64 maps, as detail::gemm.
template <class T>
void gemm_cpu(const Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, bool accumulate) {
    if (is_dry_run()) return;  // Note [The dry run]: a kernel outside dispatch_floating
    int64_t cols = out.size(-1);
    MatrixMap<T> o(out.data_ptr<T>(), out.numel() / cols, cols);
    auto ma = as_matrix<T>(a);
    auto mb = as_matrix<T>(b);
    if (!trans_a && !trans_b) gemm_blocks(o, ma, mb, accumulate);
    else if (!trans_a && trans_b) gemm_blocks(o, ma, mb.transpose(), accumulate);
    else if (trans_a && !trans_b) gemm_blocks(o, ma.transpose(), mb, accumulate);
    else gemm_blocks(o, ma.transpose(), mb.transpose(), accumulate);
}

}  // namespace

void detail::gemm(const Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
    if (a.device().is_cuda()) {
        dispatch_floating(a.dtype(), "matmul", [&]([[maybe_unused]] auto tag) {
            using T [[maybe_unused]] = decltype(tag);
            NT_CUDA(detail::gemm_cuda<T>(device_ptr<T>(out), device_ptr<T>(a), a.numel() / a.size(-1), a.size(-1),
                                         trans_a, device_ptr<T>(b), b.numel() / b.size(-1), b.size(-1), trans_b,
                                         a.device().index));
        });
        return;
    }
    if (a.dtype() == DType::BF16) {  // f32 arithmetic on f32 copies, rounded once into out
        Tensor tmp = empty(out.shape(), TensorOptions().dtype(DType::F32).device(out.device()));
        gemm_cpu<float>(tmp, a.to(DType::F32), trans_a, b.to(DType::F32), trans_b, false);
        Tensor(out).copy_(tmp.to(DType::BF16));
        return;
    }
    if (a.dtype() == DType::F32) gemm_cpu<float>(out, a, trans_a, b, trans_b, false);
    else gemm_cpu<double>(out, a, trans_a, b, trans_b, false);
}

void detail::gemm_accumulate(const Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
    if (a.device().is_cuda()) {
        dispatch_floating(a.dtype(), "matmul", [&]([[maybe_unused]] auto tag) {
            using T [[maybe_unused]] = decltype(tag);
            NT_CUDA(detail::gemm_accumulate_cuda<T>(device_ptr<acc_t<T>>(out), device_ptr<T>(a), a.numel() / a.size(-1),
                                                    a.size(-1), trans_a, device_ptr<T>(b), b.numel() / b.size(-1),
                                                    b.size(-1), trans_b, a.device().index));
        });
        return;
    }
    if (a.dtype() == DType::BF16) gemm_cpu<float>(out, a.to(DType::F32), trans_a, b.to(DType::F32), trans_b, true);
    else if (a.dtype() == DType::F32) gemm_cpu<float>(out, a, trans_a, b, trans_b, true);
    else gemm_cpu<double>(out, a, trans_a, b, trans_b, true);
}

namespace {

using detail::gemm;

// gemm() with a cuBLASLt epilogue (detail::GemmEpilogue, ops/cuda_launchers.h); aux may be
// undefined. Returns false, having done nothing, on the cpu or where cuBLASLt offers no
// algorithm: the caller then does the epilogue's work with its own kernels. (The parameters are
// unused in a build without CUDA, where NT_CUDA is a throw.)
bool gemm_epilogue([[maybe_unused]] const Tensor& out, const Tensor& a, [[maybe_unused]] bool trans_a,
                   [[maybe_unused]] const Tensor& b, [[maybe_unused]] bool trans_b,
                   [[maybe_unused]] detail::GemmEpilogue epilogue, [[maybe_unused]] const Tensor& bias,
                   [[maybe_unused]] const Tensor& aux = Tensor()) {
    if (!a.device().is_cuda()) return false;
    bool done = false;
    dispatch_floating(a.dtype(), "linear", [&]([[maybe_unused]] auto tag) {
        using T [[maybe_unused]] = decltype(tag);
        NT_CUDA(done = detail::gemm_epilogue_cuda<T>(device_ptr<T>(out), device_ptr<T>(a), a.numel() / a.size(-1),
                                                     a.size(-1), trans_a, device_ptr<T>(b), b.numel() / b.size(-1),
                                                     b.size(-1), trans_b, epilogue, device_ptr<T>(bias),
                                                     device_ptr<T>(aux), a.device().index));
    });
    return done;
}

// out[r, :] += bias for every row r (bias [N], out [..., N]).
void add_bias_rows(const Tensor& out, const Tensor& bias) {
    dispatch_floating(out.dtype(), "linear", [&](auto tag) {
        using T = decltype(tag);
        int64_t N = bias.numel(), rows = out.numel() / N;
        if (out.device().is_cuda()) {
            NT_CUDA(detail::add_bias_rows_cuda<T>(device_ptr<T>(out), device_ptr<T>(bias), rows, N, out.device().index));
            return;
        }
        T* po = out.data_ptr<T>();
        const T* pb = bias.data_ptr<T>();
        parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(N, 1)), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t j = 0; j < N; ++j)
                    po[r * N + j] = static_cast<T>(acc_t<T>(po[r * N + j]) + acc_t<T>(pb[j]));
        });
    });
}

// dbias[j] = sum over rows of g[r, j], accumulated in double (acc_t on CUDA); on the cpu by chunks
// of rows added in chunk order (detail::parallel_reduce).
Tensor sum_rows(const Tensor& g) {
    int64_t N = g.size(-1), rows = g.numel() / N;
    Tensor out = empty({N}, TensorOptions().dtype(g.dtype()).device(g.device()));
    dispatch_floating(g.dtype(), "linear", [&](auto tag) {
        using T = decltype(tag);
        if (g.device().is_cuda()) {
            NT_CUDA(detail::column_sum_cuda<T, T>(device_ptr<T>(out), device_ptr<T>(g), rows, N, g.device().index));
            return;
        }
        std::vector<double> acc(N);
        const T* pg = g.data_ptr<T>();
        const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(N, 1));
        parallel_reduce(0, rows, grain, N, acc.data(), [&](int64_t r0, int64_t r1, double* a) {
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t j = 0; j < N; ++j) a[j] += double(pg[r * N + j]);
        });
        T* po = out.data_ptr<T>();
        for (int64_t j = 0; j < N; ++j) po[j] = static_cast<T>(acc[j]);
    });
    return out;
}

Shape with_last(const Shape& s, int64_t last) {
    Shape out = s;
    out.back() = last;
    return out;
}

TensorOptions like(const Tensor& t) { return TensorOptions().dtype(t.dtype()).device(t.device()); }

// cuBLAS takes int sizes: on CUDA the rows, K and N of a product (forward and backward) must fit.
void check_gemm_sizes(const char* op, const Tensor& a, int64_t N) {
    detail::check_fits_int32(op, a, "rows (numel / K)", a.numel() / a.size(-1));
    detail::check_fits_int32(op, a, "K (the last dimension)", a.size(-1));
    detail::check_fits_int32(op, a, "N (output features)", N);
}

struct MatmulBackward : Node {
    SavedTensor a, b;
    MatmulBackward(const Tensor& a_, const Tensor& b_) : a(a_), b(b_) {}
    const char* name() const override { return "MatmulBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"self", &a}, {"mat2", &b}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor g = grad_output.contiguous();
        Tensor da, db;
        if (needs_input_grad(0)) {  // da = g @ b^T
            Tensor bs = b.unpack(name());
            da = empty(with_last(g.shape(), bs.size(0)), like(g));
            gemm(da, g, false, bs, true);
        }
        if (needs_input_grad(1)) {  // db = a^T @ g
            Tensor as = a.unpack(name());
            db = empty({as.size(-1), g.size(-1)}, like(g));
            gemm(db, as, true, g, false);
        }
        return {da, db};
    }
};

// The gradients of linear(x, weight, bias), g = dout: dx = g @ weight, dweight = g^T @ x, dbias = the
// column sums of g. (cuBLASLt's bias-gradient epilogue in dweight's product measured slower than
// the product and our column sum: docs/PERFORMANCE.md.)
std::vector<Tensor> linear_backward(const Node& node, const Tensor& grad, SavedTensor& x, SavedTensor& weight) {
    Tensor g = grad.contiguous();
    Tensor dx, dweight, dbias;
    if (node.needs_input_grad(0)) {  // dx = g @ weight
        Tensor w = weight.unpack(node.name());
        dx = empty(with_last(g.shape(), w.size(1)), like(g));
        gemm(dx, g, false, w, false);
    }
    if (node.needs_input_grad(1)) {  // dweight = g^T @ x
        Tensor xs = x.unpack(node.name());
        dweight = empty({g.size(-1), xs.size(-1)}, like(g));
        gemm(dweight, g, true, xs, false);
    }
    if (node.needs_input_grad(2)) dbias = sum_rows(g);
    return {dx, dweight, dbias};
}

struct LinearBackward : Node {
    SavedTensor x, weight;
    LinearBackward(const Tensor& x_, const Tensor& weight_) : x(x_), weight(weight_) {}
    const char* name() const override { return "LinearBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"input", &x}, {"weight", &weight}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return linear_backward(*this, grad_output, x, weight);
    }
};

// The backward of out = gelu(h), h = linear(x, weight, bias): dh = g * gelu'(h), then linear's.
struct LinearGeluBackward : Node {
    SavedTensor x, weight, h;
    LinearGeluBackward(const Tensor& x_, const Tensor& weight_, const Tensor& h_) : x(x_), weight(weight_), h(h_) {}
    const char* name() const override { return "LinearGeluBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"input", &x}, {"weight", &weight}, {"h", &h}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return linear_backward(*this, detail::gelu_backward(grad_output, h.unpack(name())), x, weight);
    }
};

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
    detail::check_floating_input("matmul", "a", a_in);
    detail::check_floating_input("matmul", "b", b_in);
    detail::check_like("matmul", "b", b_in, "a", a_in);
    NT_CHECK_AS(ShapeError, a_in.dim() >= 1, "matmul: expected a of shape [..., K], got a scalar (shape [])");
    NT_CHECK_AS(ShapeError, b_in.dim() == 2 && b_in.size(0) == a_in.size(-1), "matmul: expected b of shape [",
                a_in.size(-1), ", N] for a of shape ", shape_str(a_in.shape()), ", got ", shape_str(b_in.shape()));
    check_gemm_sizes("matmul", a_in, b_in.size(1));
    Tensor a = a_in.contiguous(), b = b_in.contiguous();
    Tensor out = empty(with_last(a.shape(), b.size(1)), like(a));
    gemm(out, a, false, b, false);
    if (should_record(a, b)) {
        auto node = std::make_shared<MatmulBackward>(b.requires_grad() ? a : Tensor(), a.requires_grad() ? b : Tensor());
        record(node, out, a, b);
    }
    detail::check_forward_anomaly("matmul", "out", out, {{"a", a}, {"b", b}});
    return out;
}

namespace {

// linear's and linear_gelu's checks (see ops/matmul.h); bias may be undefined.
void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
    detail::check_floating_input(op, "x", x);
    detail::check_floating_input(op, "weight", weight);
    detail::check_like(op, "weight", weight, "x", x);
    NT_CHECK_AS(ShapeError, x.dim() >= 1, op, ": expected x of shape [..., K], got a scalar (shape [])");
    NT_CHECK_AS(ShapeError, weight.dim() == 2 && weight.size(1) == x.size(-1), op, ": expected weight of shape [N, ",
                x.size(-1), "] for x of shape ", shape_str(x.shape()), ", got ", shape_str(weight.shape()));
    int64_t N = weight.size(0);
    if (bias.defined()) {
        detail::check_like(op, "bias", bias, "x", x);
        NT_CHECK_AS(ShapeError, bias.dim() == 1 && bias.size(0) == N, op, ": expected bias of shape [", N, "], got ",
                    shape_str(bias.shape()));
    }
    check_gemm_sizes(op, x, N);
}

// out = x @ weight^T + bias (bias may be undefined): the bias in the product's epilogue where
// cuBLASLt has one, else a second pass over out.
void linear_into(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias) {
    if (bias.defined() && gemm_epilogue(out, x, false, weight, true, detail::GemmEpilogue::Bias, bias)) return;
    gemm(out, x, false, weight, true);
    if (bias.defined()) add_bias_rows(out, bias);
}

}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
    check_linear("linear", x_in, weight_in, bias_in);
    Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
    Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
    Tensor out = empty(with_last(x.shape(), weight.size(0)), like(x));
    linear_into(out, x, weight, bias);
    if (should_record(x, weight, bias)) {
        auto node = std::make_shared<LinearBackward>(weight.requires_grad() ? x : Tensor(),
                                                     x.requires_grad() ? weight : Tensor());
        record(node, out, x, weight, bias);
    }
    detail::check_forward_anomaly("linear", "out", out, {{"x", x}, {"weight", weight}, {"bias", bias}});
    return out;
}

Tensor linear_gelu(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, bool recompute_output) {
    NT_CHECK(bias_in.defined(), "linear_gelu: expected a bias of shape [N], got an undefined tensor");
    check_linear("linear_gelu", x_in, weight_in, bias_in);
    Tensor x = x_in.contiguous(), weight = weight_in.contiguous(), bias = bias_in.contiguous();
    Shape shape = with_last(x.shape(), weight.size(0));
    Tensor h = empty(shape, like(x)), out;
    const bool recipe = recompute_output && should_record(x, weight, bias);
    if (x.device().is_cuda() && !recipe) {  // one pass: h and gelu(h) written by the product's epilogue
        out = empty(shape, like(x));
        if (!gemm_epilogue(out, x, false, weight, true, detail::GemmEpilogue::GeluAuxBias, bias, h)) out = Tensor();
    }
    if (!out.defined()) {
        linear_into(h, x, weight, bias);
        out = detail::gelu_forward(h);
    }
    if (should_record(x, weight, bias)) {
        auto node = std::make_shared<LinearGeluBackward>(weight.requires_grad() ? x : Tensor(),
                                                         x.requires_grad() ? weight : Tensor(), h);
        record(node, out, x, weight, bias);
        if (recipe) set_recipe(out, "gelu", {h}, [](const std::vector<Tensor>& in) { return detail::gelu_forward(in[0]); });
    }
    detail::check_forward_anomaly("linear_gelu", "out", out, {{"x", x}, {"weight", weight}, {"bias", bias}});
    return out;
}

}  // namespace normtape
