// fuzz/make_corpus.cpp: writes the fuzzer's seed corpus, a few small valid safetensors files
// (every dtype, a scalar, an empty tensor, metadata, no tensors at all), into the directory given:
// those save_safetensors writes, which carry checksums, and two of another writer, which carry
// none (read unverified). The files in fuzz/corpus/safetensors/ were made by it:
// make_safetensors_corpus fuzz/corpus/safetensors
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/tensor.h"
#include "nn/formats/safetensors.h"

using namespace normtape;

// A file as another writer makes it: the 8-byte little-endian length of `header`, `header`, `data`.
static void write_raw(const std::string& path, const std::string& header, const std::string& data) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
    std::ofstream(path, std::ios::binary) << bytes << header << data;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_safetensors_corpus DIR\n");
        return 2;
    }
    std::string dir = argv[1];
    save_safetensors(dir + "/empty.safetensors", {});
    save_safetensors(dir + "/metadata_only.safetensors", {}, {{"format", "normtape-gpt"}, {"step", "3"}});
    save_safetensors(dir + "/one_f32.safetensors", {{"w", from_vector<float>({1, -2, 3.5f, 0, 1e-3f, 7}, {2, 3})}});
    save_safetensors(dir + "/every_dtype.safetensors",
                     {{"a.f32", from_vector<float>({1, 2}, {2})},
                      {"b.f64", from_vector<double>({0.5, -0.25, 8}, {3, 1})},
                      {"c.bf16", from_vector<float>({1, 2, 3, 4}, {2, 2}).to(DType::BF16)},
                      {"d.i64", from_vector<int64_t>({7, -1, 255}, {3})},
                      {"e.scalar", full({}, 42.0)},
                      {"f.empty", zeros({0, 4})}},
                     {{"note", "every dtype, a scalar and an empty tensor"}});
    save_safetensors(dir + "/optimizer_like.safetensors",
                     {{"h.0.ln_1.weight", ones({4})},
                      {"optimizer.exp_avg.h.0.ln_1.weight", zeros({4})},
                      {"optimizer.exp_avg_sq.h.0.ln_1.weight", zeros({4})}},
                     {{"optimizer", "{\"type\":\"AdamW\",\"step\":1}"}});
    // Without checksums: data order unlike name order, a scalar, an empty tensor, no padding.
    write_raw(dir + "/unverified.safetensors",
              "{\"z\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
              "\"a\":{\"data_offsets\":[8,16],\"shape\":[2],\"dtype\":\"F32\"},"
              "\"e\":{\"dtype\":\"BF16\",\"shape\":[3,0],\"data_offsets\":[8,8]},"
              "\"__metadata__\":{\"who\":\"another writer\"}}",
              std::string("\xf9\xff\xff\xff\xff\xff\xff\xff\x00\x00\xc0\x3f\x00\x00\x00\xc0", 16));
    write_raw(dir + "/unverified_metadata_only.safetensors", "{\"__metadata__\":{\"format\":\"pt\"}}", "");
    return 0;
}
