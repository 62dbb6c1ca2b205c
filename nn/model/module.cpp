// nn/model/module.cpp: Module bookkeeping, Linear, Embedding.
#include "nn/model/module.h"

#include <algorithm>

#include "core/autograd.h"
#include "ops/dropout.h"
#include "ops/embedding.h"
#include "ops/matmul.h"

namespace normtape {

Tensor Module::register_parameter(const std::string& name, Tensor t) {
    NT_CHECK(t.is_leaf(), "register_parameter: expected parameter ", name, " to be a leaf tensor, got one with grad_fn ",
             t.grad_fn()->name());
    t.requires_grad_(true);
    params_.emplace_back(name, t);
    return t;
}

bool Module::contains(const Module* target, std::unordered_set<const Module*>& seen) const {
    if (this == target) return true;
    if (!seen.insert(this).second) return false;  // a module shared by two parents: walked once
    for (const auto& [name, child] : children_)
        if (child->contains(target, seen)) return true;
    return false;
}

void Module::check_child(const std::string& name, const Module* module) const {
    NT_CHECK(module != nullptr, "register_module: expected a module for \"", name, "\", got a null pointer");
    std::unordered_set<const Module*> seen;
    NT_CHECK(!module->contains(this, seen), "register_module: expected a submodule \"", name,
             "\" that is not this module and does not contain it, got ",
             module == this ? "this module itself" : "one that holds this module",
             " (a cycle: walking the modules would never end)");
}

void Module::collect(const std::string& prefix, NamedTensors& out, std::unordered_set<const TensorImpl*>& seen) const {
    for (const auto& [name, t] : params_)
        if (seen.insert(&t.impl()).second) out.emplace_back(prefix + name, t);
    for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, seen);
}

NamedTensors Module::named_parameters() const {
    NamedTensors out;
    std::unordered_set<const TensorImpl*> seen;  // a tied parameter keeps its first name, as torch's
    collect("", out, seen);
    return out;
}

std::vector<Tensor> Module::parameters() const {
    std::vector<Tensor> out;
    for (auto& [name, t] : named_parameters()) out.push_back(t);
    return out;
}

int64_t Module::num_parameters() const {
    int64_t n = 0;
    for (const Tensor& t : parameters()) n += t.numel();
    return n;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
    std::vector<std::shared_ptr<Module>> out;
    for (const auto& [name, child] : children_)
        if (std::find(out.begin(), out.end(), child) == out.end()) out.push_back(child);
    return out;
}

void Module::collect_modules(const std::string& path, std::vector<std::pair<std::string, Module*>>& out,
                             std::unordered_set<const Module*>& seen) {
    if (!seen.insert(this).second) return;
    out.emplace_back(path, this);
    for (const auto& [name, child] : children_)
        child->collect_modules(path.empty() ? name : path + "." + name, out, seen);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
    std::vector<std::pair<std::string, Module*>> out;
    std::unordered_set<const Module*> seen;  // a shared module keeps its first path, as torch's
    collect_modules("", out, seen);
    return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
    for (const std::shared_ptr<Module>& child : children()) child->apply(fn);
    fn(*this);
}

void Module::zero_grad() {
    for (Tensor& t : parameters()) t.zero_grad();
}

void Module::train(bool on) {
    training_ = on;
    for (auto& child : children_) child.second->train(on);
}

void Module::to(Device device, DType dtype) {
    NT_CHECK_AS(DTypeError, is_floating(dtype), "Module::to: expected a floating dtype, got ", dtype_name(dtype));
    for (Tensor& p : parameters()) {
        Tensor moved = p.detach().to(dtype).to(device);
        moved.storage()->mark_parameter();
        TensorImpl& impl = p.impl();
        impl.storage = moved.storage();
        impl.strides = moved.strides();
        impl.offset = 0;
        impl.dtype = dtype;
        impl.device = device;
        impl.grad.reset();
    }
}

namespace {
Tensor normal_init(const Shape& shape, double std, TensorOptions options) {
    Tensor t = randn(shape, options.requires_grad(false));
    t.mul_(std);
    return t;
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool has_bias, TensorOptions options, double init_std) {
    NT_CHECK_AS(ShapeError, in_features > 0 && out_features > 0,
                "Linear: expected positive in_features and out_features, got ", in_features, " and ", out_features);
    NT_CHECK_AS(DTypeError, is_floating(options.dtype_), "Linear: expected a floating dtype, got ",
                dtype_name(options.dtype_));
    weight = register_parameter("weight", normal_init({out_features, in_features}, init_std, options));
    if (has_bias) bias = register_parameter("bias", zeros({out_features}, options.requires_grad(false)));
}

Linear::Linear(Tensor w, Tensor b) {
    NT_CHECK(w.defined(), "Linear: expected a weight of shape [out_features, in_features], got an undefined tensor");
    NT_CHECK_AS(DTypeError, is_floating(w.dtype()), "Linear: expected a floating weight, got ", dtype_name(w.dtype()));
    NT_CHECK_AS(ShapeError, w.dim() == 2, "Linear: expected a weight of shape [out_features, in_features], got ",
                shape_str(w.shape()));
    NT_CHECK_AS(ShapeError, !b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), "Linear: expected a bias of shape [",
                w.size(0), "], got ", shape_str(b.shape()));
    weight = register_parameter("weight", w);
    if (b.defined()) bias = register_parameter("bias", b);
}

Tensor Linear::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    return linear(x, weight, bias);
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options) {
    NT_CHECK_AS(ShapeError, num_embeddings > 0 && embedding_dim > 0,
                "Embedding: expected positive num_embeddings and embedding_dim, got ", num_embeddings, " and ",
                embedding_dim);
    NT_CHECK_AS(DTypeError, is_floating(options.dtype_), "Embedding: expected a floating dtype, got ",
                dtype_name(options.dtype_));
    weight = register_parameter("weight", normal_init({num_embeddings, embedding_dim}, 0.02, options));
}

Tensor Embedding::forward(const Tensor& ids) const {
    ModuleScope scope(*this);
    return embedding(ids, weight);
}

Dropout::Dropout(double p_) : p(p_) {
    NT_CHECK(p >= 0 && p < 1, "Dropout: expected a probability p in [0, 1), got ", p);
}

Tensor Dropout::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    return dropout(x, p, is_training());
}

}  // namespace normtape
