// core/check.h: the library's exception type and the checks that throw it.
//
// User errors throw normtape::Error with a message that names the op, what was expected and
// what was found; the library never exits. The macro is NT_CHECK, not CHECK, so that it never collides with doctest's CHECK in the tests.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace normtape {

// The one exception type the library throws for bad input or misuse.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
[[noreturn]] void throw_error(const char* file, int line, const Args&... args) {
    std::ostringstream ss;
    (ss << ... << args);
    (void)file;
    (void)line;
    throw Error(ss.str());
}
}  // namespace detail

}  // namespace normtape

// NT_CHECK(cond, "layer_norm: expected ", a, ", got ", b) throws normtape::Error when cond is false.
#define NT_CHECK(cond, ...)                                                  \
    do {                                                                     \
        if (!(cond)) ::normtape::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
