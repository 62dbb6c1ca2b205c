// ops/linear_cross_entropy.cpp: the head's product and the cross-entropy over chunks of rows
// (ops/linear_cross_entropy.h): checks, the chunk loops of forward and backward, the cpu row
// kernels, the node. The CUDA row kernels are in ops/linear_cross_entropy.cu; the products are
// detail::gemm (ops/gemm.h).
#include "ops/linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/dry_run.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"
#include "ops/gemm.h"

namespace normtape {

namespace {
// The least elements of a chunk's dx product [rows, C] (its output has K = V behind each element):
// with fewer, a GPU's product leaves most of its multiprocessors idle (docs/PERFORMANCE.md, the
// head loss's chunk sizes).
constexpr int64_t kChunkProductElements = int64_t{1} << 22;
}  // namespace

int64_t linear_cross_entropy_chunk_rows(int64_t M, int64_t V, int64_t C) {
    const int64_t chunks = std::clamp<int64_t>((V + C - 1) / std::max<int64_t>(C, 1), 1, std::max<int64_t>(M, 1));
    const int64_t fill = (kChunkProductElements + C - 1) / std::max<int64_t>(C, 1);  // dx's rows of a full product
    return std::min(std::max<int64_t>(M, 1), std::max((M + chunks - 1) / chunks, fill));
}

namespace {

using detail::device_ptr;

// What the row kernels need besides the data: the options, resolved.
struct RowOptions {
    double softcap, smoothing;
    int64_t ignore_index;
};

// Rows per chunk of the cpu row kernels: about kGrain / 4 elements (each one an exp).
int64_t rows_grain(int64_t V) { return std::max<int64_t>(1, detail::kGrain / 4 / std::max<int64_t>(V, 1)); }

// The forward of `rows` rows of logits [rows, V] on the cpu: lse[i] and loss[i] (the row's
// smoothed loss; both 0 on an ignored row), as linear_cross_entropy_rows_cuda.
template <class T>
void rows_forward_cpu(acc_t<T>* lse, acc_t<T>* loss, const T* logits, const int64_t* targets, int64_t rows, int64_t V,
                      const RowOptions& o) {
    using A = acc_t<T>;
    auto z = [&](T x) { return o.softcap > 0 ? o.softcap * std::tanh(double(x) / o.softcap) : double(x); };
    detail::parallel_for(0, rows, rows_grain(V), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            const T* row = logits + i * V;
            if (targets[i] == o.ignore_index) {
                lse[i] = loss[i] = A(0);
                continue;
            }
            double maxv = z(row[0]), zsum = 0.0;
            for (int64_t v = 1; v < V; ++v) maxv = std::max(maxv, z(row[v]));
            double sum = 0.0;
            for (int64_t v = 0; v < V; ++v) {
                sum += std::exp(z(row[v]) - maxv);
                zsum += z(row[v]);
            }
            const double l = maxv + std::log(sum);
            lse[i] = static_cast<A>(l);
            loss[i] = static_cast<A>(l - (1.0 - o.smoothing) * z(row[targets[i]]) - o.smoothing / double(V) * zsum);
        }
    });
}

// The backward of `rows` rows on the cpu, in place: logits[i, v] becomes
// (softmax(z)[v] - (1 - s) [v == t] - s / V) * g * scale * dz/dlogit, 0 on an ignored row.
template <class T>
void rows_backward_cpu(T* logits, const acc_t<T>* lse, const int64_t* targets, acc_t<T> g, int64_t rows, int64_t V,
                       const RowOptions& o) {
    using A = acc_t<T>;
    const bool capped = o.softcap > 0;
    const A c = static_cast<A>(o.softcap), s = static_cast<A>(o.smoothing), uniform = s / static_cast<A>(V);
    detail::parallel_for(0, rows, rows_grain(V), [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            T* row = logits + i * V;
            const bool ignored = targets[i] == o.ignore_index;
            for (int64_t v = 0; v < V; ++v) {
                A z = A(row[v]), dz = A(1);
                if (capped) {
                    const A th = std::tanh(z / c);
                    z = c * th;
                    dz = A(1) - th * th;
                }
                const A target = v == targets[i] ? A(1) - s : A(0);
                row[v] = ignored ? T(0) : static_cast<T>((std::exp(z - lse[i]) - target - uniform) * g * dz);
            }
        }
    });
}

// rows_forward_cpu, or its CUDA twin, on a chunk's logits [n, V] and its rows' lse, loss and targets.
void rows_forward(const Tensor& lse, const Tensor& loss, const Tensor& logits, const Tensor& targets,
                  const RowOptions& o) {
    dispatch_floating(logits.dtype(), "linear_cross_entropy", [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const int64_t rows = logits.size(0), V = logits.size(1);
        if (logits.device().is_cuda()) {
            NT_CUDA(detail::linear_cross_entropy_rows_cuda<T>(device_ptr<A>(lse), device_ptr<A>(loss), device_ptr<T>(logits),
                                                              device_ptr<int64_t>(targets), rows, V, o.softcap, o.smoothing,
                                                              o.ignore_index, logits.device().index));
            return;
        }
        rows_forward_cpu<T>(lse.data_ptr<A>(), loss.data_ptr<A>(), logits.data_ptr<T>(), targets.data_ptr<int64_t>(),
                            rows, V, o);
    });
}

// rows_backward_cpu, or its CUDA twin: the gradient of the chunk written over its logits, with
// g = grad[0] * scale.
void rows_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, const Tensor& grad, double scale,
                   const RowOptions& o) {
    dispatch_floating(logits.dtype(), "linear_cross_entropy", [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const int64_t rows = logits.size(0), V = logits.size(1);
        if (logits.device().is_cuda()) {
            NT_CUDA(detail::linear_cross_entropy_grad_cuda<T>(device_ptr<T>(logits), device_ptr<A>(lse),
                                                              device_ptr<int64_t>(targets), device_ptr<T>(grad), scale, rows,
                                                              V, o.softcap, o.smoothing, o.ignore_index,
                                                              logits.device().index));
            return;
        }
        rows_backward_cpu<T>(logits.data_ptr<T>(), lse.data_ptr<A>(), targets.data_ptr<int64_t>(),
                             static_cast<A>(A(grad.item<T>()) * scale), rows, V, o);
    });
}

// Note [The fused head's chunks]
// Forward and backward walk the rows in chunks of `chunk` rows, each making that chunk's logits
// [rows, V] into one buffer reused by every chunk: the logits are never whole in memory. The
// forward keeps only lse [M] (saved) and the rows' losses [M] (summed once, in a fixed order).
// The backward makes a chunk's logits again with the same product (so bit for bit the forward's),
// turns them into their gradient in place, then dx's rows of the chunk are one product
// (dz @ weight: no chunk shares rows with another) and dweight gets dz^T @ x[chunk] added in
// f32 (gemm_accumulate): the f32 sum of every chunk's product, rounded once at the end.
struct LinearCrossEntropyBackward : Node {
    SavedTensor x, weight, lse, targets;  // x [M, C]; weight [V, C]; lse [M] acc_t; targets [M] i64
    RowOptions options;
    int64_t chunk, counted;  // rows per chunk; rows not ignored
    LinearCrossEntropyBackward(const Tensor& x_, const Tensor& w, const Tensor& s, const Tensor& t, RowOptions o,
                               int64_t chunk_, int64_t counted_)
        : x(x_), weight(w), lse(s), targets(t), options(o), chunk(chunk_), counted(counted_) {}
    const char* name() const override { return "LinearCrossEntropyBackward"; }
    std::vector<SavedSlot> saved_tensors() override {
        return {{"input", &x}, {"weight", &weight}, {"lse", &lse}, {"targets", &targets}};
    }

    std::vector<Tensor> apply(const Tensor& grad_output) override {
        NoGradGuard no_grad;
        Tensor xs = x.unpack(name()), w = weight.unpack(name()), s = lse.unpack(name()), t = targets.unpack(name());
        const int64_t C = xs.size(-1), M = xs.numel() / C, V = w.size(0);
        const TensorOptions opts = TensorOptions().dtype(xs.dtype()).device(xs.device());
        Tensor x2 = xs.view({M, C}), t2 = t.view({M});
        Tensor dx = needs_input_grad(0) ? empty(xs.shape(), opts) : Tensor();
        // dweight's f32 (f64) sum over the chunks: dweight itself unless bf16, rounded once at the end.
        Tensor dw_acc = needs_input_grad(1) ? zeros({V, C}, opts.dtype(stat_dtype(xs.dtype()))) : Tensor();
        if (counted > 0 && (dx.defined() || dw_acc.defined())) {
            Tensor buffer = empty({std::min(chunk, M), V}, opts);
            Tensor dx2 = dx.defined() ? dx.view({M, C}) : Tensor();
            for (int64_t r0 = 0; r0 < M; r0 += chunk) {
                const int64_t n = std::min(chunk, M - r0);
                Tensor dz = buffer.narrow(0, 0, n), xr = x2.narrow(0, r0, n);
                detail::gemm(dz, xr, false, w, true);
                rows_backward(dz, s.narrow(0, r0, n), t2.narrow(0, r0, n), grad_output, 1.0 / static_cast<double>(counted),
                              options);
                if (dx.defined()) detail::gemm(dx2.narrow(0, r0, n), dz, false, w, false);
                if (dw_acc.defined()) detail::gemm_accumulate(dw_acc, dz, true, xr, false);
            }
        } else if (dx.defined()) {
            dx.zero_();
        }
        Tensor dweight = !dw_acc.defined() || dw_acc.dtype() == xs.dtype() ? dw_acc : dw_acc.to(xs.dtype());
        return {dx, dweight, Tensor()};
    }
};

}  // namespace

Tensor linear_cross_entropy(const Tensor& x_in, const Tensor& weight_in, const Tensor& targets_in,
                            const LinearCrossEntropyOptions& options) {
    const char* op = "linear_cross_entropy";
    NT_CHECK(std::isfinite(options.softcap) && options.softcap >= 0, op,
             ": expected softcap >= 0 and finite (0: no cap), got ", options.softcap);
    NT_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1, op,
             ": expected label_smoothing in [0, 1], got ", options.label_smoothing);
    NT_CHECK(options.chunk_rows >= 0, op, ": expected chunk_rows >= 0 (0: chosen from the shapes), got ",
             options.chunk_rows);
    detail::check_floating_input(op, "x", x_in);
    detail::check_like(op, "weight", weight_in, "x", x_in);
    detail::check_index_input(op, "targets", targets_in);
    NT_CHECK_AS(ShapeError, x_in.dim() >= 1, op, ": expected x of shape [..., C], got a scalar (shape [])");
    const int64_t C = x_in.size(-1);
    NT_CHECK_AS(ShapeError, weight_in.dim() == 2 && weight_in.size(1) == C && weight_in.size(0) > 0, op,
                ": expected weight of shape [V, ", C, "] for x of shape ", shape_str(x_in.shape()), ", got ",
                shape_str(weight_in.shape()));
    Shape rows_shape(x_in.shape().begin(), x_in.shape().end() - 1);
    NT_CHECK_AS(ShapeError, targets_in.shape() == rows_shape, op, ": expected targets of shape ", shape_str(rows_shape),
                " for x of shape ", shape_str(x_in.shape()), ", got ", shape_str(targets_in.shape()));
    NT_CHECK(!detail::cuda_graph_capturing(), op, ": expected to run outside a CUDA graph capture, got one (it counts ",
             "its targets on the host)");
    NT_CHECK_AS(DeviceError, targets_in.device() == x_in.device(), op, ": expected targets on ",
                device_name(x_in.device()), " (as x), got ", device_name(targets_in.device()));
    const int64_t V = weight_in.size(0), M = x_in.numel() / C;
    detail::check_fits_int32(op, x_in, "the rows M", M);
    detail::check_fits_int32(op, weight_in, "the vocabulary V", V);

    // Every target in [0, V) or ignore_index; the counted rows are the mean's divisor.
    Tensor targets = targets_in.contiguous();
    int64_t counted = 0;
    {
        Tensor host = targets.device().is_cuda() ? targets.to(Device::CPU) : targets;
        const int64_t* p = is_dry_run() ? nullptr : host.data_ptr<int64_t>();
        if (!p) counted = M;  // Note [The dry run]: the placeholder targets, 0, are all counted
        for (int64_t i = 0; p && i < M; ++i) {
            if (p[i] == options.ignore_index) continue;
            NT_CHECK(p[i] >= 0 && p[i] < V, op, ": expected targets in [0, ", V, ") or ignore_index ",
                     options.ignore_index, ", got ", p[i], " at flat position ", i, " of targets ",
                     shape_str(targets.shape()));
            ++counted;
        }
    }
    const RowOptions rows{options.softcap, options.label_smoothing, options.ignore_index};
    const int64_t chunk = options.chunk_rows > 0 ? options.chunk_rows : linear_cross_entropy_chunk_rows(M, V, C);

    Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
    const TensorOptions opts = TensorOptions().dtype(x.dtype()).device(x.device());
    Tensor lse = empty({M}, opts.dtype(stat_dtype(x.dtype())));
    Tensor loss = empty({}, opts);
    {
        NoGradGuard no_grad;  // the chunks' views and products are no part of the graph
        Tensor row_loss = empty({M}, opts.dtype(stat_dtype(x.dtype())));
        Tensor buffer = empty({std::min(chunk, M), V}, opts);  // Note [The fused head's chunks]
        Tensor x2 = x.view({M, C}), t = targets.view({M});
        for (int64_t r0 = 0; r0 < M; r0 += chunk) {
            const int64_t n = std::min(chunk, M - r0);
            Tensor logits = buffer.narrow(0, 0, n);
            detail::gemm(logits, x2.narrow(0, r0, n), false, weight, true);
            rows_forward(lse.narrow(0, r0, n), row_loss.narrow(0, r0, n), logits, t.narrow(0, r0, n), rows);
        }
        buffer = Tensor();
        // The mean over the counted rows: one fixed-order sum (NaN when none is counted).
        const double scale = counted > 0 ? 1.0 / static_cast<double>(counted) : std::numeric_limits<double>::quiet_NaN();
        dispatch_floating(x.dtype(), op, [&](auto tag) {
            using T = decltype(tag);
            using A = acc_t<T>;
            if (x.device().is_cuda()) {
                NT_CUDA(detail::single_block_sum_cuda<A, T>(device_ptr<T>(loss), device_ptr<A>(row_loss), M, scale,
                                                            x.device().index));
                return;
            }
            const A* p = row_loss.data_ptr<A>();
            double total = 0.0;
            for (int64_t i = 0; i < M; ++i) total += double(p[i]);
            *loss.data_ptr<T>() = static_cast<T>(total * scale);
        });
    }
    if (should_record(x, weight, targets))
        record(std::make_shared<LinearCrossEntropyBackward>(x, weight, lse, targets, rows, chunk, counted), loss, x,
               weight, targets);
    detail::check_forward_anomaly(op, "loss", loss, {{"x", x}, {"weight", weight}});
    return loss;
}

}  // namespace normtape
