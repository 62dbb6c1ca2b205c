// core/activation_checkpoint.cpp: checkpoint() and its frame (Note [Activation checkpointing]).
#include "core/activation_checkpoint.h"

#include <string>

#include "core/activation_checkpoint_internal.h"
#include "core/philox.h"

namespace normtape {

namespace detail {

// What one checkpoint() call keeps: fn, its saved inputs, the state to rerun it in, what its
// forward saved (shape, dtype, device: the rerun must save the same) and, after a rerun, the
// tensors it saved, each handed out once. Owned by the recipes of the tensors it dropped.
class CheckpointFrame : public std::enable_shared_from_this<CheckpointFrame> {
public:
    struct Saved {
        Shape shape;
        DType dtype;
        Device device;
    };

    CheckpointFunction fn;
    std::vector<SavedTensor> inputs;
    std::vector<bool> input_requires_grad;
    PhiloxState dropout_stream;
    std::shared_ptr<const std::string> scope;
    std::vector<Saved> saved;        // in fn's forward, in saving order
    std::vector<Tensor> recomputed;  // by the last rerun, same order
    std::vector<bool> handed_out;

    Tensor take(size_t k) {
        if (k >= handed_out.size() || handed_out[k]) rerun();
        handed_out[k] = true;
        return std::move(recomputed[k]);
    }

private:
    void rerun();
};

namespace {
// Restores the thread's grad mode, dropout stream and save scopes when a rerun ends, even by an
// exception.
struct RerunState {
    bool grad = grad_mode_enabled();
    PhiloxState stream = philox_state();
    size_t scopes = save_scopes().size();
    ~RerunState() {
        set_grad_mode(grad);
        set_philox_state(stream);
        save_scopes().resize(scopes);
    }
};

std::string saved_str(const Shape& shape, DType dtype, Device device) {
    return shape_str(shape) + " " + dtype_name(dtype) + " " + device_name(device);
}
}  // namespace

void CheckpointFrame::rerun() {
    std::vector<Tensor> args;
    for (size_t i = 0; i < inputs.size(); ++i) {
        Tensor a = inputs[i].unpack("checkpoint").detach();
        // Requires grad as the forward's input did, so that the same ops record and save; set on
        // the handle only, so that the storage is not taken for a parameter's (core/storage.h).
        a.impl().requires_grad = input_requires_grad[i];
        args.push_back(a);
    }
    recomputed.clear();
    {
        RerunState restore;
        set_grad_mode(true);
        set_philox_state(dropout_stream);
        BackwardNodeScope where(scope, current_backward_node());
        SaveScope rerun_scope;
        rerun_scope.checkpoint_rerun = this;
        save_scopes().push_back(rerun_scope);
        fn(args);  // its graph is dropped here; what it saved is in `recomputed`
    }
    NT_CHECK(recomputed.size() == saved.size(), "checkpoint: expected the function's rerun in backward to save ",
             saved.size(), " tensors, as its forward did, got ", recomputed.size(),
             " (the function must do the same work on the same inputs)");
    for (size_t k = 0; k < saved.size(); ++k) {
        const Tensor& t = recomputed[k];
        NT_CHECK(t.shape() == saved[k].shape && t.dtype() == saved[k].dtype && t.device() == saved[k].device,
                 "checkpoint: expected the function's rerun in backward to save tensor ", k, " as ",
                 saved_str(saved[k].shape, saved[k].dtype, saved[k].device), ", as its forward did, got ",
                 saved_str(t.shape(), t.dtype(), t.device()), " (the function must do the same work on the same inputs)");
    }
    handed_out.assign(saved.size(), false);
}

std::shared_ptr<const Recipe> checkpoint_drop(CheckpointFrame& frame, const Tensor& t) {
    const size_t k = frame.saved.size();
    frame.saved.push_back({t.shape(), t.dtype(), t.device()});
    auto recipe = std::make_shared<Recipe>();
    recipe->name = "checkpoint";
    recipe->inputs = frame.inputs;  // copies of the handles: counted once by storage
    recipe->unpack_inputs = false;
    recipe->make = [owner = frame.shared_from_this(), k](const std::vector<Tensor>&) { return owner->take(k); };
    return recipe;
}

void checkpoint_capture(CheckpointFrame& frame, const Tensor& t) { frame.recomputed.push_back(t.detach()); }

}  // namespace detail

Tensor checkpoint(CheckpointFunction fn, const std::vector<Tensor>& inputs) {
    NT_CHECK(static_cast<bool>(fn), "checkpoint: expected a function, got an empty one");
    for (size_t i = 0; i < inputs.size(); ++i)
        NT_CHECK(inputs[i].defined(), "checkpoint: expected defined inputs, got an undefined tensor at input ", i);
    if (!grad_mode_enabled()) return fn(inputs);
    auto frame = std::make_shared<detail::CheckpointFrame>();
    for (const Tensor& in : inputs) {
        frame->inputs.emplace_back(in);  // saved as any tensor is: hooks around the call apply
        frame->input_requires_grad.push_back(in.requires_grad());
    }
    frame->dropout_stream = philox_state();
    frame->scope = current_scope();
    detail::SaveScope scope;
    scope.checkpoint_forward = frame.get();
    detail::save_scopes().push_back(scope);
    struct Pop {
        size_t size;
        ~Pop() { detail::save_scopes().resize(size); }
    } pop{detail::save_scopes().size() - 1};
    Tensor out = fn(inputs);
    frame->fn = std::move(fn);
    return out;
}

}  // namespace normtape
