// core/saved_hooks.h: saved-tensor hooks, as torch.autograd.graph.saved_tensors_hooks: while a
// SavedTensorHooks guard lives, every tensor that a recorded op saves for backward is handed to
// its pack function, and what pack returns is kept instead; backward hands that to unpack, which
// must give back a tensor of the saved one's shape, dtype and device. SaveOnCpu
// (core/save_on_cpu.h) is one such pair.
//
// Note [Nested saved-tensor hooks]
// Guards nest: a tensor saved under several is packed by the innermost pair first, its result by
// the next pair out, and so on; unpack runs the other way round, outermost first. (PyTorch applies
// only the innermost pair; composing lets a user stack, say, a compression inside an offload.)
// The pairs a tensor was packed with stay with it: leaving the guard's scope changes nothing for
// tensors already saved, and unpack runs even after the guard is gone.
//
// Not hooked: a parameter's storage (Storage::is_parameter, alive anyway, as saved_bytes() skips
// it), a tensor saved with a recipe (its recipe's inputs are, when they are saved), and what a
// function run by checkpoint() saves (nothing is kept of it).
//
// The version check still holds: a tensor modified in place after it was saved fails unpack(),
// whatever the hooks returned (core/autograd.h SavedTensor).
//
// Note [Saved-tensor hooks run without hooks]
// A pack or unpack function runs with grad mode off (as PyTorch runs pack) and with this thread's
// stack of save scopes set aside: no hook, and no checkpoint() frame, applies to what the
// function's own ops save, so a pack whose ops save tensors does not run itself again (without
// end). Guards and checkpoints that the function opens itself apply inside it as anywhere.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace normtape {

namespace detail {
struct HookPair;  // below
}  // namespace detail

// pack: the saved tensor (detached, no grad_fn) -> what to keep (any tensor; it is detached).
// unpack: what pack kept -> a tensor equal to the saved one (same shape, dtype and device).
using PackHook = std::function<Tensor(const Tensor&)>;
using UnpackHook = std::function<Tensor(const Tensor&)>;

// Applies pack to every tensor saved on this thread while it lives (Note [Nested saved-tensor
// hooks]; Note [Saved-tensor hooks run without hooks]). Throws Error if pack or unpack is empty.
// Exceptions that pack throws leave the op that saved (and the forward) by the same path any op
// error takes; those of unpack leave backward(). The destructor removes this guard's own pair,
// wherever it is on the stack (guards may end in any order), and never throws.
class SavedTensorHooks {
public:
    SavedTensorHooks(PackHook pack, UnpackHook unpack);
    ~SavedTensorHooks();
    SavedTensorHooks(const SavedTensorHooks&) = delete;
    SavedTensorHooks& operator=(const SavedTensorHooks&) = delete;

private:
    std::shared_ptr<const detail::HookPair> pair_;  // what this guard pushed
};

namespace detail {

struct HookPair {
    PackHook pack;
    UnpackHook unpack;
};

class CheckpointFrame;  // core/activation_checkpoint.cpp

// One entry of the per-thread stack that decides what a SavedTensor keeps (innermost last):
// a hook pair, or a function run by checkpoint() (its forward, or its rerun in backward).
struct SaveScope {
    std::shared_ptr<const HookPair> hooks;
    CheckpointFrame* checkpoint_forward = nullptr;
    CheckpointFrame* checkpoint_rerun = nullptr;
};
std::vector<SaveScope>& save_scopes();

// Sets this thread's save scopes aside, and turns grad mode off, for its lifetime: what a hook
// function runs in (Note [Saved-tensor hooks run without hooks]). Never throws.
class HookCallScope {
public:
    HookCallScope();
    ~HookCallScope();
    HookCallScope(const HookCallScope&) = delete;
    HookCallScope& operator=(const HookCallScope&) = delete;

private:
    std::vector<SaveScope> outer_;
    bool grad_mode_;
};

}  // namespace detail

}  // namespace normtape
