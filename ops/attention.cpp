// ops/attention.cpp: causal self-attention: checks, the autograd node, and the CPU kernels, plain
// loops over (b, h, t) that compute what the CUDA kernels compute (ops/attention.cu): the
// softmax's row log-sum-exp in forward, the probabilities again in backward. The inference op
// causal_self_attention_rows runs the same forward loop from its first row on.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/parallel.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

// The head-h slices of one position's q, k and v rows in the packed [B, T, 3C] layout.
template <class T>
struct Heads {
    const T* qkv;
    int64_t Tn, C, hs;
    const T* q(int64_t b, int64_t t, int64_t h) const { return qkv + (b * Tn + t) * 3 * C + h * hs; }
    const T* k(int64_t b, int64_t t, int64_t h) const { return q(b, t, h) + C; }
    const T* v(int64_t b, int64_t t, int64_t h) const { return q(b, t, h) + 2 * C; }
};

template <class A, class T>
A dot(const T* x, const T* y, int64_t n) {
    A s = 0;
    for (int64_t d = 0; d < n; ++d) s += A(x[d]) * A(y[d]);
    return s;
}

// The output rows t = first_row .. T-1, Tq = T - first_row of them: out: [B, Tq, C], lse:
// [B, NH, Tq] (natural log of the softmax's denominator, scores scaled) or null, qkv: [B, T, 3C];
// dropout `drop` on the probabilities (only with first_row 0). Arithmetic in A = acc_t<T>.
template <class T>
void attention_forward_cpu(T* out, acc_t<T>* lse, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                           int64_t first_row, const DropoutMask& drop) {
    using A = acc_t<T>;
    const int64_t hs = C / NH, Tq = Tn - first_row;
    const A scale = A(1) / std::sqrt(A(hs));
    const A keep_scale = A(1) / (A(1) - A(drop.p));
    const Heads<T> x{qkv, Tn, C, hs};
    // One (batch, head) per chunk: each writes its own rows of out and lse.
    detail::parallel_for(0, B * NH, 1, [&](int64_t bh0, int64_t bh1) {
        std::vector<A> a(Tn), o(hs);
        for (int64_t bh = bh0; bh < bh1; ++bh) {
            const int64_t b = bh / NH, h = bh % NH;
            for (int64_t t = first_row; t < Tn; ++t) {
                A m = -std::numeric_limits<A>::infinity();
                for (int64_t s = 0; s <= t; ++s) {
                    a[s] = dot<A>(x.q(b, t, h), x.k(b, s, h), hs) * scale;
                    m = std::max(m, a[s]);
                }
                A sum = 0;
                for (int64_t s = 0; s <= t; ++s) sum += a[s] = std::exp(a[s] - m);
                std::fill(o.begin(), o.end(), A(0));
                for (int64_t s = 0; s <= t; ++s) {
                    const A w = a[s] * detail::attention_drop_factor(drop, keep_scale, b * NH + h, Tn, t, s);
                    const T* v = x.v(b, s, h);
                    for (int64_t d = 0; d < hs; ++d) o[d] += w * A(v[d]);
                }
                T* out_row = out + (b * Tq + t - first_row) * C + h * hs;
                for (int64_t d = 0; d < hs; ++d) out_row[d] = static_cast<T>(o[d] / sum);
                if (lse) lse[(b * NH + h) * Tq + t - first_row] = m + std::log(sum);
            }
        }
    });
}

// With p[t, s] = exp(q_t . k_s * scale - lse[t]) recomputed, z[t, s] the dropout factor drawn
// again, D[t] = dout_t . out_t and ds[t, s] = p[t, s] * (z[t, s] dout_t . v_s - D[t]) (the softmax
// backward, since sum_s p z dp = D):
//   dq[t] = scale * sum_s ds k_s,  dk[s] = scale * sum_t ds q_t,  dv[s] = sum_t p z dout_t.
// dqkv is overwritten (=); sums are kept in A = acc_t<T> and rounded to T once at the end.
template <class T>
void attention_backward_cpu(T* dqkv, const T* dout, const T* qkv, const T* out, const acc_t<T>* lse, int64_t B,
                            int64_t Tn, int64_t C, int64_t NH, const DropoutMask& drop) {
    using A = acc_t<T>;
    const int64_t hs = C / NH;
    const A keep_scale = A(1) / (A(1) - A(drop.p));
    const A scale = A(1) / std::sqrt(A(hs));
    const Heads<T> x{qkv, Tn, C, hs};
    std::vector<A> grad(B * Tn * 3 * C, A(0));
    auto g = [&](int64_t b, int64_t t, int64_t h, int64_t part) { return grad.data() + (b * Tn + t) * 3 * C + part * C + h * hs; };
    // One (batch, head) per chunk: each sums into its own head's columns of dq, dk and dv.
    detail::parallel_for(0, B * NH, 1, [&](int64_t bh0, int64_t bh1) {
        for (int64_t bh = bh0; bh < bh1; ++bh) {
            const int64_t b = bh / NH, h = bh % NH;
            for (int64_t t = 0; t < Tn; ++t) {
                const T* go = dout + (b * Tn + t) * C + h * hs;
                const A D = dot<A>(go, out + (b * Tn + t) * C + h * hs, hs), row_lse = lse[(b * NH + h) * Tn + t];
                A* dq = g(b, t, h, 0);
                for (int64_t s = 0; s <= t; ++s) {
                    // <= 1 exactly as in forward; at scores whose rounding exceeds 1 (|score| ~ 1e8 in
                    // f32) the exponent's own rounding would otherwise make p overflow.
                    const A p = std::min(A(1), std::exp(dot<A>(x.q(b, t, h), x.k(b, s, h), hs) * scale - row_lse));
                    const A z = detail::attention_drop_factor(drop, keep_scale, b * NH + h, Tn, t, s);
                    const A ds = p * (z * dot<A>(go, x.v(b, s, h), hs) - D) * scale;
                    const T *q = x.q(b, t, h), *k = x.k(b, s, h);
                    A *dk = g(b, s, h, 1), *dv = g(b, s, h, 2);
                    for (int64_t d = 0; d < hs; ++d) {
                        dq[d] += ds * A(k[d]);
                        dk[d] += ds * A(q[d]);
                        dv[d] += p * z * A(go[d]);
                    }
                }
            }
        }
    });
    for (size_t i = 0; i < grad.size(); ++i) dqkv[i] = static_cast<T>(grad[i]);
}

using detail::device_ptr;

constexpr int64_t kMaxCudaHeadSize = 8192;

struct AttentionBackward : Node {
    SavedTensor qkv, out, lse;
    int64_t n_head;
    DropoutMask drop;  // drawn again, never stored
    AttentionBackward(const Tensor& qkv_, const Tensor& out_, const Tensor& lse_, int64_t nh, const DropoutMask& d)
        : qkv(qkv_), out(out_), lse(lse_), n_head(nh), drop(d) {}
    const char* name() const override { return "CausalSelfAttentionBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"qkv", &qkv}, {"out", &out}, {"lse", &lse}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor x = qkv.unpack(name()), o = out.unpack(name()), l = lse.unpack(name()), g = grad_output.contiguous();
        Tensor dqkv = empty(x.shape(), TensorOptions().dtype(x.dtype()).device(x.device()));
        const int64_t B = x.size(0), Tn = x.size(1), C = x.size(2) / 3;
        dispatch_floating(x.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            using S = acc_t<T>;
            if (x.device().is_cuda()) {
                NT_CUDA(detail::attention_backward_cuda<T>(device_ptr<T>(dqkv), device_ptr<T>(g), device_ptr<T>(x),
                                                           device_ptr<T>(o), device_ptr<S>(l), B, Tn, C, n_head, drop,
                                                           x.device().index));
            } else {
                attention_backward_cpu<T>(device_ptr<T>(dqkv), device_ptr<T>(g), device_ptr<T>(x), device_ptr<T>(o),
                                          device_ptr<S>(l), B, Tn, C, n_head, drop);
            }
        });
        return {dqkv};
    }
};

// The checks both ops make of qkv [B, T, 3C] and n_head, naming `op`.
void check_qkv(const char* op, const Tensor& qkv, int64_t n_head) {
    detail::check_floating_input(op, "qkv", qkv);
    NT_CHECK_AS(ShapeError, qkv.dim() == 3, op, ": expected qkv of shape [B, T, 3C], got ", shape_str(qkv.shape()));
    NT_CHECK(n_head >= 1, op, ": expected n_head >= 1, got ", n_head);
    const int64_t C = qkv.size(2) / 3;
    NT_CHECK_AS(ShapeError, qkv.size(2) % 3 == 0 && C % n_head == 0, op,
                ": expected qkv's last dimension to be 3C with C divisible by n_head = ", n_head, ", got shape ",
                shape_str(qkv.shape()));
    // CUDA: the kernels launch up to one block per (batch, head, row) on grid x (<= INT32_MAX) and
    // keep up to two head-size vectors of f64 a row in shared memory.
    int64_t rows = 0;
    if (__builtin_mul_overflow(qkv.size(0), n_head, &rows) || __builtin_mul_overflow(rows, qkv.size(1), &rows))
        rows = INT64_MAX;
    detail::check_fits_int32(op, qkv, "B * n_head * T", rows);
    NT_CHECK_AS(ShapeError, !qkv.device().is_cuda() || C / n_head <= kMaxCudaHeadSize, op,
                ": expected a head size C / n_head <= ", kMaxCudaHeadSize, " on cuda, got ", C / n_head, " for shape ",
                shape_str(qkv.shape()), " and n_head = ", n_head);
}

}  // namespace

Tensor causal_self_attention(const Tensor& qkv_in, int64_t n_head, double dropout_p) {
    const char* op = "causal_self_attention";
    check_qkv(op, qkv_in, n_head);
    NT_CHECK(dropout_p >= 0 && dropout_p < 1, op, ": expected a dropout probability in [0, 1), got ", dropout_p);
    const int64_t B = qkv_in.size(0), Tn = qkv_in.size(1), C = qkv_in.size(2) / 3;
    DropoutMask drop;
    if (dropout_p > 0) {  // one word per (b, h, t, s)
        int64_t words = 0;
        NT_CHECK_AS(ShapeError, !__builtin_mul_overflow(B * n_head * Tn, Tn, &words), op,
                    ": expected B * n_head * T * T to fit in int64 with dropout, got shape ", shape_str(qkv_in.shape()));
        drop = DropoutMask(philox_next(static_cast<uint64_t>(words)), dropout_p);
    }
    Tensor qkv = qkv_in.contiguous();
    TensorOptions opts = TensorOptions().dtype(qkv.dtype()).device(qkv.device());
    Tensor out = empty({B, Tn, C}, opts);
    Tensor lse = empty({B, n_head, Tn}, opts.dtype(stat_dtype(qkv.dtype())));
    dispatch_floating(qkv.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        using S = acc_t<T>;
        if (qkv.device().is_cuda()) {
            NT_CUDA(detail::attention_forward_cuda<T>(device_ptr<T>(out), device_ptr<S>(lse), device_ptr<T>(qkv), B, Tn,
                                                      C, n_head, drop, qkv.device().index));
        } else {
            attention_forward_cpu<T>(device_ptr<T>(out), device_ptr<S>(lse), device_ptr<T>(qkv), B, Tn, C, n_head, 0,
                                     drop);
        }
    });
    if (should_record(qkv)) record(std::make_shared<AttentionBackward>(qkv, out, lse, n_head, drop), out, qkv);
    detail::check_forward_anomaly(op, "out", out, {{"qkv", qkv}});
    return out;
}

Tensor causal_self_attention_rows(const Tensor& qkv_in, int64_t n_head, int64_t first_row) {
    const char* op = "causal_self_attention_rows";
    check_qkv(op, qkv_in, n_head);
    const int64_t B = qkv_in.size(0), Tn = qkv_in.size(1), C = qkv_in.size(2) / 3;
    NT_CHECK(first_row >= 0 && first_row < Tn, op, ": expected first_row in [0, T = ", Tn, "), got ", first_row,
             " for qkv of shape ", shape_str(qkv_in.shape()));
    NT_CHECK(!(grad_mode_enabled() && qkv_in.requires_grad()), op,
             ": inference only (it records no graph): call under NoGradGuard, got qkv that requires grad with grad "
             "mode on");
    Tensor qkv = qkv_in.contiguous();
    Tensor out = empty({B, Tn - first_row, C}, TensorOptions().dtype(qkv.dtype()).device(qkv.device()));
    dispatch_floating(qkv.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        if (qkv.device().is_cuda()) {
            NT_CUDA(detail::attention_forward_rows_cuda<T>(device_ptr<T>(out), device_ptr<T>(qkv), B, Tn, C, n_head,
                                                           first_row, qkv.device().index));
        } else {
            attention_forward_cpu<T>(device_ptr<T>(out), nullptr, device_ptr<T>(qkv), B, Tn, C, n_head, first_row,
                                     DropoutMask());
        }
    });
    detail::check_forward_anomaly(op, "out", out, {{"qkv", qkv}});
    return out;
}

}  // namespace normtape
