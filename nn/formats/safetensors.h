// nn/formats/safetensors.h: tensors to and from files in the safetensors format: an atomic writer that
// checksums what it writes, and a reader that validates the whole header before it allocates and
// verifies the checksums a file carries. Needs only core/. Not here: module and optimizer
// checkpoints, which are written in this format (nn/formats/checkpoint.h).
//
// The format (huggingface/safetensors): 8 bytes little-endian header length n, n bytes of UTF-8
// JSON, then the data:
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// Offsets are bytes relative to the start of the data; the data is the raw little-endian
// elements, row-major. dtypes: F32, F64, BF16, I64 (normtape's; others are refused). PyTorch reads
// these files (tests/torch_reference.py parses the header with Python's json and struct), and so
// does the safetensors package: the checksums are ordinary "__metadata__" strings.
//
// Checksums. save_safetensors adds these "__metadata__" entries to every file it writes, each
// value "xxh3-64:" and 16 lowercase hex digits of an XXH3-64 hash (xxHash, seed 0; Python:
// xxhash.xxh3_64_hexdigest):
//   "normtape.checksum.tensor.<name>"  one per tensor: the hash of its data, exactly the bytes
//                                      [begin, end) of its data_offsets;
//   "normtape.checksum.header"         the hash of the header's canonical serialization S, the
//                                      concatenation of
//       u64(T), T the number of tensors; for each tensor, in ascending byte order of names:
//         str(name), str(dtype) ("F32", ...), u64(rank), u64(d) for each dimension d;
//       u64(M), M the number of metadata entries other than "normtape.checksum.header"; for
//         each of them, in ascending byte order of keys (the tensor checksum entries included):
//         str(key), str(value);
//     where u64(x) is x as 8 bytes little-endian and str(s) is u64(byte length of s) followed by
//     the bytes of s (UTF-8, as the JSON decodes). data_offsets are not in S (the tensor hashes
//     cover what the offsets select), nor is the JSON's layout (spacing, key order, escapes).
// A file with no metadata key beginning "normtape.checksum." is read unverified (a file of
// another writer, or from before checksums). A file with any must hold all of them, well formed:
// the header entry, one entry per tensor and none for a tensor it does not hold, and no other key
// of that prefix; the data of each tensor and the header must hash to what they state. These
// guard against corruption (a bad disk, a truncated copy, a stray edit), not against someone who
// means to forge a file: XXH3 is not a cryptographic hash, and a file stripped of its checksum
// entries is read unverified.
//
// Errors: every function here throws IOError when a file cannot be opened, read, written or
// renamed, and FormatError when a file's contents are not a valid safetensors file or do not
// match their checksums. The message always names the file, and the tensor or entry and what was
// expected and found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace normtape {

// Writes `tensors` (any device and dtype; copied to the host, contiguous; data in the order given)
// and string `metadata`, with the checksums above, to `path`, atomically (Note [Atomic checkpoint
// writes] in nn/formats/safetensors.cpp): the bytes go to "<target>.tmp" beside the file, which is locked
// (flock) while it is written, flushed to disk (fsync) and renamed over the file; the directory
// is then synced. <target> is `path` or, when `path` is a symbolic link (or a chain of them, up
// to 40; a relative link is relative to its own directory), the file it leads to: that file is
// replaced (created, if the link dangles) and the link is left as it was. A "<target>.tmp" left
// by a writer that died is reused and, once renamed, gone; one that a live writer holds locked
// makes this save throw IOError ("another process is writing <path>"), touching nothing. On a
// failure before the rename, "<target>.tmp" is removed, `path` is left as it was, and IOError
// names the file and the reason; if only the final sync of the directory fails, `path` already
// holds the new file (IOError says so). Invalid UTF-8 in a name or in the metadata is written as
// U+FFFD. Throws IOError on a loop of symbolic links; Error (nothing is written) on an undefined
// tensor, two tensors of one name, an empty name or the name "__metadata__", and on a metadata
// key that begins with "normtape.checksum." (reserved for the checksums).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// The temporary file that save_safetensors(path, ...) writes before renaming it over the file:
// "<target>.tmp", <target> being `path` with its symbolic links followed as above. For a program
// that checks, before long work, that the save will be able to create or replace it (a directory,
// a FIFO or a symbolic link at that name makes the save throw). Throws IOError on a loop of
// symbolic links or an unreadable link.
std::string safetensors_temp_path(const std::string& path);

// Reads every tensor of `path` onto the cpu, sorted by name. `metadata`, when given, receives the
// "__metadata__" entries without the checksum entries, i.e. exactly what the writer was given
// (only on success). `checksummed`, when given, is set (only on success) to whether the file
// carried checksums, all of which then matched; false: the file was read unverified. The whole
// header is validated before any tensor is allocated, so a hostile header cannot make it allocate
// more than the file holds:
//  - size >= 8; header length n with 2 <= n <= 100,000,000 (the reference implementation's bound)
//    and 8 + n <= file size;
//  - the header is valid UTF-8 JSON, an object, no object holds a key twice, nesting depth <= 3;
//  - "__metadata__", if present, is an object of strings;
//  - every other key is a non-empty tensor name whose value is an object with exactly "dtype"
//    (F32, F64, BF16 or I64), "shape" (at most 64 integers >= 0 whose product, zeros counted as
//    1, is below 2^60, so that no size, stride or byte count overflows) and "data_offsets"
//    ([begin, end] integers, begin <= end <= data size, end - begin == elements * element size);
//  - the tensors tile the data exactly, as the format requires: no overlap, no gap, no trailing
//    bytes;
//  - the checksum entries, if any, are complete and well formed (see Checksums above).
// Then each tensor's data is hashed as it is read and compared with its checksum, and last the
// header's checksum is compared.
// Throws IOError when the file is missing, not a regular file or cannot be read; FormatError for
// anything above, naming the file, the tensor or checksum entry and what was expected and found
// (a checksum that does not match: "... the file is corrupt or was modified"); OutOfMemoryError
// when the tensors do not fit in host memory.
NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
                              bool* checksummed = nullptr);

namespace detail {
// The parser under load_safetensors, over a whole file held in memory (`size` bytes at `data`),
// with the same checks and errors; `name` stands for the file in messages. For the fuzz target
// (fuzz/fuzz_safetensors.cpp) and tests.
NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name,
                               std::map<std::string, std::string>* metadata = nullptr, bool* checksummed = nullptr);
}  // namespace detail

}  // namespace normtape
