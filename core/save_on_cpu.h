// core/save_on_cpu.h: SaveOnCpu, saved-tensor hooks (core/saved_hooks.h) that keep the saved CUDA
// tensors in pinned host memory, as torch.autograd.graph.save_on_cpu(pin_memory=True).
//
// Note [SaveOnCpu]
// pack: a CUDA tensor is copied to a pinned host buffer by an asynchronous copy on a side stream,
// which first waits for the work queued so far on the device's stream (so the copy reads the
// finished tensor); the device tensor is kept until that copy has finished (polled at each pack,
// and waited for by the device's stream, not the host, when the guard ends), so the caching
// allocator cannot hand its bytes out while the copy still reads them. A storage saved twice (by
// two nodes; the same view at the same version, while its first copy lives) is copied once. CPU
// tensors are kept as they are.
// unpack: the host copy comes back to the device by an asynchronous copy on the side stream; the
// unpack of the i-th packed tensor also starts the copies of the next `prefetch` ones in reverse
// packing order (the order a backward unpacks them in), so that the backward seldom waits on a copy;
// the device's stream waits for the copy (an event), never the host.
// The saved bytes held on the GPU after a forward under it are those of the parameters only (not
// counted by saved_bytes()); what stays is on the host, in pinned memory.
//
// Details a user may meet:
// - The host copy is written by the side stream, after pack has returned: what holds it
//   (SavedTensor::data(), an outer pair of hooks) must not read its bytes on the host; unpack is
//   the way back. It is a contiguous cpu tensor of the saved tensor's shape and dtype, counted by
//   memory_stats(Device::CPU) (allocate_pinned, core/allocator.h) and by saved_bytes() instead of
//   the device tensor; its pinned block goes to a cache by size when freed (empty_cache(Device::CPU)
//   returns it).
// - Unpack returns a new contiguous device tensor each time, on the device the tensor was saved
//   from; the host copy stays, so a backward with retain_graph can unpack it again. A tensor is
//   copied back ahead of time only once, before its first unpack; a copy ahead of time that finds no
//   device memory is skipped (the unpack copies then), and one never handed out (its node never
//   ran) is kept until the last tensor packed by this guard is gone.
// - Until the guard ends, a device tensor whose copy is still running stays allocated on the GPU.
// - A tensor modified in place after it was packed still fails unpack: SavedTensor checks the
//   version of the device tensor's storage before the hooks run (core/autograd.h).
#pragma once

#include <cstdint>
#include <memory>

#include "core/saved_hooks.h"

namespace normtape {

class SaveOnCpu {
public:
    // Packs what is saved on this thread while it lives (Note [SaveOnCpu]); the tensors packed
    // are unpacked after it is gone too. prefetch: how many packed tensors ahead of the one being
    // unpacked are copied back (>= 0; 0 copies each one when it is unpacked). Throws Error for
    // prefetch < 0. Its pack throws DeviceError or OutOfMemoryError when pinned memory cannot be had
    // and Error on a CUDA error, out of the op that saved; its unpack OutOfMemoryError when the
    // device cannot take the copy back, out of backward().
    explicit SaveOnCpu(int64_t prefetch = 8);
    // Makes the devices' streams wait for the copies still running (the host does not wait) and
    // lets their device tensors go.
    ~SaveOnCpu();
    SaveOnCpu(const SaveOnCpu&) = delete;
    SaveOnCpu& operator=(const SaveOnCpu&) = delete;

    struct State;  // core/save_on_cpu.cpp

private:
    std::shared_ptr<State> state_;
    SavedTensorHooks hooks_;
};

}  // namespace normtape
