// nn/formats/safetensors_internal.h: what the safetensors reader (nn/formats/safetensors.cpp) and writer
// (nn/formats/safetensors_write.cpp) share: the checksum entries' names and form, the hash, a tensor's
// header entry. Internal: not installed. The format and the API: nn/formats/safetensors.h.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

// Header-only (every function static inline here): nothing to link, for the library or its users.
// Where AVX-512 is on (-march=native on such a CPU, -march=x86-64-v4), xxHash would take its
// AVX-512 path, whose intrinsics GCC 12 reports as "may be used uninitialized" once inlined
// (its _mm512_undefined_* leave a register unset on purpose); the AVX2 path is warning-free,
// and a checksum of a file read from disk is not limited by the hash's vector width.
#define XXH_INLINE_ALL
#if defined(__AVX512F__) && !defined(XXH_VECTOR)
#define XXH_VECTOR XXH_AVX2
#endif
#include <xxhash.h>

#include "core/tensor.h"

namespace normtape::detail::safetensors {

// The metadata keys of the checksums (nn/formats/safetensors.h, "Checksums").
constexpr std::string_view kChecksumPrefix = "normtape.checksum.";
constexpr std::string_view kHeaderChecksumKey = "normtape.checksum.header";
constexpr std::string_view kTensorChecksumPrefix = "normtape.checksum.tensor.";
constexpr std::string_view kHashTag = "xxh3-64:";
// Bytes read or written per call when the data is hashed on the way: small enough that the
// hash reads them from the cache, large enough that the calls cost nothing.
constexpr size_t kIoChunk = size_t(1) << 20;

// The format's name of a dtype: "F32", "F64", "BF16", "I64".
const char* st_dtype(DType d);

// The system's message for errno value `err`.
inline std::string errno_str(int err) { return std::strerror(err); }

// XXH3-64 (seed 0) over bytes given in pieces; the digest equals XXH3_64bits of the concatenation.
// In an unnamed namespace: its inline members call xxHash's static functions, which are each
// translation unit's own.
namespace {
class Hasher {
public:
    Hasher() {
        XXH3_INITSTATE(&state_);
        XXH3_64bits_reset(&state_);
    }
    void update(const void* p, size_t n) {
        if (n > 0) XXH3_64bits_update(&state_, p, n);
    }
    void u64(uint64_t v) {  // 8 bytes little-endian (the host's order: nn/formats/safetensors.cpp checks it)
        update(&v, 8);
    }
    void str(const std::string& s) {  // its length as u64, then its bytes
        u64(s.size());
        update(s.data(), s.size());
    }
    uint64_t digest() const { return XXH3_64bits_digest(&state_); }

private:
    XXH3_state_t state_;
};
}  // namespace

// "xxh3-64:" and 16 lowercase hex digits: how a checksum is written in the metadata.
std::string checksum_str(uint64_t h);

// A string from a file, quoted for a message: JSON-escaped, invalid UTF-8 replaced, cut at 80 bytes.
std::string quoted(const std::string& s);

// One tensor of a validated header.
struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;  // bytes, relative to the start of the data
};

// XXH3-64 of the canonical serialization of a header (nn/formats/safetensors.h, "Checksums"): the
// tensors' names, dtypes and shapes, then every metadata entry but the header checksum's.
uint64_t header_checksum(const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata);

// Closes a file descriptor when it goes out of scope.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace normtape::detail::safetensors
