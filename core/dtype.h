// core/dtype.h: element types of tensor data.
//
// F32 and BF16 are training dtypes (BF16 is storage only: arithmetic is done in f32), F64 is for
// gradient checks and references (every op takes it, on the cpu and on CUDA), I64 holds token ids. Statistics (the norms' mean and
// rstd) are F64 for F64 data and F32 otherwise: stat_dtype().
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/bf16.h"

namespace normtape {

enum class DType { F32, F64, BF16, I64 };

// Bytes per element.
inline size_t element_size(DType dtype) {
    switch (dtype) {
        case DType::F32: return 4;
        case DType::F64: return 8;
        case DType::BF16: return 2;
        case DType::I64: return 8;
    }
    return 0;
}

// "f32", "f64", "bf16", "i64": the names used in messages, the CLI and JSON.
inline const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F32: return "f32";
        case DType::F64: return "f64";
        case DType::BF16: return "bf16";
        case DType::I64: return "i64";
    }
    return "?";
}

inline bool is_floating(DType dtype) { return dtype != DType::I64; }

// The dtype of statistics and optimizer state for data of `dtype`: f64 for f64, f32 otherwise.
inline DType stat_dtype(DType dtype) { return dtype == DType::F64 ? DType::F64 : DType::F32; }

// The DType of a C++ element type: dtype_of<float>() == DType::F32.
// acc_t<T>: the type arithmetic on T is done in (double for double, float otherwise).
template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) return DType::F32;
    else if constexpr (std::is_same_v<T, double>) return DType::F64;
    else if constexpr (std::is_same_v<T, bf16>) return DType::BF16;
    else {
        static_assert(std::is_same_v<T, int64_t>, "normtape: unsupported element type");
        return DType::I64;
    }
}

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

}  // namespace normtape
