// examples/common/checksums.h: the checksums train_gpt's checkpoint records of the files a run read
// (FNV-1a, 64-bit, in hex), which --resume and generate check: the data's, and the tokenizer's
// files (those Tokenizer::load reads: a rank file and the JSON beside it, or a tokenizer.json).
// Not here: the tokenizer itself (nn/data/tokenizer.h), the checkpoint (examples/train_gpt/resume.h).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "normtape.h"

// FNV-1a (64-bit) of `bytes`, continuing from `h` (0xcbf29ce484222325, FNV's offset basis, to start).
inline uint64_t fnv1a64(uint64_t h, std::string_view bytes) {
    for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

// `v` as 16 hexadecimal digits, as the checkpoint records a checksum.
inline std::string hex(uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

// The files Tokenizer::load(path) reads: a tokenizer.json (a name ending in ".json"), or a rank file
// and its JSON (the path with the extension .json).
inline std::vector<std::string> tokenizer_files(const std::string& path) {
    if (std::filesystem::path(path).extension() == ".json") return {path};
    return {path, std::filesystem::path(path).replace_extension(".json").string()};
}

// FNV-1a of the bytes of tokenizer_files(path), one after the other. Throws normtape::IOError
// naming a file that cannot be read and the system's reason.
inline uint64_t tokenizer_fnv1a64(const std::string& path) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const std::string& file : tokenizer_files(path)) {
        std::ifstream f(file, std::ios::binary);
        std::string bytes;
        if (f) bytes.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
        if (!f.is_open() || f.bad())
            throw normtape::IOError("cannot read the tokenizer's file " + file + ": " + std::strerror(errno));
        h = fnv1a64(h, bytes);
    }
    return h;
}
