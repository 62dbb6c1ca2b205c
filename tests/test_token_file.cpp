// tests/test_token_file.cpp: token files (nn/data/token_file.h): llm.c's two kinds and nanoGPT's raw
// uint16 ids, byte for byte as their writers lay them out (built here from the format's
// description, not by the code under test), the format told apart by its magic number, and each
// malformed file's error.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

void append_le(std::string& out, uint32_t v, int width) {
    for (int i = 0; i < width; ++i, v >>= 8) out += static_cast<char>(v & 0xff);
}

// llm.c's file: 256 int32 (magic, version, count, zeros), then the ids of `width` bytes.
std::string llmc_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint32_t>& ids, int width) {
    std::string out;
    append_le(out, static_cast<uint32_t>(magic), 4);
    append_le(out, static_cast<uint32_t>(version), 4);
    append_le(out, static_cast<uint32_t>(count), 4);
    out.append(253 * 4, '\0');
    for (uint32_t id : ids) append_le(out, id, width);
    return out;
}

}  // namespace

TEST_CASE("token_file: llm.c's uint16 and uint32 files are written as its writer lays them out, and read back") {
    TempDir dir("token_file");
    const std::vector<uint32_t> small = {0, 1, 50256, 65535, 7}, large = {3, 65536, 128255, 0};
    write_token_file(dir / "small.bin", small);
    write_token_file(dir / "large.bin", large);
    CHECK(slurp(dir / "small.bin") == llmc_bytes(20240520, 1, 5, small, 2));
    CHECK(slurp(dir / "large.bin") == llmc_bytes(20240801, 7, 4, large, 4));
    TokenFileFormat format = TokenFileFormat::Raw;
    CHECK(read_token_file(dir / "small.bin", TokenFileFormat::Auto, &format) == small);
    CHECK(format == TokenFileFormat::LlmC);
    CHECK(read_token_file(dir / "large.bin", TokenFileFormat::LlmC) == large);
    // No temporary left, and the files readable by others (not mkstemp's 0600).
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file();
    CHECK(files == 2);
    CHECK((std::filesystem::status(dir / "small.bin").permissions() & std::filesystem::perms::others_read) !=
          std::filesystem::perms::none);
}

TEST_CASE("token_file: nanoGPT's raw uint16 ids are read without a header, told apart from llm.c's by the magic") {
    TempDir dir("token_file_raw");
    std::string raw;
    for (uint32_t id : {5u, 50000u, 0u, 65535u}) append_le(raw, id, 2);
    write_bytes(dir / "train.bin", raw);
    TokenFileFormat format = TokenFileFormat::LlmC;
    CHECK(read_token_file(dir / "train.bin", TokenFileFormat::Auto, &format) == std::vector<uint32_t>{5, 50000, 0, 65535});
    CHECK(format == TokenFileFormat::Raw);
    // An llm.c file read as raw is its bytes as uint16: the header's magic number first.
    write_token_file(dir / "llmc.bin", {1, 2, 3});
    const std::vector<uint32_t> as_raw = read_token_file(dir / "llmc.bin", TokenFileFormat::Raw);
    REQUIRE(as_raw.size() == 512 + 3);
    CHECK(as_raw[0] + (as_raw[1] << 16) == 20240520u);
    CHECK(std::vector<uint32_t>(as_raw.end() - 3, as_raw.end()) == std::vector<uint32_t>{1, 2, 3});
    CHECK(std::string(token_file_format_name(TokenFileFormat::LlmC)) == "llm.c");
}

TEST_CASE("token_file: a malformed file is refused with FormatError naming the file, the expectation and what was found") {
    const std::vector<uint32_t> ids = {1, 2, 3};
    struct Case {
        std::string bytes;
        TokenFileFormat format;
        std::vector<std::string> says;
    };
    std::string odd;
    append_le(odd, 7, 2);
    odd += 'x';
    for (const Case& c : {
             Case{llmc_bytes(20240520, 2, 3, ids, 2), TokenFileFormat::Auto, {"expected version 1", "got 2"}},
             Case{llmc_bytes(20240801, 1, 3, ids, 4), TokenFileFormat::Auto, {"expected version 7", "got 1"}},
             Case{llmc_bytes(20240520, 1, 4, ids, 2), TokenFileFormat::Auto, {"the header says 4 ids", "3 ids"}},
             Case{llmc_bytes(20240520, 1, 2, ids, 2), TokenFileFormat::Auto, {"the header says 2 ids", "3 ids"}},
             Case{llmc_bytes(20240520, 1, 0, {}, 2), TokenFileFormat::Auto, {"the header says 0 ids"}},
             Case{llmc_bytes(20240520, 1, -1, ids, 2), TokenFileFormat::Auto, {"the header says -1 ids"}},
             Case{llmc_bytes(20240520, 1, 3, ids, 2).substr(0, 1024 + 5), TokenFileFormat::Auto,
                  {"the header says 3 ids", "and a part of one", "truncated"}},
             Case{llmc_bytes(20240520, 1, 3, ids, 2).substr(0, 600), TokenFileFormat::Auto,
                  {"expected llm.c's header of 1024 bytes", "got a file of 600 bytes"}},
             Case{llmc_bytes(12345, 1, 3, ids, 2), TokenFileFormat::LlmC,
                  {"expected llm.c's magic number 20240520", "20240801", "got 12345"}},
             Case{odd, TokenFileFormat::Auto, {"expected raw uint16 ids", "got 3 bytes"}},
             Case{"", TokenFileFormat::Raw, {"expected raw uint16 ids", "got 0 bytes"}},
         }) {
        CAPTURE(c.says[0]);
        CHECK_THROWS_KIND_WITH(parse_token_file(c.bytes, "f.bin", c.format), FormatError,
                               "token file f.bin", c.says[0], c.says.back());
    }
}

TEST_CASE("token_file: a file that cannot be read or written is an IOError naming it, and no ids or too many an Error") {
    TempDir dir("token_file_io");
    CHECK_THROWS_KIND_WITH(read_token_file(dir / "missing.bin"), IOError, "missing.bin", "No such file");
    CHECK_THROWS_KIND_WITH(read_token_file(dir.path.string()), IOError, "Is a directory");
    CHECK_THROWS_KIND_WITH(write_token_file((dir.path / "no" / "such" / "dir.bin").string(), {1}), IOError, "dir.bin.tmp",
                           "No such file");
    CHECK_THROWS_KIND_WITH(write_token_file(dir / "empty.bin", {}), Error, "write_token_file", "got 0");
    // A failed write leaves the file that was there.
    write_token_file(dir / "kept.bin", {4, 5});
    CHECK_THROWS(write_token_file(dir / "kept.bin", {}));
    CHECK(read_token_file(dir / "kept.bin") == std::vector<uint32_t>{4, 5});
}
