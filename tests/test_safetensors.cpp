// tests/test_safetensors.cpp: the safetensors reader and writer (save_safetensors,
// load_safetensors; nn/formats/checkpoint.h): hostile and truncated files are refused with FormatError
// naming the file and the problem, I/O failures are IOError, and valid files of other writers
// (no padding, any key order, zero-size tensors) are read. The checksums: the writer's equal
// XXH3-64 recomputed here from the bytes and the documented serialization; a file changed
// anywhere, by any single byte, is refused or reads the same; a file without checksums is read
// unverified. Checkpoints of a model and its optimizer: tests/test_checkpoint.cpp; how files are
// replaced (the temporary file, its lock, symbolic links): tests/test_checkpoint_files.cpp.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/device_ptr.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;
using nlohmann::json;

namespace {

const std::string kTensorKey = "normtape.checksum.tensor.", kHeaderKey = "normtape.checksum.header";

// The parts of a safetensors file: its header, parsed, and its data.
struct Parts {
    json header;
    std::string data;
};
Parts split(const std::string& bytes) {
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}
std::string join(const Parts& p) { return st_file(p.header.dump(), p.data); }

// "xxh3-64:" and the 16 hex digits of XXH3-64 (seed 0) of `bytes`, as xxHash computes it.
std::string xxh3(const std::string& bytes) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
    return "xxh3-64:" + std::string(hex);
}

// The header serialization of nn/formats/safetensors.h ("Checksums"), built from a parsed header.
std::string u64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
    return s;
}
std::string str(const std::string& s) { return u64(s.size()) + s; }
std::string canonical_header(const json& header) {
    std::vector<std::string> names;
    for (const auto& [key, value] : header.items())
        if (key != "__metadata__") names.push_back(key);
    std::sort(names.begin(), names.end());
    std::string s = u64(names.size());
    for (const std::string& name : names) {
        const json& e = header[name];
        s += str(name) + str(e["dtype"].get<std::string>()) + u64(e["shape"].size());
        for (const json& d : e["shape"]) s += u64(d.get<uint64_t>());
    }
    std::vector<std::pair<std::string, std::string>> meta;
    for (const auto& [key, value] : header["__metadata__"].items())
        if (key != kHeaderKey) meta.emplace_back(key, value.get<std::string>());
    std::sort(meta.begin(), meta.end());
    s += u64(meta.size());
    for (const auto& [key, value] : meta) s += str(key) + str(value);
    return s;
}

// A file's tensors as bytes, names, dtypes and shapes, to compare two reads.
std::string describe(const NamedTensors& tensors) {
    std::string s;
    for (const auto& [name, t] : tensors)
        s += name + " " + dtype_name(t.dtype()) + " " + shape_str(t.shape()) + " " +
             std::string(detail::byte_ptr(t), static_cast<size_t>(t.nbytes())) + "\n";
    return s;
}

// A small file with every dtype, a scalar, an empty tensor and metadata.
NamedTensors small_tensors() {
    return {{"f", from_vector<float>({1.5f, -2}, {2})},
            {"d", from_vector<double>({0.25}, {1, 1})},
            {"b", from_vector<float>({1, 2, 3}, {3}).to(DType::BF16)},
            {"i", from_vector<int64_t>({-7}, {})},
            {"e", zeros({0, 2})}};
}
const std::map<std::string, std::string> kSmallMeta = {{"note", "h\xc3\xa9llo"}, {"step", "3"}};

}  // namespace

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

TEST_CASE("safetensors: the checksums written equal XXH3-64 of the data bytes and of the documented header serialization") {
    TempDir dir("checksums");
    std::string path = dir / "c.safetensors";
    save_safetensors(path, small_tensors(), kSmallMeta);
    Parts p = split(slurp(path));
    const json& meta = p.header["__metadata__"];
    size_t tensors = 0;
    for (const auto& [name, e] : p.header.items()) {
        if (name == "__metadata__") continue;
        CAPTURE(name);
        ++tensors;
        uint64_t begin = e["data_offsets"][0].get<uint64_t>(), end = e["data_offsets"][1].get<uint64_t>();
        REQUIRE(meta.contains(kTensorKey + name));
        CHECK(meta[kTensorKey + name].get<std::string>() == xxh3(p.data.substr(begin, end - begin)));
    }
    CHECK(tensors == 5);
    // Exactly the caller's metadata, one entry per tensor and the header's.
    CHECK(meta.size() == kSmallMeta.size() + tensors + 1);
    for (const auto& [key, value] : kSmallMeta) CHECK(meta[key].get<std::string>() == value);
    // XXH3-64 of nothing, from xxHash's documentation: the empty tensor's.
    CHECK(meta[kTensorKey + "e"].get<std::string>() == "xxh3-64:2d06800538d394c2");
    CHECK(meta[kHeaderKey].get<std::string>() == xxh3(canonical_header(p.header)));

    std::map<std::string, std::string> got;
    bool checksummed = false;
    NamedTensors t = load_safetensors(path, &got, &checksummed);
    CHECK(checksummed);
    CHECK(got == kSmallMeta);  // without the checksum entries
    CHECK(describe(t) == describe(detail::parse_safetensors(reinterpret_cast<const uint8_t*>(slurp(path).data()),
                                                            slurp(path).size(), "mem")));
}

TEST_CASE("safetensors: a changed data byte, metadata value, checksum or a missing checksum entry is refused, naming it") {
    TempDir dir("tampered");
    std::string path = dir / "c.safetensors", bad = dir / "bad.safetensors";
    save_safetensors(path, {{"a", from_vector<float>({1, 2, 3}, {3})}, {"b", from_vector<int64_t>({4, 5}, {2})}},
                     {{"note", "hello"}});
    const std::string good = slurp(path);
    const Parts p = split(good);
    // Both readers refuse `bytes` with FormatError naming the file and saying each of `says`.
    auto refused = [&](const std::string& bytes, std::vector<std::string> says) {
        write_bytes(bad, bytes);
        says.push_back("the file is corrupt or was modified");
        std::vector<std::string> with_path = says;
        with_path.push_back(bad);
        check_throws<FormatError>([&] { load_safetensors(bad); }, with_path);
        check_throws<FormatError>(
            [&] { detail::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem"); }, says);
    };
    SUBCASE("every data byte") {
        const size_t data_start = good.size() - p.data.size();
        for (size_t i = 0; i < p.data.size(); ++i) {
            CAPTURE(i);
            std::string name = i < p.header["a"]["data_offsets"][1].get<size_t>() ? "a" : "b";
            std::string bytes = good;
            bytes[data_start + i] ^= 0x10;
            refused(bytes, {"tensor " + name + ": data checksum mismatch", kTensorKey + name});
        }
    }
    SUBCASE("a metadata value") {
        std::string bytes = good;
        bytes[bytes.find("hello")] = 'j';
        refused(bytes, {"header checksum mismatch", kHeaderKey});
    }
    SUBCASE("a tensor's checksum, another hex digit or not hex") {
        std::string value = p.header["__metadata__"][kTensorKey + "b"].get<std::string>();
        size_t at = good.find(value) + value.size() - 1;
        std::string bytes = good;
        bytes[at] = bytes[at] == '0' ? '1' : '0';
        refused(bytes, {"tensor b: data checksum mismatch", kTensorKey + "b", "expects"});
        bytes[at] = 'A';
        refused(bytes, {"checksum entry \"" + kTensorKey + "b\" must be", "16 lowercase hex digits"});
    }
    SUBCASE("the header's checksum") {
        std::string value = p.header["__metadata__"][kHeaderKey].get<std::string>();
        std::string bytes = good;
        size_t at = good.find(value) + 8;
        bytes[at] = bytes[at] == 'f' ? 'e' : 'f';
        refused(bytes, {"header checksum mismatch", kHeaderKey});
    }
    SUBCASE("entries removed, added or renamed (the header rewritten)") {
        Parts q = p;
        q.header["__metadata__"].erase(kTensorKey + "b");
        refused(join(q), {"tensor b has no checksum entry", kTensorKey + "b"});
        q = p;
        q.header["__metadata__"].erase(kHeaderKey);
        refused(join(q), {"no \"" + kHeaderKey + "\" entry"});
        q = p;
        q.header["__metadata__"][kTensorKey + "c"] = q.header["__metadata__"][kTensorKey + "b"];
        refused(join(q), {kTensorKey + "c", "is for tensor \"c\", which the file does not hold"});
        q = p;
        q.header["__metadata__"]["normtape.checksum.sha256"] = "abc";
        refused(join(q), {"unknown checksum entry \"normtape.checksum.sha256\""});
        q = p;
        q.header["b"] = p.header["a"];
        q.header["a"] = p.header["b"];
        refused(join(q), {"data checksum mismatch"});  // the names swapped
        q = p;
        q.header["a"]["shape"] = {1, 3};
        refused(join(q), {"header checksum mismatch"});
        q = p;
        q.header["__metadata__"]["extra"] = "x";
        refused(join(q), {"header checksum mismatch"});
    }
    SUBCASE("stripped of every checksum entry: read unverified") {
        Parts q = p;
        q.header["__metadata__"] = {{"note", "hello"}};
        write_bytes(bad, join(q));
        bool checksummed = true;
        std::map<std::string, std::string> meta;
        NamedTensors t = load_safetensors(bad, &meta, &checksummed);
        CHECK(!checksummed);
        CHECK(meta == std::map<std::string, std::string>{{"note", "hello"}});
        CHECK(describe(t) == describe(load_safetensors(path)));
    }
}

TEST_CASE("safetensors: EXHAUSTIVE: every byte of a checksummed file changed is refused or reads the same") {
    TempDir dir("exhaustive");
    std::string path = dir / "c.safetensors", bad = dir / "bad.safetensors";
    save_safetensors(path, small_tensors(), kSmallMeta);
    const std::string good = slurp(path);
    REQUIRE(good.size() < 1200);
    std::map<std::string, std::string> meta;
    bool checksummed = false;
    const std::string want = describe(load_safetensors(path, &meta, &checksummed));
    REQUIRE(checksummed);
    size_t refused = 0, same = 0;
    for (size_t pos = 0; pos < good.size(); ++pos) {
        for (int mask : {0x01, 0x80, 0xff, -1}) {  // -1: the byte replaced by a space
            std::string bytes = good;
            if (mask < 0) bytes[pos] = ' ';
            else bytes[pos] = static_cast<char>(bytes[pos] ^ mask);
            if (bytes == good) continue;
            CAPTURE(pos);
            CAPTURE(mask);
            for (bool from_file : {true, false}) {
                CAPTURE(from_file);
                std::map<std::string, std::string> got_meta;
                bool got_checksummed = false;
                try {
                    NamedTensors t;
                    if (from_file) {
                        write_bytes(bad, bytes);
                        t = load_safetensors(bad, &got_meta, &got_checksummed);
                    } else {
                        t = detail::parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem",
                                                      &got_meta, &got_checksummed);
                    }
                    ++same;
                    CHECK(describe(t) == want);
                    CHECK(got_meta == meta);
                    CHECK(got_checksummed);
                } catch (const FormatError&) {
                    ++refused;
                }
            }
        }
    }
    MESSAGE(refused << " changed files refused, " << same << " read the same");
    CHECK(refused > 4 * good.size());
}

TEST_CASE("safetensors: a file without checksums is read unverified, and the checksum keys are reserved") {
    TempDir dir("unverified");
    std::string path = dir / "plain.safetensors";
    // Another writer's file (the test's own bytes), with metadata.
    write_bytes(path, st_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                              "\"__metadata__\":{\"who\":\"someone\"}}",
                              std::string(4, '\0')));
    bool checksummed = true;
    std::map<std::string, std::string> meta;
    CHECK(load_safetensors(path, &meta, &checksummed).size() == 1);
    CHECK(!checksummed);
    CHECK(meta == std::map<std::string, std::string>{{"who", "someone"}});
    // Saved by normtape: checksummed, and the metadata read back is exactly what was saved.
    save_safetensors(path, {{"w", ones({1})}}, {{"who", "normtape"}});
    CHECK(load_safetensors(path, &meta, &checksummed).size() == 1);
    CHECK(checksummed);
    CHECK(meta == std::map<std::string, std::string>{{"who", "normtape"}});
    // No tensors at all: still checksummed.
    save_safetensors(dir / "empty.safetensors", {});
    CHECK(load_safetensors(dir / "empty.safetensors", &meta, &checksummed).empty());
    CHECK(checksummed);
    CHECK(meta.empty());
    // A caller's key with the reserved prefix: Error, nothing written.
    const std::string before = slurp(path);
    for (const char* key : {"normtape.checksum.header", "normtape.checksum.tensor.w", "normtape.checksum."}) {
        CAPTURE(key);
        CHECK_THROWS_KIND_WITH(save_safetensors(path, {{"w", zeros({1})}}, {{key, "x"}}), Error, path, key, "reserved");
        CHECK_THROWS_KIND_WITH(save_safetensors(dir / "new.safetensors", {}, {{key, "x"}}), Error, "reserved");
    }
    CHECK(slurp(path) == before);
    CHECK(!std::filesystem::exists(dir / "new.safetensors"));
    CHECK(!std::filesystem::exists(dir / "new.safetensors.tmp"));
}

}  // TEST_SUITE
