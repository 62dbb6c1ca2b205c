// core/save_on_cpu.cpp: SaveOnCpu (core/save_on_cpu.h), the host side of Note [SaveOnCpu]: which
// tensors are copied, the entries that remember them, when device memory may be let go. The CUDA
// calls (side streams, copies, events) are behind core/cuda_copy.h.
#include "core/save_on_cpu.h"

#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/cuda_copy.h"
#include "core/cuda_event.h"
#include "core/device_ptr.h"
#include "core/tensor_internal.h"

namespace normtape {

struct SaveOnCpu::State {
    explicit State(int64_t prefetch) : prefetch(prefetch) {}
    ~State();
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    Tensor pack(const Tensor& t);
    Tensor unpack(const Tensor& h);
    // The guard's end: the devices' streams wait for the copies to the host, whose sources are let go.
    void end_packing() noexcept;

    // One packed CUDA tensor: its pinned host copy and what is needed to bring it back.
    struct Entry {
        std::weak_ptr<Storage> host;    // the pinned copy; the SavedTensors that keep it hold it
        std::weak_ptr<Storage> source;  // the saved tensor's storage, and where in it, to copy a storage once
        int64_t offset = 0;
        Shape shape, strides;
        uint64_t version = 0;
        DType dtype = DType::F32;
        Device device = Device::CUDA;
        Tensor prefetched;                 // a copy back to the device queued ahead, not yet handed out
        void* prefetched_event = nullptr;  // recorded on the side stream after that copy
        bool consumed = false;             // unpacked at least once (not prefetched again)
    };

    int64_t prefetch;
    std::vector<Entry> entries;                                         // in packing order
    std::unordered_map<const Storage*, size_t> by_host;                 // host copy -> entry
    std::unordered_map<const Storage*, std::vector<size_t>> by_source;  // saved storage -> entries

    // A copy to the host still running, maybe: its source stays alive until `event` is reached.
    struct InFlight {
        Tensor source;
        void* event;
        int device;
    };
    std::vector<InFlight> in_flight;
    std::vector<std::pair<int, void*>> spare_events;  // (device, event) reached and waited for: reusable

private:
    void* take_event(int device);
    void give_back_event(int device, void* event) noexcept;
    void poll_in_flight();
    // Queues the copy of entry i back to its device; the caller makes the stream wait for `event`.
    Tensor copy_back(size_t i, void*& event);
    void prefetch_below(size_t i);
};

namespace {

// A contiguous cpu tensor of `shape` and `dtype` over `storage`.
Tensor host_tensor(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = std::move(storage);
    impl->shape = shape;
    impl->strides = detail::contiguous_strides(shape);
    impl->dtype = dtype;
    impl->device = Device::CPU;
    return Tensor(impl);
}

// A pinned cpu tensor for a copy of t. Throws OutOfMemoryError naming SaveOnCpu and the tensor.
Tensor pinned_like(const Tensor& t) {
    size_t nbytes = static_cast<size_t>(t.nbytes());
    std::shared_ptr<Storage> storage;
    try {
        storage = std::make_shared<Storage>(nbytes, Device::CPU, /*pinned=*/true);
    } catch (const OutOfMemoryError& e) {
        detail::throw_error<OutOfMemoryError>("SaveOnCpu: cannot allocate the pinned host copy of a tensor of shape ",
                                              shape_str(t.shape()), " ", dtype_name(t.dtype()), " (", nbytes,
                                              " bytes): ", e.what());
    }
    return host_tensor(std::move(storage), t.shape(), t.dtype());
}

}  // namespace

void* SaveOnCpu::State::take_event(int device) {
    for (size_t k = 0; k < spare_events.size(); ++k) {
        if (spare_events[k].first != device) continue;
        void* event = spare_events[k].second;
        spare_events[k] = spare_events.back();
        spare_events.pop_back();
        return event;
    }
    return detail::cuda_copy_event_create(device);
}

void SaveOnCpu::State::give_back_event(int device, void* event) noexcept {
    try {
        spare_events.emplace_back(device, event);
    } catch (...) {
        detail::cuda_event_destroy(event);  // released by the driver once its record is reached
    }
}

void SaveOnCpu::State::poll_in_flight() {
    size_t kept = 0;
    for (size_t k = 0; k < in_flight.size(); ++k) {
        if (detail::cuda_event_query(in_flight[k].event)) {
            give_back_event(in_flight[k].device, in_flight[k].event);
            in_flight[k].source = Tensor();  // the copy has read it: its bytes may be reused
        } else {
            if (kept != k) in_flight[kept] = std::move(in_flight[k]);
            ++kept;
        }
    }
    in_flight.resize(kept);
}

// Note [SaveOnCpu]: a cpu tensor is kept as it is; a CUDA storage already copied (same view, same
// version, copy still alive) gives the same host copy.
Tensor SaveOnCpu::State::pack(const Tensor& t) {
    if (!t.device().is_cuda()) return t;
    poll_in_flight();
    const std::shared_ptr<Storage>& storage = t.storage();
    auto found = by_source.find(storage.get());
    if (found != by_source.end()) {
        for (size_t i : found->second) {
            const Entry& e = entries[i];
            std::shared_ptr<Storage> host = e.host.lock();
            if (host && e.source.lock() == storage && e.offset == t.impl().offset && e.shape == t.shape() &&
                e.strides == t.strides() && e.version == storage->version() && e.dtype == t.dtype())
                return host_tensor(std::move(host), e.shape, e.dtype);
        }
    }
    const int device = t.device().index;
    in_flight.reserve(in_flight.size() + 1);  // once the copy is queued, keeping its source cannot fail
    Tensor source = t.is_contiguous() ? t : t.contiguous();  // queued on the device's stream, before the copy
    Tensor host = pinned_like(t);
    void* done = take_event(device);
    try {
        detail::cuda_copy_to_host_async(host.storage()->data(), detail::byte_ptr(source),
                                        static_cast<size_t>(t.nbytes()), device, done);
    } catch (...) {
        give_back_event(device, done);
        throw;
    }
    Entry e;
    e.host = host.storage();
    e.source = storage;
    e.offset = t.impl().offset;
    e.shape = t.shape();
    e.strides = t.strides();
    e.version = storage->version();
    e.dtype = t.dtype();
    e.device = t.device();
    in_flight.push_back({source, done, device});  // reserved: does not throw
    entries.push_back(std::move(e));
    by_host[host.storage().get()] = entries.size() - 1;
    by_source[storage.get()].push_back(entries.size() - 1);
    return host;
}

Tensor SaveOnCpu::State::copy_back(size_t i, void*& event) {
    const Entry& e = entries[i];
    std::shared_ptr<Storage> host = e.host.lock();  // alive: checked by the callers
    // Allocated before the copy is queued: the copy waits for the work queued on the device's
    // stream so far, which may still use this block's bytes (freed on the host, not yet on the GPU).
    Tensor out = empty(e.shape, TensorOptions().dtype(e.dtype).device(e.device));
    event = take_event(e.device.index);
    try {
        detail::cuda_copy_to_device_async(out.storage()->data(), host->data(), host->nbytes(), e.device.index, event);
    } catch (...) {
        give_back_event(e.device.index, event);
        event = nullptr;
        throw;
    }
    return out;
}

void SaveOnCpu::State::prefetch_below(size_t i) {
    size_t lowest = i > static_cast<size_t>(prefetch) ? i - static_cast<size_t>(prefetch) : 0;
    for (size_t j = i; j-- > lowest;) {
        Entry& e = entries[j];
        if (e.consumed || e.prefetched.defined() || e.host.expired()) continue;
        void* event = nullptr;
        try {
            e.prefetched = copy_back(j, event);
        } catch (const OutOfMemoryError&) {
            return;  // a prefetch is only ahead of time: the unpack copies then
        }
        e.prefetched_event = event;
    }
}

// Note [SaveOnCpu]: the host copy stays (a second backward under retain_graph copies it again);
// the device's stream waits for the copy back before anything reads the tensor returned.
Tensor SaveOnCpu::State::unpack(const Tensor& h) {
    if (!h.device().is_cpu() || !h.storage()) return h;
    auto found = by_host.find(h.storage().get());
    if (found == by_host.end() || entries[found->second].host.lock() != h.storage()) return h;  // not packed here
    const size_t i = found->second;
    poll_in_flight();
    Entry& e = entries[i];
    const int device = e.device.index;
    Tensor out;
    void* event = nullptr;
    if (e.prefetched.defined()) {
        out = std::move(e.prefetched);
        e.prefetched = Tensor();
        event = std::exchange(e.prefetched_event, nullptr);
    } else {
        out = copy_back(i, event);
    }
    try {
        detail::cuda_stream_wait_event(device, event);
    } catch (...) {
        give_back_event(device, event);
        throw;
    }
    give_back_event(device, event);  // the wait is queued: the event may be recorded again
    e.consumed = true;
    prefetch_below(i);
    return out;
}

void SaveOnCpu::State::end_packing() noexcept {
    int waited = -1;
    for (const InFlight& f : in_flight) {
        if (f.device == waited) continue;
        try {
            detail::cuda_stream_wait_side(f.device);
        } catch (...) {
            return;  // a CUDA error (the context is broken): keep the sources while the State lives
        }
        waited = f.device;
    }
    for (const InFlight& f : in_flight) detail::cuda_event_destroy(f.event);
    in_flight.clear();
}

SaveOnCpu::State::~State() {
    end_packing();
    for (Entry& e : entries) {
        if (!e.prefetched.defined()) continue;
        try {  // a copy never handed out: its block goes back to the allocator, after the copy
            detail::cuda_stream_wait_event(e.device.index, e.prefetched_event);
        } catch (...) {
            // a CUDA error here means the context is broken; nothing would run on the block again
        }
        detail::cuda_event_destroy(e.prefetched_event);
        e.prefetched = Tensor();
    }
    for (const auto& [device, event] : spare_events) detail::cuda_event_destroy(event);
}

namespace {

std::shared_ptr<SaveOnCpu::State> make_state(int64_t prefetch) {
    NT_CHECK(prefetch >= 0, "SaveOnCpu: expected prefetch >= 0 (the packed tensors copied back ahead), got ", prefetch);
    return std::make_shared<SaveOnCpu::State>(prefetch);
}

}  // namespace

SaveOnCpu::SaveOnCpu(int64_t prefetch)
    : state_(make_state(prefetch)),
      hooks_([state = state_](const Tensor& t) { return state->pack(t); },
             [state = state_](const Tensor& h) { return state->unpack(h); }) {}

SaveOnCpu::~SaveOnCpu() { state_->end_packing(); }

}  // namespace normtape
