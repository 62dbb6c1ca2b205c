// ops/norm/fused_norm.h: the fused norm's options and outputs (layer_norm_fn, rms_norm_fn in
// ops/norm/layer_norm.h and ops/norm/rms_norm.h), in the names of FlashAttention's layer_norm_fn
// (flash_attn/ops/triton/layer_norm.py). Public.
//
// Note [The fused norm]
// A pre-LN block does x = x + branch(norm(x)) and then norm(x) again: the residual add and the next
// norm read and write the residual stream apart. layer_norm_fn and rms_norm_fn take the add in:
//     s = dropout(x * rowscale) + dropout(x1) + residual   (each term optional)
//     y = norm(s) * weight + bias,  y1 = norm(s) * weight1 + bias1   (y1 with weight1 only)
// in the order of FlashAttention's layer_norm_ref: x's mask is drawn first, then x1's, from the
// dropout stream (ops/dropout.h). The dropouts and the add of x1 are the dropout and add ops,
// recorded as they are (they save no tensor: a mask is drawn again in backward); rowscale's
// multiply is its own kernel and node, which saves rowscale (one element a row). The residual add
// is the norm's: its forward kernel reads x and residual and writes s and y in one pass over the
// rows (on CUDA where the fast kernels apply: f32 and bf16, 16-byte aligned rows; elsewhere the add
// op's kernel runs first). With prenorm s comes back too, the new residual stream, as layer_norm_fn(prenorm=True)
// does. s is rounded to x's dtype before the norm reads it, so that s and y are the unfused
// composition (dropout, add, norm, after the same manual_seed) bit for bit (FlashAttention's kernel
// normalizes the unrounded sum instead). With a residual, one node with y and s as its two outputs
// (Note [Nodes of several outputs], core/autograd.h) takes both gradients at once: ds = the norm's
// dx + the gradient that reached s, added in the norm's backward kernel (with weight1 by the add
// op after the kernels; in the add op's arithmetic: the same bits again) and given to residual and
// to dropout(x) + dropout(x1) alike, as llm.c's layernorm_backward adds into dresidual. What it
// saves is the norm's policy (ops/norm/norm_policy.h) with s in x's place: under Input s (which
// with prenorm the next block keeps anyway), under Output y, under Normalized x_hat; never x, x1 or
// residual themselves.
// weight1 and bias1 (GPT-J's and GPT-NeoX's parallel block) make a second affine output of the same
// normalized rows: y and y1 are both made from x_hat rounded to x's dtype, and the one node saves what
// the policy saves once. Its backward is linear in (dy, dy1): ds is the sum of the norm's dx for each
// output, computed with x_hat in hand (made again from s under Input, saved under Normalized). Under
// Output a second output makes the policy Normalized (the same bytes, x_hat in y's place): y gives
// x_hat back only through weight, and dweight1 needs x_hat itself. With zero_centered_weight the norm
// multiplies by weight + 1 (and weight1 + 1), made by the add op before the norm in x's dtype (in bf16
// rounded to steps of 2^-8 near 1; FlashAttention adds the 1 in f32): the node saves those N
// elements, and weight's gradient is theirs.
// The residual stream's dtype, s's, is the residual's, or f32 for a bf16 x with residual_in_fp32
// (FlashAttention's residual_dtype), else x's. Where it is wider than x (f32 for bf16), x (after
// its rowscale, dropout and the add of x1, each rounded to bf16) and the weights are cast to it (the
// cast op, ops/cast.h), and the norm runs in f32: s = x + residual is not rounded to bf16, as
// FlashAttention's kernel keeps it (its kernel also scales, drops and adds x1 in f32; its
// layer_norm_ref rounds s to x's dtype unless upcast). y and y1 are cast to out_dtype (x's dtype
// when unset) where that differs from the stream's (so a bf16 x with out_dtype f32 gets y rounded to
// bf16 and widened); the cast y is then made again from x_hat under Normalized (its recipe casts
// too, so a Linear after the norm saves nothing of y), and Output becomes Normalized, which saves
// the same bytes without the Linear's copy of y. The casts are their own kernels beside the
// norm's: no kernel mixes dtypes.
#pragma once

#include <optional>

#include "core/tensor.h"
#include "ops/norm/norm_policy.h"

namespace normtape {

// What layer_norm_fn and rms_norm_fn fuse into the norm, beside x.
struct FusedNormOptions {
    Tensor residual;         // added to x before the norm: x's shape and device, x's dtype or f32 (bf16 x);
                             // undefined: none
    Tensor x1;               // a second input, dropped out and added to x: x's shape, dtype and device
    double dropout_p = 0.0;  // dropout on x and x1 before the adds, in [0, 1); 0: none (eval)
    Tensor rowscale;         // x * rowscale[..., None] before x's dropout (stochastic depth): x's shape
                             // without its last dimension, x's dtype and device; a constant (no
                             // gradient; one that requires one is refused); not with x1
    bool prenorm = false;    // also return s (x.contiguous() when nothing is added, scaled, dropped or cast)
    Tensor weight1;          // a second affine output's weight: [N] of x's dtype and device; undefined: no y1
    Tensor bias1;            // its bias (LayerNorm only, with weight1): [N]; undefined: none
    bool zero_centered_weight = false;  // multiply by weight + 1 (and weight1 + 1), Gemma's form
    bool residual_in_fp32 = false;      // s (and the norm) in f32 for a bf16 x; a residual's own dtype wins
    std::optional<DType> out_dtype;     // y's and y1's dtype (f32, f64 or bf16); unset: x's
    double eps = 1e-5;
    SavePolicy policy = SavePolicy::Input;
};

// What they return.
struct FusedNormOutputs {
    Tensor y;             // the norm's output: x's shape and device, out_dtype (x's dtype when unset)
    Tensor residual_out;  // with prenorm, s (x's shape, the stream's dtype: see above); otherwise undefined
    Tensor y1;            // with weight1, norm(s) * weight1 + bias1 (x's shape, y's dtype); otherwise undefined
};

}  // namespace normtape
