// tests/test_memory.cpp: the memory a GPT saves under each preset (gpt2, nanochat, llama) and
// policy, and what the Output and Normalized policies and activation recompute save, measured by
// the tape (saved_bytes) and by the allocator, against predictions, to the byte.
#include <unistd.h>

#include "core/cuda_allocator.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

struct AfterForward {
    int64_t saved, allocated;
    bool norm_input_saved;  // a norm node holds its input x (the saved-tensor report)
};

// saved_bytes() and live allocator bytes right after the forward of one batch, loss alive.
AfterForward measure(const GPTConfig& config, SavePolicy policy, int64_t B, int64_t T) {
    manual_seed(5);
    GPTConfig c = config;
    c.policy = policy;
    GPT model(c);
    std::vector<int64_t> ids(B * T);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 37) % c.vocab_size);
    Tensor idx = from_vector(ids, {B, T}), targets = from_vector(ids, {B, T});
    int64_t before = memory_stats(Device::CPU).allocated_bytes;
    Tensor loss = model.loss(idx, targets);
    AfterForward r{saved_bytes(), memory_stats(Device::CPU).allocated_bytes - before, false};
    for (const SavedTensorEntry& e : saved_tensors_report().entries)
        for (const SavedTensorHolder& h : e.holders)
            r.norm_input_saved = r.norm_input_saved || (h.grad_fn.find("NormBackward") != std::string::npos && h.slot == "x");
    loss.backward();
    CHECK(saved_bytes() == 0);
    return r;
}

}  // namespace

TEST_SUITE("memory") {

TEST_CASE("memory: every preset under every policy saves predicted_saved_bytes, in the tape and the allocator") {
    // fused_head_loss: the same less the logits, which are then never whole in memory.
    const int64_t B = 2, T = 9;
    for (const char* arch : {"gpt2", "nanochat", "llama"}) {
        for (int64_t kv_heads : {0, 2}) {
            if (kv_heads && std::string(arch) == "gpt2") continue;
            for (DType dtype : {DType::F32, DType::BF16}) {
                for (auto [recompute, fused] : {std::pair{true, false}, {false, false}, {true, true}, {false, true}}) {
                    GPTConfig c = gpt_config(arch);
                    c.block_size = 16, c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.dtype = dtype;
                    c.n_kv_head = kv_heads, c.recompute_activation = recompute, c.fused_head_loss = fused;
                    CAPTURE(arch);
                    CAPTURE(kv_heads);
                    CAPTURE(dtype_name(dtype));
                    CAPTURE(recompute);
                    CAPTURE(fused);
                    for (SavePolicy policy : kSavePolicies) {
                        CAPTURE(policy_name(policy));
                        c.policy = policy;
                        AfterForward r = measure(c, policy, B, T);
                        CHECK(r.saved == predicted_saved_bytes(c, B, T));
                        // Nothing else lives: the saved tensors (less the ids and targets, made before the
                        // forward) and the loss, a 0-dim tensor.
                        CHECK(r.allocated == r.saved - 2 * B * T * 8 + static_cast<int64_t>(element_size(dtype)));
                        CHECK(r.norm_input_saved == (policy == SavePolicy::Input));
                    }
                    c.policy = SavePolicy::Input;
                    CHECK(measure(c, SavePolicy::Input, B, T).saved - measure(c, SavePolicy::Output, B, T).saved ==
                          predicted_saving_bytes(c, B, T));
                }
            }
        }
    }
}

TEST_CASE("memory: with dropout every preset saves predicted_saved_bytes, its bytes without dropout (no mask)") {
    const int64_t B = 2, T = 9;
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (SavePolicy policy : kSavePolicies) {
            CAPTURE(arch);
            CAPTURE(policy_name(policy));
            GPTConfig c = gpt_config(arch);
            c.block_size = 16, c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.dtype = DType::BF16, c.policy = policy;
            const int64_t without = measure(c, policy, B, T).saved;
            c.dropout = 0.1;
            AfterForward r = measure(c, policy, B, T);
            CHECK(r.saved == without);
            CHECK(r.saved == predicted_saved_bytes(c, B, T));
        }
}

TEST_CASE("memory: Output saves exactly (2L+1) norm inputs (and LayerNorm means) over Input") {
    for (NormKind norm : {NormKind::Layer, NormKind::RMS}) {
        for (DType dtype : {DType::F32, DType::F64}) {
            for (int64_t L : {1, 3}) {
                GPTConfig c{.block_size = 16, .n_layer = L, .n_head = 2, .n_embd = 24, .norm = norm, .dtype = dtype};
                const int64_t B = 3, T = 10;
                CAPTURE(norm_kind_name(norm));
                CAPTURE(dtype_name(dtype));
                CAPTURE(L);
                AfterForward in = measure(c, SavePolicy::Input, B, T);
                AfterForward out = measure(c, SavePolicy::Output, B, T);
                int64_t predicted = predicted_saving_bytes(c, B, T);
                int64_t per_norm = B * T * c.n_embd + (norm == NormKind::Layer ? B * T : 0);
                CHECK(predicted == (2 * L + 1) * per_norm * static_cast<int64_t>(element_size(dtype)));
                CHECK(in.saved - out.saved == predicted);
                // The allocator agrees: the freed norm inputs are really gone, not just uncounted.
                CHECK(in.allocated - out.allocated == predicted);
            }
        }
    }
}

TEST_CASE("memory: Normalized saves what Output saves, and GELU recompute L * 4 * B*T*C elements more") {
    for (NormKind norm : {NormKind::Layer, NormKind::RMS}) {
        for (DType dtype : {DType::F32, DType::BF16}) {
            const int64_t L = 2, B = 3, T = 10;
            GPTConfig c{.block_size = 16, .n_layer = L, .n_head = 2, .n_embd = 24, .norm = norm, .dtype = dtype};
            c.recompute_activation = false;
            CAPTURE(norm_kind_name(norm));
            CAPTURE(dtype_name(dtype));
            AfterForward out = measure(c, SavePolicy::Output, B, T);
            AfterForward normalized = measure(c, SavePolicy::Normalized, B, T);
            CHECK(normalized.saved == out.saved);
            CHECK(normalized.allocated == out.allocated);
            c.recompute_activation = true;
            AfterForward recomputed = measure(c, SavePolicy::Normalized, B, T);
            const int64_t gelu_bytes = L * 4 * B * T * c.n_embd * static_cast<int64_t>(element_size(dtype));  // H = 4C
            CHECK(predicted_recompute_saving_bytes(c, B, T) == gelu_bytes);
            CHECK(normalized.saved - recomputed.saved == gelu_bytes);
            // The allocator agrees: gelu(h) is gone after the forward, not just uncounted.
            CHECK(normalized.allocated - recomputed.allocated == gelu_bytes);
        }
    }
}

TEST_CASE("memory: at a fixed number of tokens the saved bytes do not depend on T") {
    // Attention saves qkv, out and one statistic a row per head, no T x T tensor: every saved
    // tensor of the GPT is linear in B * T.
    for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output}) {
        GPTConfig c{.block_size = 64, .n_layer = 2, .n_head = 2, .n_embd = 16, .policy = policy};
        CAPTURE(std::string(policy_name(policy)));
        AfterForward a = measure(c, policy, 8, 8), b = measure(c, policy, 4, 16), d = measure(c, policy, 1, 64);
        CHECK(a.saved == b.saved);
        CHECK(a.saved == d.saved);
    }
}

TEST_CASE("memory: after backward and with the graph dropped, the allocator is back where it started") {
    GPTConfig c{.block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
    manual_seed(6);
    GPT model(c);
    Tensor idx = from_vector(std::vector<int64_t>(16, 7), {2, 8});
    int64_t before = memory_stats(Device::CPU).allocated_bytes;
    {
        Tensor loss = model.loss(idx, idx);
        loss.backward();
    }
    int64_t grads = 0;
    for (const Tensor& p : model.parameters()) grads += p.grad().nbytes();
    CHECK(memory_stats(Device::CPU).allocated_bytes == before + grads);
    model.zero_grad();
    CHECK(memory_stats(Device::CPU).allocated_bytes == before);
}

TEST_CASE("memory: NORMTAPE_NO_CUDA_MEMORY_CACHING turns caching off at 1, and refuses what is not 0 or 1") {
    CHECK(detail::cuda_memory_caching_setting(nullptr));
    CHECK(detail::cuda_memory_caching_setting(""));
    CHECK(detail::cuda_memory_caching_setting("0"));
    CHECK_FALSE(detail::cuda_memory_caching_setting("1"));
    for (const char* wrong : {"yes", "true", "2", " 1", "10"})
        CHECK_THROWS_KIND_WITH(detail::cuda_memory_caching_setting(wrong), Error, "NORMTAPE_NO_CUDA_MEMORY_CACHING",
                               "unset, empty, 0 or 1", std::string("got \"") + wrong + "\"");
}

TEST_CASE("memory: memory_available_bytes on the cpu is above 0 and at most the machine's memory") {
    const int64_t available = memory_available_bytes(Device::CPU);
    const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
    CHECK(available > 0);
    CHECK(available <= physical);
}

}  // TEST_SUITE
