// nn/formats/json_read.h: JSON that a file hands normtape (a Hugging Face config.json, a checkpoint's
// metadata), read with a bound on its nesting and quoted in error messages by a short prefix.
// Internal and header-only: the library's readers and the example programs include it; it is not
// installed, since it names nlohmann::json. Not here: the safetensors header, whose reader bounds
// its nesting tighter still (nn/formats/safetensors.cpp).
//
// Why a bound: nlohmann::json parses without recursion, but copying a value and dump() recurse, so
// a list nested 100,000 deep (200 KB of brackets) would overflow the stack of whoever copies it or
// quotes it in a message. A parse that refuses anything deeper than kMaxJsonDepth makes every later
// copy and dump safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace normtape::detail {

// Deeper than any file normtape reads needs: transformers' config.json nests 3 deep, train_gpt's
// metadata 1.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` into `out`. Returns false, with `error` saying why, for text that is not JSON or
// that nests arrays and objects more than kMaxJsonDepth deep (then `out` is null). Throws nothing.
inline bool parse_json(const std::string& text, nlohmann::json& out, std::string& error) {
    struct TooDeep {};
    const nlohmann::json::parser_callback_t bound = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > kMaxJsonDepth) throw TooDeep{};
        return true;
    };
    try {
        out = nlohmann::json::parse(text, bound);
        return true;
    } catch (const TooDeep&) {
        error = "nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    } catch (const nlohmann::json::exception& e) {
        // nlohmann's message quotes all it last read ("; last read: '...'"), which can be the whole
        // text: keep where it failed and why, at most 200 characters.
        std::string what = e.what();
        const size_t last = what.find("; last read: ");
        if (last != std::string::npos) {
            const size_t next = what.find("; expected", last);
            what.erase(last, next == std::string::npos ? std::string::npos : next - last);
        }
        error = "not valid JSON (" + what.substr(0, 200) + ")";
    }
    out = nullptr;
    return false;
}

// `value` as JSON text for an error message: at most its first `max_bytes` bytes, cut before a
// UTF-8 sequence that would not fit, then "..." when it is longer; bytes that are not UTF-8 are
// replaced. `value` must come from parse_json (or nest as little), since dump() recurses.
inline std::string json_excerpt(const nlohmann::json& value, size_t max_bytes = 80) {
    std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (text.size() <= max_bytes) return text;
    size_t cut = max_bytes;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // a continuation byte
    return text.substr(0, cut) + "...";
}

}  // namespace normtape::detail
