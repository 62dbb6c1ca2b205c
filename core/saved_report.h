// core/saved_tensors_report(): what the graphs alive now hold for backward, storage by storage:
// who holds each (node, slot, module), its size, and what a recipe or a hook made of it. PyTorch
// has no such API (its saved tensors can be listed only node by node, from Python); this is how a
// user sees where the bytes of saved_bytes() go and what a policy, a hook or a checkpoint changed.
//
// One entry per storage, counted once however many nodes hold it, as saved_bytes() counts: the
// report's total_bytes equals saved_bytes() to the byte. A holder that keeps a recipe instead of a
// tensor (Note [Rematerialization], core/autograd.h; a checkpoint, core/activation_checkpoint.h)
// appears as a holder of each storage the recipe keeps alive, "via" the recipe. Parameters'
// storages are left out, as saved_bytes() leaves them out.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace normtape {

// A node that holds a saved storage, and how.
struct SavedTensorHolder {
    std::string grad_fn;       // the node's name(): "LayerNormBackward"
    uint64_t sequence_nr = 0;  // its sequence number (recording order)
    std::string slot;          // the saved slot: "x", "x_hat", "input", "qkv"
    std::string module;        // the scope it was recorded in: "h.3.ln_1" ("" outside modules)
    std::string via;           // "" when it keeps the storage itself; else the recipe that keeps
                               // it alive: "norm affine", "gelu", "checkpoint"
};

// One saved storage alive now.
struct SavedTensorEntry {
    std::vector<SavedTensorHolder> holders;  // in recording order; more than one: shared
    Shape shape;                             // as the first holder saved it (a view may be smaller)
    DType dtype = DType::F32;
    Device device = Device::CPU;
    int64_t bytes = 0;    // the storage's bytes
    bool packed = false;  // what saved-tensor hooks kept (core/saved_hooks.h), e.g. SaveOnCpu's host copy

    bool shared() const { return holders.size() > 1; }
    // The module that recorded it: its first holder's.
    const std::string& module() const { return holders.front().module; }
};

struct SavedTensorsReport {
    std::vector<SavedTensorEntry> entries;  // by the first holder's sequence number
    int64_t total_bytes = 0;                // == saved_bytes() when the report was made
    // Totals by the module that recorded the entry, and by its first holder's grad_fn, in bytes,
    // largest first (ties by name).
    std::vector<std::pair<std::string, int64_t>> bytes_by_module, bytes_by_op;

    // Bytes of the entries on `device` (packed ones on the host count there).
    int64_t bytes_on(Device device) const;
    // A table for a terminal: the `top` largest entries, largest first, with their holders (top 0:
    // every entry, in recording order), then the totals by op and by module. Never throws except
    // std::bad_alloc.
    std::string table(size_t top = 0) const;
    // The whole report as a JSON object: {"total_bytes", "entries": [{"bytes", "shape", "dtype",
    // "device", "packed", "holders": [{"grad_fn", "sequence_nr", "slot", "module", "via"}]}],
    // "bytes_by_module": {..}, "bytes_by_op": {..}}. Never throws except std::bad_alloc.
    std::string json(int indent = 2) const;
};

// The report of every saved tensor held now by live nodes (the tape, core/autograd.h). Costs one
// walk over the live nodes; reads no tensor data, so it never waits for a device. Never throws
// except std::bad_alloc.
SavedTensorsReport saved_tensors_report();

}  // namespace normtape
