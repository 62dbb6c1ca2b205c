// ops/attention.cpp: causal self-attention, plain loops over (b, h, t), in llm.c's style.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

// out: [B, T, C], att: [B, NH, T, T], qkv: [B, T, 3C]. Arithmetic in A = acc_t<T>.
template <class T>
void attention_forward_cpu(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
    using A = acc_t<T>;
    int64_t hs = C / NH;
    A scale = A(1) / std::sqrt(A(hs));
    std::vector<A> a(Tn), o(hs);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t t = 0; t < Tn; ++t) {
                const T* q = qkv + (b * Tn + t) * 3 * C + h * hs;
                A maxv = -std::numeric_limits<A>::infinity();
                for (int64_t s = 0; s <= t; ++s) {
                    const T* k = qkv + (b * Tn + s) * 3 * C + C + h * hs;
                    A dot = 0;
                    for (int64_t d = 0; d < hs; ++d) dot += A(q[d]) * A(k[d]);
                    a[s] = dot * scale;
                    maxv = std::max(maxv, a[s]);
                }
                A sum = 0;
                for (int64_t s = 0; s <= t; ++s) {
                    a[s] = std::exp(a[s] - maxv);
                    sum += a[s];
                }
                T* att_row = att + ((b * NH + h) * Tn + t) * Tn;
                for (int64_t s = 0; s < Tn; ++s) {
                    a[s] = s <= t ? a[s] / sum : A(0);
                    att_row[s] = static_cast<T>(a[s]);
                }
                std::fill(o.begin(), o.end(), A(0));
                for (int64_t s = 0; s <= t; ++s) {
                    const T* v = qkv + (b * Tn + s) * 3 * C + 2 * C + h * hs;
                    for (int64_t d = 0; d < hs; ++d) o[d] += a[s] * A(v[d]);
                }
                T* out_row = out + (b * Tn + t) * C + h * hs;
                for (int64_t d = 0; d < hs; ++d) out_row[d] = static_cast<T>(o[d]);
            }
}

// With datt = dout . v and the softmax backward dpre = att * (datt - sum_s att * datt):
//   dq[t] = sum_s dpre[s] k[s] / sqrt(hs), dk[s] += dpre[s] q[t] / sqrt(hs), dv[s] += att[s] dout[t].
// dqkv is overwritten (=); sums are kept in A = acc_t<T> and rounded to T once at the end.
template <class T>
void attention_backward_cpu(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn, int64_t C,
                            int64_t NH) {
    using A = acc_t<T>;
    int64_t hs = C / NH;
    A scale = A(1) / std::sqrt(A(hs));
    std::vector<A> grad(B * Tn * 3 * C, A(0)), datt(Tn);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t t = 0; t < Tn; ++t) {
                const T* a = att + ((b * NH + h) * Tn + t) * Tn;
                const T* go = dout + (b * Tn + t) * C + h * hs;
                const T* q = qkv + (b * Tn + t) * 3 * C + h * hs;
                A* dq = grad.data() + (b * Tn + t) * 3 * C + h * hs;
                A sum_ad = 0;
                for (int64_t s = 0; s <= t; ++s) {
                    const T* v = qkv + (b * Tn + s) * 3 * C + 2 * C + h * hs;
                    A* dv = grad.data() + (b * Tn + s) * 3 * C + 2 * C + h * hs;
                    A d_att = 0;
                    for (int64_t d = 0; d < hs; ++d) {
                        d_att += A(go[d]) * A(v[d]);
                        dv[d] += A(a[s]) * A(go[d]);
                    }
                    datt[s] = d_att;
                    sum_ad += A(a[s]) * d_att;
                }
                for (int64_t s = 0; s <= t; ++s) {
                    A dp = A(a[s]) * (datt[s] - sum_ad) * scale;
                    const T* k = qkv + (b * Tn + s) * 3 * C + C + h * hs;
                    A* dk = grad.data() + (b * Tn + s) * 3 * C + C + h * hs;
                    for (int64_t d = 0; d < hs; ++d) {
                        dq[d] += dp * A(k[d]);
                        dk[d] += dp * A(q[d]);
                    }
                }
            }
    for (size_t i = 0; i < grad.size(); ++i) dqkv[i] = static_cast<T>(grad[i]);
}

using detail::device_ptr;

struct AttentionBackward : Node {
    SavedTensor qkv, att;
    int64_t n_head;
    AttentionBackward(const Tensor& qkv_, const Tensor& att_, int64_t nh) : qkv(qkv_), att(att_), n_head(nh) {}
    const char* name() const override { return "CausalSelfAttentionBackward"; }
    std::vector<SavedTensor*> saved_tensors() override { return {&qkv, &att}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor q = qkv.unpack(name()), a = att.unpack(name()), g = grad_output.contiguous();
        Tensor dqkv = empty(q.shape(), TensorOptions().dtype(q.dtype()).device(q.device()));
        dispatch_floating(q.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            if (q.device().is_cuda()) {
                NT_CUDA(detail::attention_backward_cuda<T>(device_ptr<T>(dqkv), device_ptr<T>(g), device_ptr<T>(q),
                                                           device_ptr<T>(a), q.size(0), q.size(1), q.size(2) / 3,
                                                           n_head, q.device().index));
            } else {
                attention_backward_cpu<T>(device_ptr<T>(dqkv), device_ptr<T>(g), device_ptr<T>(q), device_ptr<T>(a),
                                          q.size(0), q.size(1), q.size(2) / 3, n_head);
            }
        });
        return {dqkv};
    }
};

}  // namespace

Tensor causal_self_attention(const Tensor& qkv_in, int64_t n_head) {
    const char* op = "causal_self_attention";
    detail::check_floating_input(op, "qkv", qkv_in);
    NT_CHECK_AS(ShapeError, qkv_in.dim() == 3, op, ": expected qkv of shape [B, T, 3C], got ", shape_str(qkv_in.shape()));
    NT_CHECK(n_head >= 1, op, ": expected n_head >= 1, got ", n_head);
    int64_t C = qkv_in.size(2) / 3;
    NT_CHECK_AS(ShapeError, qkv_in.size(2) % 3 == 0 && C % n_head == 0, op,
                ": expected qkv's last dimension to be 3C with C divisible by n_head = ", n_head, ", got shape ",
                shape_str(qkv_in.shape()));
    int64_t B = qkv_in.size(0), Tn = qkv_in.size(1);
    // CUDA: cuBLAS takes int sizes, leading dimensions and batch counts; the softmax kernels launch
    // n_head * T blocks (grid x <= INT32_MAX).
    detail::check_fits_int32(op, qkv_in, "3C (qkv's last dimension)", qkv_in.size(2));
    int64_t softmax_blocks = 0;
    if (__builtin_mul_overflow(n_head, Tn, &softmax_blocks)) softmax_blocks = INT64_MAX;
    detail::check_fits_int32(op, qkv_in, "n_head * T", softmax_blocks);
    Tensor qkv = qkv_in.contiguous();
    TensorOptions opts = TensorOptions().dtype(qkv.dtype()).device(qkv.device());
    Tensor out = empty({B, Tn, C}, opts);
    Tensor att = empty({B, n_head, Tn, Tn}, opts);
    dispatch_floating(qkv.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        if (qkv.device().is_cuda()) {
            NT_CUDA(detail::attention_forward_cuda<T>(device_ptr<T>(out), device_ptr<T>(att), device_ptr<T>(qkv), B, Tn,
                                                      C, n_head, qkv.device().index));
        } else {
            attention_forward_cpu<T>(device_ptr<T>(out), device_ptr<T>(att), device_ptr<T>(qkv), B, Tn, C, n_head);
        }
    });
    if (should_record(qkv)) record(std::make_shared<AttentionBackward>(qkv, att, n_head), out, qkv);
    detail::check_forward_anomaly(op, "out", out, {{"qkv", qkv}});
    return out;
}

}  // namespace normtape
