// core/check.h: the library's exceptions and the checks that throw them.
//
// User errors throw normtape::Error, or one of the kinds below it, with a message that names the
// op or file, what was expected and what was found; the library never exits. Catch Error for all
// of them. The macros are NT_CHECK*, not CHECK, so that they never collide with doctest's CHECK.
// (Kept to C++17: the .cu files include this header.)
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace normtape {

// Every error the library reports about its input or its use.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};
// A tensor of the wrong shape, or shapes that do not match each other.
class ShapeError : public Error {
public:
    using Error::Error;
};
// A tensor of a dtype the op does not take, or dtypes that do not match.
class DTypeError : public Error {
public:
    using Error::Error;
};
// A tensor on the wrong device, tensors on different devices, or a device that is not there.
class DeviceError : public Error {
public:
    using Error::Error;
};
// An allocation the host or the GPU could not satisfy (the message gives the bytes asked for).
class OutOfMemoryError : public Error {
public:
    using Error::Error;
};
// A file that cannot be opened, read, written or renamed.
class IOError : public Error {
public:
    using Error::Error;
};
// A file or document whose contents are not what its format requires (safetensors, JSON).
class FormatError : public Error {
public:
    using Error::Error;
};
// A NaN or Inf produced by an op's forward or a backward node while anomaly detection is on
// (set_detect_anomaly, core/anomaly.h); the message names the op or node and where the value is.
class AnomalyError : public Error {
public:
    using Error::Error;
};
// A collective or the start of a process group that failed or timed out (core/distributed.h): the message names the
// collective, the ranks that did not arrive, or the error string of NCCL or MPI.
class DistributedError : public Error {
public:
    using Error::Error;
};

namespace detail {
template <class Kind, class... Args>
[[noreturn]] void throw_error(const Args&... args) {
    std::ostringstream ss;
    (ss << ... << args);
    throw Kind(ss.str());
}
}  // namespace detail

}  // namespace normtape

// NT_CHECK(cond, "layer_norm: expected ", a, ", got ", b) throws normtape::Error when cond is
// false; NT_CHECK_AS(ShapeError, cond, ...) throws the kind named (one of the classes above).
#define NT_CHECK_AS(Kind, cond, ...)                                                          \
    do {                                                                                      \
        if (!(cond)) ::normtape::detail::throw_error<::normtape::Kind>(__VA_ARGS__);          \
    } while (0)
#define NT_CHECK(cond, ...) NT_CHECK_AS(Error, cond, __VA_ARGS__)
