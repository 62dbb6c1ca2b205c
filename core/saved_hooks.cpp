// core/saved_hooks.cpp: the per-thread stack of save scopes and the SavedTensorHooks guard. What a
// SavedTensor does with them: core/autograd.cpp.
#include "core/saved_hooks.h"

#include <utility>

namespace normtape {

std::vector<detail::SaveScope>& detail::save_scopes() {
    thread_local std::vector<SaveScope> scopes;
    return scopes;
}

SavedTensorHooks::SavedTensorHooks(PackHook pack, UnpackHook unpack) {
    NT_CHECK(pack && unpack, "SavedTensorHooks: expected a pack and an unpack function, got ",
             pack ? "an empty unpack" : "an empty pack");
    detail::SaveScope scope;
    scope.hooks = std::make_shared<const detail::HookPair>(detail::HookPair{std::move(pack), std::move(unpack)});
    detail::save_scopes().push_back(std::move(scope));
}

SavedTensorHooks::~SavedTensorHooks() { detail::save_scopes().pop_back(); }

}  // namespace normtape
