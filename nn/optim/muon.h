// nn/optim/muon.h: the Muon optimizer for a model's hidden matrices, its Newton-Schulz orthogonalization,
// and the split of a GPT's parameters between Muon and AdamW (nanochat's).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "nn/optim/adamw.h"

namespace normtape {

class GPT;

// Every value must be finite: lr >= 0, momentum in [0, 1), weight_decay >= 0, ns_steps in [1, 100]
// (Muon's constructor checks them, set_lr the lr). The defaults are KellerJordan/Muon's and
// nanochat's (lr 0.02, momentum 0.95, Nesterov, 5 steps; no weight decay).
struct MuonOptions {
    double lr = 0.02;
    double momentum = 0.95;
    bool nesterov = true;
    int64_t ns_steps = 5;        // Newton-Schulz iterations
    double weight_decay = 0.0;   // default for groups built from a plain parameter list
};

// Muon, "MomentUm Orthogonalized by Newton-schulz" (Keller Jordan et al. 2024, KellerJordan/Muon;
// as torch.optim.Muon with its default learning-rate adjustment): for each matrix parameter p
// [rows, cols] (a parameter of more dimensions is taken as [size(0), the product of the others])
// with gradient g, in its group (lr_g = lr * lr_scale, weight decay wd):
//   buf = momentum buf + (1 - momentum) g                     (torch: buf.lerp_(g, 1 - momentum))
//   u = nesterov ? (1 - momentum) g + momentum buf : buf      (torch: g.lerp(buf, momentum))
//   o = newton_schulz(u, ns_steps) * max(1, rows / cols)^0.5
//   p = p (1 - lr_g wd) - lr_g o                              (decoupled weight decay)
// The momentum buffer is kept in f64 for f64 parameters and f32 otherwise, on the parameter's
// device; a bf16 parameter also gets an f32 master copy, which is what is updated (the parameter
// is its rounding). One buffer where AdamW keeps two moments: the state of a matrix is half of
// AdamW's (masters aside). Parameters whose grad() is undefined are skipped; updates are in place
// (the storage version is bumped).
// On the cpu the orthogonalization runs in f32 (f64 for f64 parameters) through Eigen, one
// matrix per thread; Eigen's temporaries are its own heap's, outside normtape's allocator. On CUDA
// it runs in bf16 products with f32 accumulation (f64 for f64 parameters) through cuBLASLt, as the
// reference does: the matrices of one group with one shape are a class, orthogonalized as one
// batch (Note [Muon on CUDA] in nn/optim/muon.cu): per class a few elementwise launches and
// 3 ns_steps strided-batched products, queued without waiting for the GPU. Each class takes its
// scratch from normtape's allocator for the step and gives it back before the next class:
// 2 n rows cols + 2 n m^2 elements of bf16 (f64) for n matrices, m = min(rows, cols), and
// a few floats per 4096 elements (a dry run counts them as it runs: core/dry_run.h). The update's
// kernel reads the lr from device memory, where set_lr writes it, so that a step captured in a
// CUDA graph (core/cuda_graph.h) replays with the current one.
class Muon {
public:
    // The state of one parameter: its momentum buffer (torch's "momentum_buffer") in
    // stat_dtype(p.dtype()) on p's device, and the f32 master copy of a bf16 parameter (else
    // undefined).
    struct ParamState {
        Tensor momentum_buffer;
        Tensor master;
    };

    // Throw Error naming Muon, the option, the range and the value for an option or a group's
    // weight_decay or lr_scale out of range (lr >= 0; momentum in [0, 1); weight_decay,
    // lr_scale >= 0; ns_steps in [1, 100]), or a parameter that is undefined, not a leaf, not
    // contiguous, does not require grad, has fewer than 2 dimensions (vectors and scalars belong
    // to AdamW: param_groups_for_muon) or is listed in two groups; OutOfMemoryError or
    // DeviceError when the state cannot be allocated. A parameter listed twice in one group is
    // kept once, as AdamW does.
    Muon(std::vector<ParamGroup> groups, MuonOptions options);
    Muon(const std::vector<Tensor>& params, MuonOptions options);

    // An empty parameter ([0, N] or [N, 0]) is left as it is: there is nothing to orthogonalize.
    // Throws DeviceError / DTypeError when a parameter changed device / dtype since construction,
    // DTypeError, DeviceError or ShapeError naming the parameter (its index and group) when its
    // gradient is not of its dtype, device and shape or not contiguous, or (on CUDA) a matrix has
    // more rows or columns than cuBLAS's int; every parameter is checked first, so a step that
    // throws these changes nothing. On CUDA, OutOfMemoryError when a class's scratch cannot be
    // allocated and Error when cuBLASLt has no algorithm for its products: the classes before it
    // have then been stepped (and the step counted).
    void step();
    // As step(), except that no parameter, master copy or buffer changes when `grad_norm` (one
    // element, floating, on every stepped parameter's device: what clip_grad_norm_tensor_
    // returned) is NaN or infinite; on CUDA the kernels read it, so nothing waits for the GPU.
    // The step count advances either way, as AdamW::step_if_finite's. Throws as step(), and as
    // AdamW::step_if_finite for a bad grad_norm.
    void step_if_finite(const Tensor& grad_norm);
    // Drops every parameter's gradient.
    void zero_grad();
    // Throws Error for lr < 0 or not finite; the lr is then unchanged.
    void set_lr(double lr);
    double lr() const { return options_.lr; }
    // The steps taken: on CUDA the device's count, which a step replayed from a CUDA graph
    // (core/cuda_graph.h) advances (reading it waits for the GPU); else the host's.
    int64_t step_count() const;
    const MuonOptions& options() const { return options_; }
    const std::vector<ParamGroup>& groups() const { return groups_; }

    // For checkpoints (nn/formats/checkpoint.h): the state of parameter `p`, matched by identity. The
    // tensors returned are the optimizer's own: copy_ into them to restore a state. Throws Error
    // if p is not one of this optimizer's.
    const ParamState& state(const Tensor& p) const;
    // Every parameter's state in order: states()[g][i] is groups()[g].params[i]'s.
    const std::vector<std::vector<ParamState>>& states() const { return state_; }
    // Sets the number of steps taken (Muon's update does not depend on it; kept for resuming a
    // run, whose step count a checkpoint records). Throws Error if t < 0.
    void set_step_count(int64_t t);

private:
    void step_impl(const Tensor* grad_norm);

    std::vector<ParamGroup> groups_;
    std::vector<std::vector<ParamState>> state_;  // per group, per parameter
    MuonOptions options_;
    int64_t t_ = 0;
    std::shared_ptr<detail::StepScalars> scalars_;  // the lr (and t) that the CUDA kernels read
};

// The approximate orthogonalization of Muon: five (`steps`) quintic Newton-Schulz iterations
// towards U V^T of g = U S V^T (KellerJordan/Muon's zeropower_via_newtonschulz5):
//   X = g / (||g||_F + 1e-7), transposed when rows > cols (so that X X^T is the smaller Gram matrix)
//   each step: A = X X^T, B = b A + c A^2, X = a X + B X,   (a, b, c) = (3.4445, -4.7750, 2.0315)
// returned in g's orientation. The coefficients maximize the slope at 0 while keeping every
// singular value in about [0.7, 1.2] (not exactly 1: Muon does not need it, Jordan et al. 2024).
// g: [rows, cols], or [n, rows, cols] for n matrices each orthogonalized alone; f32, f64 or bf16;
// any device. Returns a tensor of g's shape, dtype and device, not connected to the graph. On
// the cpu computed in f32 (f64 for f64) through Eigen; on CUDA in bf16 products with f32
// accumulation (f64 for f64), as the reference, except that X's update is (B + a I) X (Note
// [Muon on CUDA]). Throws Error for an undefined g or steps outside [1, 100], ShapeError for g not
// 2-D or 3-D or with a zero size (on CUDA also for more than 65535 matrices, or sizes beyond
// cuBLAS's int), DTypeError for a non-floating g; on CUDA as Muon::step for its scratch and
// products.
Tensor newton_schulz(const Tensor& g, int64_t steps = 5);

// A GPT's parameters split as nanochat splits them (karpathy/nanochat, GPT.setup_optimizers): the
// blocks' matrices (every parameter of 2 or more dimensions under "h.") to Muon; the token and
// position embeddings, lm_head's weight (unless tied to wte's) and every vector (norm weights,
// biases) to AdamW. Each parameter in exactly one list, in named_parameters() order.
struct MuonParamSplit {
    std::vector<Tensor> matrices;    // Muon's
    std::vector<Tensor> embeddings;  // wte, wpe
    std::vector<Tensor> head;        // lm_head.weight, untied
    std::vector<Tensor> vectors;     // the rest: norm weights and biases
};
MuonParamSplit param_groups_for_muon(const GPT& model);

}  // namespace normtape
