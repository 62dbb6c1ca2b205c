// core/storage.cpp: Storage over the device allocator (or the pinned host allocator, or a dry run's
// counters).
#include "core/storage.h"

#include "core/allocator.h"
#include "core/check.h"
#include "core/dry_run.h"

namespace normtape {

namespace {

void* storage_bytes(size_t nbytes, Device device, bool pinned) {
    NT_CHECK_AS(DeviceError, !pinned || device.is_cpu(), "Storage: expected device cpu for pinned memory, got ",
                device_name(device));
    if (is_dry_run()) return detail::dry_allocate(device, nbytes);  // pinned or not: cpu bytes
    return pinned ? allocate_pinned(nbytes) : allocate(device, nbytes);
}

}  // namespace

Storage::Storage(size_t nbytes, Device device, bool pinned)
    : data_(storage_bytes(nbytes, device, pinned)),
      nbytes_(nbytes),
      device_(device),
      pinned_(pinned),
      dry_run_(detail::dry_run_id()) {}

Storage::~Storage() {
    if (dry_run_ != 0) detail::dry_deallocate(dry_run_, device_, nbytes_);
    else if (pinned_) deallocate_pinned(data_, nbytes_);
    else deallocate(device_, data_, nbytes_);
}

}  // namespace normtape
