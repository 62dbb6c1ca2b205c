// core/random.cpp: the global generator (std::mt19937_64, seeded by manual_seed, which also seeds
// every GPU's cuRAND generator and resets the dropout stream of core/philox.h) and the scalar
// samples drawn from it, the same on every platform.
// Not here: randn, the factory that fills a tensor from it (core/factories.cpp).
#include "core/tensor.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "core/philox.h"
#include "core/tensor_cuda.h"

namespace normtape {

namespace {

std::mt19937_64& generator() {
    static std::mt19937_64 gen(0);
    return gen;
}

PhiloxState& dropout_stream() {
    static PhiloxState state;
    return state;
}

}  // namespace

void manual_seed(uint64_t seed) {
    generator().seed(seed);
    dropout_stream() = PhiloxState{seed, 0};
#if NORMTAPE_WITH_CUDA
    detail::cuda_manual_seed(seed);
#endif
}

PhiloxState philox_next(uint64_t n) {
    PhiloxState s = dropout_stream();
    dropout_stream().offset += n / 4 + (n % 4 != 0);
    return s;
}

PhiloxState philox_state() { return dropout_stream(); }

void set_philox_state(PhiloxState state) { dropout_stream() = state; }

double rand_scalar() {
    // 53 random bits -> [0, 1), identical on every platform (std::uniform_real_distribution is not).
    return static_cast<double>(generator()() >> 11) * 0x1.0p-53;
}

double randn_scalar() {
    // Box-Muller; one sample per call keeps the stream simple to reproduce.
    double u1 = rand_scalar(), u2 = rand_scalar();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace normtape
