// core/activation_checkpoint.h: checkpoint(fn, inputs...), activation checkpointing as
// torch.utils.checkpoint.checkpoint(fn, *inputs, use_reentrant=False).
//
// Note [Activation checkpointing]
// checkpoint() runs fn on its inputs at once, recording its ops as usual, so the graph and the
// output are those of fn; but every tensor those ops save is dropped as it is saved: it keeps a
// recipe (Note [Rematerialization], core/autograd.h) named "checkpoint" whose inputs are fn's
// inputs. The first unpack() of any of them in backward runs fn again on the saved inputs, with
// grad mode on, the same dropout stream (core/philox.h) and the same module scope, collects what
// that rerun saves, in order, and hands out each tensor once; the rerun's own graph is dropped.
// So the saved bytes of a checkpointed function are its inputs' (counted once, as any storage,
// by saved_bytes()), and its backward costs one more forward. The gradients are bit-identical to
// a run without checkpointing, as long as fn does the same work on the same inputs (the kernels
// here are deterministic); a rerun that saves other tensors than the forward did throws.
// The inputs are saved as any saved tensor is, so SavedTensorHooks around the call pack them
// (SaveOnCpu moves a block's input to the host). A backward with retain_graph reruns fn once per
// backward.
#pragma once

#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace normtape {

// fn takes the inputs, in order, and returns one tensor.
using CheckpointFunction = std::function<Tensor(const std::vector<Tensor>&)>;

// Returns fn(inputs), saving for backward only `inputs` (Note [Activation checkpointing]). fn must
// stay callable until the backward has run (it is copied; what it refers to, e.g. a module, must
// live). Under NoGradGuard it calls fn and saves nothing. Gradients accumulate into leaves as
// without checkpointing. Throws Error for an empty fn or an undefined input; rethrows what fn
// throws. In backward: Error naming checkpoint when the rerun saves another number of tensors, or
// one of another shape, dtype or device, than the forward did; what fn throws.
Tensor checkpoint(CheckpointFunction fn, const std::vector<Tensor>& inputs);

namespace detail {
template <class F, size_t... I>
Tensor call_with_inputs(const F& fn, const std::vector<Tensor>& in, std::index_sequence<I...>) {
    return fn(in[I]...);
}
}  // namespace detail

// checkpoint(fn, x, y, ...) with fn(const Tensor& x, const Tensor& y, ...).
template <class F, class... Ts, std::enable_if_t<std::is_invocable_r_v<Tensor, const F&, const Tensor&, const Ts&...>, int> = 0>
Tensor checkpoint(F fn, const Tensor& input, const Ts&... inputs) {
    CheckpointFunction call = [fn = std::move(fn)](const std::vector<Tensor>& in) {
        return detail::call_with_inputs(fn, in, std::index_sequence_for<Tensor, Ts...>{});
    };
    return checkpoint(std::move(call), std::vector<Tensor>{input, inputs...});
}

}  // namespace normtape
