// nn/formats/safetensors.cpp: the safetensors reader (nn/formats/safetensors.h), which validates every byte of
// the header before it allocates anything, over nlohmann::json, then verifies the checksums a file
// carries; and what the reader and the writer share (nn/formats/safetensors_internal.h). Not here: the
// writer (nn/formats/safetensors_write.cpp), module and optimizer checkpoints (nn/formats/checkpoint.cpp).
#include "nn/formats/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/device_ptr.h"
#include "nn/formats/safetensors_internal.h"

namespace normtape {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace detail::safetensors {

const char* st_dtype(DType d) {
    switch (d) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::BF16: return "BF16";
        case DType::I64: return "I64";
    }
    return "?";
}

// "xxh3-64:" and 16 lowercase hex digits: how a checksum is written in the metadata.
std::string checksum_str(uint64_t h) {
    static const char digits[] = "0123456789abcdef";
    std::string s(kHashTag);
    for (int shift = 60; shift >= 0; shift -= 4) s += digits[(h >> shift) & 0xf];
    return s;
}

// A string from a file, quoted for a message: JSON-escaped, invalid UTF-8 replaced, cut at 80 bytes.
std::string quoted(const std::string& s) {
    std::string q = nlohmann::json(s.substr(0, 80)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return s.size() > 80 ? q + "..." : q;
}

// XXH3-64 of the canonical serialization of a header (nn/formats/safetensors.h, "Checksums"): the
// tensors' names, dtypes and shapes, then every metadata entry but the header checksum's.
uint64_t header_checksum(const std::vector<Entry>& entries, const std::map<std::string, std::string>& metadata) {
    std::vector<const Entry*> by_name;
    for (const Entry& e : entries) by_name.push_back(&e);
    // std::string orders by unsigned bytes (char_traits<char>::lt), as std::map does the keys.
    std::sort(by_name.begin(), by_name.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
    Hasher h;
    h.u64(by_name.size());
    for (const Entry* e : by_name) {
        h.str(e->name);
        h.str(st_dtype(e->dtype));
        h.u64(e->shape.size());
        for (int64_t d : e->shape) h.u64(static_cast<uint64_t>(d));
    }
    h.u64(metadata.size() - metadata.count(std::string(kHeaderChecksumKey)));
    for (const auto& [key, value] : metadata) {
        if (key == kHeaderChecksumKey) continue;
        h.str(key);
        h.str(value);
    }
    return h.digest();
}

}  // namespace detail::safetensors

namespace {

using namespace detail::safetensors;

// huggingface/safetensors refuses headers longer than this (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// More dimensions than any tensor has; bounds the work a hostile shape can ask for.
constexpr size_t kMaxRank = 64;
// The most elements a tensor may have: INT64_MAX bytes of the widest dtype (8 bytes).
constexpr uint64_t kMaxElements = static_cast<uint64_t>(INT64_MAX) / 8;
// Root object (0) > tensor entry (1) > "shape" array (2) > its integers (3).
constexpr int kMaxDepth = 3;

bool parse_st_dtype(const std::string& s, DType* out) {
    if (s == "F32") *out = DType::F32;
    else if (s == "F64") *out = DType::F64;
    else if (s == "BF16") *out = DType::BF16;
    else if (s == "I64") *out = DType::I64;
    else return false;
    return true;
}

// The value of checksum_str(h) back into *h; false when `s` is not of that form exactly.
bool parse_checksum(const std::string& s, uint64_t* h) {
    if (s.size() != kHashTag.size() + 16 || !s.starts_with(kHashTag)) return false;
    uint64_t v = 0;
    for (size_t i = kHashTag.size(); i < s.size(); ++i) {
        char c = s[i];
        if (c >= '0' && c <= '9') v = v << 4 | static_cast<uint64_t>(c - '0');
        else if (c >= 'a' && c <= 'f') v = v << 4 | static_cast<uint64_t>(c - 'a' + 10);
        else return false;
    }
    *h = v;
    return true;
}

struct Header {
    std::vector<Entry> entries;  // sorted by name
    std::map<std::string, std::string> metadata;  // without the checksum entries
    // Whether the file carries checksums; then, for each entry, the checksum of its data, and
    // the header's checksum as the file states it and as computed.
    bool checksummed = false;
    std::vector<uint64_t> data_checksums;
    uint64_t header_checksum_stated = 0, header_checksum_computed = 0;
};

template <class... Args>
[[noreturn]] void format_error(const std::string& file, const Args&... args) {
    detail::throw_error<FormatError>("load_safetensors: ", file, ": ", args...);
}

// The header length n from the first 8 bytes of a file of `file_size` bytes (>= 8), checked.
uint64_t header_length(const uint8_t* first8, uint64_t file_size, const std::string& file) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(first8[i]) << (8 * i);
    if (n > kMaxHeaderBytes)
        format_error(file, "header length ", n, " is larger than the format allows (", kMaxHeaderBytes, " bytes)");
    if (n > file_size - 8) format_error(file, "header length ", n, " exceeds the file size ", file_size);
    if (n < 2) format_error(file, "header length ", n, " is too short for a JSON object");
    return n;
}

const char* json_type(const nlohmann::json& j) { return j.type_name(); }

// "tensor x: shape" etc. The checks of one tensor entry.
Entry parse_entry(const std::string& file, const std::string& name, const nlohmann::json& entry, uint64_t data_size) {
    if (name.empty()) format_error(file, "a tensor has an empty name");
    if (!entry.is_object())
        format_error(file, "tensor ", name, ": expected an object {dtype, shape, data_offsets}, found a ", json_type(entry));
    for (const auto& [key, value] : entry.items())
        if (key != "dtype" && key != "shape" && key != "data_offsets")
            format_error(file, "tensor ", name, ": unexpected key \"", key, "\" (expected dtype, shape, data_offsets)");
    for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!entry.contains(key)) format_error(file, "tensor ", name, ": missing \"", key, "\"");

    Entry e;
    e.name = name;
    const nlohmann::json& dtype = entry["dtype"];
    if (!dtype.is_string()) format_error(file, "tensor ", name, ": dtype must be a string, found a ", json_type(dtype));
    if (!parse_st_dtype(dtype.get<std::string>(), &e.dtype))
        format_error(file, "tensor ", name, ": unsupported dtype ", dtype.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                     " (expected F32, F64, BF16 or I64)");

    const nlohmann::json& shape = entry["shape"];
    if (!shape.is_array()) format_error(file, "tensor ", name, ": shape must be an array, found a ", json_type(shape));
    if (shape.size() > kMaxRank)
        format_error(file, "tensor ", name, ": shape has ", shape.size(), " dimensions, more than ", kMaxRank);
    // The product of the dimensions, zeros counted as 1, must stay within what a tensor can hold
    // (INT64_MAX bytes of 8-byte elements): it bounds every stride and partial product, also of an
    // empty tensor such as [0, 2^62, 2^62].
    uint64_t span = 1;
    bool has_zero = false;
    for (const nlohmann::json& d : shape) {
        if (!d.is_number_unsigned())
            format_error(file, "tensor ", name, ": shape ", shape.dump(), " has an entry that is not an integer >= 0");
        uint64_t v = d.get<uint64_t>();
        if (v > static_cast<uint64_t>(INT64_MAX))
            format_error(file, "tensor ", name, ": shape ", shape.dump(), " has a dimension too large");
        e.shape.push_back(static_cast<int64_t>(v));
        has_zero = has_zero || v == 0;
        if (__builtin_mul_overflow(span, std::max<uint64_t>(v, 1), &span) || span > kMaxElements)
            format_error(file, "tensor ", name, ": shape ", shape.dump(), " has more elements than memory can hold");
    }
    const uint64_t numel = has_zero ? 0 : span;
    const uint64_t nbytes = numel * element_size(e.dtype);  // <= INT64_MAX: span <= INT64_MAX / 8

    const nlohmann::json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
        format_error(file, "tensor ", name, ": data_offsets must be [begin, end], two integers >= 0, found ",
                     offsets.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_size || e.end - e.begin != nbytes)
        format_error(file, "tensor ", name, ": data_offsets [", e.begin, ", ", e.end, "] do not fit its shape ",
                     shape_str(e.shape), " ", dtype_name(e.dtype), " (", nbytes, " bytes) within ", data_size,
                     " data bytes");
    return e;
}

// Takes the checksum entries out of h.metadata, after the header's structure has been validated.
// A file without any is left unverified; a file with some must have them all, well formed.
void parse_checksums(Header& h, const std::string& file) {
    auto has_prefix = [](const std::string& key) { return key.starts_with(kChecksumPrefix); };
    if (std::none_of(h.metadata.begin(), h.metadata.end(), [&](const auto& kv) { return has_prefix(kv.first); })) return;
    h.checksummed = true;
    const std::string corrupt = ": the file is corrupt or was modified";
    std::map<std::string, uint64_t> by_tensor;
    bool header_found = false;
    for (const auto& [key, value] : h.metadata) {
        if (!has_prefix(key)) continue;
        if (key != kHeaderChecksumKey && !key.starts_with(kTensorChecksumPrefix))
            format_error(file, "unknown checksum entry ", quoted(key), " (expected ", kHeaderChecksumKey, " or ",
                         kTensorChecksumPrefix, "<tensor name>)", corrupt);
        uint64_t sum = 0;
        if (!parse_checksum(value, &sum))
            format_error(file, "checksum entry ", quoted(key), " must be \"xxh3-64:\" and 16 lowercase hex digits, found ",
                         quoted(value), corrupt);
        if (key == kHeaderChecksumKey) {
            h.header_checksum_stated = sum;
            header_found = true;
        } else {
            std::string name = key.substr(kTensorChecksumPrefix.size());
            bool held = std::ranges::binary_search(h.entries, name, {}, &Entry::name);  // sorted by name
            if (!held)
                format_error(file, "checksum entry ", quoted(key), " is for tensor ", quoted(name),
                             ", which the file does not hold", corrupt);
            by_tensor[name] = sum;
        }
    }
    for (const Entry& e : h.entries) {
        auto it = by_tensor.find(e.name);
        if (it == by_tensor.end())
            format_error(file, "tensor ", e.name, " has no checksum entry \"", kTensorChecksumPrefix, e.name,
                         "\" although the file carries checksums", corrupt);
        h.data_checksums.push_back(it->second);
    }
    if (!header_found)
        format_error(file, "carries checksums but no \"", kHeaderChecksumKey, "\" entry", corrupt);
    h.header_checksum_computed = header_checksum(h.entries, h.metadata);
    std::erase_if(h.metadata, [&](const auto& kv) { return has_prefix(kv.first); });
}

// FormatError unless the data of h.entries[i], which hashed to `computed`, matches its checksum.
void check_data_checksum(const Header& h, size_t i, uint64_t computed, const std::string& file) {
    if (computed != h.data_checksums[i])
        format_error(file, "tensor ", h.entries[i].name, ": data checksum mismatch: \"", kTensorChecksumPrefix,
                     h.entries[i].name, "\" expects ", checksum_str(h.data_checksums[i]), ", its ",
                     h.entries[i].end - h.entries[i].begin, " data bytes hash to ", checksum_str(computed),
                     ": the file is corrupt or was modified");
}
// FormatError unless a checksummed header hashed to the checksum it states. Checked after the
// data, so that a file whose data or a tensor's checksum entry changed names that tensor.
void check_header_checksum(const Header& h, const std::string& file) {
    if (h.checksummed && h.header_checksum_computed != h.header_checksum_stated)
        format_error(file, "header checksum mismatch: \"", kHeaderChecksumKey, "\" expects ",
                     checksum_str(h.header_checksum_stated), ", the header (tensor names, dtypes, shapes and metadata) ",
                     "hashes to ", checksum_str(h.header_checksum_computed), ": the file is corrupt or was modified");
}

// Parses and checks the n bytes of JSON at `text`, for a data section of `data_size` bytes.
Header parse_header(const char* text, size_t n, uint64_t data_size, const std::string& file) {
    using json = nlohmann::json;
    // The keys of each object being parsed, to refuse a key given twice (json would keep the last).
    std::vector<std::set<std::string>> open_objects;
    json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth > kMaxDepth)
            format_error(file, "header nests deeper than a safetensors header can (depth ", depth, " > ", kMaxDepth, ")");
        if (event == json::parse_event_t::object_start) {
            open_objects.emplace_back();
        } else if (event == json::parse_event_t::object_end) {
            if (!open_objects.empty()) open_objects.pop_back();
        } else if (event == json::parse_event_t::key) {
            const std::string& key = parsed.get_ref<const std::string&>();
            if (!open_objects.empty() && !open_objects.back().insert(key).second)
                format_error(file, "header has the key \"", key, "\" twice in one object",
                             depth == 1 ? " (two tensors of one name)" : "");
        }
        return true;
    };
    json header;
    try {
        header = json::parse(text, text + n, check);
    } catch (const json::exception& e) {
        format_error(file, "header is not valid JSON: ", e.what());
    }
    if (!header.is_object()) format_error(file, "header is not a JSON object but a ", json_type(header));

    Header h;
    for (const auto& [key, value] : header.items()) {
        if (key == "__metadata__") {
            if (!value.is_object()) format_error(file, "__metadata__ must be an object of strings, found a ", json_type(value));
            for (const auto& [k, v] : value.items()) {
                if (!v.is_string())
                    format_error(file, "__metadata__ entry \"", k, "\" must be a string, found a ", json_type(v));
                h.metadata[k] = v.get<std::string>();
            }
            continue;
        }
        h.entries.push_back(parse_entry(file, key, value, data_size));
    }

    // The tensors must tile the data: sorted by offsets, each begins where the previous ended.
    std::vector<const Entry*> by_offset;
    for (const Entry& e : h.entries) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
        return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t covered = 0;
    const Entry* previous = nullptr;
    for (const Entry* e : by_offset) {
        if (e->begin < covered)
            format_error(file, "tensor ", e->name, " [", e->begin, ", ", e->end, "] overlaps tensor ", previous->name, " [",
                         previous->begin, ", ", previous->end, "]");
        if (e->begin > covered)
            format_error(file, "data bytes [", covered, ", ", e->begin, ") belong to no tensor (the format allows no gaps)");
        covered = e->end;
        previous = e;
    }
    if (covered != data_size)
        format_error(file, "the tensors end at data byte ", covered, " but the file holds ", data_size,
                     " data bytes (the format allows no trailing bytes)");
    parse_checksums(h, file);
    return h;
}

// Reads exactly `n` bytes at `offset`, into `dst` and through `hasher` when given (chunk by
// chunk, while the bytes are in the cache); throws IOError on a read error or a file that got shorter.
void read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path, Hasher* hasher = nullptr) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, kIoChunk));
        ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) detail::throw_error<IOError>("load_safetensors: read error in ", path, ": ", errno_str(errno));
        if (got == 0) detail::throw_error<IOError>("load_safetensors: ", path, " got shorter while it was read");
        if (hasher) hasher->update(p, static_cast<size_t>(got));
        p += got;
        n -= static_cast<uint64_t>(got);
        offset += static_cast<uint64_t>(got);
    }
}

}  // namespace

namespace detail {

NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name,
                               std::map<std::string, std::string>* metadata, bool* checksummed) {
    if (size < 8) format_error(name, "file of ", size, " bytes is too short for a header");
    uint64_t n = header_length(data, size, name);
    Header h = parse_header(reinterpret_cast<const char*>(data + 8), static_cast<size_t>(n), size - 8 - n, name);
    const uint8_t* start = data + 8 + n;
    NamedTensors out;
    for (size_t i = 0; i < h.entries.size(); ++i) {
        const Entry& e = h.entries[i];
        Tensor t = empty(e.shape, TensorOptions().dtype(e.dtype));
        if (e.end > e.begin) std::memcpy(detail::byte_ptr(t), start + e.begin, e.end - e.begin);
        if (h.checksummed) check_data_checksum(h, i, XXH3_64bits(start + e.begin, e.end - e.begin), name);
        out.emplace_back(e.name, t);
    }
    check_header_checksum(h, name);
    if (metadata) *metadata = std::move(h.metadata);
    if (checksummed) *checksummed = h.checksummed;
    return out;
}

}  // namespace detail

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata, bool* checksummed) {
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) detail::throw_error<IOError>("load_safetensors: cannot open ", path, ": ", errno_str(errno));
    struct stat st;
    if (::fstat(f.fd, &st) != 0) detail::throw_error<IOError>("load_safetensors: cannot stat ", path, ": ", errno_str(errno));
    if (!S_ISREG(st.st_mode)) detail::throw_error<IOError>("load_safetensors: ", path, " is not a regular file");
    uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < 8) format_error(path, "file of ", file_size, " bytes is too short for a header");
    uint8_t first8[8];
    read_exact(f.fd, first8, 8, 0, path);
    uint64_t n = header_length(first8, file_size, path);
    std::string text(static_cast<size_t>(n), '\0');  // n <= kMaxHeaderBytes and <= the file size
    read_exact(f.fd, text.data(), n, 8, path);
    Header h = parse_header(text.data(), text.size(), file_size - 8 - n, path);
    NamedTensors out;
    for (size_t i = 0; i < h.entries.size(); ++i) {  // the tensors' bytes sum to the file's data size
        const Entry& e = h.entries[i];
        Tensor t = empty(e.shape, TensorOptions().dtype(e.dtype));
        Hasher hasher;
        if (e.end > e.begin)
            read_exact(f.fd, detail::byte_ptr(t), e.end - e.begin, 8 + n + e.begin, path, h.checksummed ? &hasher : nullptr);
        if (h.checksummed) check_data_checksum(h, i, hasher.digest(), path);
        out.emplace_back(e.name, t);
    }
    check_header_checksum(h, path);
    if (metadata) *metadata = std::move(h.metadata);
    if (checksummed) *checksummed = h.checksummed;
    return out;
}

}  // namespace normtape
