// core/random.cpp: the global generator (std::mt19937_64, seeded by manual_seed, which also seeds
// every GPU's cuRAND generator) and the scalar samples drawn from it, the same on every platform.
// Not here: randn, the factory that fills a tensor from it (core/factories.cpp).
#include "core/tensor.h"

#include <cmath>
#include <cstdint>
#include <random>

#include "core/tensor_cuda.h"

namespace normtape {

namespace {

std::mt19937_64& generator() {
    static std::mt19937_64 gen(0);
    return gen;
}

}  // namespace

void manual_seed(uint64_t seed) {
    generator().seed(seed);
#if NORMTAPE_WITH_CUDA
    detail::cuda_manual_seed(seed);
#endif
}

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
