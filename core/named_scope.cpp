// core/named_scope.cpp: the per-thread scope path and backward node.
#include "core/named_scope.h"

#include <utility>

namespace normtape {

namespace {
const std::shared_ptr<const std::string>& root_scope() {
    static const std::shared_ptr<const std::string> root = std::make_shared<const std::string>();
    return root;
}
thread_local std::shared_ptr<const std::string> scope_path;  // null: the root
thread_local const char* backward_node = nullptr;
}  // namespace

NamedScope::NamedScope(const std::string& name) : previous_(scope_path) {
    if (name.empty()) return;
    const std::string& parent = *current_scope();
    scope_path = std::make_shared<const std::string>(parent.empty() ? name : parent + "." + name);
}

NamedScope::~NamedScope() { scope_path = std::move(previous_); }

const std::shared_ptr<const std::string>& current_scope() { return scope_path ? scope_path : root_scope(); }

bool in_backward() { return backward_node != nullptr; }
const char* current_backward_node() { return backward_node; }

detail::BackwardNodeScope::BackwardNodeScope(std::shared_ptr<const std::string> module_path, const char* node)
    : previous_path_(std::move(scope_path)), previous_node_(backward_node) {
    scope_path = std::move(module_path);
    backward_node = node;
}

detail::BackwardNodeScope::~BackwardNodeScope() {
    scope_path = std::move(previous_path_);
    backward_node = previous_node_;
}

}  // namespace normtape
