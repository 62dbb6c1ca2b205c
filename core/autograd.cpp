// core/autograd.cpp: SavedTensor, the tape of live nodes, grad mode, and the backward engine.
// Not here: anomaly detection, whose backward check the engine calls (core/anomaly.cpp).
#include "core/autograd.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/activation_checkpoint_internal.h"
#include "core/anomaly_internal.h"
#include "core/saved_hooks.h"
#include "core/tensor_internal.h"

namespace normtape {

namespace {

thread_local bool grad_mode = true;

// The tape: every recorded node in recording order, held weakly so that a graph nobody
// references any more is freed at once. Expired entries are compacted away as the tape grows.
struct Tape {
    std::vector<std::weak_ptr<Node>> nodes;
    size_t compact_at = 1024;
    uint64_t next_sequence_nr = 0;

    void add(const std::shared_ptr<Node>& node) {
        if (nodes.size() >= compact_at) {
            std::erase_if(nodes, [](const std::weak_ptr<Node>& w) { return w.expired(); });
            compact_at = std::max<size_t>(1024, 2 * nodes.size());
        }
        nodes.push_back(node);
    }
};

Tape& tape() {
    static Tape t;
    return t;
}

void check_not_released(bool released, const char* node_name) {
    NT_CHECK(!released, node_name,
             ": expected a graph not yet run, got one already run: trying to backward through the graph a second time (its saved tensors were freed "
             "after the first backward); pass retain_graph=true to the first backward if you need "
             "to run backward twice");
}

}  // namespace

SavedTensor::SavedTensor(const Tensor& t) {
    if (!t.defined()) return;
    version_ = t.storage()->version();
    was_saved_ = true;
    std::vector<std::shared_ptr<const detail::HookPair>> hooks;  // innermost first
    if (!t.storage()->is_parameter()) {
        for (auto it = detail::save_scopes().rbegin(); it != detail::save_scopes().rend(); ++it) {
            if (it->hooks) {
                hooks.push_back(it->hooks);
                continue;
            }
            if (it->checkpoint_forward) {  // nothing is kept but the way to make it again
                recipe_ = detail::checkpoint_drop(*it->checkpoint_forward, t);
                origin_ = t.storage();
                return;
            }
            detail::checkpoint_capture(*it->checkpoint_rerun, t);
            break;  // hooks outside a rerun belong to the forward that recorded the checkpoint
        }
    }
    const std::shared_ptr<const Recipe>& recipe = t.impl().recipe;
    if (recipe && recipe->version == version_) {  // Note [Rematerialization]
        recipe_ = recipe;
        origin_ = t.storage();
        return;
    }
    if (hooks.empty()) {
        data_ = t.detach();
        return;
    }
    Tensor packed = t.detach();  // Note [Nested saved-tensor hooks]
    {
        detail::HookCallScope hook_call;  // Note [Saved-tensor hooks run without hooks]
        for (const auto& pair : hooks) packed = pair->pack(packed).detach();
    }
    data_ = packed;
    hooks_ = std::move(hooks);
    origin_ = t.storage();
    shape_ = t.shape();
    dtype_ = t.dtype();
    device_ = t.device();
}

namespace {
void check_version(const char* node_name, uint64_t saved, uint64_t now) {
    NT_CHECK(now == saved, node_name, ": a tensor saved for backward was modified by an in-place operation (expected version ",
             saved, ", the one saved, got version ", now, ")");
}
}  // namespace

Tensor SavedTensor::unpack(const char* node_name) const {
    check_not_released(released_, node_name);
    if (!was_saved_) return Tensor();
    if (recipe_ || !hooks_.empty())
        if (std::shared_ptr<Storage> origin = origin_.lock()) check_version(node_name, version_, origin->version());
    if (recipe_) {
        std::vector<Tensor> inputs;
        if (recipe_->unpack_inputs)
            for (const SavedTensor& in : recipe_->inputs) inputs.push_back(in.unpack(node_name));
        NoGradGuard no_grad;
        return recipe_->make(inputs);
    }
    if (hooks_.empty()) {
        check_version(node_name, version_, data_.storage()->version());
        return data_;
    }
    Tensor t = data_;
    {
        detail::HookCallScope hook_call;  // Note [Saved-tensor hooks run without hooks]
        for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) t = (*it)->unpack(t);
    }
    NT_CHECK(t.defined() && t.shape() == shape_ && t.dtype() == dtype_ && t.device() == device_, node_name,
             ": expected saved-tensor hooks to unpack a tensor of the saved one's shape, dtype and device ",
             shape_str(shape_), " ", dtype_name(dtype_), " ", device_name(device_), ", got ",
             t.defined() ? shape_str(t.shape()) + " " + dtype_name(t.dtype()) + " " + device_name(t.device())
                         : std::string("an undefined tensor"));
    return t.detach();
}

void SavedTensor::release() {
    data_ = Tensor();
    recipe_.reset();
    hooks_.clear();
    origin_.reset();
    released_ = true;
}

void set_recipe(Tensor& t, const char* name, const std::vector<Tensor>& inputs,
                std::function<Tensor(const std::vector<Tensor>&)> make) {
    if (!grad_mode_enabled()) return;
    auto recipe = std::make_shared<Recipe>();
    recipe->name = name;
    for (const Tensor& in : inputs) recipe->inputs.emplace_back(in);
    recipe->make = std::move(make);
    recipe->version = t.storage()->version();
    t.impl().recipe = std::move(recipe);
}

void Node::release_saved() {
    for (SavedSlot s : saved_tensors()) s.tensor->release();
    released_ = true;
}

void Node::set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }

Node::~Node() {
    // The producers this node alone keeps alive are taken out of its edges and released here, one
    // at a time, after taking theirs: each destructor then finds no producer it alone holds.
    std::vector<std::shared_ptr<Node>> last_holder;
    auto take = [&last_holder](Node& n) {
        for (Edge& e : n.next_edges_)
            if (e.node && e.node.use_count() == 1) last_holder.push_back(std::move(e.node));
    };
    try {
        take(*this);
        while (!last_holder.empty()) {
            std::shared_ptr<Node> n = std::move(last_holder.back());
            last_holder.pop_back();
            take(*n);
        }
    } catch (...) {  // no memory for the list: the rest is released as it is, recursively
    }
}

void add_to_tape(const std::shared_ptr<Node>& node) {
    node->sequence_nr_ = tape().next_sequence_nr++;
    node->module_path_ = current_scope();
    tape().add(node);
}

bool grad_mode_enabled() { return grad_mode; }
void detail::set_grad_mode(bool enabled) { grad_mode = enabled; }

NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }

Edge gradient_edge(const Tensor& t) {
    if (!t.defined() || !t.requires_grad()) return {};
    if (t.grad_fn()) return {t.grad_fn(), nullptr, t.impl().output_nr};
    return {nullptr, t.impl_ptr()};
}

int64_t saved_bytes() {
    std::unordered_set<const Storage*> seen;
    int64_t total = 0;
    // A recipe counts what it keeps alive, its inputs (Note [Rematerialization]).
    std::function<void(const SavedTensor&)> count = [&](const SavedTensor& s) {
        if (const Recipe* r = s.recipe()) {
            for (const SavedTensor& in : r->inputs) count(in);
            return;
        }
        if (!s.holds_data()) return;
        const Storage* storage = s.data().storage().get();
        if (storage && !storage->is_parameter() && seen.insert(storage).second) total += static_cast<int64_t>(storage->nbytes());
    };
    detail::for_each_live_node([&](Node& node) {
        for (SavedSlot s : node.saved_tensors()) count(*s.tensor);
    });
    return total;
}

void detail::for_each_live_node(const std::function<void(Node&)>& fn) {
    for (const std::weak_ptr<Node>& w : tape().nodes)
        if (std::shared_ptr<Node> node = w.lock()) fn(*node);
}

namespace {

// Adds `grad` into the slot: the first gradient is taken as is, later ones are summed into a
// fresh tensor (the first may alias storage that a node still reads), in one pass.
void accumulate(Tensor& slot, const Tensor& grad) {
    if (!slot.defined()) {
        slot = grad;
        return;
    }
    NT_CHECK_AS(ShapeError, grad.shape() == slot.shape() && grad.dtype() == slot.dtype() && grad.device() == slot.device(),
                "backward: expected the gradients of one input to share shape, dtype and device, got ",
                shape_str(slot.shape()), " ", dtype_name(slot.dtype()), " and ", shape_str(grad.shape()), " ",
                dtype_name(grad.dtype()));
    Tensor sum = slot.is_contiguous() ? detail::empty_for("backward", slot.shape(),
                                                          TensorOptions().dtype(slot.dtype()).device(slot.device()))
                                      : slot.clone();
    detail::add_scaled_into(sum, slot.is_contiguous() ? slot : sum, grad.contiguous(), 1.0);
    slot = sum;
}

// Whether `grad` is the only holder of its storage, which it covers exactly: the engine's tensor,
// which nothing else can read or write (PyTorch's AccumulateGrad steals such a gradient).
bool held_alone(const Tensor& grad) {
    return grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1 && grad.is_contiguous() &&
           grad.impl().offset == 0 && grad.storage()->nbytes() == static_cast<size_t>(grad.nbytes());
}

// Note [Gradient accumulation]: a leaf's grad is its own storage, never an alias of a
// gradient that a node produced, so that += on it cannot change anything else. Its first
// gradient is taken over, not copied, where the engine holds it alone.
void accumulate_into_leaf(TensorImpl& leaf, const Tensor& grad) {
    NT_CHECK_AS(ShapeError, grad.shape() == leaf.shape, "backward: expected a gradient of the leaf's shape ",
                shape_str(leaf.shape), ", got ", shape_str(grad.shape()));
    NT_CHECK_AS(DTypeError, grad.dtype() == leaf.dtype, "backward: expected a gradient of the leaf's dtype ",
                dtype_name(leaf.dtype), ", got ", dtype_name(grad.dtype()));
    if (!leaf.grad) {
        leaf.grad = (held_alone(grad) ? grad.detach() : grad.detach().clone()).impl_ptr();
        return;
    }
    Tensor(leaf.grad).add_(grad);
}

// Note [Post-accumulate-grad hooks]: each hook of `leaf`, in registration order (a copy of the
// list, so that a hook may remove itself).
void run_post_accumulate_grad_hooks(const std::shared_ptr<TensorImpl>& leaf) {
    const auto hooks = leaf->post_accumulate_grad_hooks;
    const Tensor t(leaf);
    for (const auto& [handle, hook] : hooks) hook(t);
}

}  // namespace

void detail::run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
    NT_CHECK(root.requires_grad(), "backward: expected a tensor that requires grad, got one that does not require grad "
             "and has no grad_fn");
    Tensor g = gradient;
    if (!g.defined()) {
        NT_CHECK_AS(ShapeError, root.numel() == 1,
                    "backward: expected a one-element output (a gradient can be implied only for one), got shape ",
                    shape_str(root.shape()), "; pass a gradient");
        g = ones(root.shape(), TensorOptions().dtype(root.dtype()).device(root.device()));
    }
    NT_CHECK_AS(ShapeError, g.shape() == root.shape(), "backward: expected a gradient of shape ",
                shape_str(root.shape()), ", got ", shape_str(g.shape()));
    NT_CHECK_AS(DTypeError, g.dtype() == root.dtype(), "backward: expected a gradient of dtype ", dtype_name(root.dtype()),
                ", got ", dtype_name(g.dtype()));
    NT_CHECK_AS(DeviceError, g.device() == root.device(), "backward: expected a gradient on ",
                device_name(root.device()), ", got ", device_name(g.device()));

    NoGradGuard no_grad;  // backward builds no graph of its own
    // Note [Anomaly detection]: the nodes are checked here, not the ops they call.
    detail::BackwardAnomalyScope in_backward;
    if (root.is_leaf()) {
        accumulate_into_leaf(root.impl(), g);
        run_post_accumulate_grad_hooks(root.impl_ptr());
        return;
    }

    // The nodes reachable from the root, run in reverse recording order (a topological order).
    std::vector<Node*> order;
    std::unordered_set<Node*> seen{root.grad_fn().get()};
    std::vector<Node*> stack{root.grad_fn().get()};
    while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        order.push_back(n);
        for (const Edge& e : n->next_edges())
            if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
    std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->sequence_nr() > b->sequence_nr(); });

    // Note [Post-accumulate-grad hooks]: a leaf's hooks run after the last node with an edge to it,
    // if one of them gave it a gradient; the edges left to run, per leaf with hooks.
    std::unordered_map<TensorImpl*, std::pair<int64_t, bool>> leaf_edges;  // edges left, gradient added
    for (Node* n : order)
        for (const Edge& e : n->next_edges())
            if (e.leaf && !e.leaf->post_accumulate_grad_hooks.empty()) ++leaf_edges[e.leaf.get()].first;
    auto leaf_edge_done = [&](const Edge& e, bool added) {
        auto it = leaf_edges.find(e.leaf.get());
        if (it == leaf_edges.end()) return;
        it->second.second |= added;
        if (--it->second.first == 0 && it->second.second) run_post_accumulate_grad_hooks(e.leaf);
    };

    // The gradients reaching each node, one per output of it (undefined until one arrives).
    std::unordered_map<Node*, std::vector<Tensor>> pending;
    auto gradient_of = [&](Node* n, uint32_t output_nr) -> Tensor& {
        std::vector<Tensor>& grads = pending[n];
        if (grads.empty()) grads.resize(n->num_outputs());
        NT_CHECK(output_nr < grads.size(), n->name(), ": expected a gradient for one of its ", grads.size(),
                 " outputs, got one for output ", output_nr);
        return grads[output_nr];
    };
    gradient_of(root.grad_fn().get(), root.impl().output_nr) = g;
    for (Node* node : order) {
        auto it = pending.find(node);
        if (it == pending.end()) {  // no gradient reached this node
            for (const Edge& e : node->next_edges())
                if (e.leaf) leaf_edge_done(e, false);
            continue;
        }
        std::vector<Tensor> grad_outputs = std::move(it->second);
        pending.erase(it);
        check_not_released(node->released(), node->name());
        node->retain_saved_ = retain_graph;
        std::vector<Tensor> grad_inputs;
        {
            detail::BackwardNodeScope where(node->module_path_, node->name());
            grad_inputs = node->apply_outputs(grad_outputs);
        }
        if (!retain_graph) node->release_saved();
        const std::vector<Edge>& edges = node->next_edges();
        NT_CHECK(grad_inputs.size() == edges.size(), node->name(), ": expected ", edges.size(),
                 " gradients (one per input), got ", grad_inputs.size());
        for (size_t i = 0; i < edges.size(); ++i) {
            if (!edges[i].valid() || !grad_inputs[i].defined()) {
                if (edges[i].leaf) leaf_edge_done(edges[i], false);
                continue;
            }
            if (is_anomaly_enabled()) detail::check_backward_anomaly(node->name(), i, grad_inputs[i], grad_outputs);
            if (edges[i].node) accumulate(gradient_of(edges[i].node.get(), edges[i].input_nr), grad_inputs[i]);
            else {
                accumulate_into_leaf(*edges[i].leaf, grad_inputs[i]);
                leaf_edge_done(edges[i], true);
            }
        }
    }
}

}  // namespace normtape
