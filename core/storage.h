// core/storage.h: a buffer of bytes on one device, shared by the tensors that view it.
//
// A Storage is owned through std::shared_ptr; the last owner returns the bytes to the device's
// allocator (a pinned host storage to the pinned cache, core/allocator.h). `version` counts
// in-place writes: autograd's SavedTensor records it when saving and checks it when unpacking, so
// a saved tensor that was modified in place is detected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"

namespace normtape {

class Storage {
public:
    // Allocates `nbytes` on `device` (contents uninitialized). Throws as allocate()
    // (core/allocator.h): OutOfMemoryError, DeviceError, or Error on another CUDA error.
    // pinned: page-locked host memory from allocate_pinned(), for asynchronous copies to and from
    // a GPU (SaveOnCpu); counted as any cpu bytes. Throws DeviceError for pinned on a device other
    // than the cpu, or where allocate_pinned() does (no CUDA backend, no GPU visible).
    // In a dry run (core/dry_run.h) the bytes are counted and none are held: data() is an address
    // that must not be dereferenced, and is_dry() is true for the storage's lifetime.
    Storage(size_t nbytes, Device device, bool pinned = false);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }
    size_t nbytes() const { return nbytes_; }
    Device device() const { return device_; }
    bool is_pinned() const { return pinned_; }
    bool is_dry() const { return dry_run_ != 0; }
    uint64_t version() const { return version_; }
    void bump_version() { ++version_; }
    // True once a leaf over this storage was marked requires_grad (a parameter or a user input
    // that wants a gradient). saved_bytes() does not count such storages: they exist whether or
    // not a graph does, whichever view of them was saved.
    bool is_parameter() const { return is_parameter_; }
    void mark_parameter() { is_parameter_ = true; }

private:
    void* data_ = nullptr;
    size_t nbytes_ = 0;
    Device device_;
    uint64_t version_ = 0;
    bool is_parameter_ = false;
    bool pinned_ = false;
    uint64_t dry_run_ = 0;  // the dry run that counted these bytes (core/dry_run.h); 0: real bytes
};

}  // namespace normtape
