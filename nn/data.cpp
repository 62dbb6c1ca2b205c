// nn/data.cpp: Batcher (nn/data.h).
#include "nn/data.h"

#include <sstream>
#include <utility>
#include <vector>

#include "core/check.h"

namespace normtape {

Batcher::Batcher(std::string text, int64_t B, int64_t T, int64_t vocab_size, uint64_t seed, Device device)
    : text_(std::move(text)), B_(B), T_(T), V_(vocab_size), rng_(seed), device_(device) {
    NT_CHECK_AS(ShapeError, B >= 1 && T >= 1, "Batcher: expected a batch size B >= 1 and a block size T >= 1, got B ",
                B, " and T ", T);
    if (text_.empty()) {
        NT_CHECK_AS(ShapeError, vocab_size >= 1, "Batcher: expected vocab_size >= 1 for random tokens (an empty text), got ",
                    vocab_size);
    } else {
        NT_CHECK_AS(ShapeError, static_cast<int64_t>(text_.size()) >= T + 1, "Batcher: expected a text of at least T + 1 = ",
                    T + 1, " tokens for windows of T = ", T, " and their targets, got ", text_.size());
    }
}

Batch Batcher::next() {
    std::vector<int64_t> x(B_ * T_), y(B_ * T_);
    for (int64_t b = 0; b < B_; ++b) {
        if (text_.empty()) {
            for (int64_t t = 0; t < T_; ++t) {
                x[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
                y[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
            }
            continue;
        }
        uint64_t s = rng_() % (text_.size() - static_cast<uint64_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
            x[b * T_ + t] = static_cast<unsigned char>(text_[s + t]);
            y[b * T_ + t] = static_cast<unsigned char>(text_[s + t + 1]);
        }
    }
    TensorOptions opts = TensorOptions().device(device_);
    return {from_vector(x, {B_, T_}, opts), from_vector(y, {B_, T_}, opts)};
}

std::string Batcher::state() const {
    std::ostringstream ss;
    ss << rng_;
    return ss.str();
}

void Batcher::set_state(const std::string& state) {
    std::istringstream ss(state);
    std::mt19937_64 rng;
    ss >> rng;
    NT_CHECK(!ss.fail(), "Batcher: expected a generator state written by Batcher::state(), got ", state.size(),
             " characters that are not one");
    rng_ = rng;
}

}  // namespace normtape
