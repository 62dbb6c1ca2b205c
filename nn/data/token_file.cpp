// nn/data/token_file.cpp: llm.c's and nanoGPT's token files (nn/data/token_file.h).
#include "nn/data/token_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace normtape {

namespace {

constexpr int64_t kHeaderInts = 256, kHeaderBytes = kHeaderInts * 4;

// llm.c's two kinds of file: magic number, version, bytes an id.
struct LlmCKind {
    int32_t magic, version;
    int width;
};
constexpr LlmCKind kLlmCKinds[] = {{20240520, 1, 2}, {20240801, 7, 4}};

// The little-endian unsigned integer of `width` bytes at p.
uint32_t load_le(const unsigned char* p, int width) {
    uint32_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void store_le(unsigned char* p, uint32_t v, int width) {
    for (int i = 0; i < width; ++i, v >>= 8) p[i] = static_cast<unsigned char>(v & 0xff);
}

// The whole file `path`; IOError naming it and the system's reason.
std::string read_bytes(const std::string& path) {
    auto fail = [&](const char* what) {
        return IOError("token file " + path + ": " + what + ": " + std::strerror(errno));
    };
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw fail("cannot open it");
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st;
    if (::fstat(fd, &st) != 0) throw fail("cannot stat it");
    if (S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        throw fail("cannot read it");
    }
    std::string bytes;
    char chunk[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw fail("cannot read it");
        if (n == 0) break;
        bytes.append(chunk, static_cast<size_t>(n));
    }
    return bytes;
}

}  // namespace

const char* token_file_format_name(TokenFileFormat format) {
    switch (format) {
        case TokenFileFormat::Auto: return "auto";
        case TokenFileFormat::LlmC: return "llm.c";
        case TokenFileFormat::Raw: return "raw";
    }
    return "?";
}

std::vector<uint32_t> read_token_file(const std::string& path, TokenFileFormat format, TokenFileFormat* detected) {
    return parse_token_file(read_bytes(path), path, format, detected);
}

std::vector<uint32_t> parse_token_file(std::string_view bytes, const std::string& name, TokenFileFormat format,
                                       TokenFileFormat* detected) {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
    const auto size = static_cast<int64_t>(bytes.size());
    const LlmCKind* kind = nullptr;
    if (size >= 4)
        for (const LlmCKind& k : kLlmCKinds)
            if (static_cast<int32_t>(load_le(p, 4)) == k.magic) kind = &k;
    if (format == TokenFileFormat::Auto) format = kind ? TokenFileFormat::LlmC : TokenFileFormat::Raw;
    if (detected) *detected = format;
    const std::string what = "token file " + name + ": ";
    int64_t offset = 0, count = 0;
    int width = 2;
    if (format == TokenFileFormat::LlmC) {
        NT_CHECK_AS(FormatError, size >= kHeaderBytes, what, "expected llm.c's header of ", kHeaderBytes,
                    " bytes, got a file of ", size, " bytes");
        const auto magic = static_cast<int32_t>(load_le(p, 4)), version = static_cast<int32_t>(load_le(p + 4, 4));
        NT_CHECK_AS(FormatError, kind != nullptr, what, "expected llm.c's magic number 20240520 (uint16 ids) or ",
                    "20240801 (uint32 ids), got ", magic);
        NT_CHECK_AS(FormatError, version == kind->version, what, "expected version ", kind->version,
                    " after magic number ", magic, ", got ", version);
        count = static_cast<int32_t>(load_le(p + 8, 4));
        width = kind->width;
        offset = kHeaderBytes;
        const int64_t held = (size - offset) / width;
        NT_CHECK_AS(FormatError, count >= 1 && count == held && (size - offset) % width == 0, what,
                    "the header says ", count, " ids of ", width, " bytes, expected it to equal the ", size - offset,
                    " bytes after the header (", held, " ids", (size - offset) % width ? " and a part of one" : "",
                    "): a wrong count or a truncated file");
    } else {
        NT_CHECK_AS(FormatError, size > 0 && size % 2 == 0, what, "expected raw uint16 ids (an even number of bytes, ",
                    "at least 2), got ", size, " bytes");
        count = size / 2;
    }
    std::vector<uint32_t> ids(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) ids[i] = load_le(p + offset + i * width, width);
    return ids;
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& ids) {
    NT_CHECK(!ids.empty() && ids.size() < (size_t{1} << 31), "write_token_file: expected 1 to 2^31 - 1 ids, got ",
             ids.size());
    uint32_t largest = 0;
    for (uint32_t id : ids) largest = std::max(largest, id);
    const LlmCKind& kind = kLlmCKinds[largest < 65536 ? 0 : 1];
    std::string bytes(static_cast<size_t>(kHeaderBytes) + ids.size() * kind.width, '\0');
    auto* p = reinterpret_cast<unsigned char*>(bytes.data());
    store_le(p, static_cast<uint32_t>(kind.magic), 4);
    store_le(p + 4, static_cast<uint32_t>(kind.version), 4);
    store_le(p + 8, static_cast<uint32_t>(ids.size()), 4);
    for (size_t i = 0; i < ids.size(); ++i) store_le(p + kHeaderBytes + i * kind.width, ids[i], kind.width);
    // Written beside the target and renamed over it: a failed write leaves the old file as it was.
    // The temporary is the writer's own (mkstemp creates a new file, O_EXCL): processes, data-parallel
    // ranks on several hosts of one file system among them, may write one path at once.
    std::string tmp = path + ".tmp.XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) throw IOError("write_token_file: cannot create " + tmp + ": " + std::strerror(errno));
    (void)::fchmod(fd, 0644);  // mkstemp's 0600 would keep the file from the run's other users
    std::FILE* f = ::fdopen(fd, "wb");
    if (!f) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        std::remove(tmp.c_str());
        throw IOError("write_token_file: cannot write " + tmp + ": " + why);
    }
    const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    const int saved_errno = errno;
    if (std::fclose(f) != 0 || !written) {
        const std::string why = std::strerror(written ? errno : saved_errno);
        std::remove(tmp.c_str());
        throw IOError("write_token_file: cannot write " + tmp + ": " + why);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        std::remove(tmp.c_str());
        throw IOError("write_token_file: cannot rename " + tmp + " to " + path + ": " + why);
    }
}

}  // namespace normtape
