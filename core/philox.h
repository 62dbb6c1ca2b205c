// core/philox.h: Philox4x32-10, the counter-based generator of dropout's masks, and the global
// dropout stream (a seed and an offset) that manual_seed resets.
//
// Note [Counter-based masks]
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the generator of cuRAND's CURAND_RNG_PSEUDO_PHILOX4_32_10 and of FlashAttention's
// dropout) maps a 128-bit counter and a 64-bit key to four 32-bit words by ten rounds of
// multiplications and xors. A word is a pure function of (key, counter), so a mask is never
// stored: the backward draws it again from the two integers the forward used. One function here
// serves host and device code, so the cpu and the GPU draw the same mask bit for bit.
// A draw of n words takes the counters offset, offset + 1, ..., offset + ceil(n / 4) - 1 (as a
// 64-bit number in the counter's low two words) under key = seed: word i is word i % 4 of counter
// offset + i / 4. philox_next(n) hands out such a range of the global stream and moves its offset
// past it, as PyTorch's CUDA generator hands out Philox offsets, so consecutive calls never share
// a counter.
#pragma once

#include <cstdint>

#include "core/bf16.h"  // NT_HOST_DEVICE

namespace normtape {

struct PhiloxWords {
    uint32_t w[4];
};

// Philox4x32-10 of the 128-bit counter (c0 least significant) under the 64-bit key (k0, k1).
// Matches Random123's philox4x32_10 and cuRAND's curand_Philox4x32_10.
NT_HOST_DEVICE inline PhiloxWords philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                 uint32_t k1) {
    constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
    constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule: golden ratio, sqrt(3) - 1
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0, p1 = static_cast<uint64_t>(kMul1) * c2;
        const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
        const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += kWeyl0;
        k1 += kWeyl1;
    }
    return {{c0, c1, c2, c3}};
}

// A range of the dropout stream: word i of it is philox_word(state, i).
struct PhiloxState {
    uint64_t seed = 0;
    uint64_t offset = 0;  // in counters (4 words each)
};

// Word i (0-based) of the range that starts at state (Note [Counter-based masks]).
NT_HOST_DEVICE inline uint32_t philox_word(PhiloxState s, uint64_t i) {
    const uint64_t counter = s.offset + i / 4;
    return philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0,
                         static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32))
        .w[i % 4];
}

// The dropout rule: an element whose word is below drop_threshold(p) is zeroed, the others are
// scaled by 1 / (1 - p) (Srivastava et al. 2014, inverted dropout, as torch.nn.functional.dropout).
// The threshold is round(p * 2^32), so an element is dropped with probability p to within 2^-33.
// p must be in [0, 1); the callers check it.
NT_HOST_DEVICE inline uint32_t drop_threshold(double p) {
    const double t = p * 4294967296.0 + 0.5;
    return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}
NT_HOST_DEVICE inline bool dropout_keep(uint32_t word, uint32_t threshold) { return word >= threshold; }

// Dropout with probability p over the words of a range of the stream: element i is kept (and
// scaled by 1 / (1 - p)) unless philox_word(state, i) < drop_threshold(p). p == 0 keeps every
// element without drawing. Passed by value to kernels.
struct DropoutMask {
    PhiloxState state;
    double p = 0;
    uint32_t threshold = 0;

    DropoutMask() = default;
    DropoutMask(PhiloxState s, double p_) : state(s), p(p_), threshold(drop_threshold(p_)) {}
    NT_HOST_DEVICE bool active() const { return p > 0; }
    NT_HOST_DEVICE bool keep(uint64_t i) const { return dropout_keep(philox_word(state, i), threshold); }
};

// The global dropout stream. Returns the state a draw of n words uses and moves the offset past
// it (ceil(n / 4) counters). manual_seed(seed) sets the stream to (seed, 0). Never throws.
PhiloxState philox_next(uint64_t n);
// The stream's current state, and setting it (to resume a run whose steps drew from it).
PhiloxState philox_state();
void set_philox_state(PhiloxState state);

}  // namespace normtape
