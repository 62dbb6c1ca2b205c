// nn/adamw_update.h: the AdamW update of one element, shared by the cpu loop (nn/adamw.cpp) and
// the CUDA kernel (nn/adamw.cu) so that the formula exists once. Internal.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace normtape::detail {

struct AdamWStep {
    double lr, beta1, beta2, eps, weight_decay;
    double bias_correction1, bias_correction2;  // 1 - beta^t
};

// p: the parameter; master: its f32 copy when p is bf16 (updated, then rounded into p), else
// nullptr; m, v: moments in acc_t<T>. Loshchilov & Hutter 2019; as torch.optim.AdamW.
template <class T>
NT_HOST_DEVICE inline void adamw_update(T* p, acc_t<T>* master, T g_in, acc_t<T>* m, acc_t<T>* v, const AdamWStep& s) {
    using A = acc_t<T>;
    A g = A(g_in);
    A w = master ? *master : A(*p);
    *m = A(s.beta1) * *m + A(1 - s.beta1) * g;
    *v = A(s.beta2) * *v + A(1 - s.beta2) * g * g;
    A update = (*m / A(s.bias_correction1)) / (sqrt(*v / A(s.bias_correction2)) + A(s.eps));
    w = w * A(1 - s.lr * s.weight_decay) - A(s.lr) * update;
    if (master) *master = w;
    *p = static_cast<T>(w);
}

}  // namespace normtape::detail
