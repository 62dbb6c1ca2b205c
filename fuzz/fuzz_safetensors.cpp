// fuzz/fuzz_safetensors.cpp: a libFuzzer target for the safetensors reader (nn/formats/safetensors.h).
//
// Each input is a whole file, handed to detail::parse_safetensors, the parser under
// load_safetensors. FormatError and IOError are the expected answers to a bad file; anything else
// is a finding: a crash, an AddressSanitizer or UndefinedBehaviorSanitizer report, a leak, an
// exception of another kind (it escapes and aborts), or an accepted file whose tensors do not
// account for exactly its data bytes or whose shapes overflow, or whose metadata returned still
// holds a checksum entry. Run by scripts/fuzz.sh.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <map>
#include <string>

#include "core/check.h"
#include "nn/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace normtape;
    try {
        std::map<std::string, std::string> metadata;
        bool checksummed = false;
        NamedTensors tensors = detail::parse_safetensors(data, size, "<fuzz input>", &metadata, &checksummed);
        // The checksum entries are the reader's, never the caller's.
        for (const auto& [key, value] : metadata)
            if (key.rfind("normtape.checksum.", 0) == 0) std::abort();
        // Accepted: the tensors must tile the data exactly (the reader's promise).
        uint64_t header = 0;
        for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(data[i]) << (8 * i);
        uint64_t bytes = 0;
        for (const auto& [name, t] : tensors) {
            if (name.empty() || !t.defined() || !t.is_contiguous()) std::abort();
            // Every stride and partial product of the shape (zeros counted as 1) fits in int64.
            int64_t span = 1;
            for (int64_t d : t.shape())
                if (d < 0 || __builtin_mul_overflow(span, d > 0 ? d : 1, &span)) std::abort();
            bytes += static_cast<uint64_t>(t.nbytes());
        }
        if (bytes != size - 8 - header) {
            std::fprintf(stderr, "accepted a file whose tensors hold %llu bytes of %llu data bytes\n",
                         static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(size - 8 - header));
            std::abort();
        }
    } catch (const FormatError&) {
    } catch (const IOError&) {
    }
    return 0;
}
