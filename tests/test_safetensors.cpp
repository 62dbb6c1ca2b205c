// tests/test_safetensors.cpp: the safetensors reader and writer (save_safetensors,
// load_safetensors; nn/checkpoint.h): hostile and truncated files are refused with FormatError
// naming the file and the problem, I/O failures are IOError, and valid files of other writers
// (no padding, any key order, zero-size tensors) are read. Checkpoints of a model and its
// optimizer: tests/test_checkpoint.cpp.
#include <map>
#include <string>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

TEST_SUITE("safetensors") {

TEST_CASE("safetensors: hostile and truncated files are refused with FormatError naming the file and the problem") {
    TempDir dir("hostile");
    std::string path = dir / "bad.safetensors";
    // A valid file to truncate: every dtype.
    std::string valid_path = dir / "valid.safetensors";
    save_safetensors(valid_path, {{"a", from_vector<float>({1, 2, 3}, {3})},
                                  {"b", from_vector<double>({4, 5}, {2, 1})},
                                  {"c", from_vector<int64_t>({6}, {1})},
                                  {"d", ones({2, 2}).to(DType::BF16)}},
                     {{"k", "v"}});
    const std::string valid = slurp(valid_path);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(valid[i])) << (8 * i);
    REQUIRE(valid.size() == 8 + n + 12 + 16 + 8 + 8);

    SUBCASE("truncated at every length") {
        for (size_t len = 0; len < valid.size(); ++len) {
            CAPTURE(len);
            write_bytes(path, valid.substr(0, len));
            CHECK_THROWS_KIND_WITH(load_safetensors(path), FormatError, path);
            // The same bytes in memory give the same answer.
            CHECK_THROWS_AS(detail::parse_safetensors(reinterpret_cast<const uint8_t*>(valid.data()), len, "mem"),
                            FormatError);
        }
        write_bytes(path, valid + "x");  // one trailing byte
        CHECK_THROWS_KIND_WITH(load_safetensors(path), FormatError, "no trailing bytes");
    }

    const std::string f32x2 = "{\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}";
    const std::string data8(8, '\x01');
    struct Case {
        std::string name, bytes, says;
    };
    const std::vector<Case> cases = {
        {"empty file", "", "too short"},
        {"header length past the file", st_file("{}", "", 200), "exceeds the file size"},
        {"header length huge", st_file("{}", "", uint64_t(1) << 40), "larger than the format allows"},
        {"header length 2^64 - 2", st_file("{}", "", UINT64_MAX - 1), "larger than the format allows"},
        {"header length 0", st_file("", ""), "too short for a JSON object"},
        {"header not JSON", st_file("{\"a\": [1, 2"), "not valid JSON"},
        {"header garbage", st_file("\x01\x02\x03\x04\x05\x06\x07\x08"), "not valid JSON"},
        {"header not an object", st_file("[1, 2, 3]"), "not a JSON object"},
        {"header a string", st_file("\"abcd\""), "not a JSON object"},
        {"header with trailing junk", st_file("{} {}"), "not valid JSON"},
        {"header not UTF-8", st_file("{\"\xff\xfe\": " + f32x2 + "}", data8), "not valid JSON"},
        {"entry not an object", st_file("{\"w\": [1, 2]}"), "tensor w: expected an object"},
        {"dtype missing", st_file("{\"w\": {\"shape\": [2], \"data_offsets\": [0, 8]}}", data8), "missing \"dtype\""},
        {"dtype F16", st_file("{\"w\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [0, 8]}}", data8),
         "unsupported dtype \"F16\""},
        {"dtype lower case", st_file("{\"w\": {\"dtype\": \"f32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", data8),
         "unsupported dtype \"f32\""},
        {"dtype a number", st_file("{\"w\": {\"dtype\": 4, \"shape\": [2], \"data_offsets\": [0, 8]}}", data8),
         "dtype must be a string"},
        {"shape negative", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", data8),
         "not an integer >= 0"},
        {"shape fractional", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [2.0], \"data_offsets\": [0, 8]}}", data8),
         "not an integer >= 0"},
        {"shape a string", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", data8),
         "not an integer >= 0"},
        {"shape not an array", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": 2, \"data_offsets\": [0, 8]}}", data8),
         "shape must be an array"},
        {"shape beyond int64",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [9223372036854775808], \"data_offsets\": [0, 8]}}", data8),
         "dimension too large"},
        {"shape overflowing the element count",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 2], \"data_offsets\": [0, 8]}}", data8),
         "more elements than memory can hold"},
        {"shape overflowing the element count to 0, claiming no bytes",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}"),
         "more elements than memory can hold"},
        {"an empty shape whose other dimensions overflow",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 4611686018427387904, 4611686018427387904], "
                 "\"data_offsets\": [0, 0]}}"),
         "more elements than memory can hold"},
        {"an empty shape with a dimension of 2^63 - 1",
         st_file("{\"w\": {\"dtype\": \"BF16\", \"shape\": [9223372036854775807, 0], \"data_offsets\": [0, 0]}}"),
         "more elements than memory can hold"},
        {"shape overflowing the byte count",
         st_file("{\"w\": {\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 8]}}", data8),
         "more elements than memory can hold"},
        {"shape of 65 dimensions",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
                 "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2], \"data_offsets\": [0, 8]}}",
                 data8),
         "65 dimensions"},
        {"offsets past the data", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 1000]}}", data8),
         "do not fit"},
        {"offsets reversed", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 0]}}", data8),
         "do not fit"},
        {"offsets not matching the shape",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", data8), "do not fit"},
        {"offsets negative", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [-8, 0]}}", data8),
         "two integers >= 0"},
        {"offsets of three", st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 8]}}", data8),
         "two integers >= 0"},
        {"offsets huge",
         st_file("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [18446744073709551615, 7]}}", data8),
         "do not fit"},
        {"overlapping tensors", st_file("{\"a\": " + f32x2 + ", \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                                        std::string(12, 'x')),
         "overlaps tensor a"},
        {"two tensors on the same bytes", st_file("{\"a\": " + f32x2 + ", \"b\": " + f32x2 + "}", data8), "overlaps"},
        {"a gap between tensors",
         st_file("{\"a\": " + f32x2 + ", \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}",
                 std::string(20, 'x')),
         "belong to no tensor"},
        {"bytes after the last tensor", st_file("{\"a\": " + f32x2 + "}", data8 + "xxxx"), "no trailing bytes"},
        {"metadata not strings", st_file("{\"__metadata__\": {\"step\": 3}}"), "__metadata__ entry \"step\" must be a string"},
        {"metadata not an object", st_file("{\"__metadata__\": [\"a\"]}"), "__metadata__ must be an object"},
        {"duplicate tensor names", st_file("{\"a\": " + f32x2 + ", \"a\": " + f32x2 + "}", data8 + data8),
         "key \"a\" twice"},
        {"duplicate keys in an entry",
         st_file("{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 8]}}", data8),
         "key \"dtype\" twice"},
        {"empty tensor name", st_file("{\"\": " + f32x2 + "}", data8), "empty name"},
        {"unknown key in an entry",
         st_file("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8], \"extra\": 1}}", data8),
         "unexpected key \"extra\""},
        {"nested too deep", st_file("{\"a\": {\"shape\": [[[[1]]]]}}"), "nests deeper"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        write_bytes(path, c.bytes);
        CHECK_THROWS_KIND_WITH(load_safetensors(path), FormatError, path, c.says);
    }
    // I/O failures are IOError.
    CHECK_THROWS_KIND_WITH(load_safetensors(dir / "missing.safetensors"), IOError, dir / "missing.safetensors", "cannot open");
    CHECK_THROWS_KIND_WITH(load_safetensors(dir.path.string()), IOError, "not a regular file");
}

TEST_CASE("safetensors: valid files of other writers are read (no padding, any key order, zero-size tensors)") {
    TempDir dir("other_writers");
    std::string path = dir / "ok.safetensors";
    // Data order differs from name order; a scalar; an empty tensor (which takes no bytes,
    // anywhere); metadata last; no padding; a header of only "{}".
    std::string data;
    float f[2] = {1.5f, -2.0f};
    int64_t i = -7;
    data.append(reinterpret_cast<const char*>(&i), 8);
    data.append(reinterpret_cast<const char*>(f), 8);
    write_bytes(path, st_file("{\"z\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
                              "\"a\":{\"data_offsets\":[8,16],\"shape\":[2],\"dtype\":\"F32\"},"
                              "\"e\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
                              "\"__metadata__\":{\"who\":\"another writer\"}}",
                              data));
    std::map<std::string, std::string> meta;
    NamedTensors t = load_safetensors(path, &meta);
    REQUIRE(t.size() == 3);
    CHECK(t[0].first == "a");
    CHECK(t[0].second.to_vector<float>() == std::vector<float>{1.5f, -2.0f});
    CHECK(t[1].first == "e");
    CHECK(t[1].second.shape() == Shape{3, 0});
    CHECK(t[2].first == "z");
    CHECK(t[2].second.dim() == 0);
    CHECK(t[2].second.item<int64_t>() == -7);
    CHECK(meta == std::map<std::string, std::string>{{"who", "another writer"}});

    write_bytes(path, st_file("{}"));
    CHECK(load_safetensors(path).empty());
}

}  // TEST_SUITE
