// nn/safetensors.h: tensors to and from files in the safetensors format: an atomic writer and a
// reader that validates the whole header before it allocates. Needs only core/. Not here: module
// and optimizer checkpoints, which are written in this format (nn/checkpoint.h).
//
// The format (huggingface/safetensors): 8 bytes little-endian header length n, n bytes of UTF-8
// JSON, then the data:
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// Offsets are bytes relative to the start of the data; the data is the raw little-endian
// elements, row-major. dtypes: F32, F64, BF16, I64 (normtape's; others are refused). PyTorch reads
// these files (tests/torch_reference.py parses the header with Python's json and struct).
//
// Errors: every function here throws IOError when a file cannot be opened, read, written or
// renamed, and FormatError when a file's contents are not a valid safetensors file. The message
// always names the file, and the tensor and what was expected and found.
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
// and string `metadata` to `path`, atomically: the bytes go to a temporary
// file beside it ("<path>.tmp.<pid>.<n>"), which is flushed to disk (fsync) and renamed over
// `path`; the directory is then synced. On a failure before the rename the temporary file is
// removed, `path` is left as it was, and IOError names the file and the reason; if only the final
// sync of the directory fails, `path` already holds the new file (IOError says so). Throws Error
// on an undefined tensor, two tensors of one name, an empty name or the name "__metadata__"
// (nothing is written then).
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` onto the cpu, sorted by name. `metadata`, when given, receives the
// "__metadata__" entries (only on success). The whole file is validated before any tensor is
// allocated, so a hostile header cannot make it allocate more than the file holds:
//  - size >= 8; header length n with 2 <= n <= 100,000,000 (the reference implementation's bound)
//    and 8 + n <= file size;
//  - the header is valid UTF-8 JSON, an object, no object holds a key twice, nesting depth <= 3;
//  - "__metadata__", if present, is an object of strings;
//  - every other key is a non-empty tensor name whose value is an object with exactly "dtype"
//    (F32, F64, BF16 or I64), "shape" (at most 64 integers >= 0 whose product, zeros counted as
//    1, is below 2^60, so that no size, stride or byte count overflows) and "data_offsets"
//    ([begin, end] integers, begin <= end <= data size, end - begin == elements * element size);
//  - the tensors tile the data exactly, as the format requires: no overlap, no gap, no trailing
//    bytes.
// Throws IOError when the file is missing, not a regular file or cannot be read; FormatError for
// anything above, naming the file, the tensor and what was expected and found; OutOfMemoryError
// when the tensors do not fit in host memory.
NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr);

namespace detail {
// The parser under load_safetensors, over a whole file held in memory (`size` bytes at `data`),
// with the same checks and errors; `name` stands for the file in messages. For the fuzz target
// (fuzz/fuzz_safetensors.cpp) and tests.
NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name,
                               std::map<std::string, std::string>* metadata = nullptr);
}  // namespace detail

}  // namespace normtape
