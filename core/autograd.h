// core/autograd.h: the tape-based reverse-mode engine: Node, Edge, SavedTensor, Recipe
// (rematerialization), backward(), NoGradGuard, and saved_bytes(), the bytes held by saved
// tensors right now.
//
// An op that records builds a Node holding exactly the tensors its backward reads (its saved
// tensors) and one Edge per differentiable input; record() stamps it with the next sequence
// number, so the recording order is a topological order. backward() walks the reachable nodes in
// reverse recording order. The engine knows no op: it only calls Node::apply_outputs(), which for
// a node of one output is Node::apply().
//
// Note [Nodes of several outputs]
// An op that returns several tensors with gradients of their own (a fused norm's y and its
// residual sum, say) records one MultiOutputNode with record_outputs(). Each output remembers
// which one it is (TensorImpl::output_nr), each Edge to it says which output its gradient belongs
// to (Edge::input_nr), and the engine sums the gradients per output before it runs the node once
// with all of them, as PyTorch's engine does. An output that no gradient reached gets an undefined
// Tensor, which the node reads as zeros; a node none of whose outputs got one does not run.
//
// Note [A node holds no input it did not save]
// An Edge points at the producer's Node, never at the producer's output data. (An edge to a leaf
// holds the leaf itself, as PyTorch's AccumulateGrad does: leaves that want a gradient are
// parameters or user inputs, alive anyway.) So when a norm saves y instead of x, nothing keeps x alive once the
// forward has moved on, and the allocator gets its bytes back. Breaking this invariant silently
// turns SavePolicy::Output into a no-op.
//
// Note [Saved outputs and cycles]
// A SavedTensor shares storage with the tensor it saves but drops its grad_fn and grad (it keeps
// a detached handle). A node that saves its own output therefore holds no reference to itself.
//
// Note [Gradient accumulation]
// Leaf gradients accumulate (+=) across backward() calls until zero_grad(). Inside one backward,
// a tensor that fed several nodes receives the sum of their gradients before its producer runs.
// A Node's apply() returns gradients (=) that may alias grad_output (add, view, clone pass it
// through); nothing writes in place into a gradient a node returned: the engine sums into fresh
// tensors and copies a leaf's first gradient, unless the engine holds that gradient alone (no
// other tensor or node refers to its storage, which it fills exactly), in which case the leaf takes
// it over with no copy (PyTorch's AccumulateGrad rule). A leaf's own .grad is updated in place
// (+= by later backwards, clip_grad_norm_'s scaling).
//
// Note [Rematerialization]
// A tensor that a cheap elementwise op makes from tensors saved anyway can carry a Recipe
// (set_recipe): those inputs, as SavedTensors, and a function that makes the tensor again, bit
// for bit, from them. A SavedTensor made from such a tensor keeps the recipe, not the tensor's
// storage; unpack() makes the tensor again into a transient tensor, which the node's apply() holds
// until it returns. So a norm's output y = x_hat * weight + bias, saved by the Linear after it,
// costs nothing beyond the x_hat that the norm saves (SavePolicy::Normalized), and gelu(h), saved
// by the MLP's second Linear, nothing beyond the h that its backward saves (linear_gelu).
// - Only a fresh output of an op carries a recipe (a view of it does not, and saves its data).
// - A tensor modified in place before it is saved saves its data: the recipe holds only while the
//   storage's version is the one at set_recipe. Modified after it was saved, while the tensor is
//   still alive, it fails unpack() as any saved tensor would; the recipe's inputs are checked
//   the same way.
// - saved_bytes() counts the storages a recipe keeps alive (its inputs, once each across all
//   holders), not the tensor it makes.
// - release() drops the recipe; under retain_graph the recipe stays, and each backward makes the
//   tensor again.
// - make() runs under NoGradGuard, on the device of its inputs; it must give the same bits as the
//   op that made the tensor (the ops that set recipes compute the tensor with make() itself).
//
// Anomaly detection (Note [Anomaly detection]) is in core/anomaly.h, included here; the engine
// checks every gradient a node returns while it is on.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/anomaly.h"
#include "core/check.h"
#include "core/named_scope.h"
#include "core/tensor.h"

namespace normtape {

class Node;
namespace detail {
void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph);  // below
}  // namespace detail

// Where the gradient of one input goes: its producer node (as the gradient of that node's output
// input_nr), or the leaf whose grad accumulates. Both null: the input needs no gradient.
struct Edge {
    std::shared_ptr<Node> node;
    std::shared_ptr<TensorImpl> leaf;
    uint32_t input_nr = 0;  // PyTorch's name: which of node's outputs the input was
    bool valid() const { return node != nullptr || leaf != nullptr; }
};

namespace detail {
struct HookPair;  // core/saved_hooks.h
}

// A tensor saved for backward. What it keeps, in the order it is decided when it is saved:
// - inside a function that checkpoint() runs (core/activation_checkpoint.h): nothing but a recipe
//   that reruns the function from its saved inputs;
// - for a tensor that carries a recipe: the recipe (Note [Rematerialization]);
// - while SavedTensorHooks are active (core/saved_hooks.h): what their pack functions returned;
// - otherwise the tensor itself: shared storage (no copy), no grad_fn.
// A parameter's storage (Storage::is_parameter) is always kept as itself: it exists anyway. The
// storage's version at save time is remembered, so that unpack() refuses a tensor modified in
// place since. A default-constructed SavedTensor stands for "nothing saved" (e.g. no bias) and
// unpacks to an undefined Tensor. Copying one copies handles, not data, and runs no hook.
class SavedTensor {
public:
    SavedTensor() = default;
    explicit SavedTensor(const Tensor& t);

    // The saved data as a tensor with no autograd fields (made again from a recipe, or unpacked by
    // the hooks: a new tensor, the caller's to hold). Throws Error naming `node_name` if it was
    // released by an earlier backward, if the tensor (or a recipe's input) was modified in place
    // since it was saved, or if the hooks' unpack returned a tensor of another shape, dtype or
    // device than the one saved; rethrows what a hook or a checkpoint's rerun throws.
    Tensor unpack(const char* node_name) const;
    // Drops the reference to the data or recipe (storages go back to the allocator if unshared).
    void release();

    bool holds_data() const { return data_.defined(); }
    // The tensor held: the saved tensor, or, with hooks, what they packed.
    const Tensor& data() const { return data_; }
    // The recipe kept instead of the data, or nullptr.
    const Recipe* recipe() const { return recipe_.get(); }
    // True when saved-tensor hooks packed the data.
    bool packed() const { return !hooks_.empty(); }

private:
    Tensor data_;
    std::shared_ptr<const Recipe> recipe_;
    std::vector<std::shared_ptr<const detail::HookPair>> hooks_;  // the pairs that packed data_, innermost first
    std::weak_ptr<Storage> origin_;  // with a recipe or hooks: the storage of the tensor it stands for
    Shape shape_;                    // with hooks: what unpack must return
    DType dtype_ = DType::F32;
    Device device_ = Device::CPU;
    uint64_t version_ = 0;
    bool was_saved_ = false;
    bool released_ = false;
};

// One of a node's saved tensors with the name of its slot ("input", "x_hat", "qkv"), as
// saved_tensors_report() prints it.
struct SavedSlot {
    const char* name;
    SavedTensor* tensor;
};

// How to make a tensor again from saved tensors (Note [Rematerialization]).
struct Recipe {
    const char* name = "";  // what makes it, for messages and reports: "gelu", "norm affine", "checkpoint"
    std::vector<SavedTensor> inputs;
    std::function<Tensor(const std::vector<Tensor>&)> make;  // from the unpacked inputs, in order
    // false: make() is called with no inputs and unpacks them itself when it needs them (a
    // checkpoint reruns its function once for all the tensors it dropped).
    bool unpack_inputs = true;
    uint64_t version = 0;  // the made tensor's storage version at set_recipe
};

// Gives `t` (an op's fresh output, which make(inputs) computed) a recipe: inputs are saved
// (shared storage, version checked). Does nothing under NoGradGuard (nothing will be saved).
void set_recipe(Tensor& t, const char* name, const std::vector<Tensor>& inputs,
                std::function<Tensor(const std::vector<Tensor>&)> make);

// One recorded op. Subclasses hold their saved tensors and plain values (eps, shapes), nothing
// else, and list the saved tensors in saved_tensors(), with their slot names, so that the engine
// can release and count them and saved_tensors_report() can name them.
class Node {
public:
    // Releases the chain of producers behind this node without recursion: a graph as deep as a
    // model of 20,000 layers is freed in a loop, not on the stack (as PyTorch's deleteNode does).
    virtual ~Node();
    // The grad_fn name as PyTorch prints it: "LayerNormBackward".
    virtual const char* name() const = 0;
    // Gradients of the inputs given the gradient of the output; one entry per next_edges() entry,
    // undefined where !needs_input_grad(i). May alias grad_output (Note [Gradient accumulation]).
    virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
    // What the engine calls: one gradient per output, undefined for an output that no gradient
    // reached (the node treats it as zeros). A node of one output keeps this default; a node of
    // several (record_outputs) derives from MultiOutputNode, which overrides it.
    virtual std::vector<Tensor> apply_outputs(const std::vector<Tensor>& grad_outputs) { return apply(grad_outputs[0]); }
    virtual std::vector<SavedSlot> saved_tensors() { return {}; }
    // How many outputs record() (1) or record_outputs() gave the node.
    size_t num_outputs() const { return num_outputs_; }

    const std::vector<Edge>& next_edges() const { return next_edges_; }
    bool needs_input_grad(size_t i) const { return i < next_edges_.size() && next_edges_[i].valid(); }
    uint64_t sequence_nr() const { return sequence_nr_; }
    // The scope (core/named_scope.h) the node was recorded in: "h.3.ln_1", "" outside modules.
    const std::string& module_path() const { return *module_path_; }
    // Frees the saved tensors; a later apply() through this node is refused by the engine.
    void release_saved();
    bool released() const { return released_; }
    // True while apply() runs in a backward with retain_graph: the node may run again on the same
    // saved tensors, so it must not write over them (cross-entropy otherwise writes its gradient
    // over its saved logits). Set by the engine.
    bool saved_tensors_retained() const { return retain_saved_; }

private:
    template <class... Ts>
    friend void record(const std::shared_ptr<Node>& node, Tensor& output, const Ts&... inputs);
    template <class... Ts>
    friend void record_outputs(const std::shared_ptr<Node>& node, std::initializer_list<Tensor*> outputs,
                               const Ts&... inputs);
    friend void add_to_tape(const std::shared_ptr<Node>& node);
    void set_next_edges(std::vector<Edge> edges);
    friend void detail::run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph);

    std::vector<Edge> next_edges_;
    std::shared_ptr<const std::string> module_path_;
    uint64_t sequence_nr_ = 0;
    size_t num_outputs_ = 1;
    bool released_ = false;
    bool retain_saved_ = false;
};

// A node of several outputs (an op that returns more than one tensor, each with its own gradient):
// it implements apply_outputs(); apply() passes its one gradient as output 0's.
class MultiOutputNode : public Node {
public:
    std::vector<Tensor> apply(const Tensor& grad_output) final {
        std::vector<Tensor> grad_outputs(num_outputs());
        grad_outputs[0] = grad_output;
        return apply_outputs(grad_outputs);
    }
    std::vector<Tensor> apply_outputs(const std::vector<Tensor>& grad_outputs) override = 0;
};

// Grad mode: on by default, per thread. NoGradGuard turns it off for its scope.
bool grad_mode_enabled();
namespace detail {
void set_grad_mode(bool enabled);  // for EnableGrad scopes inside the library (checkpoint's rerun)
}
class NoGradGuard {
public:
    NoGradGuard();
    ~NoGradGuard();
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
    bool previous_;
};

// The edge through which `t`'s gradient flows back (see Edge).
Edge gradient_edge(const Tensor& t);

// True when grad mode is on and some defined input requires grad: the op must record a node.
template <class... Ts>
bool should_record(const Ts&... inputs) {
    return grad_mode_enabled() && ((inputs.defined() && inputs.requires_grad()) || ...);
}

// Connects `node` to `inputs` (one edge each, in order), gives it the next sequence number, adds
// it to the tape, and makes it `output`'s grad_fn (output then requires grad).
void add_to_tape(const std::shared_ptr<Node>& node);
template <class... Ts>
void record(const std::shared_ptr<Node>& node, Tensor& output, const Ts&... inputs) {
    node->set_next_edges({gradient_edge(inputs)...});
    add_to_tape(node);
    output.impl().grad_fn = node;
    output.impl().output_nr = 0;
    output.impl().requires_grad = true;
}

// record() for a node of several outputs (a MultiOutputNode): output k of `outputs` becomes the
// node's output k, its gradient the node's grad_outputs[k]. A null or undefined entry is an
// output the call did not make (its gradient stays undefined). Throws Error for an empty list.
template <class... Ts>
void record_outputs(const std::shared_ptr<Node>& node, std::initializer_list<Tensor*> outputs, const Ts&... inputs) {
    NT_CHECK(outputs.size() > 0, "record_outputs: expected at least one output for ", node->name(), ", got none");
    node->set_next_edges({gradient_edge(inputs)...});
    add_to_tape(node);
    node->num_outputs_ = outputs.size();
    uint32_t k = 0;
    for (Tensor* out : outputs) {
        if (out && out->defined()) {
            out->impl().grad_fn = node;
            out->impl().output_nr = k;
            out->impl().requires_grad = true;
        }
        ++k;
    }
}

// Bytes of the unique storages held right now by the saved tensors of live nodes, not counting
// parameters (leaves that require grad). A storage saved by several nodes counts once.
int64_t saved_bytes();

namespace detail {
// Calls fn(node) for every live node of the tape, in recording order.
void for_each_live_node(const std::function<void(Node&)>& fn);
// The engine behind Tensor::backward (see there).
void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph);
}  // namespace detail

}  // namespace normtape
