// nn/formats/checkpoint.h: module checkpoints: a module's parameters, optionally with the optimizer's
// state so that training can resume, in one safetensors file. Not here: the format, its reader and
// writer (nn/formats/safetensors.h, included here, so that this header gives both).
//
// Parameter names are GPT-2 / nanoGPT style state_dict keys: "wte.weight", "h.0.ln_1.weight".
//
// A checkpoint with optimizer state adds, for each parameter P, the state of the optimizer that
// owns it (AdamW, or Muon for the matrices of param_groups_for_muon, nn/optim/muon.h; each parameter
// in exactly one): AdamW's "optimizer.exp_avg.P" (m) and "optimizer.exp_avg_sq.P" (v), or Muon's
// "optimizer.momentum_buffer.P"; for a bf16 parameter "optimizer.master.P" (its f32 master copy);
// and a metadata entry per optimizer, a JSON string: "optimizer" for AdamW, {"type": "AdamW",
// "step": t, "beta1", "beta2", "eps", "groups": [{"size", "weight_decay", "lr_scale"}]} (a file
// without lr_scale has 1), and "optimizer.muon" for Muon, {"type": "Muon", "step": t, "momentum",
// "nesterov", "ns_steps", "groups": [{"size", "weight_decay", "lr_scale"}]}. (Torch's own
// state_dicts name the moments and the buffer the same way.)
//
// Saving is atomic and checksummed, as save_safetensors is (a locked "<target>.tmp", renamed over
// the file; a symbolic link is written through); loading verifies the checksums a file carries.
//
// Errors: every function here throws as save_safetensors / load_safetensors do (IOError when a
// file cannot be opened, read, written or renamed, or another process is writing it; FormatError
// when it is not a valid safetensors file or does not match its checksums), FormatError when a
// file lacks what a checkpoint needs or holds a NaN or an Inf, and ShapeError / DTypeError when a
// file's tensor does not match the module's parameter. The message always names the file, and the
// tensor and what was expected and found.
#pragma once

#include <map>
#include <string>

#include "nn/optim/adamw.h"
#include "nn/model/module.h"
#include "nn/optim/muon.h"
#include "nn/formats/safetensors.h"

namespace normtape {

// Saves every parameter of `module` under its named_parameters() name and, with `optimizer` and/or
// `muon`, their state (the names above); `metadata` is written as the file's "__metadata__" (the
// keys "optimizer" and "optimizer.muon" belong to the optimizers: Error when `metadata` holds one
// and an optimizer is given). Throws as save_safetensors, and Error when an optimizer is given and
// a parameter is in neither or in both.
void save_checkpoint(const std::string& path, const Module& module, const std::map<std::string, std::string>& metadata = {},
                     const AdamW* optimizer = nullptr, const Muon* muon = nullptr);

// Copies each parameter of `module` from the file's tensor of the same name, in place, onto the
// parameter's device (the storage version is bumped); other tensors of the file are ignored. With
// `optimizer` and/or `muon` (built for `module`'s parameters, after Module::to, each parameter in
// exactly one), also restores their moments or buffers, master copies and step counts from the
// file; their hyperparameters (AdamW's betas and eps, Muon's momentum, nesterov and ns_steps, the
// groups' sizes, weight decays and lr scales; not lr, which a schedule sets) must equal the
// file's. Without optimizers, build them after loading: each takes the f32 master copies of bf16
// parameters when it is constructed. `checksummed`, when given, is set on success to whether the file carried checksums
// (all of which matched; see nn/formats/safetensors.h), false when it was read unverified.
// Names, shapes, dtypes, metadata and values are all checked before anything is modified, so on
// those errors the module and the optimizer are unchanged; an allocation or device error while
// copying (OutOfMemoryError, DeviceError) can leave earlier tensors updated. Every tensor to be
// copied (f32, f64, bf16) is checked on the host for NaN and Inf, and each exp_avg_sq (a mean of
// squares) for a negative value. Throws FormatError naming the file and the tensor when one is
// missing, or holds a non-finite value (with the flat index and the value of the first:
// "load_checkpoint: run.safetensors: parameter h.0.ln_1.weight holds a non-finite value (nan) at
// flat index 3 of [8] f32 (a checkpoint of a run that diverged?)") or a negative second moment, or
// the file holds no (or malformed) optimizer state; ShapeError or DTypeError when a tensor has
// another shape or dtype; Error when the hyperparameters differ or a parameter of `module` is in
// neither optimizer or in both; and as load_safetensors.
void load_checkpoint(const std::string& path, Module& module, AdamW* optimizer = nullptr, bool* checksummed = nullptr,
                     Muon* muon = nullptr);
// The same from a file already read by load_safetensors(path, &metadata) (`path` names it in
// messages; the checksums were verified, or not, by that call): lets a caller read a
// checkpoint's metadata before it builds the module.
void load_checkpoint(const std::string& path, const NamedTensors& file, const std::map<std::string, std::string>& metadata,
                     Module& module, AdamW* optimizer = nullptr, Muon* muon = nullptr);

}  // namespace normtape
