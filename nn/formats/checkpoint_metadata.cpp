// nn/formats/checkpoint_metadata.cpp: a checkpoint's optimizer entries read back (nn/formats/checkpoint_metadata.h).
#include "nn/formats/checkpoint_metadata.h"

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "nn/formats/json_read.h"

namespace normtape {

namespace {

// Whether `j` is an optimizer entry of the checkpoint format (nn/formats/checkpoint.h) of its "type".
bool well_formed(const nlohmann::json& j) {
    if (!(j.is_object() && j.contains("type") && (j["type"] == "AdamW" || j["type"] == "Muon") && j.contains("step") &&
          j["step"].is_number_unsigned() && j["step"].get<uint64_t>() <= uint64_t(INT64_MAX) && j.contains("groups") &&
          j["groups"].is_array()))
        return false;
    const bool adamw = j["type"] == "AdamW";
    for (const char* field : adamw ? std::vector<const char*>{"beta1", "beta2", "eps"}
                                   : std::vector<const char*>{"momentum", "ns_steps"})
        if (!j.contains(field) || !j[field].is_number()) return false;
    if (!adamw && !(j.contains("nesterov") && j["nesterov"].is_boolean())) return false;
    for (const nlohmann::json& g : j["groups"])
        if (!(g.is_object() && g.contains("size") && g["size"].is_number_unsigned() && g.contains("weight_decay") &&
              g["weight_decay"].is_number() && (!g.contains("lr_scale") || g["lr_scale"].is_number())))
            return false;
    return true;
}

// The hyperparameters of a well-formed entry, in words. Numbers in their shortest round-trip
// decimal forms: equal strings mean equal values.
std::string hyperparameters(const nlohmann::json& j) {
    std::string s = j["type"] == "AdamW" ? "betas (" + j["beta1"].dump() + ", " + j["beta2"].dump() + "), eps " +
                                               j["eps"].dump()
                                         : "momentum " + j["momentum"].dump() + ", nesterov " + j["nesterov"].dump() +
                                               ", ns_steps " + j["ns_steps"].dump();
    s += ", groups";
    for (const nlohmann::json& g : j["groups"])
        s += " (" + g["size"].dump() + " params, weight decay " + g["weight_decay"].dump() + ", lr scale " +
             (g.contains("lr_scale") ? g["lr_scale"] : nlohmann::json(1.0)).dump() + ")";
    return s;
}

}  // namespace

int64_t detail::stored_step(const std::string& path, const std::map<std::string, std::string>& metadata,
                            const std::string& key, const std::string& own) {
    const nlohmann::json want = nlohmann::json::parse(own);
    const std::string type = want["type"];
    auto it = metadata.find(key);
    NT_CHECK_AS(FormatError, it != metadata.end(), "load_checkpoint: ", path, ": holds no optimizer state for ", type,
                " (no \"", key, "\" metadata; was it saved with the optimizer?)");
    nlohmann::json j;
    std::string why;
    NT_CHECK_AS(FormatError, detail::parse_json(it->second, j, why), "load_checkpoint: ", path,
                ": malformed optimizer metadata \"", key, "\": ", why, " (expected ", type, "'s entry)");
    NT_CHECK_AS(FormatError, well_formed(j) && j["type"] == type, "load_checkpoint: ", path,
                ": malformed optimizer metadata \"", key, "\": ", detail::json_excerpt(j), " (expected ", type,
                "'s entry)");
    // Quoted by their first 300 characters: a file's entry may list any number of groups.
    const auto cut = [](std::string s) { return s.size() > 300 ? s.substr(0, 300) + "..." : s; };
    NT_CHECK(hyperparameters(want) == hyperparameters(j), "load_checkpoint: ", path, ": the ", type,
             " optimizer's hyperparameters differ from the file's: expected ", cut(hyperparameters(want)),
             ", the file has ", cut(hyperparameters(j)));
    return static_cast<int64_t>(j["step"].get<uint64_t>());
}

}  // namespace normtape
