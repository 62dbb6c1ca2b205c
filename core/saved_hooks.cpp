// core/saved_hooks.cpp: the per-thread stack of save scopes and the SavedTensorHooks guard. What a
// SavedTensor does with them: core/autograd.cpp.
#include "core/saved_hooks.h"

#include <iterator>
#include <utility>

#include "core/autograd.h"

namespace normtape {

std::vector<detail::SaveScope>& detail::save_scopes() {
    thread_local std::vector<SaveScope> scopes;
    return scopes;
}

SavedTensorHooks::SavedTensorHooks(PackHook pack, UnpackHook unpack) {
    NT_CHECK(pack && unpack, "SavedTensorHooks: expected a pack and an unpack function, got ",
             pack ? "an empty unpack" : "an empty pack");
    pair_ = std::make_shared<const detail::HookPair>(detail::HookPair{std::move(pack), std::move(unpack)});
    detail::SaveScope scope;
    scope.hooks = pair_;
    detail::save_scopes().push_back(std::move(scope));
}

SavedTensorHooks::~SavedTensorHooks() {
    // Its own entry, not the top: an outer guard may end first. Gone already if a checkpoint()
    // that this guard was opened in has ended, which drops the scopes above its own.
    std::vector<detail::SaveScope>& scopes = detail::save_scopes();
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it)
        if (it->hooks == pair_) {
            scopes.erase(std::next(it).base());
            return;
        }
}

detail::HookCallScope::HookCallScope() : outer_(std::move(save_scopes())), grad_mode_(grad_mode_enabled()) {
    save_scopes().clear();
    set_grad_mode(false);
}

detail::HookCallScope::~HookCallScope() {
    save_scopes() = std::move(outer_);
    set_grad_mode(grad_mode_);
}

}  // namespace normtape
