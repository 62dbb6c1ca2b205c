// core/storage.cpp: Storage over the device allocator (or the pinned host allocator).
#include "core/storage.h"

#include "core/allocator.h"
#include "core/check.h"

namespace normtape {

namespace {

void* storage_bytes(size_t nbytes, Device device, bool pinned) {
    if (!pinned) return allocate(device, nbytes);
    NT_CHECK_AS(DeviceError, device.is_cpu(), "Storage: expected device cpu for pinned memory, got ",
                device_name(device));
    return allocate_pinned(nbytes);
}

}  // namespace

Storage::Storage(size_t nbytes, Device device, bool pinned)
    : data_(storage_bytes(nbytes, device, pinned)), nbytes_(nbytes), device_(device), pinned_(pinned) {}

Storage::~Storage() {
    if (pinned_) deallocate_pinned(data_, nbytes_);
    else deallocate(device_, data_, nbytes_);
}

}  // namespace normtape
