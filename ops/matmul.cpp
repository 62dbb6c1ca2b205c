// ops/matmul.cpp: matmul and linear. Every product goes through gemm(): Eigen maps of row-major
// data on the cpu (bf16 through f32 copies: Eigen has no bf16 kernels), cuBLAS on CUDA.
#include "ops/matmul.h"

#include <Eigen/Core>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

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

// out = op(a) @ op(b), op(m) = m^T when its flag is set; every tensor is a contiguous row-major
// matrix whose columns are its last dimension, all of one dtype and device. out is overwritten.
void gemm(const Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
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
        gemm(tmp, a.to(DType::F32), trans_a, b.to(DType::F32), trans_b);
        Tensor(out).copy_(tmp.to(DType::BF16));
        return;
    }
    dispatch_floating(a.dtype(), "matmul", [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, bf16>) {
            int64_t cols = out.size(-1);
            MatrixMap<T> o(out.data_ptr<T>(), out.numel() / cols, cols);
            auto ma = as_matrix<T>(a);
            auto mb = as_matrix<T>(b);
            if (!trans_a && !trans_b) o.noalias() = ma * mb;
            else if (!trans_a && trans_b) o.noalias() = ma * mb.transpose();
            else if (trans_a && !trans_b) o.noalias() = ma.transpose() * mb;
            else o.noalias() = ma.transpose() * mb.transpose();
        }
    });
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
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < N; ++j) po[r * N + j] = static_cast<T>(acc_t<T>(po[r * N + j]) + acc_t<T>(pb[j]));
    });
}

// dbias[j] = sum over rows of g[r, j], accumulated in double.
Tensor sum_rows(const Tensor& g) {
    int64_t N = g.size(-1), rows = g.numel() / N;
    Tensor out = empty({N}, TensorOptions().dtype(g.dtype()).device(g.device()));
    dispatch_floating(g.dtype(), "linear", [&](auto tag) {
        using T = decltype(tag);
        if (g.device().is_cuda()) {
            NT_CUDA(detail::column_sum_cuda<T, T>(device_ptr<T>(out), device_ptr<T>(g), rows, N, g.device().index));
            return;
        }
        std::vector<double> acc(N, 0.0);
        const T* pg = g.data_ptr<T>();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < N; ++j) acc[j] += double(pg[r * N + j]);
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
    std::vector<SavedTensor*> saved_tensors() override { return {&a, &b}; }
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

struct LinearBackward : Node {
    SavedTensor x, weight;
    LinearBackward(const Tensor& x_, const Tensor& weight_) : x(x_), weight(weight_) {}
    const char* name() const override { return "LinearBackward"; }
    std::vector<SavedTensor*> saved_tensors() override { return {&x, &weight}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor g = grad_output.contiguous();
        Tensor dx, dweight, dbias;
        if (needs_input_grad(0)) {  // dx = g @ weight
            Tensor w = weight.unpack(name());
            dx = empty(with_last(g.shape(), w.size(1)), like(g));
            gemm(dx, g, false, w, false);
        }
        if (needs_input_grad(1)) {  // dweight = g^T @ x
            Tensor xs = x.unpack(name());
            dweight = empty({g.size(-1), xs.size(-1)}, like(g));
            gemm(dweight, g, true, xs, false);
        }
        if (needs_input_grad(2)) dbias = sum_rows(g);
        return {dx, dweight, dbias};
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

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
    detail::check_floating_input("linear", "x", x_in);
    detail::check_floating_input("linear", "weight", weight_in);
    detail::check_like("linear", "weight", weight_in, "x", x_in);
    NT_CHECK_AS(ShapeError, x_in.dim() >= 1, "linear: expected x of shape [..., K], got a scalar (shape [])");
    NT_CHECK_AS(ShapeError, weight_in.dim() == 2 && weight_in.size(1) == x_in.size(-1),
                "linear: expected weight of shape [N, ", x_in.size(-1), "] for x of shape ", shape_str(x_in.shape()),
                ", got ", shape_str(weight_in.shape()));
    int64_t N = weight_in.size(0);
    if (bias_in.defined()) {
        detail::check_like("linear", "bias", bias_in, "x", x_in);
        NT_CHECK_AS(ShapeError, bias_in.dim() == 1 && bias_in.size(0) == N, "linear: expected bias of shape [", N,
                    "], got ", shape_str(bias_in.shape()));
    }
    check_gemm_sizes("linear", x_in, N);
    Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
    Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
    Tensor out = empty(with_last(x.shape(), N), like(x));
    gemm(out, x, false, weight, true);
    if (bias.defined()) add_bias_rows(out, bias);
    if (should_record(x, weight, bias)) {
        auto node = std::make_shared<LinearBackward>(weight.requires_grad() ? x : Tensor(),
                                                     x.requires_grad() ? weight : Tensor());
        record(node, out, x, weight, bias);
    }
    detail::check_forward_anomaly("linear", "out", out, {{"x", x}, {"weight", weight}, {"bias", bias}});
    return out;
}

}  // namespace normtape
