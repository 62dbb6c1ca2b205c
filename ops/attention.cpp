// ops/attention.cpp: causal self-attention: checks, the autograd node, and the CPU kernels, plain
// loops over (b, h, t) that compute what the CUDA kernels compute (ops/attention.cu): the
// softmax's row log-sum-exp in forward, the probabilities again in backward. The inference op
// causal_self_attention_rows runs the same forward loop from its first row on.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/parallel.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "ops/attention_cudnn.h"
#include "ops/attention_layout.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

using detail::AttentionLayout;

template <class A, class T>
A dot(const T* x, const T* y, int64_t n) {
    A s = 0;
    for (int64_t d = 0; d < n; ++d) s += A(x[d]) * A(y[d]);
    return s;
}

// The output rows t = first_row .. T-1 (ops/attention_layout.h): out and lse (natural log of the
// softmax's denominator, scores scaled; may be null); dropout `drop` on the probabilities (only
// with first_row 0). Arithmetic in A = acc_t<T>.
template <class T>
void attention_forward_cpu(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v, const AttentionLayout& L,
                           const DropoutMask& drop) {
    using A = acc_t<T>;
    const int64_t hs = L.hs;
    const A scale = A(1) / std::sqrt(A(hs));
    const A keep_scale = A(1) / (A(1) - A(drop.p));
    // One (batch, head) per chunk: each writes its own rows of out and lse.
    detail::parallel_for(0, L.B * L.NH, 1, [&](int64_t bh0, int64_t bh1) {
        std::vector<A> a(L.T), o(hs);
        for (int64_t bh = bh0; bh < bh1; ++bh) {
            const int64_t b = bh / L.NH, h = bh % L.NH, g = h / L.group();
            for (int64_t t = L.first_row; t < L.T; ++t) {
                const T* qt = q + L.q_at(b, t, h);
                A m = -std::numeric_limits<A>::infinity();
                for (int64_t s = 0; s <= t; ++s) {
                    a[s] = dot<A>(qt, k + L.kv_at(b, s, g), hs) * scale;
                    m = std::max(m, a[s]);
                }
                A sum = 0;
                for (int64_t s = 0; s <= t; ++s) sum += a[s] = std::exp(a[s] - m);
                std::fill(o.begin(), o.end(), A(0));
                for (int64_t s = 0; s <= t; ++s) {
                    const A w = a[s] * detail::attention_drop_factor(drop, keep_scale, bh, L.T, t, s);
                    const T* vs = v + L.kv_at(b, s, g);
                    for (int64_t d = 0; d < hs; ++d) o[d] += w * A(vs[d]);
                }
                T* out_row = out + L.out_at(b, t, h);
                for (int64_t d = 0; d < hs; ++d) out_row[d] = static_cast<T>(o[d] / sum);
                if (lse) lse[L.row(b, h, t)] = m + std::log(sum);
            }
        }
    });
}

// With p[t, s] = exp(q_t . k_s * scale - lse[t]) recomputed, z[t, s] the dropout factor drawn
// again, D[t] = dout_t . out_t and ds[t, s] = p[t, s] * (z[t, s] dout_t . v_s - D[t]) (the softmax
// backward, since sum_s p z dp = D):
//   dq[t] = scale * sum_s ds k_s,  dk[s] = scale * sum_t ds q_t,  dv[s] = sum_t p z dout_t,
// dk and dv summed over the query heads of their group too. dq, dk, dv (laid out as q, k, v;
// first_row 0) are overwritten (=); sums are kept in A = acc_t<T> and rounded to T once.
template <class T>
void attention_backward_cpu(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                            const acc_t<T>* lse, const AttentionLayout& L, const DropoutMask& drop) {
    using A = acc_t<T>;
    const int64_t hs = L.hs, Tn = L.T;
    const A keep_scale = A(1) / (A(1) - A(drop.p));
    const A scale = A(1) / std::sqrt(A(hs));
    // One (batch, key/value head) per chunk: each sums into its own heads' rows of dq, dk and dv,
    // the query heads of the group in order.
    detail::parallel_for(0, L.B * L.NKV, 1, [&](int64_t bg0, int64_t bg1) {
        std::vector<A> gq(Tn * hs), gk(Tn * hs), gv(Tn * hs);
        for (int64_t bg = bg0; bg < bg1; ++bg) {
            const int64_t b = bg / L.NKV, g = bg % L.NKV;
            std::fill(gk.begin(), gk.end(), A(0));
            std::fill(gv.begin(), gv.end(), A(0));
            for (int64_t h = g * L.group(); h < (g + 1) * L.group(); ++h) {
                std::fill(gq.begin(), gq.end(), A(0));
                for (int64_t t = 0; t < Tn; ++t) {
                    const T *go = dout + L.out_at(b, t, h), *qt = q + L.q_at(b, t, h);
                    const A D = dot<A>(go, out + L.out_at(b, t, h), hs), row_lse = lse[L.row(b, h, t)];
                    A* dqt = gq.data() + t * hs;
                    for (int64_t s = 0; s <= t; ++s) {
                        const T *ks = k + L.kv_at(b, s, g), *vs = v + L.kv_at(b, s, g);
                        // <= 1 exactly as in forward; at scores whose rounding exceeds 1 (|score| ~ 1e8
                        // in f32) the exponent's own rounding would otherwise make p overflow.
                        const A p = std::min(A(1), std::exp(dot<A>(qt, ks, hs) * scale - row_lse));
                        const A z = detail::attention_drop_factor(drop, keep_scale, b * L.NH + h, Tn, t, s);
                        const A ds = p * (z * dot<A>(go, vs, hs) - D) * scale;
                        A *dks = gk.data() + s * hs, *dvs = gv.data() + s * hs;
                        for (int64_t d = 0; d < hs; ++d) {
                            dqt[d] += ds * A(ks[d]);
                            dks[d] += ds * A(qt[d]);
                            dvs[d] += p * z * A(go[d]);
                        }
                    }
                }
                for (int64_t t = 0; t < Tn; ++t)
                    for (int64_t d = 0; d < hs; ++d) dq[L.q_at(b, t, h) + d] = static_cast<T>(gq[t * hs + d]);
            }
            for (int64_t s = 0; s < Tn; ++s)
                for (int64_t d = 0; d < hs; ++d) {
                    dk[L.kv_at(b, s, g) + d] = static_cast<T>(gk[s * hs + d]);
                    dv[L.kv_at(b, s, g) + d] = static_cast<T>(gv[s * hs + d]);
                }
        }
    });
}

using detail::device_ptr;

constexpr int64_t kMaxCudaHeadSize = 8192;

// A tensor and the element at which an operand starts in it (k and v in a packed qkv).
struct At {
    const Tensor& t;
    int64_t offset = 0;
    template <class T>
    T* ptr() const { return device_ptr<T>(t) + offset; }
};

// out (and lse, when defined) from q, k, v laid out as `L`, on q's device.
void attention_forward(const char* op, const Tensor& out, const Tensor& lse, At q, At k, At v,
                       const AttentionLayout& L, const DropoutMask& drop) {
    dispatch_floating(q.t.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        using S = acc_t<T>;
        S* l = lse.defined() ? device_ptr<S>(lse) : nullptr;
        if (q.t.device().is_cuda()) {
            NT_CUDA(detail::attention_forward_cuda<T>(device_ptr<T>(out), l, q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), L, drop,
                                                      q.t.device().index));
        } else {
            attention_forward_cpu<T>(device_ptr<T>(out), l, q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), L, drop);
        }
    });
}

// dq, dk, dv (=) from the output gradient g, laid out as `L`, on q's device.
void attention_backward(const char* op, At dq, At dk, At dv, const Tensor& g, At q, At k, At v, const Tensor& out,
                        const Tensor& lse, const AttentionLayout& L, const DropoutMask& drop) {
    dispatch_floating(q.t.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        using S = acc_t<T>;
        if (q.t.device().is_cuda()) {
            NT_CUDA(detail::attention_backward_cuda<T>(dq.ptr<T>(), dk.ptr<T>(), dv.ptr<T>(), device_ptr<T>(g),
                                                       q.ptr<T>(), k.ptr<T>(), v.ptr<T>(), device_ptr<T>(out),
                                                       device_ptr<S>(lse), L, drop, q.t.device().index));
        } else {
            attention_backward_cpu<T>(dq.ptr<T>(), dk.ptr<T>(), dv.ptr<T>(), device_ptr<T>(g), q.ptr<T>(), k.ptr<T>(),
                                      v.ptr<T>(), device_ptr<T>(out), device_ptr<S>(lse), L, drop);
        }
    });
}

AttentionLayout packed_layout(const Tensor& qkv, int64_t n_head, int64_t first_row) {
    const int64_t B = qkv.size(0), Tn = qkv.size(1), C = qkv.size(2) / 3;
    return {B, Tn, n_head, n_head, C / n_head, Tn * 3 * C, 3 * C, 3 * C, first_row};
}

AttentionLayout grouped_layout(const Tensor& q, const Tensor& k, int64_t first_row) {
    const int64_t B = q.size(0), Tq = q.size(1), NH = q.size(2), NKV = k.size(2), hs = q.size(3);
    return {B, k.size(1), NH, NKV, hs, Tq * NH * hs, NH * hs, NKV * hs, first_row};
}

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
        const int64_t C = x.size(2) / 3;
        attention_backward(name(), {dqkv}, {dqkv, C}, {dqkv, 2 * C}, g, {x}, {x, C}, {x, 2 * C}, o, l,
                           packed_layout(x, n_head, 0), drop);
        return {dqkv};
    }
};

struct CausalAttentionBackward : Node {
    SavedTensor q, k, v, out, lse;
    DropoutMask drop;  // drawn again, never stored
    CausalAttentionBackward(const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& out_,
                            const Tensor& lse_, const DropoutMask& d)
        : q(q_), k(k_), v(v_), out(out_), lse(lse_), drop(d) {}
    const char* name() const override { return "CausalAttentionBackward"; }
    std::vector<SavedSlot> saved_tensors() override {
        return {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}};
    }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor qs = q.unpack(name()), ks = k.unpack(name()), vs = v.unpack(name());
        Tensor o = out.unpack(name()), l = lse.unpack(name()), g = grad_output.contiguous();
        TensorOptions opts = TensorOptions().dtype(qs.dtype()).device(qs.device());
        Tensor dq = empty(qs.shape(), opts), dk = empty(ks.shape(), opts), dv = empty(vs.shape(), opts);
        attention_backward(name(), {dq}, {dk}, {dv}, g, {qs}, {ks}, {vs}, o, l, grouped_layout(qs, ks, 0), drop);
        return {dq, dk, dv};
    }
};

// CUDA: the kernels launch up to one block per (batch, head, row) on grid x (<= INT32_MAX) and keep
// up to two head-size vectors of f64 a row in shared memory. `what` describes the shapes.
void check_cuda_sizes(const char* op, const Tensor& x, int64_t B, int64_t NH, int64_t T, int64_t hs,
                      const std::string& what) {
    int64_t rows = 0;
    if (__builtin_mul_overflow(B, NH, &rows) || __builtin_mul_overflow(rows, T, &rows)) rows = INT64_MAX;
    detail::check_fits_int32(op, x, "B * n_head * T", rows);
    NT_CHECK_AS(ShapeError, !x.device().is_cuda() || hs <= kMaxCudaHeadSize, op, ": expected a head size <= ",
                kMaxCudaHeadSize, " on cuda, got ", hs, " for ", what);
}

// The checks both packed ops make of qkv [B, T, 3C] and n_head, naming `op`.
void check_qkv(const char* op, const Tensor& qkv, int64_t n_head) {
    detail::check_floating_input(op, "qkv", qkv);
    NT_CHECK_AS(ShapeError, qkv.dim() == 3, op, ": expected qkv of shape [B, T, 3C], got ", shape_str(qkv.shape()));
    NT_CHECK(n_head >= 1, op, ": expected n_head >= 1, got ", n_head);
    const int64_t C = qkv.size(2) / 3;
    NT_CHECK_AS(ShapeError, qkv.size(2) % 3 == 0 && C % n_head == 0, op,
                ": expected qkv's last dimension to be 3C with C divisible by n_head = ", n_head, ", got shape ",
                shape_str(qkv.shape()));
    check_cuda_sizes(op, qkv, qkv.size(0), n_head, qkv.size(1), C / n_head,
                     "shape " + shape_str(qkv.shape()) + " and n_head = " + std::to_string(n_head));
}

// The checks both grouped ops make of q [B, Tq, NH, hs], k and v [B, T, NKV, hs], naming `op`.
void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
    detail::check_floating_input(op, "q", q);
    detail::check_like(op, "k", k, "q", q);
    detail::check_like(op, "v", v, "q", q);
    const std::string shapes =
        "q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " + shape_str(v.shape());
    NT_CHECK_AS(ShapeError, q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape(), op,
                ": expected q of shape [B, T, n_head, hs] and k, v of one shape [B, T, n_kv_head, hs], got ", shapes);
    NT_CHECK_AS(ShapeError,
                k.size(0) == q.size(0) && k.size(3) == q.size(3) && k.size(2) >= 1 && q.size(2) % k.size(2) == 0 &&
                    q.size(1) <= k.size(1),
                op, ": expected q, k and v to share B and hs, n_kv_head >= 1 to divide n_head and q to have at most "
                    "k's T positions, got ", shapes);
    check_cuda_sizes(op, q, q.size(0), q.size(2), k.size(1), q.size(3), shapes);
}

DropoutMask attention_dropout(const char* op, int64_t B, int64_t NH, int64_t Tn, double dropout_p, const Tensor& x) {
    NT_CHECK(dropout_p >= 0 && dropout_p < 1, op, ": expected a dropout probability in [0, 1), got ", dropout_p);
    if (dropout_p == 0) return DropoutMask();
    int64_t words = 0;  // one per (b, h, t, s)
    NT_CHECK_AS(ShapeError, !__builtin_mul_overflow(B * NH * Tn, Tn, &words), op,
                ": expected B * n_head * T * T to fit in int64 with dropout, got shape ", shape_str(x.shape()));
    return DropoutMask(philox_next(static_cast<uint64_t>(words)), dropout_p);
}

void check_inference_only(const char* op, const Tensor& x, const char* name) {
    NT_CHECK(!(grad_mode_enabled() && x.requires_grad()), op,
             ": inference only (it records no graph): call under NoGradGuard, got ", name,
             " that requires grad with grad mode on");
}

AttentionBackend& chosen_backend() {
    static AttentionBackend backend =
        detail::cudnn_attention_built() ? AttentionBackend::Cudnn : AttentionBackend::Kernels;
    return backend;
}

}  // namespace

AttentionBackend attention_backend() { return chosen_backend(); }

void set_attention_backend(AttentionBackend backend) {
    NT_CHECK(backend != AttentionBackend::Cudnn || detail::cudnn_attention_built(),
             "set_attention_backend: expected Kernels in a library built without cuDNN (NORMTAPE_CUDNN), got Cudnn");
    chosen_backend() = backend;
}

const char* attention_backend_name(AttentionBackend backend) {
    return backend == AttentionBackend::Cudnn ? "cudnn" : "kernels";
}

Tensor causal_self_attention(const Tensor& qkv_in, int64_t n_head, double dropout_p) {
    const char* op = "causal_self_attention";
    check_qkv(op, qkv_in, n_head);
    const int64_t B = qkv_in.size(0), Tn = qkv_in.size(1), C = qkv_in.size(2) / 3;
    const DropoutMask drop = attention_dropout(op, B, n_head, Tn, dropout_p, qkv_in);
    Tensor qkv = qkv_in.contiguous();
    TensorOptions opts = TensorOptions().dtype(qkv.dtype()).device(qkv.device());
    Tensor out = empty({B, Tn, C}, opts);
    Tensor lse = empty({B, n_head, Tn}, opts.dtype(stat_dtype(qkv.dtype())));
    attention_forward(op, out, lse, {qkv}, {qkv, C}, {qkv, 2 * C}, packed_layout(qkv, n_head, 0), drop);
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
    check_inference_only(op, qkv_in, "qkv");
    Tensor qkv = qkv_in.contiguous();
    Tensor out = empty({B, Tn - first_row, C}, TensorOptions().dtype(qkv.dtype()).device(qkv.device()));
    attention_forward(op, out, Tensor(), {qkv, first_row * 3 * C}, {qkv, C}, {qkv, 2 * C},
                      packed_layout(qkv, n_head, first_row), DropoutMask());
    detail::check_forward_anomaly(op, "out", out, {{"qkv", qkv}});
    return out;
}

Tensor causal_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double dropout_p) {
    const char* op = "causal_attention";
    check_qkv(op, q_in, k_in, v_in);
    NT_CHECK_AS(ShapeError, q_in.size(1) == k_in.size(1), op, ": expected q, k and v of one length T, got q ",
                shape_str(q_in.shape()), " and k ", shape_str(k_in.shape()));
    const int64_t B = q_in.size(0), Tn = q_in.size(1), NH = q_in.size(2);
    const DropoutMask drop = attention_dropout(op, B, NH, Tn, dropout_p, q_in);
    Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    TensorOptions opts = TensorOptions().dtype(q.dtype()).device(q.device());
    Tensor out = empty(q.shape(), opts);
    Tensor lse = empty({B, NH, Tn}, opts.dtype(stat_dtype(q.dtype())));
    attention_forward(op, out, lse, {q}, {k}, {v}, grouped_layout(q, k, 0), drop);
    if (should_record(q, k, v))
        record(std::make_shared<CausalAttentionBackward>(q, k, v, out, lse, drop), out, q, k, v);
    detail::check_forward_anomaly(op, "out", out, {{"q", q}, {"k", k}, {"v", v}});
    return out;
}

Tensor causal_attention_rows(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in) {
    const char* op = "causal_attention_rows";
    check_qkv(op, q_in, k_in, v_in);
    NT_CHECK_AS(ShapeError, q_in.size(1) >= 1, op, ": expected q with at least one row, got ", shape_str(q_in.shape()));
    check_inference_only(op, q_in, "q");
    check_inference_only(op, k_in, "k");
    check_inference_only(op, v_in, "v");
    Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    Tensor out = empty(q.shape(), TensorOptions().dtype(q.dtype()).device(q.device()));
    attention_forward(op, out, Tensor(), {q}, {k}, {v}, grouped_layout(q, k, k.size(1) - q.size(1)), DropoutMask());
    detail::check_forward_anomaly(op, "out", out, {{"q", q}, {"k", k}, {"v", v}});
    return out;
}

}  // namespace normtape
