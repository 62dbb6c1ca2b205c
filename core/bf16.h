// core/bf16.h: bf16, the storage type of DType::BF16 (bfloat16: 1 sign, 8 exponent and 7
// mantissa bits, the upper half of an IEEE f32). Arithmetic is never done in bf16: values
// convert to float (exactly) and back (round to nearest even, NaN kept NaN). Usable in host and
// device code; the layout is that of CUDA's __nv_bfloat16.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define NT_HOST_DEVICE __host__ __device__
#else
#define NT_HOST_DEVICE
#endif

namespace normtape {

struct bf16 {
    uint16_t bits = 0;

    bf16() = default;
    // From any arithmetic value, through float (implicit, like a built-in floating type).
    template <class U, class = std::enable_if_t<std::is_arithmetic_v<U>>>
    NT_HOST_DEVICE bf16(U value) : bits(round_to_bf16(static_cast<float>(value))) {}  // NOLINT
    NT_HOST_DEVICE operator float() const {  // NOLINT: implicit, exact
        uint32_t u = static_cast<uint32_t>(bits) << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }

    static NT_HOST_DEVICE uint16_t round_to_bf16(float f) {
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
        u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
        return static_cast<uint16_t>(u >> 16);
    }
};

static_assert(sizeof(bf16) == 2, "bf16 must be two bytes");

}  // namespace normtape
