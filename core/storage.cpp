// core/storage.cpp: Storage over the device allocator.
#include "core/storage.h"

#include "core/allocator.h"

namespace normtape {

Storage::Storage(size_t nbytes, Device device)
    : data_(allocate(device, nbytes)), nbytes_(nbytes), device_(device) {}

Storage::~Storage() { deallocate(device_, data_, nbytes_); }

}  // namespace normtape
