// nn/safetensors.cpp: the safetensors format (nn/safetensors.h): a writer (atomic: temporary
// file, fsync, rename) and a reader that validates every byte of the header before it allocates
// anything, over nlohmann::json. Not here: module and optimizer checkpoints (nn/checkpoint.cpp).
#include "nn/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/device_ptr.h"

namespace normtape {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; so must the host be");

namespace {

// huggingface/safetensors refuses headers longer than this (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// More dimensions than any tensor has; bounds the work a hostile shape can ask for.
constexpr size_t kMaxRank = 64;
// The most elements a tensor may have: INT64_MAX bytes of the widest dtype (8 bytes).
constexpr uint64_t kMaxElements = static_cast<uint64_t>(INT64_MAX) / 8;
// Root object (0) > tensor entry (1) > "shape" array (2) > its integers (3).
constexpr int kMaxDepth = 3;

const char* st_dtype(DType d) {
    switch (d) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::BF16: return "BF16";
        case DType::I64: return "I64";
    }
    return "?";
}

bool parse_st_dtype(const std::string& s, DType* out) {
    if (s == "F32") *out = DType::F32;
    else if (s == "F64") *out = DType::F64;
    else if (s == "BF16") *out = DType::BF16;
    else if (s == "I64") *out = DType::I64;
    else return false;
    return true;
}

std::string errno_str(int err) { return std::strerror(err); }

// One tensor of a validated header.
struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;  // bytes, relative to the start of the data
};

struct Header {
    std::vector<Entry> entries;  // sorted by name
    std::map<std::string, std::string> metadata;
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
    return h;
}

// Closes a file descriptor when it goes out of scope.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// Reads exactly `n` bytes at `offset`; throws IOError on a read error or a file that got shorter.
void read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
        size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, uint64_t(1) << 30));
        ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) detail::throw_error<IOError>("load_safetensors: read error in ", path, ": ", errno_str(errno));
        if (got == 0) detail::throw_error<IOError>("load_safetensors: ", path, " got shorter while it was read");
        p += got;
        n -= static_cast<uint64_t>(got);
        offset += static_cast<uint64_t>(got);
    }
}

// Writes exactly `n` bytes; throws IOError naming `path` (the file being replaced).
void write_all(int fd, const void* src, size_t n, const std::string& path, const std::string& tmp) {
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
        size_t chunk = std::min<size_t>(n, size_t(1) << 30);
        ssize_t put = ::write(fd, p, chunk);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0)
            detail::throw_error<IOError>("save_safetensors: cannot write ", path, " (writing ", tmp, "): ", errno_str(errno));
        p += put;
        n -= static_cast<size_t>(put);
    }
}

// The temporary file of an atomic save: removed when it goes out of scope unless committed.
struct TempFile {
    std::string path;
    Fd file;
    bool committed = false;
    ~TempFile() {
        if (file.fd >= 0) {
            ::close(file.fd);
            file.fd = -1;
        }
        if (!committed) ::unlink(path.c_str());
    }
};

}  // namespace

namespace detail {

NamedTensors parse_safetensors(const uint8_t* data, size_t size, const std::string& name,
                               std::map<std::string, std::string>* metadata) {
    if (size < 8) format_error(name, "file of ", size, " bytes is too short for a header");
    uint64_t n = header_length(data, size, name);
    Header h = parse_header(reinterpret_cast<const char*>(data + 8), static_cast<size_t>(n), size - 8 - n, name);
    const uint8_t* start = data + 8 + n;
    NamedTensors out;
    for (const Entry& e : h.entries) {
        Tensor t = empty(e.shape, TensorOptions().dtype(e.dtype));
        if (e.end > e.begin) std::memcpy(t.storage()->data(), start + e.begin, e.end - e.begin);
        out.emplace_back(e.name, t);
    }
    if (metadata) *metadata = std::move(h.metadata);
    return out;
}

}  // namespace detail

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::vector<Tensor> data;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
        NT_CHECK(!name.empty() && name != "__metadata__", "save_safetensors: ", path, ": a tensor may not be named \"",
                 name, "\"");
        NT_CHECK(names.insert(name).second, "save_safetensors: ", path, ": duplicate tensor name ", name);
        NT_CHECK(t.defined(), "save_safetensors: ", path, ": tensor ", name, " is undefined");
        Tensor c = t.device().is_cuda() ? t.to(Device::CPU) : t.detach().contiguous();
        uint64_t n = static_cast<uint64_t>(c.nbytes());
        header[name] = {{"dtype", st_dtype(c.dtype())}, {"shape", c.shape()}, {"data_offsets", {offset, offset + n}}};
        offset += n;
        data.push_back(c);
    }
    // Names or metadata that are not valid UTF-8 are written with U+FFFD rather than throwing.
    std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
    uint64_t len = text.size();
    unsigned char len_le[8];
    for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(len >> (8 * i));

    // Note [Atomic checkpoint writes]: readers of `path` see the old file or the new one, never a
    // part of the new one, and a crash (or a full disk) mid-write leaves the old file in place.
    static std::atomic<uint64_t> counter{0};
    TempFile tmp;
    tmp.path = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    tmp.file.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (tmp.file.fd < 0) {
        int err = errno;
        tmp.committed = true;  // nothing was created: nothing to remove (and another's file is not ours)
        detail::throw_error<IOError>("save_safetensors: cannot write ", path, " (creating ", tmp.path, "): ", errno_str(err));
    }
    write_all(tmp.file.fd, len_le, 8, path, tmp.path);
    write_all(tmp.file.fd, text.data(), text.size(), path, tmp.path);
    for (const Tensor& c : data)
        if (c.nbytes() > 0)
            write_all(tmp.file.fd, detail::byte_ptr(c), static_cast<size_t>(c.nbytes()), path, tmp.path);
    if (::fsync(tmp.file.fd) != 0)
        detail::throw_error<IOError>("save_safetensors: cannot write ", path, " (fsync of ", tmp.path, "): ", errno_str(errno));
    int fd = tmp.file.fd;
    tmp.file.fd = -1;
    if (::close(fd) != 0)
        detail::throw_error<IOError>("save_safetensors: cannot write ", path, " (closing ", tmp.path, "): ", errno_str(errno));
    if (::rename(tmp.path.c_str(), path.c_str()) != 0)
        detail::throw_error<IOError>("save_safetensors: cannot write ", path, " (renaming ", tmp.path, " over it): ",
                                     errno_str(errno));
    tmp.committed = true;
    // The rename is durable once the directory's entry is on disk.
    std::string dir = std::filesystem::path(path).parent_path().string();
    Fd d;
    d.fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd < 0 || (::fsync(d.fd) != 0 && errno != EINVAL))
        detail::throw_error<IOError>("save_safetensors: wrote ", path, " but cannot sync its directory: ", errno_str(errno));
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
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
    for (const Entry& e : h.entries) {  // the tensors' bytes sum to the file's data size
        Tensor t = empty(e.shape, TensorOptions().dtype(e.dtype));
        if (e.end > e.begin) read_exact(f.fd, t.storage()->data(), e.end - e.begin, 8 + n + e.begin, path);
        out.emplace_back(e.name, t);
    }
    if (metadata) *metadata = std::move(h.metadata);
    return out;
}

}  // namespace normtape
