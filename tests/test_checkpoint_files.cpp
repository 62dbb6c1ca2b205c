// tests/test_checkpoint_files.cpp: how save_safetensors (and so save_checkpoint) replaces a file
// (nn/formats/safetensors.h; Note [Atomic checkpoint writes] in nn/formats/safetensors.cpp):
// - the temporary file is "<target>.tmp"; a stale one (a killed writer's) is reused and gone after
//   the save;
// - while another writer holds the lock on it (another open file, or another process), a save
//   throws IOError and touches neither the target nor that file;
// - a symbolic link (absolute, relative, a chain; dangling) is written through and stays a link;
//   a loop of links is IOError;
// - load_checkpoint reports whether the file carried checksums.
// What a failed write leaves (a full disk, a directory in the way): tests/test_checkpoint.cpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;
namespace fs = std::filesystem;

namespace {

// The values of a one-tensor file's tensor "w".
std::vector<float> w_of(const std::string& path) {
    NamedTensors t = load_safetensors(path);
    REQUIRE(t.size() == 1);
    REQUIRE(t[0].first == "w");
    return t[0].second.to_vector<float>();
}
void save_w(const std::string& path, std::vector<float> values) {
    size_t n = values.size();
    save_safetensors(path, {{"w", from_vector<float>(std::move(values), {static_cast<int64_t>(n)})}});
}

// Holds flock(LOCK_EX) on `path` through its own open file description: another writer, as far
// as the lock is concerned, even within this process.
struct HeldLock {
    int fd;
    explicit HeldLock(const std::string& path) : fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666)) {
        REQUIRE(fd >= 0);
        REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
    }
    ~HeldLock() { ::close(fd); }
};

}  // namespace

TEST_SUITE("checkpoint") {

TEST_CASE("checkpoint files: a stale <target>.tmp is reused and gone after the save") {
    TempDir dir("stale_tmp");
    std::string path = dir / "ck.safetensors";
    save_w(path, {1, 2});
    write_bytes(path + ".tmp", std::string(1 << 20, '\x5a'));  // what a killed writer left: 1 MB of junk
    save_w(path, {3, 4, 5});
    CHECK(w_of(path) == std::vector<float>{3, 4, 5});
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors"});
    // And where no target exists yet.
    write_bytes(dir / "new.safetensors.tmp", std::string(1 << 20, '\x00'));
    save_w(dir / "new.safetensors", {6});
    CHECK(w_of(dir / "new.safetensors") == std::vector<float>{6});
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors", "new.safetensors"});
}

TEST_CASE("checkpoint files: safetensors_temp_path names the temporary file a save writes, through symbolic links") {
    TempDir dir("temp_path");
    const std::string ck = dir / "ck.safetensors";
    CHECK(safetensors_temp_path(ck) == ck + ".tmp");
    fs::create_directory(dir / "real");
    fs::create_symlink("real/ck.safetensors", dir / "link.safetensors");
    const std::string tmp = safetensors_temp_path(dir / "link.safetensors");
    CHECK(tmp == (dir / "real/ck.safetensors") + ".tmp");
    // The save writes there: a directory in its way makes it fail, naming it.
    fs::create_directory(tmp);
    CHECK_THROWS_KIND_WITH(save_w(dir / "link.safetensors", {1}), IOError, tmp);
    fs::remove(tmp);
    save_w(dir / "link.safetensors", {1});
    CHECK(w_of(dir / "real/ck.safetensors") == std::vector<float>{1});
    fs::create_symlink("loop", dir / "loop");
    CHECK_THROWS_KIND_WITH(safetensors_temp_path(dir / "loop"), IOError, "levels of symbolic links");
}

TEST_CASE("checkpoint files: a second writer of one file gets IOError and touches nothing") {
    TempDir dir("locked");
    std::string path = dir / "ck.safetensors", tmp = path + ".tmp";
    save_w(path, {1, 2});
    const std::string good = slurp(path);
    SUBCASE("the lock held through another open file of this process") {
        HeldLock other(tmp);
        write_bytes(tmp, "the other writer's bytes");
        CHECK_THROWS_KIND_WITH(save_w(path, {9}), IOError, path, "another process is writing", tmp);
        CHECK(slurp(path) == good);
        CHECK(slurp(tmp) == "the other writer's bytes");  // neither emptied nor removed
    }
    SUBCASE("the lock held by another process, then that process killed") {
        int ready[2];
        REQUIRE(::pipe(ready) == 0);
        pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {  // only async-signal-safe calls here
            int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT, 0666);
            char ok = (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::write(fd, "junk", 4) == 4) ? 'y' : 'n';
            if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
            for (;;) ::pause();
        }
        ::close(ready[1]);
        char ok = 'n';
        REQUIRE(::read(ready[0], &ok, 1) == 1);
        ::close(ready[0]);
        struct Reap {  // the child dies even if a check throws
            pid_t pid;
            ~Reap() {
                ::kill(pid, SIGKILL);
                ::waitpid(pid, nullptr, 0);
            }
        };
        {
            Reap reap{child};
            REQUIRE(ok == 'y');
            CHECK_THROWS_KIND_WITH(save_w(path, {9}), IOError, "another process is writing", path);
            CHECK(slurp(path) == good);
            CHECK(slurp(tmp) == "junk");
        }
        // Killed: its lock is gone with it, and its file is taken over.
        save_w(path, {7, 8});
        CHECK(w_of(path) == std::vector<float>{7, 8});
    }
    // Once the other writer is gone, a save works and leaves no temporary file.
    save_w(path, {5});
    CHECK(w_of(path) == std::vector<float>{5});
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors"});
}

TEST_CASE("checkpoint files: a symbolic link is written through and stays a link, and a loop is IOError") {
    TempDir dir("symlinks");
    fs::create_directories(dir.path / "real");
    fs::create_directories(dir.path / "links" / "sub");
    std::string real = dir / "real/ck.safetensors";
    save_w(real, {1});
    struct Case {
        std::string name, link;
    };
    // links/abs -> /.../real/ck.safetensors; links/sub/rel -> ../../real/ck.safetensors (relative to
    // the link's directory, not to the working directory); links/chain -> sub/rel (a chain of two).
    fs::create_symlink(fs::absolute(real), dir.path / "links" / "abs");
    fs::create_symlink("../../real/ck.safetensors", dir.path / "links" / "sub" / "rel");
    fs::create_symlink("sub/rel", dir.path / "links" / "chain");
    float v = 2;
    for (const Case& c : {Case{"absolute", dir / "links/abs"}, Case{"relative", dir / "links/sub/rel"},
                          Case{"a chain of two", dir / "links/chain"}}) {
        CAPTURE(c.name);
        const fs::path target = fs::read_symlink(c.link);
        save_w(c.link, {v, v});
        CHECK(fs::is_symlink(c.link));
        CHECK(fs::read_symlink(c.link) == target);
        CHECK(w_of(real) == std::vector<float>{v, v});
        CHECK(listing(dir.path / "real") == std::vector<std::string>{"ck.safetensors"});
        v += 1;
    }
    CHECK(listing(dir.path / "links") == std::vector<std::string>{"abs", "chain", "sub"});
    CHECK(listing(dir.path / "links" / "sub") == std::vector<std::string>{"rel"});

    // A dangling link: its target is created.
    fs::create_symlink("../real/new.safetensors", dir.path / "links" / "dangling");
    save_w(dir / "links/dangling", {4});
    CHECK(fs::is_symlink(dir.path / "links" / "dangling"));
    CHECK(w_of(dir / "real/new.safetensors") == std::vector<float>{4});

    // Loops: two links pointing at each other, and one at itself.
    fs::create_symlink("b", dir.path / "links" / "a");
    fs::create_symlink("a", dir.path / "links" / "b");
    fs::create_symlink("self", dir.path / "links" / "self");
    for (const char* name : {"a", "self"}) {
        CAPTURE(name);
        CHECK_THROWS_KIND_WITH(save_w(dir / ("links/" + std::string(name)), {1}), IOError, "symbolic links", "loop");
    }
    CHECK(listing(dir.path / "links") == std::vector<std::string>{"a", "abs", "b", "chain", "dangling", "self", "sub"});
}

TEST_CASE("checkpoint files: load_checkpoint says whether the file carried checksums") {
    TempDir dir("checksummed_flag");
    manual_seed(7);
    GPT model({.block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8});
    save_checkpoint(dir / "ck.safetensors", model);
    bool checksummed = false;
    load_checkpoint(dir / "ck.safetensors", model, nullptr, &checksummed);
    CHECK(checksummed);
    // The same tensors, with no checksum entries in the metadata: another writer's file.
    std::string bytes = slurp(dir / "ck.safetensors");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    header.erase("__metadata__");
    write_bytes(dir / "plain.safetensors", st_file(header.dump(), bytes.substr(8 + n)));
    load_checkpoint(dir / "plain.safetensors", model, nullptr, &checksummed);
    CHECK(!checksummed);
}

}  // TEST_SUITE
