// nn/checkpoint.h: tensors to and from files in the safetensors format, and module checkpoints.
//
// safetensors (huggingface/safetensors): 8 bytes little-endian header length n, n bytes of JSON
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {"key": "value"}}, then the raw little-endian data. PyTorch reads these files
// (tests/torch_reference.py does, with the standard library only). Parameter names are GPT-2 /
// nanoGPT style state_dict keys: "wte.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight".
#pragma once

#include <map>
#include <string>

#include "nn/module.h"

namespace normtape {

// Writes `tensors` (any device and dtype; copied to the host, contiguous) and string `metadata`
// to `path`.
// Throws Error naming the file when it cannot be written or two tensors share a name.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path`, in file order (sorted by name, as the format's writers do),
// onto the cpu. `metadata`, when given, receives the "__metadata__" entries.
// Throws Error naming the file when it is missing, truncated, or its header is not valid JSON of
// the expected form (unknown dtype, offsets outside the data or not matching the shape).
NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

// Saves every parameter of `module` under its named_parameters() name.
void save_checkpoint(const std::string& path, const Module& module, const std::map<std::string, std::string>& metadata = {});

// Copies each parameter of `module` from the file's tensor of the same name, in place, onto the
// parameter's device (the storage version is bumped). Build optimizers after loading: AdamW's
// f32 master copies of bf16 parameters are taken when it is constructed. Throws Error naming the file and the parameter when one is
// missing or has another shape or dtype; nothing is modified then.
void load_checkpoint(const std::string& path, Module& module);

}  // namespace normtape
