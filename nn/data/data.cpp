// nn/data/data.cpp: Batcher (nn/data/data.h).
#include "nn/data/data.h"

#include <sstream>
#include <utility>

#include "core/check.h"

namespace normtape {

namespace {
std::vector<uint32_t> bytes_of(const std::string& text) {
    std::vector<uint32_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
}
}  // namespace

Batcher::Batcher(const std::string& text, int64_t B, int64_t T, int64_t vocab_size, uint64_t seed, Device device)
    : Batcher(bytes_of(text), B, T, vocab_size, seed, device) {}

Batcher::Batcher(std::vector<uint32_t> tokens, int64_t B, int64_t T, int64_t vocab_size, uint64_t seed, Device device)
    : tokens_(std::move(tokens)), B_(B), T_(T), V_(vocab_size), rng_(seed), device_(device) {
    NT_CHECK_AS(ShapeError, B >= 1 && T >= 1, "Batcher: expected a batch size B >= 1 and a block size T >= 1, got B ",
                B, " and T ", T);
    // Every size next() computes, checked once here: a window's T + 1 tokens, the B * (T + 1)
    // tokens a batch reads, and the B * T elements and B * T * 8 bytes of each i64 tensor.
    int64_t window = 0, read = 0, numel = 0, bytes = 0;
    NT_CHECK_AS(ShapeError, !__builtin_add_overflow(T, int64_t(1), &window), "Batcher: expected a block size T whose T + 1 fits in int64, got T ",
                T, ", whose T + 1 would overflow");
    NT_CHECK_AS(ShapeError,
                !__builtin_mul_overflow(B, window, &read) && !__builtin_mul_overflow(B, T, &numel) &&
                    !__builtin_mul_overflow(numel, static_cast<int64_t>(sizeof(int64_t)), &bytes),
                "Batcher: expected B * T tokens of 8 bytes (and B * (T + 1)) to fit in int64, got B ", B, " and T ", T,
                ", whose product would overflow");
    NT_CHECK_AS(ShapeError, vocab_size >= 1, "Batcher: expected vocab_size >= 1, got ", vocab_size);
    if (tokens_.empty()) return;  // random tokens
    NT_CHECK_AS(ShapeError, tokens_.size() >= static_cast<uint64_t>(window), "Batcher: expected at least T + 1 = ",
                window, " tokens for windows of T = ", T, " and their targets, got ", tokens_.size());
    for (size_t i = 0; i < tokens_.size(); ++i)
        NT_CHECK(tokens_[i] < static_cast<uint64_t>(vocab_size), "Batcher: expected token ids below vocab_size ",
                 vocab_size, ", got ", tokens_[i], " at position ", i);
}

Batch Batcher::next() {
    // The sizes fit in int64 (checked by the constructor); the memory may not be there.
    const int64_t bytes = B_ * T_ * static_cast<int64_t>(sizeof(int64_t));
    Tensor x, y;
    try {
        x = empty({B_, T_}, TensorOptions().dtype(DType::I64));
        y = empty({B_, T_}, TensorOptions().dtype(DType::I64));
    } catch (const OutOfMemoryError& e) {
        detail::throw_error<OutOfMemoryError>("Batcher: cannot allocate a batch of two [", B_, ", ", T_, "] i64 tensors (",
                                              bytes, " bytes each) on the host: ", e.what());
    }
    int64_t* px = x.data_ptr<int64_t>();
    int64_t* py = y.data_ptr<int64_t>();
    for (int64_t b = 0; b < B_; ++b) {
        if (tokens_.empty()) {
            for (int64_t t = 0; t < T_; ++t) {
                px[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
                py[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
            }
            continue;
        }
        uint64_t s = rng_() % (tokens_.size() - static_cast<uint64_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
            px[b * T_ + t] = tokens_[s + t];
            py[b * T_ + t] = tokens_[s + t + 1];
        }
    }
    if (device_.is_cuda()) {
        try {
            x = x.to(device_);
            y = y.to(device_);
        } catch (const OutOfMemoryError& e) {
            detail::throw_error<OutOfMemoryError>("Batcher: cannot copy a batch of two [", B_, ", ", T_, "] i64 tensors (",
                                                  bytes, " bytes each) to ", device_name(device_), ": ", e.what());
        }
    }
    return {x, y};
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
