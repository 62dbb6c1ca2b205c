// nn/model/generate.cpp: the key/value cache, the cached forward and sampling (nn/model/generate.h).
#include "nn/model/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "ops/attention.h"
#include "ops/elementwise.h"

namespace normtape {

namespace {

const Tensor& first_parameter(const GPT& model) { return model.wte->weight; }

// Sampling is inference: a model with dropout must be in evaluation mode, or its forward would drop.
void check_eval_mode(const char* op, const GPT& model) {
    NT_CHECK(!model.is_training() || model.config().dropout == 0, op,
             ": expected a model in evaluation mode (model.eval()): it has dropout ", model.config().dropout,
             ", which drops in training mode");
}

}  // namespace

KVCache::KVCache(const GPT& model, int64_t batch_size)
    : capacity_(model.config().block_size), batch_size_(batch_size), n_embd_(model.config().n_embd),
      dtype_(first_parameter(model).dtype()), device_(first_parameter(model).device()) {
    NT_CHECK_AS(ShapeError, batch_size >= 1, "KVCache: expected batch_size >= 1, got ", batch_size);
    const GPTConfig& c = model.config();
    TensorOptions opts = TensorOptions().dtype(dtype_).device(device_);
    const int64_t hs = c.n_embd / c.n_head;
    for (size_t i = 0; i < model.h.size(); ++i) {
        KVLayer layer;
        if (c.separate_qkv()) {
            layer.k = empty({batch_size, capacity_, c.kv_heads(), hs}, opts);
            layer.v = empty({batch_size, capacity_, c.kv_heads(), hs}, opts);
        } else {
            layer.qkv = empty({batch_size, capacity_, 3 * n_embd_}, opts);
        }
        layers_.push_back(std::move(layer));
    }
}

// GPT::forward's steps (embed, the blocks, head), each block's attention reading the cache's rows
// 0 .. pos + n - 1 and computing the rows pos .. pos + n - 1 only (Note [The key/value cache]).
Tensor forward_cached(const GPT& model, KVCache& cache, const Tensor& idx_new) {
    const char* op = "forward_cached";
    const Tensor& w = first_parameter(model);
    check_eval_mode(op, model);
    NT_CHECK(idx_new.defined(), op, ": expected idx_new of shape [B, n] i64, got an undefined tensor");
    NT_CHECK_AS(DTypeError, idx_new.dtype() == DType::I64, op, ": expected idx_new of shape [B, n] i64, got ",
                shape_str(idx_new.shape()), " ", dtype_name(idx_new.dtype()));
    NT_CHECK_AS(ShapeError, idx_new.dim() == 2, op, ": expected idx_new of shape [B, n] i64, got ",
                shape_str(idx_new.shape()));
    const int64_t B = idx_new.size(0), n = idx_new.size(1), pos = cache.length_;
    const bool separate = model.config().separate_qkv();
    NT_CHECK_AS(ShapeError, cache.layers_.size() == model.h.size() && cache.capacity_ == model.config().block_size &&
                                cache.n_embd_ == model.config().n_embd &&
                                (cache.layers_.empty() || cache.layers_[0].k.defined() == separate),
                op, ": expected a cache made for this model (n_layer ", model.h.size(), ", block_size ",
                model.config().block_size, ", n_embd ", model.config().n_embd, "), got one of n_layer ",
                cache.layers_.size(), ", block_size ", cache.capacity_, ", n_embd ", cache.n_embd_);
    NT_CHECK_AS(DTypeError, cache.dtype_ == w.dtype(), op, ": expected a cache of the model's dtype ",
                dtype_name(w.dtype()), ", got ", dtype_name(cache.dtype_));
    NT_CHECK_AS(DeviceError, cache.device_ == w.device() && idx_new.device() == w.device(), op,
                ": expected idx_new and the cache on the model's device ", device_name(w.device()), ", got ",
                device_name(idx_new.device()), " and ", device_name(cache.device_));
    NT_CHECK_AS(ShapeError, B == cache.batch_size_, op, ": expected idx_new of batch size ", cache.batch_size_,
                " (the cache's), got shape ", shape_str(idx_new.shape()));
    NT_CHECK_AS(ShapeError, n >= 1 && pos + n <= cache.capacity_, op, ": expected 1 to ", cache.capacity_ - pos,
                " new positions (the cache holds ", pos, " of block_size = ", cache.capacity_, "), got ", n);
    NoGradGuard no_grad;
    Tensor x = model.embed(idx_new, pos);
    for (size_t i = 0; i < model.h.size(); ++i) x = model.h[i]->forward(std::move(x), pos, &cache.layers_[i]);
    cache.length_ = pos + n;
    return model.head(x);
}

namespace {

// The next token from the last row of `logits` [1, n, V], drawn as generate() says (nn/model/generate.h),
// after the model's logit softcap (softcap * tanh(z / softcap); none at 0), as loss() sees them.
// p_i = exp((z_i - max z) / temperature), the same softmax as exp(z_i / temperature) normalized,
// without overflow at small temperatures.
int64_t sample(const Tensor& logits, double softcap, const SamplingOptions& o, std::mt19937_64& rng) {
    const int64_t V = logits.size(2);
    std::vector<double> z = logits.narrow(1, logits.size(1) - 1, 1).to(Device::CPU).to(DType::F64).to_vector<double>();
    for (int64_t i = 0; i < V; ++i)
        NT_CHECK(std::isfinite(z[i]), "generate: expected finite logits, got ", z[i], " for token ", i,
                 " (a model whose training diverged?)");
    if (softcap > 0)
        for (double& zi : z) zi = softcap * std::tanh(zi / softcap);
    if (o.temperature == 0) return std::max_element(z.begin(), z.end()) - z.begin();
    double cut = -std::numeric_limits<double>::infinity();
    if (o.top_k > 0 && o.top_k < V) {  // nanoGPT: the logits below the k-th largest are left out
        std::vector<double> sorted = z;
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<double>());
        cut = sorted[o.top_k - 1];
    }
    const double m = *std::max_element(z.begin(), z.end());
    std::vector<double> p(V, 0.0);
    double total = 0;
    for (int64_t i = 0; i < V; ++i)
        if (z[i] >= cut) total += p[i] = std::exp((z[i] - m) / o.temperature);
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // uniform in [0, 1), 53 bits
    const double target = u * total;
    double cumulative = 0;
    int64_t last = 0;
    for (int64_t i = 0; i < V; ++i) {
        if (p[i] == 0) continue;
        cumulative += p[i];
        last = i;
        if (cumulative > target) return i;
    }
    return last;  // rounding left the sum just short of the target: the last token that may be drawn
}

Tensor ids_tensor(const std::vector<int64_t>& tokens, int64_t begin, int64_t end, Device device) {
    std::vector<int64_t> ids(tokens.begin() + begin, tokens.begin() + end);
    return from_vector<int64_t>(ids, {1, end - begin}).to(device);
}

}  // namespace

std::vector<int64_t> generate(const GPT& model, std::vector<int64_t> prompt, int64_t max_new_tokens,
                              const SamplingOptions& o, const std::function<void(int64_t token)>& on_token) {
    const int64_t V = model.config().vocab_size, block_size = model.config().block_size;
    NT_CHECK_AS(ShapeError, !prompt.empty(), "generate: expected a prompt of at least one token, got an empty one");
    for (size_t i = 0; i < prompt.size(); ++i)
        NT_CHECK(prompt[i] >= 0 && prompt[i] < V, "generate: expected prompt tokens in [0, V = ", V, "), got ",
                 prompt[i], " at position ", i);
    NT_CHECK(max_new_tokens >= 0, "generate: expected max_new_tokens >= 0, got ", max_new_tokens);
    NT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
             "generate: expected a temperature >= 0 and finite (0: greedy), got ", o.temperature);
    NT_CHECK(o.top_k >= 0, "generate: expected top_k >= 0 (0: all tokens), got ", o.top_k);
    check_eval_mode("generate", model);
    NoGradGuard no_grad;
    const Device device = first_parameter(model).device();
    const int64_t keep = std::max<int64_t>(1, block_size / 2);  // Note [Context longer than block_size]
    std::vector<int64_t> tokens = std::move(prompt), out;
    const int64_t prompt_length = static_cast<int64_t>(tokens.size());
    int64_t start = std::max<int64_t>(0, prompt_length - block_size);  // the context is tokens[start, end)
    std::mt19937_64 rng(o.seed);
    std::optional<KVCache> cache;  // holds the positions tokens[start, start + cache->length())
    if (o.use_cache && max_new_tokens > 0) cache.emplace(model, 1);
    for (int64_t k = 0; k < max_new_tokens; ++k) {
        const int64_t end = static_cast<int64_t>(tokens.size());
        if (end - start > block_size) {  // the restart: one prefill of the last `keep` tokens
            start = end - keep;
            if (cache) cache->clear();
        }
        Tensor logits = cache ? forward_cached(model, *cache, ids_tensor(tokens, start + cache->length(), end, device))
                              : model.forward(ids_tensor(tokens, start, end, device));
        const int64_t next = sample(logits, model.config().logit_softcap, o, rng);
        tokens.push_back(next);
        out.push_back(next);
        if (on_token) on_token(next);
    }
    return out;
}

}  // namespace normtape
