// core/activation_checkpoint_internal.h: internal (not installed): what a SavedTensor made inside
// checkpoint()'s function does (core/autograd.cpp calls these; Note [Activation checkpointing]).
#pragma once

#include <memory>

#include "core/autograd.h"
#include "core/saved_hooks.h"

namespace normtape::detail {

// In fn's forward: registers `t` as the frame's next dropped tensor and returns the recipe that
// hands it out after the rerun.
std::shared_ptr<const Recipe> checkpoint_drop(CheckpointFrame& frame, const Tensor& t);
// In fn's rerun: keeps `t` (detached) as the frame's next recomputed tensor.
void checkpoint_capture(CheckpointFrame& frame, const Tensor& t);

}  // namespace normtape::detail
