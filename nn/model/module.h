// nn/model/module.h: Module, the base of every layer: named parameters and submodules, zero_grad,
// train/eval; and the layers without a norm: Linear, Embedding, Dropout.
//
// Parameter names join submodule names with dots, as PyTorch's state_dict does
// ("h.0.ln_1.weight"): a module's own parameters first, in registration order, then each
// submodule's, in registration order. Parameters are leaves with requires_grad set.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/named_scope.h"
#include "core/tensor.h"

namespace normtape {

class Module {
public:
    virtual ~Module() = default;
    Module() = default;
    Module(const Module&) = delete;
    Module& operator=(const Module&) = delete;

    // Every parameter of this module and its submodules, depth first, with dotted names. A
    // parameter reachable twice (a module registered under two names, a tensor registered in two
    // modules: weight tying) is listed once, under its first name, as torch's named_parameters()
    // does; so an optimizer built from parameters() updates it once, and a checkpoint holds it once.
    NamedTensors named_parameters() const;
    std::vector<Tensor> parameters() const;
    // Total number of parameter elements (a tied parameter counted once).
    int64_t num_parameters() const;
    // Drops every parameter's gradient (grad() becomes undefined, as PyTorch's set_to_none).
    void zero_grad();
    // Moves every parameter to `device` and converts it to `dtype`, in place: the parameter
    // tensors (and every handle to them) keep their identity, their data is replaced. Drops
    // gradients. As torch.nn.Module.to(device, dtype). Throws DTypeError for a non-floating dtype,
    // DeviceError for a device this build or machine lacks, OutOfMemoryError as the factories.
    void to(Device device, DType dtype);
    // Training mode (the default) or evaluation mode, for this module and every submodule, as
    // torch.nn.Module.train(mode) / eval(): it decides whether Dropout (and attention's dropout)
    // drops. Never throws.
    void train(bool on = true);
    void eval() { train(false); }
    bool is_training() const { return training_; }

    // The name this module was registered under in its parent ("ln_1", "h.3"); "" for a module
    // never registered (a model's root). A module registered twice keeps the last name.
    const std::string& name() const { return name_; }
    // The submodules registered directly in this one, in registration order (one registered under
    // two names once, as torch's children()).
    std::vector<std::shared_ptr<Module>> children() const;
    // This module ("") and every submodule, depth first in registration order, with dotted paths
    // ("h.3.ln_1"), as torch.nn.Module.named_modules(): a module reachable twice is listed once,
    // under its first path. The pointers live as long as this module.
    std::vector<std::pair<std::string, Module*>> named_modules();
    // Calls fn on every submodule, children() before their parent, then on this module, as
    // torch.nn.Module.apply(fn). Rethrows what fn throws (the modules before it were visited).
    void apply(const std::function<void(Module&)>& fn);

protected:
    // Adds `t` as a parameter called `name` (it must be a leaf, else Error; requires_grad is set;
    // DTypeError for an i64 tensor). Returns it.
    Tensor register_parameter(const std::string& name, Tensor t);
    // Adds a submodule called `name` (its parameters are named "name.<its names>"). Returns it.
    // Throws Error naming register_module and `name`, adding nothing, when `module` is null or is
    // this module or one that contains it (a cycle: every walk of the tree would never end, and
    // the shared_ptrs would keep each other alive). A module shared by two parents is allowed.
    template <class M>
    std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
        check_child(name, module.get());
        static_cast<Module&>(*module).name_ = name;
        children_.emplace_back(name, module);
        return module;
    }

private:
    // register_module's checks, above.
    void check_child(const std::string& name, const Module* module) const;
    // True if this module is `target` or holds it at any depth.
    bool contains(const Module* target, std::unordered_set<const Module*>& seen) const;
    void collect(const std::string& prefix, NamedTensors& out, std::unordered_set<const TensorImpl*>& seen) const;
    void collect_modules(const std::string& path, std::vector<std::pair<std::string, Module*>>& out,
                         std::unordered_set<const Module*>& seen);

    std::string name_;
    NamedTensors params_;
    std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
    bool training_ = true;
};

// Opens the scope of `module` (core/named_scope.h) for its lifetime: every forward of the modules
// here starts with one, so the nodes it records, and the allocations it makes, carry the module's
// path ("h.3.mlp.c_fc") in saved_tensors_report() and the memory trace. A user's module does the
// same: `Tensor forward(const Tensor& x) const { ModuleScope scope(*this); ... }`. Never throws
// except std::bad_alloc.
class ModuleScope : public NamedScope {
public:
    explicit ModuleScope(const Module& module) : NamedScope(module.name()) {}
};

// Linear(in_features, out_features, bias): y = x @ weight^T + bias (ops/matmul.h linear).
// weight: [out_features, in_features] drawn N(0, init_std^2), bias: [out_features] zeros (GPT-2's
// initialization), of options' dtype and device (on CUDA drawn by cuRAND). Throws ShapeError for
// sizes <= 0 (or too large to count), DTypeError for a non-floating dtype, DeviceError for a device
// this build or machine lacks, OutOfMemoryError when the weights cannot be allocated.
class Linear : public Module {
public:
    Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions options = {},
           double init_std = 0.02);
    // A Linear over existing tensors, registered as its parameters: weight tying (a GPT's lm_head
    // over wte's table; Module lists a tied tensor once). weight: [out_features, in_features] of a
    // floating dtype, bias: [out_features] or undefined. Throws ShapeError or DTypeError naming
    // Linear, and Error for an undefined weight or one that is not a leaf.
    explicit Linear(Tensor weight, Tensor bias = Tensor());
    // x: [..., in_features], dtype and device of weight -> [..., out_features]; see linear().
    Tensor forward(const Tensor& x) const;

    Tensor weight, bias;
};

// Embedding(num_embeddings, embedding_dim): a [V, C] table drawn N(0, 0.02^2) (ops/embedding.h),
// of options' dtype and device. Throws as Linear.
class Embedding : public Module {
public:
    Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options = {});
    // ids: [...] i64 in [0, num_embeddings) -> [..., embedding_dim]; see embedding().
    Tensor forward(const Tensor& ids) const;

    Tensor weight;
};

// Dropout(p): dropout(x, p, is_training()) (ops/dropout.h): in training mode each element is
// zeroed with probability p and the others scaled by 1 / (1 - p); in evaluation mode the identity.
// No parameters; saves no tensor for backward. Throws Error for p outside [0, 1).
class Dropout : public Module {
public:
    explicit Dropout(double p);
    // x: any shape, floating, any device -> x's shape; see dropout().
    Tensor forward(const Tensor& x) const;

    double p;
};

}  // namespace normtape
