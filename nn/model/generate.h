// nn/model/generate.h: sampling tokens from a GPT (nn/model/gpt.h), as nanoGPT's GPT.generate and sample.py,
// with a key/value cache. Not here: reading a checkpoint or text (examples/generate/generate.cpp).
//
// Dimensions as nn/model/gpt.h: B batch, C = n_embd, L = n_layer, V = vocab_size, block_size the
// longest context; t the positions in the cache, n the new ones.
//
// Note [The key/value cache]
// Position s's output at layer l depends on the earlier positions only through their k and v rows
// at layer l, which do not change when later tokens arrive (causal attention; the rotary
// embedding of a row depends on its own position only). KVCache keeps, per layer, those rows of
// the positions seen so far (KVLayer, nn/model/gpt.h), so a new token costs its own projections and one
// attention row over the t cached positions: O(L * C * (C + t)) per token, against
// O(L * t * C * (C + t)) for a forward of the whole context (generate with use_cache = false, the
// reference). For GPT-2's block the cache holds the packed qkv rows [B, block_size, 3C], q
// included, because causal_self_attention_rows reads the packed layout (a third more than keys
// and values alone); for the others the rotated (and normalized) k and v, [B, block_size, NKV,
// hs] each: L * B * block_size * 2 * NKV * hs elements of the model's dtype, allocated when it is
// made. forward_cached runs GPT::forward's own steps (GPT::embed, Block::forward with the layer's
// cache, GPT::head), so the two cannot drift apart.
// Sampling is inference: a model with dropout must be in evaluation mode (Module::eval()).

// Note [Context longer than block_size]
// The model sees at most block_size positions. When the next token would not fit, both modes
// restart the context from the last max(1, block_size / 2) tokens: the cache is cleared and
// refilled by one forward of those tokens (a prefill), which gives the next token's logits. So
// a restart costs one forward of block_size / 2 tokens every block_size / 2 tokens: linear in
// the tokens generated, amortized. A prompt longer than block_size starts from its last
// block_size tokens. use_cache = false follows the same rule with a whole forward per token, so
// both modes see the same contexts and agree to rounding. (nanoGPT instead crops the context to
// its last block_size tokens at every token, which a cache of absolute positions cannot do
// without recomputing all of them.)
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/model/gpt.h"

namespace normtape {

// The qkv rows of the positions a model has seen (Note [The key/value cache]).
class KVCache {
public:
    // Allocates, for each of model's L layers, its KVLayer (a [batch_size, block_size, 3C] qkv, or
    // k and v [batch_size, block_size, NKV, hs]) of the model's parameters' dtype and device,
    // empty (length() = 0). Throws ShapeError, naming KVCache, on batch_size < 1; OutOfMemoryError or
    // DeviceError as empty() does.
    KVCache(const GPT& model, int64_t batch_size);

    int64_t length() const { return length_; }          // positions held, 0 .. block_size
    int64_t capacity() const { return capacity_; }      // block_size
    int64_t batch_size() const { return batch_size_; }  // B
    // Layer i's rows (KVLayer, nn/model/gpt.h): qkv [B, block_size, 3C], or k and v [B, block_size,
    // NKV, hs]; those from length() on are not yet written.
    const KVLayer& layer(int64_t i) const { return layers_.at(static_cast<size_t>(i)); }
    // Forgets every position (length() = 0); keeps the memory.
    void clear() { length_ = 0; }

private:
    friend Tensor forward_cached(const GPT& model, KVCache& cache, const Tensor& idx_new);
    std::vector<KVLayer> layers_;
    int64_t length_ = 0, capacity_ = 0, batch_size_ = 0, n_embd_ = 0;
    DType dtype_;
    Device device_;
};

// forward_cached(model, cache, idx_new): GPT::forward of the tokens idx_new at positions
// cache.length() .. cache.length() + n - 1, given the positions before them in the cache:
// appends the new positions' qkv rows to the cache (its length grows by n) and returns their
// logits. With a cache filled from position 0, the logits equal the last n rows of
// model.forward(whole sequence) to rounding (Note [The key/value cache]).
// idx_new: [B, n] i64 token ids in [0, V), on the model's device, B = cache.batch_size(),
// 1 <= n <= block_size - cache.length(). Returns logits [B, n, V] of the model's dtype and device.
// Runs under NoGradGuard: records and saves nothing. Work: O(L * n * C * (C + cache.length() + n)).
// Throws, naming forward_cached: Error on an undefined idx_new or an id out of range (as
// embedding()); DTypeError on idx_new not i64; ShapeError on idx_new not 2-D, another batch size
// than the cache's, n < 1, n past the cache's capacity (the message gives length and capacity), or
// a cache made for a model of another shape; DTypeError on a cache of another dtype than the
// model's; DeviceError on idx_new or the cache on another device than the model's; Error on a
// model with dropout in training mode (call model.eval() first).
Tensor forward_cached(const GPT& model, KVCache& cache, const Tensor& idx_new);

// How generate() picks each token.
struct SamplingOptions {
    // Logits are divided by it before the softmax; 0 takes the most likely token (argmax, the
    // lowest id among equals) and draws nothing.
    double temperature = 1.0;
    // Only the top_k most likely tokens (and those equal to the k-th) may be drawn, as nanoGPT;
    // 0: all V; above V: all V.
    int64_t top_k = 0;
    // Seeds generate()'s own std::mt19937_64; the global generator (manual_seed) is not touched.
    uint64_t seed = 1337;
    // false: a forward of the whole context per token (the reference, O(L * t * C * (C + t)) each).
    bool use_cache = true;
};

// generate(model, prompt, max_new_tokens, options, on_token): max_new_tokens tokens that follow
// `prompt`, each drawn from softmax(logits / temperature) over the top_k most likely (nanoGPT's
// GPT.generate, Karpathy 2022), or the argmax at temperature 0. A token is drawn in f64, on the
// host, the same way on every platform: u = (next 64-bit word >> 11) * 2^-53 in [0, 1), and the
// token is the first id whose cumulative probability exceeds u times their sum (not
// std::discrete_distribution, whose algorithm the standard leaves open). So one seed gives the
// same tokens on every run, and with use_cache on or off (to the rounding of the logits).
// The context follows Note [Context longer than block_size].
// prompt: one or more token ids in [0, V) (one token, e.g. the byte '\n', starts a sample from
// nothing, as train_gpt --sample does). Returns the new tokens only (max_new_tokens of them);
// on_token, when given, is called with each as soon as it is drawn (to print it).
// Runs under NoGradGuard on the model's device and dtype, batch size 1. Work: with the cache
// O(L * C * (C + t)) per token, t <= block_size the context's length; without it
// O(L * t * C * (C + t)) per token; plus, for both, one forward of up to block_size tokens per
// block_size / 2 tokens when the context restarts.
// Throws, naming generate: ShapeError on an empty prompt; Error on a prompt token outside [0, V)
// (giving the token and its position), max_new_tokens < 0, temperature < 0 or not finite, or
// top_k < 0, or a model with dropout in training mode; and as forward_cached / GPT::forward
// (KVCache's allocation, the device).
std::vector<int64_t> generate(const GPT& model, std::vector<int64_t> prompt, int64_t max_new_tokens,
                              const SamplingOptions& options,
                              const std::function<void(int64_t token)>& on_token = nullptr);

}  // namespace normtape
