// ops/matmul.cpp: matmul and linear over Eigen maps of row-major data.
#include "ops/matmul.h"

#include <Eigen/Core>

#include "core/autograd.h"
#include "core/dispatch.h"
#include "ops/checks.h"

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
template <class T>
MatrixMap<T> as_mutable_matrix(const Tensor& t) {
    int64_t cols = t.size(-1);
    return MatrixMap<T>(t.data_ptr<T>(), t.numel() / cols, cols);
}

Shape with_last(const Shape& s, int64_t last) {
    Shape out = s;
    out.back() = last;
    return out;
}

struct MatmulBackward : Node {
    SavedTensor a, b;
    MatmulBackward(const Tensor& a_, const Tensor& b_) : a(a_), b(b_) {}
    const char* name() const override { return "MatmulBackward"; }
    std::vector<SavedTensor*> saved_tensors() override { return {&a, &b}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor g = grad_output.contiguous();
        Tensor da, db;
        dispatch_floating(g.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            if (needs_input_grad(0)) {
                Tensor bs = b.unpack(name());
                da = empty(with_last(g.shape(), bs.size(0)), TensorOptions().dtype(g.dtype()));
                as_mutable_matrix<T>(da).noalias() = as_matrix<T>(g) * as_matrix<T>(bs).transpose();
            }
            if (needs_input_grad(1)) {
                Tensor as = a.unpack(name());
                db = empty({as.size(-1), g.size(-1)}, TensorOptions().dtype(g.dtype()));
                as_mutable_matrix<T>(db).noalias() = as_matrix<T>(as).transpose() * as_matrix<T>(g);
            }
        });
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
        TensorOptions opts = TensorOptions().dtype(g.dtype());
        dispatch_floating(g.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            auto gm = as_matrix<T>(g);
            if (needs_input_grad(0)) {
                Tensor w = weight.unpack(name());
                dx = empty(with_last(g.shape(), w.size(1)), opts);
                as_mutable_matrix<T>(dx).noalias() = gm * as_matrix<T>(w);
            }
            if (needs_input_grad(1)) {
                Tensor xs = x.unpack(name());
                dweight = empty({g.size(-1), xs.size(-1)}, opts);
                as_mutable_matrix<T>(dweight).noalias() = gm.transpose() * as_matrix<T>(xs);
            }
            if (needs_input_grad(2)) {
                dbias = empty({g.size(-1)}, opts);
                Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(dbias.data_ptr<T>(), g.size(-1)) = gm.colwise().sum();
            }
        });
        return {dx, dweight, dbias};
    }
};

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
    detail::check_floating_input("matmul", "a", a_in);
    detail::check_floating_input("matmul", "b", b_in);
    detail::check_like("matmul", "b", b_in, "a", a_in);
    NT_CHECK(a_in.dim() >= 1, "matmul: expected a of shape [..., K], got a scalar");
    NT_CHECK(b_in.dim() == 2 && b_in.size(0) == a_in.size(-1), "matmul: expected b of shape [", a_in.size(-1),
             ", N] for a of shape ", shape_str(a_in.shape()), ", got ", shape_str(b_in.shape()));
    Tensor a = a_in.contiguous(), b = b_in.contiguous();
    Tensor out = empty(with_last(a.shape(), b.size(1)), TensorOptions().dtype(a.dtype()));
    dispatch_floating(a.dtype(), "matmul", [&](auto tag) {
        using T = decltype(tag);
        as_mutable_matrix<T>(out).noalias() = as_matrix<T>(a) * as_matrix<T>(b);
    });
    if (should_record(a, b)) {
        auto node = std::make_shared<MatmulBackward>(b.requires_grad() ? a : Tensor(), a.requires_grad() ? b : Tensor());
        record(node, out, a, b);
    }
    return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
    detail::check_floating_input("linear", "x", x_in);
    detail::check_floating_input("linear", "weight", weight_in);
    detail::check_like("linear", "weight", weight_in, "x", x_in);
    NT_CHECK(x_in.dim() >= 1, "linear: expected x of shape [..., K], got a scalar");
    NT_CHECK(weight_in.dim() == 2 && weight_in.size(1) == x_in.size(-1), "linear: expected weight of shape [N, ",
             x_in.size(-1), "] for x of shape ", shape_str(x_in.shape()), ", got ", shape_str(weight_in.shape()));
    int64_t N = weight_in.size(0);
    if (bias_in.defined()) {
        detail::check_like("linear", "bias", bias_in, "x", x_in);
        NT_CHECK(bias_in.dim() == 1 && bias_in.size(0) == N, "linear: expected bias of shape [", N, "], got ",
                 shape_str(bias_in.shape()));
    }
    Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
    Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
    Tensor out = empty(with_last(x.shape(), N), TensorOptions().dtype(x.dtype()));
    dispatch_floating(x.dtype(), "linear", [&](auto tag) {
        using T = decltype(tag);
        auto o = as_mutable_matrix<T>(out);
        o.noalias() = as_matrix<T>(x) * as_matrix<T>(weight).transpose();
        if (bias.defined()) o.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(bias.data_ptr<T>(), N);
    });
    if (should_record(x, weight, bias)) {
        auto node = std::make_shared<LinearBackward>(weight.requires_grad() ? x : Tensor(),
                                                     x.requires_grad() ? weight : Tensor());
        record(node, out, x, weight, bias);
    }
    return out;
}

}  // namespace normtape
