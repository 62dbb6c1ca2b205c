// nn/formats/safetensors_write.cpp: the safetensors writer (nn/formats/safetensors.h): atomic (a locked
// temporary file, fsync, rename), with XXH3-64 checksums in the metadata. Not here: the reader
// (nn/formats/safetensors.cpp), module and optimizer checkpoints (nn/formats/checkpoint.cpp).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/device_ptr.h"
#include "nn/formats/safetensors.h"
#include "nn/formats/safetensors_internal.h"

namespace normtape {

namespace {

using namespace detail::safetensors;

// Symbolic links followed from the target of a save before it counts as a loop (Linux's MAXSYMLINKS).
constexpr int kMaxSymlinks = 40;
// Times a save opens "<target>.tmp" again after another writer renamed it away under it.
constexpr int kLockAttempts = 5;

template <class... Args>
[[noreturn]] void save_error(const std::string& path, const Args&... args) {
    detail::throw_error<IOError>("save_safetensors: cannot write ", path, args...);
}

// Writes exactly `n` bytes at the file offset, through `hasher` when given (chunk by chunk);
// throws IOError naming `path` (the file being replaced) and `tmp`.
void write_all(int fd, const void* src, size_t n, const std::string& path, const std::string& tmp,
               Hasher* hasher = nullptr) {
    const char* p = static_cast<const char*>(src);
    while (n > 0) {
        size_t chunk = std::min<size_t>(n, kIoChunk);
        if (hasher) hasher->update(p, chunk);
        size_t done = 0;
        while (done < chunk) {
            ssize_t put = ::write(fd, p + done, chunk - done);
            if (put < 0 && errno == EINTR) continue;
            if (put < 0) save_error(path, " (writing ", tmp, "): ", errno_str(errno));
            done += static_cast<size_t>(put);
        }
        p += chunk;
        n -= chunk;
    }
}

// The file that a save to `path` replaces: `path` itself, or, where `path` is a symbolic link
// (or a chain of them), the file at its end, which need not exist (a dangling link's target is
// created). A relative link is relative to the directory of the link. IOError after kMaxSymlinks
// links (a loop). An lstat that fails for another reason than a missing file ends the walk there:
// opening the temporary file beside it then reports the reason.
std::string resolve_symlinks(const std::string& path) {
    std::string p = path;
    for (int followed = 0;; ++followed) {
        struct stat st;
        if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
        if (followed == kMaxSymlinks)
            save_error(path, ": more than ", kMaxSymlinks, " levels of symbolic links (a loop?), the last at ", p);
        std::string target(std::max<size_t>(static_cast<size_t>(st.st_size), 64), '\0');
        ssize_t n;
        while ((n = ::readlink(p.c_str(), target.data(), target.size())) == static_cast<ssize_t>(target.size()))
            target.resize(target.size() * 2);  // the link may be longer than lstat said (or have changed)
        if (n < 0) save_error(path, " (reading the symbolic link ", p, "): ", errno_str(errno));
        target.resize(static_cast<size_t>(n));
        std::string dir = std::filesystem::path(p).parent_path().string();
        p = target.starts_with('/') || dir.empty() ? target : dir + "/" + target;
    }
}

// The temporary file beside the file `target` that a save replaces (symbolic links followed).
std::string temp_path_of(const std::string& target) { return target + ".tmp"; }

// The temporary file of an atomic save, "<target>.tmp", locked (flock) while it is written.
// Removed when it goes out of scope unless committed (renamed over the target) and only while
// locked: a "<target>.tmp" that another writer holds is never ours to remove.
struct TempFile {
    std::string path;
    int fd = -1;
    bool locked = false, committed = false;
    ~TempFile() {
        if (locked && !committed) ::unlink(path.c_str());
        if (fd >= 0) ::close(fd);  // releases the lock
    }
    void close_fd() {
        if (fd >= 0) ::close(fd);
        fd = -1;
        locked = false;
    }
};

// Opens and locks tmp.path for writing `path`, and empties it. See Note [Atomic checkpoint writes].
void open_locked(TempFile& tmp, const std::string& path) {
    for (int attempt = 1;; ++attempt) {
        // No O_EXCL: a "<target>.tmp" left by a killed writer is taken over. O_NOFOLLOW: never
        // write through a link planted at that name. O_NONBLOCK: never wait on a FIFO there (it
        // changes nothing for a regular file).
        tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
        if (tmp.fd < 0) save_error(path, " (opening ", tmp.path, "): ", errno_str(errno));
        int r;
        while ((r = ::flock(tmp.fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
        }
        if (r != 0) {
            int err = errno;
            tmp.close_fd();
            if (err == EWOULDBLOCK)
                save_error(path, ": another process is writing ", path, " (it holds the lock on ", tmp.path, ")");
            save_error(path, " (locking ", tmp.path, "): ", errno_str(err));
        }
        struct stat held, named;
        if (::fstat(tmp.fd, &held) != 0) {
            int err = errno;
            tmp.close_fd();
            save_error(path, " (stat of ", tmp.path, "): ", errno_str(err));
        }
        if (!S_ISREG(held.st_mode)) {
            tmp.close_fd();
            save_error(path, ": ", tmp.path, " is in the way and is not a regular file");
        }
        // The file locked must still be the one named "<target>.tmp": between our open and our
        // lock, the writer that held it may have renamed it over the target (then truncating it
        // would destroy the target) or removed it.
        if (::lstat(tmp.path.c_str(), &named) == 0 && named.st_dev == held.st_dev && named.st_ino == held.st_ino) {
            tmp.locked = true;
            break;
        }
        tmp.close_fd();
        if (attempt == kLockAttempts)
            save_error(path, ": ", tmp.path, " was replaced ", kLockAttempts,
                       " times while this save opened it (other processes are writing ", path, ")");
    }
    if (::ftruncate(tmp.fd, 0) != 0) save_error(path, " (emptying ", tmp.path, "): ", errno_str(errno));
}

// `s` as a reader gets it back from the header: save_safetensors writes invalid UTF-8 as U+FFFD.
std::string as_written(const std::string& s) {
    using json = nlohmann::json;
    return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

// The 8-byte little-endian length and the JSON text of a header, padded with spaces to a multiple
// of 8 bytes (so that the data is aligned).
std::string header_bytes(const nlohmann::json& header) {
    std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    return out + text;
}

}  // namespace

std::string safetensors_temp_path(const std::string& path) { return temp_path_of(resolve_symlinks(path)); }

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
    // Everything the caller gave is checked, and the strings are taken as the file will hold
    // them, before any file is touched.
    std::map<std::string, std::string> meta;
    for (const auto& [key, value] : metadata) {
        NT_CHECK(!key.starts_with(kChecksumPrefix), "save_safetensors: ", path, ": the metadata key ", quoted(key),
                 " begins with \"", kChecksumPrefix, "\", which is reserved for the file's checksums");
        NT_CHECK(meta.emplace(as_written(key), as_written(value)).second, "save_safetensors: ", path,
                 ": two metadata keys are the same once their invalid UTF-8 is replaced: ", quoted(as_written(key)));
    }
    std::vector<Entry> entries;
    std::vector<Tensor> data;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const auto& [given_name, t] : tensors) {
        NT_CHECK(!given_name.empty() && given_name != "__metadata__", "save_safetensors: ", path,
                 ": a tensor may not be named \"", given_name, "\"");
        std::string name = as_written(given_name);
        NT_CHECK(names.insert(name).second, "save_safetensors: ", path, ": duplicate tensor name ", quoted(name),
                 given_name == name ? "" : " (once its invalid UTF-8 is replaced)");
        NT_CHECK(t.defined(), "save_safetensors: ", path, ": tensor ", given_name, " is undefined");
        Tensor c = t.device().is_cuda() ? t.to(Device::CPU) : t.detach().contiguous();
        uint64_t n = static_cast<uint64_t>(c.nbytes());
        entries.push_back(Entry{name, c.dtype(), c.shape(), offset, offset + n});
        offset += n;
        data.push_back(c);
    }
    // The header, first with placeholders where the checksums go (every checksum_str has the
    // same length, so the final header has the same bytes count): the data is hashed as it is written.
    nlohmann::json header = nlohmann::json::object();
    for (const Entry& e : entries)
        header[e.name] = {{"dtype", st_dtype(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
    for (const Entry& e : entries) meta[std::string(kTensorChecksumPrefix) + e.name] = checksum_str(0);
    meta[std::string(kHeaderChecksumKey)] = checksum_str(0);
    header["__metadata__"] = meta;
    const std::string placeholder = header_bytes(header);

    // Note [Atomic checkpoint writes]: readers of `path` see the old file or the new one, never a
    // part of the new one; a crash (or a full disk) mid-write leaves the old file in place; two
    // writers of one file never mix their bytes. The bytes go to "<target>.tmp", where <target>
    // is `path` or, if `path` is a symbolic link, the file it leads to (so the rename stays on one
    // filesystem and the link stays a link). That name is fixed, so a save after a crash finds
    // and reuses what the crashed one left. A writer holds flock(LOCK_EX) on it from before it
    // empties it until after the rename: a second writer fails at once (IOError), and a writer
    // killed mid-save loses its lock with its life. The file locked must still be the one of
    // that name (see open_locked). Then: write, fsync, rename over the target, fsync the
    // directory. On any failure before the rename, "<target>.tmp" is removed (while still locked).
    const std::string target = resolve_symlinks(path);
    TempFile tmp;
    tmp.path = temp_path_of(target);
    open_locked(tmp, path);
    write_all(tmp.fd, placeholder.data(), placeholder.size(), path, tmp.path);
    for (size_t i = 0; i < data.size(); ++i) {
        Hasher hasher;
        write_all(tmp.fd, detail::byte_ptr(data[i]), static_cast<size_t>(data[i].nbytes()), path, tmp.path, &hasher);
        meta[std::string(kTensorChecksumPrefix) + entries[i].name] = checksum_str(hasher.digest());
    }
    meta[std::string(kHeaderChecksumKey)] = checksum_str(header_checksum(entries, meta));
    header["__metadata__"] = meta;
    const std::string final_header = header_bytes(header);
    NT_CHECK(final_header.size() == placeholder.size(), "save_safetensors: ", path, ": internal error: the header grew from ",
             placeholder.size(), " to ", final_header.size(), " bytes once its checksums were filled in");
    for (size_t done = 0; done < final_header.size();) {
        ssize_t put = ::pwrite(tmp.fd, final_header.data() + done, final_header.size() - done, static_cast<off_t>(done));
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) save_error(path, " (writing the header of ", tmp.path, "): ", errno_str(errno));
        done += static_cast<size_t>(put);
    }
    if (::fsync(tmp.fd) != 0) save_error(path, " (fsync of ", tmp.path, "): ", errno_str(errno));
    if (::rename(tmp.path.c_str(), target.c_str()) != 0)
        save_error(path, " (renaming ", tmp.path, " over ", target == path ? "it" : target, "): ", errno_str(errno));
    tmp.committed = true;
    tmp.close_fd();  // releases the lock; fsync has reported any error of the writes
    // The rename is durable once the directory's entry is on disk.
    std::string dir = std::filesystem::path(target).parent_path().string();
    Fd d;
    d.fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d.fd < 0 || (::fsync(d.fd) != 0 && errno != EINVAL))
        detail::throw_error<IOError>("save_safetensors: wrote ", path, " but cannot sync its directory: ", errno_str(errno));
}

}  // namespace normtape
