// ops/norm/norm.cpp: the forward, argument checks, CPU kernels and backward node shared by layer_norm
// and rms_norm, and the policy's counter (output_policy_fallbacks, ops/norm/norm_policy.h). The CPU
// kernels are plain loops over rows, written to be read: the reference that the CUDA kernels are
// tested against; chunks of rows run on parallel threads (core/parallel.h). Not here: the public
// contracts (ops/norm/layer_norm.h, ops/norm/rms_norm.h), the CUDA kernels (ops/norm/norm_reference.cu,
// ops/norm/norm_forward.cu, ops/norm/norm_backward.cu).
#include "ops/norm/norm.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/dry_run.h"
#include "core/parallel.h"
#include "ops/cast.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"

namespace normtape {

namespace {

using detail::device_ptr;

int64_t fallback_count = 0;

// Rows per chunk of the cpu kernels: about kGrain / 4 elements (a norm's element costs several
// of an elementwise op's).
int64_t rows_grain(int64_t N) { return std::max<int64_t>(1, detail::kGrain / 4 / std::max<int64_t>(N, 1)); }

// y = x_hat * weight + bias over rows of length N, x_hat = (x - mean) * rstd (mean = 0 when not
// centered), rstd = 1 / sqrt(var + eps), var biased (divided by N). Sums in double.
// x, y: [M, N] of T; weight, bias: [N] or nullptr; mean (nullptr when not centered), rstd: [M] of
// S = acc_t<T> (f32 for f32 and bf16, f64 for f64). With a residual ([M, N], or nullptr), the rows
// are sum = x + residual, written to `sum` in the add op's arithmetic (acc_t<T>, rounded to T).
template <class T, class S = acc_t<T>>
void norm_forward_cpu(T* y, S* mean, S* rstd, const T* x, const T* residual, T* sum, const T* weight, const T* bias,
                      int64_t M, int64_t N, double eps) {
    detail::parallel_for(0, M, rows_grain(N), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const T* xi = x + i * N;
            if (residual) {
                for (int64_t j = 0; j < N; ++j) sum[i * N + j] = static_cast<T>(S(xi[j]) + S(residual[i * N + j]));
                xi = sum + i * N;
            }
            double m = 0.0;
            if (mean) {
                for (int64_t j = 0; j < N; ++j) m += xi[j];
                m /= static_cast<double>(N);
            }
            double var = 0.0;
            for (int64_t j = 0; j < N; ++j) var += (double(xi[j]) - m) * (double(xi[j]) - m);
            var /= static_cast<double>(N);
            double s = 1.0 / std::sqrt(var + eps);
            if (mean) mean[i] = static_cast<S>(m);
            rstd[i] = static_cast<S>(s);
            T* yi = y + i * N;
            for (int64_t j = 0; j < N; ++j) {
                double v = (double(xi[j]) - m) * s;
                if (weight) v *= double(weight[j]);
                if (bias) v += double(bias[j]);
                yi[j] = static_cast<T>(v);
            }
        }
    });
}

// y = x_hat * weight + bias in acc_t rounded once, rows of N (weight, bias nullptr when absent).
template <class T>
void norm_affine_cpu(T* y, const T* x_hat, const T* weight, const T* bias, int64_t M, int64_t N) {
    using A = acc_t<T>;
    detail::parallel_for(0, M, rows_grain(N), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = 0; j < N; ++j) {
                A v = A(x_hat[i * N + j]);
                if (weight) v *= A(weight[j]);
                if (bias) v += A(bias[j]);
                y[i * N + j] = static_cast<T>(v);
            }
    });
}

// With g = dy * weight and means over the row (Ba et al. 2016; PyTorch's layer_norm_backward):
//   dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))     (RMSNorm: no mean(g) term)
//   dweight = sum over rows of dy * x_hat,  dbias = sum over rows of dy.
// dx, dweight, dbias are overwritten (=); nullptr skips one. With dresidual ([M, N], or nullptr), dx
// is the norm's dx rounded to T plus dresidual, in the add op's arithmetic. `saved` is x or y by `policy`;
// x_hat comes from x_hat_from_saved(), the one place the policy matters. dweight and dbias are
// summed in double by chunks of rows, the chunks' sums added in chunk order (parallel_reduce).
template <class T, class S = acc_t<T>>
void norm_backward_cpu(T* dx, T* dweight, T* dbias, const T* dy, const T* dresidual, const T* saved, const S* mean,
                       const S* rstd, const T* weight, const T* bias, bool centered, SavePolicy policy, int64_t M,
                       int64_t N) {
    const int64_t nw = dweight ? N : 0;  // acc: dweight's N sums (if any), then dbias's
    std::vector<double> acc(nw + (dbias ? N : 0));
    detail::parallel_reduce(0, M, rows_grain(N), static_cast<int64_t>(acc.size()), acc.data(),
                            [&](int64_t i0, int64_t i1, double* dw) {
        double* db = dw + nw;
        std::vector<double> x_hat(N), g(N);
        for (int64_t i = i0; i < i1; ++i) {
            const T* dyi = dy + i * N;
            const T* si = saved + i * N;
            S m = mean ? mean[i] : S(0);
            double mean_g = 0.0, mean_g_xhat = 0.0;
            for (int64_t j = 0; j < N; ++j) {
                x_hat[j] = x_hat_from_saved<T, S>(policy, si[j], m, rstd[i], weight, bias, j);
                g[j] = weight ? double(dyi[j]) * double(weight[j]) : double(dyi[j]);
                mean_g += g[j];
                mean_g_xhat += g[j] * x_hat[j];
                if (dweight) dw[j] += double(dyi[j]) * x_hat[j];
                if (dbias) db[j] += double(dyi[j]);
            }
            mean_g = centered ? mean_g / N : 0.0;
            mean_g_xhat /= N;
            if (dx) {
                T* dxi = dx + i * N;
                for (int64_t j = 0; j < N; ++j) {
                    dxi[j] = static_cast<T>(double(rstd[i]) * (g[j] - mean_g - x_hat[j] * mean_g_xhat));
                    if (dresidual) dxi[j] = static_cast<T>(S(dxi[j]) + S(dresidual[i * N + j]));
                }
            }
        }
    });
    for (int64_t j = 0; dweight && j < N; ++j) dweight[j] = static_cast<T>(acc[j]);
    for (int64_t j = 0; dbias && j < N; ++j) dbias[j] = static_cast<T>(acc[nw + j]);
}

// The forward's kernels on x's device: y = x_hat * weight + bias, mean (when defined) and rstd of the
// rows of s, which is x, or x + residual written to `s` where residual is defined (contiguous,
// x's shape); with x_hat defined, x_hat too, y then made from x_hat rounded to x's dtype.
void run_norm_forward(const char* op, const Tensor& y, const Tensor& x_hat, const Tensor& mean, const Tensor& rstd,
                      const Tensor& x, const Tensor& residual, const Tensor& s, const Tensor& weight,
                      const Tensor& bias, double eps) {
    int64_t N = x.size(-1), M = x.numel() / N;
    dispatch_floating(x.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        using S = acc_t<T>;
        const T* r = device_ptr<T>(residual);
        T* sum = r ? device_ptr<T>(s) : nullptr;
        if (x.device().is_cuda()) {
            NT_CUDA(detail::norm_forward_cuda<T>(device_ptr<T>(y), device_ptr<T>(x_hat), device_ptr<S>(mean),
                                                 device_ptr<S>(rstd), device_ptr<T>(x), r, sum, device_ptr<T>(weight),
                                                 device_ptr<T>(bias), M, N, eps, x.device().index));
        } else if (x_hat.defined()) {
            norm_forward_cpu<T>(device_ptr<T>(x_hat), device_ptr<S>(mean), device_ptr<S>(rstd), device_ptr<T>(x), r,
                                sum, nullptr, nullptr, M, N, eps);
            norm_affine_cpu<T>(device_ptr<T>(y), device_ptr<T>(x_hat), device_ptr<T>(weight), device_ptr<T>(bias), M,
                               N);
        } else {
            norm_forward_cpu<T>(device_ptr<T>(y), device_ptr<S>(mean), device_ptr<S>(rstd), device_ptr<T>(x), r, sum,
                                device_ptr<T>(weight), device_ptr<T>(bias), M, N, eps);
        }
    });
}

// Inputs: x, weight, bias, residual, weight1, bias1 (all but x may be undefined). Outputs: y; for
// layer_norm_fn and rms_norm_fn with a residual and prenorm, s = x + residual; with weight1, y1 (Note
// [The fused norm], ops/norm/fused_norm.h). Saved: s, which is x without a residual (Input), y
// (Output) or x_hat (Normalized) [M, N]; mean [M] (LayerNorm under Input), rstd [M]; weight, bias,
// weight1, bias1 [N] when present. Gradients: ds for x and for residual [.., N] (the norm's, plus s's
// own), dweight, dbias, dweight1, dbias1 [N].
struct NormBackward : MultiOutputNode {
    const char* node_name;
    bool centered;
    bool has_residual;
    SavePolicy policy;
    double eps;
    SavedTensor x_or_y, mean, rstd, weight, bias, weight1, bias1;

    NormBackward(const char* name_, bool centered_, bool has_residual_, SavePolicy policy_, double eps_,
                 const Tensor& x_or_y_, const Tensor& mean_, const Tensor& rstd_, const Tensor& weight_,
                 const Tensor& bias_, const Tensor& weight1_, const Tensor& bias1_)
        : node_name(name_), centered(centered_), has_residual(has_residual_), policy(policy_), eps(eps_),
          x_or_y(x_or_y_), mean(mean_), rstd(rstd_), weight(weight_), bias(bias_), weight1(weight1_), bias1(bias1_) {}

    const char* name() const override { return node_name; }
    std::vector<SavedSlot> saved_tensors() override {
        const char* first = policy == SavePolicy::Input ? (has_residual ? "s" : "x")
                            : policy == SavePolicy::Output ? "y" : "x_hat";
        return {{first, &x_or_y}, {"mean", &mean},       {"rstd", &rstd},  {"weight", &weight},
                {"bias", &bias},  {"weight1", &weight1}, {"bias1", &bias1}};
    }

    // grad_outputs: dy, the gradient that reached s itself (prenorm), dy1. Returns ds (x's), dweight,
    // dbias, dresidual (= ds), dweight1, dbias1.
    std::vector<Tensor> apply_outputs(const std::vector<Tensor>& grad_outputs) override {
        const Tensor& dy = grad_outputs[0];
        const Tensor& ds_out = grad_outputs[1];
        const Tensor& dy1 = grad_outputs[2];
        if (!dy.defined() && !dy1.defined())  // y and y1 unused: s's own gradient alone
            return {ds_out, Tensor(), Tensor(), has_residual ? ds_out : Tensor(), Tensor(), Tensor()};
        Tensor s = x_or_y.unpack(node_name), r = rstd.unpack(node_name);
        Tensor w = weight.unpack(node_name), b = bias.unpack(node_name);
        const bool needs_ds = needs_input_grad(0) || needs_input_grad(3);
        std::vector<Tensor> grads(6);
        Tensor ds;
        if (dy1.defined()) {
            // y and y1 are both affine in x_hat: ds is the sum of each output's dx with x_hat in
            // hand (the backward is linear in dy), each output's dweight and dbias its own.
            const bool y_part = dy.defined() && (needs_ds || needs_input_grad(1) || needs_input_grad(2));
            const bool y1_part = needs_ds || needs_input_grad(4) || needs_input_grad(5);
            Tensor x_hat = policy == SavePolicy::Input && (y_part || y1_part) ? normalized_rows(s) : s;
            if (y_part) {
                auto [dx, dw, db] = kernel(dy, x_hat, SavePolicy::Normalized, Tensor(), r, w, b, needs_ds,
                                           needs_input_grad(1), needs_input_grad(2));
                ds = dx, grads[1] = dw, grads[2] = db;
            }
            if (y1_part) {
                auto [dx, dw1, db1] = kernel(dy1, x_hat, SavePolicy::Normalized, Tensor(), r,
                                             weight1.unpack(node_name), bias1.unpack(node_name), needs_ds,
                                             needs_input_grad(4), needs_input_grad(5));
                ds = ds.defined() && dx.defined() ? ds.add_(dx) : dx;
                grads[4] = dw1, grads[5] = db1;
            }
            if (ds_out.defined()) ds = ds.defined() ? ds.add_(ds_out) : ds_out;
        } else {
            // The kernel adds s's own gradient into ds, as the add op would (dresidual).
            auto [dx, dw, db] = kernel(dy, s, policy, mean.unpack(node_name), r, w, b, needs_ds, needs_input_grad(1),
                                       needs_input_grad(2), ds_out);
            ds = dx, grads[1] = dw, grads[2] = db;
        }
        grads[0] = ds;
        grads[3] = has_residual ? ds : Tensor();  // dresidual = ds = dx
        return grads;
    }

private:
    // The norm's backward kernels on dy (shaped as the output) and `saved` under `saved_policy`:
    // {dx (when need_dx), dweight (need_dw), dbias (need_db)}, each undefined when not needed; dx
    // plus dresidual where that is defined.
    std::tuple<Tensor, Tensor, Tensor> kernel(const Tensor& grad_output, const Tensor& saved, SavePolicy saved_policy,
                                              const Tensor& m, const Tensor& r, const Tensor& w, const Tensor& b,
                                              bool need_dx, bool need_dw, bool need_db,
                                              const Tensor& dresidual_any = Tensor()) {
        Tensor dy = grad_output.contiguous();
        Tensor dresidual = need_dx && dresidual_any.defined() ? dresidual_any.contiguous() : Tensor();
        TensorOptions opts = TensorOptions().dtype(saved.dtype()).device(saved.device());
        Tensor dx = need_dx ? empty(saved.shape(), opts) : Tensor();
        Tensor dw = need_dw ? empty(w.shape(), opts) : Tensor();
        Tensor db = need_db ? empty(b.shape(), opts) : Tensor();
        int64_t N = saved.size(-1), M = saved.numel() / N;
        dispatch_floating(saved.dtype(), node_name, [&](auto tag) {
            using T = decltype(tag);
            using S = acc_t<T>;
            if (saved.device().is_cuda()) {
                NT_CUDA(detail::norm_backward_cuda<T>(device_ptr<T>(dx), device_ptr<T>(dw), device_ptr<T>(db),
                                                      device_ptr<T>(dy), device_ptr<T>(dresidual),
                                                      device_ptr<T>(saved), device_ptr<S>(m),
                                                      device_ptr<S>(r), device_ptr<T>(w), device_ptr<T>(b), centered,
                                                      saved_policy, M, N, saved.device().index));
            } else {
                norm_backward_cpu<T>(device_ptr<T>(dx), device_ptr<T>(dw), device_ptr<T>(db), device_ptr<T>(dy),
                                     device_ptr<T>(dresidual), device_ptr<T>(saved), device_ptr<S>(m), device_ptr<S>(r),
                                     device_ptr<T>(w), device_ptr<T>(b), centered, saved_policy, M, N);
            }
        });
        if (dx.defined()) dx = dx.view(grad_output.shape());
        return {dx, dw, db};
    }

    // x_hat of the rows of s, by the forward's kernels without weight or bias: the forward's x_hat
    // and statistics (on CUDA to the last bits where both calls take the same kernel: a weight of
    // misaligned storage sends the forward to the reference kernel, whose sums go in another order).
    Tensor normalized_rows(const Tensor& s) {
        TensorOptions opts = TensorOptions().dtype(s.dtype()).device(s.device());
        int64_t N = s.size(-1), M = s.numel() / N;
        Tensor x_hat = empty(s.shape(), opts);
        Tensor m = centered ? empty({M}, opts.dtype(stat_dtype(s.dtype()))) : Tensor();
        Tensor r = empty({M}, opts.dtype(stat_dtype(s.dtype())));
        run_norm_forward(node_name, x_hat, Tensor(), m, r, s, Tensor(), Tensor(), Tensor(), Tensor(), eps);
        return x_hat;
    }
};

// x * scale[..., None]: each row of x (contiguous, [..., N]) times its scale (x's dtype, one a row),
// in acc_t<T>. No recording: rows_scaled below records.
Tensor scale_rows_kernel(const Tensor& x, const Tensor& scale) {
    const int64_t N = x.size(-1), M = x.numel() / N;
    Tensor out = empty(x.shape(), TensorOptions().dtype(x.dtype()).device(x.device()));
    dispatch_floating(x.dtype(), "scale_rows", [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::scale_rows_cuda<T>(device_ptr<T>(out), device_ptr<T>(x), device_ptr<T>(scale), M, N,
                                               x.device().index));
            return;
        }
        const T *px = x.data_ptr<T>(), *ps = scale.data_ptr<T>();
        T* po = out.data_ptr<T>();
        detail::parallel_for(0, M, rows_grain(N), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                for (int64_t j = 0; j < N; ++j)
                    po[r * N + j] = static_cast<T>(acc_t<T>(px[r * N + j]) * acc_t<T>(ps[r]));
        });
    });
    return out;
}

// The fused norm's rowscale: dx = dy * scale[..., None]; scale itself gets no gradient (a constant,
// as layer_norm_fn's rowscale). Saves scale (one element a row).
struct RowScaleBackward : Node {
    SavedTensor scale;
    explicit RowScaleBackward(const Tensor& s) : scale(s) {}
    const char* name() const override { return "RowScaleBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"rowscale", &scale}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {scale_rows_kernel(grad_output.contiguous(), scale.unpack(name()))};
    }
};

Tensor rows_scaled(const Tensor& x_in, const Tensor& scale_in) {
    Tensor x = x_in.contiguous(), scale = scale_in.contiguous();
    Tensor out = scale_rows_kernel(x, scale);
    if (should_record(x)) record(std::make_shared<RowScaleBackward>(scale), out, x);
    return out;
}

// weight or bias, when given, is [N] of x's dtype and device.
void check_param(const char* op, const char* what, const Tensor& p, const Tensor& x, int64_t N) {
    if (!p.defined()) return;
    detail::check_like(op, what, p, "x", x);
    NT_CHECK_AS(ShapeError, p.dim() == 1 && p.size(0) == N, op, ": expected ", what, " of shape [", N,
                "] (normalized_shape, the last dimension of x ", shape_str(x.shape()), "), got ", shape_str(p.shape()));
}

// Note [Weights near zero under SavePolicy::Output]. Reads a GPU weight on the host (N values).
bool weight_allows_output_policy(const Tensor& weight_any) {
    if (!weight_any.defined() || (weight_any.device().is_cuda() && detail::cuda_graph_capturing()))
        return true;  // Note [CUDA graphs]: no value is read during a capture
    Tensor weight = weight_any.device().is_cuda() ? weight_any.to(Device::CPU) : weight_any;
    if (is_dry_run()) return true;  // Note [The dry run]: no values to read; predictions assume no fallback
    bool ok = true;
    dispatch_floating(weight.dtype(), "norm", [&](auto tag) {
        using T = decltype(tag);
        const T* p = weight.data_ptr<T>();
        for (int64_t j = 0, end = weight.numel(); j < end; ++j) ok = ok && std::abs(double(p[j])) >= kOutputPolicyMinWeight;
    });
    return ok;
}

}  // namespace

const char* policy_name(SavePolicy policy) {
    switch (policy) {
        case SavePolicy::Input: return "input";
        case SavePolicy::Output: return "output";
        case SavePolicy::Normalized: return "normalized";
    }
    return "?";
}

int64_t output_policy_fallbacks() { return fallback_count; }

namespace detail {

Tensor norm_forward(const char* op, const char* node_name, bool centered, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, double eps, SavePolicy policy) {
    FusedNormOptions options;
    options.eps = eps;
    options.policy = policy;
    return fused_norm_forward(op, node_name, centered, x, weight, bias, options).y;
}

FusedNormOutputs fused_norm_forward(const char* op, const char* node_name, bool centered, const Tensor& x_in,
                                    const Tensor& weight_in, const Tensor& bias_in, const FusedNormOptions& options) {
    const double eps = options.eps;
    SavePolicy policy = options.policy;
    const Tensor& residual = options.residual;
    detail::check_floating_input(op, "x", x_in);
    NT_CHECK_AS(ShapeError, x_in.dim() >= 1, op,
                ": expected x of shape [..., N] with at least one dimension, got a scalar (shape [])");
    NT_CHECK(std::isfinite(eps) && eps > 0.0, op, ": expected eps > 0 and finite, got ", eps);
    int64_t N = x_in.size(-1), M = x_in.numel() / N;
    // The CUDA kernels take N as int and launch up to one block per row (grid x <= INT32_MAX).
    detail::check_fits_int32(op, x_in, "N (normalized_shape)", N);
    detail::check_fits_int32(op, x_in, "M (rows, numel / N)", M);
    check_param(op, "weight", weight_in, x_in, N);
    check_param(op, "bias", bias_in, x_in, N);
    check_param(op, "weight1", options.weight1, x_in, N);
    check_param(op, "bias1", options.bias1, x_in, N);
    NT_CHECK(centered || !options.bias1.defined(), op, ": expected no bias1 (RMSNorm has no bias), got one");
    NT_CHECK(options.weight1.defined() || !options.bias1.defined(), op,
             ": expected weight1 with bias1 (the second affine output's weight), got bias1 alone");
    NT_CHECK(weight_in.defined() || !options.zero_centered_weight, op,
             ": expected a weight with zero_centered_weight (the norm multiplies by weight + 1), got none");
    // The residual stream's dtype (Note [The fused norm]): an f32 residual beside a bf16 x is f32's.
    const bool widens = x_in.dtype() == DType::BF16 &&
                        (residual.defined() ? residual.dtype() == DType::F32 : options.residual_in_fp32);
    const DType stream_dtype = widens ? DType::F32 : x_in.dtype();
    for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"residual", residual}, {"x1", options.x1}}) {
        if (!t.defined()) continue;
        const bool is_residual = name == std::string_view("residual");
        if (is_residual && x_in.dtype() == DType::BF16)
            NT_CHECK_AS(DTypeError, t.dtype() == DType::BF16 || t.dtype() == DType::F32, op,
                        ": expected residual of dtype bf16 (as x) or f32 (a wider residual stream), got ",
                        dtype_name(t.dtype()));
        if (is_residual && widens)
            NT_CHECK_AS(DeviceError, t.device() == x_in.device(), op, ": expected residual on ",
                        device_name(x_in.device()), " (as x), got ", device_name(t.device()));
        else
            detail::check_like(op, name, t, "x", x_in);
        NT_CHECK_AS(ShapeError, t.shape() == x_in.shape(), op, ": expected ", name, " of x's shape ",
                    shape_str(x_in.shape()), ", got ", shape_str(t.shape()));
    }
    const DType out_dtype = options.out_dtype.value_or(x_in.dtype());
    NT_CHECK_AS(DTypeError, is_floating(out_dtype), op, ": expected out_dtype f32, f64 or bf16, got ",
                dtype_name(out_dtype));
    if (x_in.device().is_cuda() && out_dtype == DType::BF16)
        detail::check_dtype_on_gpu(op, "out_dtype", out_dtype, x_in.device(), cuda_compute_capability(x_in.device()));
    const double p = options.dropout_p;
    NT_CHECK(p >= 0.0 && p < 1.0, op, ": expected dropout_p in [0, 1), got ", p);
    const Tensor& rowscale = options.rowscale;
    if (rowscale.defined()) {
        detail::check_like(op, "rowscale", rowscale, "x", x_in);
        Shape rows = x_in.shape();
        rows.pop_back();
        NT_CHECK_AS(ShapeError, rowscale.shape() == rows, op, ": expected rowscale of shape ", shape_str(rows),
                    " (x's without its last dimension), got ", shape_str(rowscale.shape()));
        NT_CHECK(!rowscale.requires_grad(), op,
                 ": expected a rowscale that requires no gradient (a constant: it gets none), got one that does");
        NT_CHECK(!options.x1.defined(), op, ": expected rowscale or x1, not both (as layer_norm_fn)");
    }

    // dropout(x * rowscale) + dropout(x1), recorded as those ops, x's mask first (Note [The fused norm]).
    Tensor x = rowscale.defined() ? rows_scaled(x_in, rowscale) : x_in.contiguous();
    if (p > 0.0) x = dropout(x, p);
    if (options.x1.defined()) x = add(x, p > 0.0 ? dropout(options.x1, p) : options.x1);
    x = cast(x, stream_dtype);
    // The norm's input: s = x + residual, written by the norm's forward kernel in the add op's
    // arithmetic, so that s is add(x, residual) bit for bit (Note [The fused norm]); x itself
    // without a residual.
    TensorOptions opts = TensorOptions().dtype(x.dtype()).device(x.device());
    const Tensor residual_c = residual.defined() ? residual.contiguous() : Tensor();
    Tensor s = residual.defined() ? empty(x.shape(), opts) : x;
    // Zero-centered weights (Gemma's): the norm multiplies by weight + 1, made here by the add op
    // (recorded, so weight gets the gradient of weight + 1; N elements, which the node saves).
    auto contiguous = [](const Tensor& t) { return t.defined() ? t.contiguous() : Tensor(); };
    auto multiplier = [&](const Tensor& w) {
        const TensorOptions like = TensorOptions().dtype(x_in.dtype()).device(x_in.device());
        return options.zero_centered_weight && w.defined() ? add(w, full({N}, 1.0, like)) : contiguous(w);
    };
    auto widened = [&](const Tensor& t) { return t.defined() ? cast(t, stream_dtype) : Tensor(); };
    const Tensor weight = widened(multiplier(weight_in)), bias = widened(contiguous(bias_in));
    const Tensor weight1 = widened(multiplier(options.weight1)), bias1 = widened(contiguous(options.bias1));
    TensorOptions stat_opts = opts.dtype(stat_dtype(s.dtype()));
    const bool records = should_record(x, weight, bias, residual, weight1, bias1);
    // With a second affine output, Output is Normalized: y gives x_hat back only through weight,
    // and y1's dweight1 needs x_hat itself. So it is where y is cast: the same bytes, and the
    // Linear after the norm makes the cast y again rather than keep it (Note [The fused norm]).
    const bool y_cast = out_dtype != stream_dtype;
    if ((weight1.defined() || y_cast) && policy == SavePolicy::Output) policy = SavePolicy::Normalized;
    // With weight1, or under Normalized with a weight or bias when the call records (Note
    // [SavePolicy::Normalized]), the forward writes x_hat too and makes y (and y1) from the rounded
    // x_hat; otherwise y alone.
    const bool normalized =
        weight1.defined() || (policy == SavePolicy::Normalized && (weight.defined() || bias.defined()) && records);
    Tensor y = empty(s.shape(), opts);
    Tensor x_hat = normalized ? empty(s.shape(), opts) : Tensor();
    // mean and rstd are separate storages so that Output can save rstd without keeping mean alive.
    Tensor mean = centered ? empty({M}, stat_opts) : Tensor();
    Tensor rstd = empty({M}, stat_opts);
    run_norm_forward(op, y, x_hat, mean, rstd, x, residual_c, s, weight, bias, eps);
    Tensor y1 = weight1.defined() ? norm_affine(x_hat, weight1, bias1) : Tensor();
    // s is the node's second output when it is returned and is not x itself.
    const bool prenorm_output = options.prenorm && residual.defined();
    bool saves_x_hat = false;
    if (records) {
        if (policy == SavePolicy::Output && !weight_allows_output_policy(weight)) {
            policy = SavePolicy::Input;
            ++fallback_count;
        }
        // Normalized: x_hat (y without affine and weight1); Output: y; Input: s.
        saves_x_hat = policy == SavePolicy::Normalized && normalized;
        const Tensor& saved = saves_x_hat ? x_hat : policy == SavePolicy::Input ? s : y;
        auto node = std::make_shared<NormBackward>(node_name, centered, residual.defined(), policy, eps, saved,
                                                   policy == SavePolicy::Input ? mean : Tensor(), rstd, weight, bias,
                                                   weight1, bias1);
        record_outputs(node, {&y, prenorm_output ? &s : nullptr, &y1}, x, weight, bias, residual, weight1, bias1);
    }
    // y and y1 in out_dtype; under Normalized, made again from x_hat (and cast) when saved.
    Tensor y_out = cast(y, out_dtype), y1_out = y1.defined() ? cast(y1, out_dtype) : Tensor();
    if (saves_x_hat) {
        auto affine = [out_dtype](const std::vector<Tensor>& in) {
            Tensor made = norm_affine(in[0], in[1], in[2]);
            return made.dtype() == out_dtype ? made : made.to(out_dtype);
        };
        set_recipe(y_out, "norm affine", {x_hat, weight, bias}, affine);
        if (y1.defined()) set_recipe(y1_out, "norm affine", {x_hat, weight1, bias1}, affine);
    }
    detail::check_forward_anomaly(op, "y", y, {{"x", x}, {"residual", residual}, {"weight", weight}, {"bias", bias}});
    if (y1.defined())
        detail::check_forward_anomaly(op, "y1", y1,
                                      {{"x", x}, {"residual", residual}, {"weight1", weight1}, {"bias1", bias1}});
    // Without residual, rowscale, dropout, x1 or a wider stream, s is x.contiguous(): x itself when x
    // is contiguous.
    return {y_out, options.prenorm ? s : Tensor(), y1_out};
}

Tensor norm_affine(const Tensor& x_hat, const Tensor& weight, const Tensor& bias) {
    Tensor y = empty(x_hat.shape(), TensorOptions().dtype(x_hat.dtype()).device(x_hat.device()));
    int64_t N = x_hat.size(-1), M = x_hat.numel() / N;
    dispatch_floating(x_hat.dtype(), "norm", [&](auto tag) {
        using T = decltype(tag);
        if (x_hat.device().is_cuda()) {
            NT_CUDA(detail::norm_affine_cuda<T>(device_ptr<T>(y), device_ptr<T>(x_hat), device_ptr<T>(weight),
                                                device_ptr<T>(bias), M, N, x_hat.device().index));
        } else {
            norm_affine_cpu<T>(device_ptr<T>(y), device_ptr<T>(x_hat), device_ptr<T>(weight), device_ptr<T>(bias), M, N);
        }
    });
    return y;
}

}  // namespace detail

}  // namespace normtape
