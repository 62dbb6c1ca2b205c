// fuzz/fuzz_json_readers.cpp: a libFuzzer target for the JSON that files hand normtape besides
// the safetensors header: a transformers config.json and the JSON values of a checkpoint's
// metadata.
//
// Each input is read three ways:
//   - as config.json, by detail::hf_config (what load_hf reads; nn/formats/hf.h);
//   - as the optimizer entries "optimizer" (AdamW's) and "optimizer.muon" (Muon's), by
//     detail::stored_step against the entries save_checkpoint writes (nn/formats/checkpoint_metadata.h);
//   - as train_gpt.config, which train_gpt --resume and generate read through detail::parse_json
//     and quote through detail::json_excerpt (nn/formats/json_read.h): every member is copied and quoted.
// FormatError (and, for the optimizer entries, Error for other hyperparameters) is the expected
// answer to bad text. Anything else is a finding: a crash (a stack overflow from deep nesting), an
// AddressSanitizer or UndefinedBehaviorSanitizer report, a leak, an exception of another kind, or a
// message longer than 1,000 bytes (messages quote at most a short prefix of a value). Run by
// scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "check_message.h"
#include "core/check.h"
#include "nn/formats/checkpoint_metadata.h"
#include "nn/formats/hf.h"
#include "nn/formats/json_read.h"

namespace {

// The entries save_checkpoint writes for an AdamW and a Muon of one group each.
const char* const kAdamW = R"({"type":"AdamW","step":3,"beta1":0.9,"beta2":0.95,"eps":1e-08,)"
                           R"("groups":[{"size":2,"weight_decay":0.1,"lr_scale":1.0}]})";
const char* const kMuon = R"({"type":"Muon","step":3,"momentum":0.95,"nesterov":true,"ns_steps":5,)"
                          R"("groups":[{"size":2,"weight_decay":0.0,"lr_scale":1.0}]})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace normtape;
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const GPTConfig c = detail::hf_config(text, "config.json");
        if (arch_name(c) != "llama" && arch_name(c) != "gpt2") std::abort();
    } catch (const FormatError& e) {
        check_message(e);
    }
    for (const auto& [key, own] : {std::pair{"optimizer", kAdamW}, std::pair{"optimizer.muon", kMuon}}) {
        try {
            if (detail::stored_step("<fuzz input>", {{key, text}}, key, own) < 0) std::abort();
        } catch (const Error& e) {
            check_message(e);
        }
    }
    nlohmann::json config;
    std::string why;
    if (detail::parse_json(text, config, why) && config.is_object())
        for (const auto& [key, value] : config.items()) {
            const nlohmann::json copy = value;
            if (detail::json_excerpt(copy).size() > 83) std::abort();
        }
    return 0;
}
