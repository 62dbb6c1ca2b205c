// core/dtype.h: element types of tensor data.
//
// F32 is the training dtype, F64 exists for gradient checks on the CPU, I64 holds token ids.
// Statistics of the norms (mean, rstd) are F32 for F32 data and F64 for F64 data.
// BF16 arrives with the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace normtape {

enum class DType { F32, F64, I64 };

// Bytes per element.
inline size_t element_size(DType dtype) {
    switch (dtype) {
        case DType::F32: return 4;
        case DType::F64: return 8;
        case DType::I64: return 8;
    }
    return 0;
}

// "f32", "f64", "i64": the names used in messages, the CLI and JSON.
inline const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::F32: return "f32";
        case DType::F64: return "f64";
        case DType::I64: return "i64";
    }
    return "?";
}

inline bool is_floating(DType dtype) { return dtype == DType::F32 || dtype == DType::F64; }

// The DType of a C++ element type: dtype_of<float>() == DType::F32.
template <class T>
constexpr DType dtype_of() {
    if constexpr (std::is_same_v<T, float>) return DType::F32;
    else if constexpr (std::is_same_v<T, double>) return DType::F64;
    else {
        static_assert(std::is_same_v<T, int64_t>, "normtape: unsupported element type");
        return DType::I64;
    }
}

}  // namespace normtape
