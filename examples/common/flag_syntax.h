// examples/common/flag_syntax.h: the syntax checks of the examples' flag values (CLI11 validators),
// shared by train_gpt and generate.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <string>

// The syntax of a flag's value, checked on the text before CLI11 converts it (CLI11 would wrap a
// negative number into an unsigned one and clamp one too large); the programs check the ranges.
template <class T>
inline CLI::Validator number(const char* expected) {
    return CLI::Validator(
        [expected](std::string& text) -> std::string {
            T v{};
            const char *first = text.data(), *last = text.data() + text.size();
            auto [end, ec] = std::from_chars(first, last, v);
            if (ec == std::errc() && end == last && !text.empty()) return "";
            if (ec == std::errc::result_out_of_range)
                return "expected " + std::string(expected) + ", got " + text + ", which is out of range";
            return "expected " + std::string(expected) + ", got \"" + text + "\"";
        },
        "", "number");
}

inline const CLI::Validator kFileName(
    [](std::string& text) -> std::string { return text.empty() ? "expected a file name, got an empty one" : ""; }, "",
    "file name");

