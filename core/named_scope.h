// core/named_scope.h: where the work being done belongs: the module path that modules open around
// their forward ("h.3.ln_1"), and, in backward, the node being run. Recorded nodes keep the path
// they were recorded under (Node::module_path()), and the allocator's trace labels each allocation
// and release with it (MemoryEvent, core/allocator.h), so that a saved tensor and an allocation can
// be traced back to the layer that made it.
//
// The state is per thread, as grad mode is. Opening a scope costs one string join.
#pragma once

#include <memory>
#include <string>

namespace normtape {

// Opens the scope `name` inside the current one for its lifetime: the path becomes
// "<current>.<name>" ("h.3" then "ln_1" gives "h.3.ln_1"); an empty name leaves the path as it is
// (a model's root module has none). nn::Module's forward functions open one each
// (nn/model/module.h ModuleScope); a user may open one around any code. Never throws except
// std::bad_alloc.
class NamedScope {
public:
    explicit NamedScope(const std::string& name);
    ~NamedScope();
    NamedScope(const NamedScope&) = delete;
    NamedScope& operator=(const NamedScope&) = delete;

private:
    std::shared_ptr<const std::string> previous_;
};

// The current scope's path, "" outside every scope. Never null.
const std::shared_ptr<const std::string>& current_scope();

// True while a backward runs a node's apply() on this thread (and while checkpoint() reruns a
// function inside it); the node being run, or nullptr.
bool in_backward();
const char* current_backward_node();

namespace detail {
// Set by the engine around each node's apply(): the scope becomes the node's module path, and
// in_backward() / current_backward_node() say which node runs.
class BackwardNodeScope {
public:
    BackwardNodeScope(std::shared_ptr<const std::string> module_path, const char* node);
    ~BackwardNodeScope();
    BackwardNodeScope(const BackwardNodeScope&) = delete;
    BackwardNodeScope& operator=(const BackwardNodeScope&) = delete;

private:
    std::shared_ptr<const std::string> previous_path_;
    const char* previous_node_;
};
}  // namespace detail

}  // namespace normtape
