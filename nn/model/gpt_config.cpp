// nn/model/gpt_config.cpp: GPTConfig and what is computed from it alone (nn/model/gpt.h): the presets, the
// checks, the parameter count. Not here: the modules (nn/model/gpt.cpp), which build a model from it.
#include <cmath>
#include <string>

#include "nn/model/gpt.h"

namespace normtape {

const char* pos_embedding_name(PosEmbedding p) { return p == PosEmbedding::Learned ? "learned" : "rotary"; }

const char* mlp_kind_name(MLPKind m) {
    switch (m) {
        case MLPKind::GELU: return "gelu";
        case MLPKind::ReLU2: return "relu2";
        case MLPKind::SwiGLU: return "swiglu";
    }
    return "?";
}

int64_t GPTConfig::hidden() const {
    if (mlp_hidden > 0) return mlp_hidden;
    if (mlp != MLPKind::SwiGLU) return 4 * n_embd;
    return (8 * n_embd / 3 + 63) / 64 * 64;  // Llama's 2/3 of 4C, to a multiple of 64
}

GPTConfig gpt_config(const std::string& arch) {
    GPTConfig c;
    if (arch == "gpt2") return c;
    if (arch == "nanochat") {
        c.pos_embedding = PosEmbedding::Rotary;
        c.qk_norm = true;
        c.norm = NormKind::RMS;
        c.norm_affine = false;
        c.mlp = MLPKind::ReLU2;
        c.bias = false;
        c.logit_softcap = 15.0;
        c.embedding_norm = true;
        c.zero_init_proj = true;
        return c;
    }
    if (arch == "llama") {
        c.pos_embedding = PosEmbedding::Rotary;
        c.norm = NormKind::RMS;
        c.mlp = MLPKind::SwiGLU;
        c.bias = false;
        return c;
    }
    NT_CHECK(false, "gpt_config: expected an architecture gpt2, nanochat or llama, got '", arch, "'");
    return c;
}

std::string arch_name(const GPTConfig& c) {
    for (const char* name : {"gpt2", "nanochat", "llama"}) {
        const GPTConfig p = gpt_config(name);
        if (c.pos_embedding == p.pos_embedding && c.qk_norm == p.qk_norm && c.norm == p.norm &&
            c.norm_affine == p.norm_affine && c.mlp == p.mlp && c.bias == p.bias && c.logit_softcap == p.logit_softcap &&
            c.embedding_norm == p.embedding_norm)
            return name;
    }
    return "custom";
}

namespace {
// The largest model and step the sizes may describe: far more than any machine holds, and far
// enough from int64's end that every sum of a step's bytes (parameters, gradients, the optimizers'
// state, the activations) fits. check_config and detail::check_step_shape refuse the rest.
constexpr double kMaxParameters = 0x1p54;
constexpr double kMaxActivationBytes = 0x1p58;

// The parameter elements of GPT(c) with the MLP's hidden width H, in the arithmetic N: double to
// bound them before int64 could overflow (check_config, H from hidden_bound), int64_t to count
// them (num_parameters, H = c.hidden()). c's sizes are positive and n_head divides n_embd.
template <class N>
N parameter_count(const GPTConfig& c, N H) {
    const N C = N(c.n_embd), V = N(c.vocab_size), hs = N(c.n_embd / c.n_head), NH = N(c.n_head), NKV = N(c.kv_heads());
    const N b = N(c.bias ? 1 : 0);
    const N norm = !c.norm_affine ? N(0) : c.norm == NormKind::Layer ? N(2) * C : C;  // weight (+ bias)
    const N qk_norms = c.qk_norm && c.norm_affine ? N(2) * hs : N(0);
    const N qkv = (NH + N(2) * NKV) * hs;  // c_attn or c_q, c_k, c_v outputs
    const N fc = c.mlp == MLPKind::SwiGLU ? N(2) * H : H;
    const N block = N(2) * norm + qk_norms + (C * qkv + b * qkv) + (C * C + b * C) + (C * fc + b * fc) + (H * C + b * C);
    const N wpe = c.pos_embedding == PosEmbedding::Learned ? N(c.block_size) * C : N(0);
    const N lm_head = c.tie_embeddings ? N(0) : V * C;
    return V * C + wpe + (c.embedding_norm ? norm : N(0)) + N(c.n_layer) * block + norm + lm_head;
}
}  // namespace

void check_config(const GPTConfig& c) {
    NT_CHECK_AS(ShapeError, c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
                "GPTConfig: expected positive sizes, got vocab_size ", c.vocab_size, ", block_size ", c.block_size,
                ", n_layer ", c.n_layer, ", n_head ", c.n_head, ", n_embd ", c.n_embd);
    NT_CHECK_AS(ShapeError, c.n_embd % c.n_head == 0, "GPTConfig: expected n_embd divisible by n_head, got n_embd ",
                c.n_embd, " and n_head ", c.n_head);
    NT_CHECK_AS(ShapeError, c.n_kv_head >= 0 && c.n_head % c.kv_heads() == 0,
                "GPTConfig: expected n_kv_head dividing n_head (or 0: n_head), got n_kv_head ", c.n_kv_head,
                " and n_head ", c.n_head);
    NT_CHECK_AS(ShapeError, c.mlp_hidden >= 0, "GPTConfig: expected mlp_hidden >= 0 (0: the MLP's default), got ",
                c.mlp_hidden);
    NT_CHECK_AS(ShapeError, c.pos_embedding != PosEmbedding::Rotary || (c.n_embd / c.n_head) % 2 == 0,
                "GPTConfig: expected an even head size n_embd / n_head with rotary positions, got ",
                c.n_embd / c.n_head);
    NT_CHECK_AS(ShapeError, c.checkpoint_every >= 1, "GPTConfig: expected checkpoint_every >= 1 (1: every block), got ",
                c.checkpoint_every);
    NT_CHECK_AS(DTypeError, is_floating(c.dtype), "GPTConfig: expected a floating dtype, got ", dtype_name(c.dtype));
    NT_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "GPTConfig: expected norm_eps > 0 and finite, got ",
             c.norm_eps);
    NT_CHECK(c.dropout >= 0 && c.dropout < 1, "GPTConfig: expected dropout in [0, 1), got ", c.dropout);
    NT_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0, "GPTConfig: expected rope_theta > 0 and finite, got ",
             c.rope_theta);
    NT_CHECK(std::isfinite(c.logit_softcap) && c.logit_softcap >= 0,
             "GPTConfig: expected logit_softcap >= 0 and finite (0: none), got ", c.logit_softcap);
    NT_CHECK(c.mlp != MLPKind::GELU || c.bias,
             "GPTConfig: expected bias on with mlp gelu (linear_gelu adds c_fc's bias in its epilogue), got bias off");
    // Every count of a model's bytes (parameters, gradients, the optimizers' state) is then far
    // from int64's end.
    // (GPTConfig::hidden() in double, which cannot overflow: at least the hidden width.)
    const double hidden_bound = c.mlp_hidden > 0             ? double(c.mlp_hidden)
                                : c.mlp != MLPKind::SwiGLU ? 4.0 * double(c.n_embd)
                                                           : 8.0 * double(c.n_embd) / 3.0 + 64.0;
    const double parameters = parameter_count<double>(c, hidden_bound);
    NT_CHECK_AS(ShapeError, parameters <= kMaxParameters,
                "GPTConfig: expected at most 2^54 parameters (num_parameters: vocab_size * n_embd for wte and an untied "
                "lm_head, n_layer * (4 n_embd^2 + 2 or 3 n_embd * mlp hidden) for the blocks, block_size * n_embd for "
                "wpe), got about ", parameters, " for vocab_size ", c.vocab_size, ", n_embd ", c.n_embd, ", n_layer ",
                c.n_layer, ", mlp_hidden ", c.mlp_hidden, ", block_size ", c.block_size);
}

void detail::check_step_shape(const char* op, const GPTConfig& c, int64_t B, int64_t T) {
    check_config(c);
    NT_CHECK_AS(ShapeError, B >= 1, op, ": expected a batch of B >= 1 rows, got ", B);
    NT_CHECK_AS(ShapeError, T >= 1 && T <= c.block_size, op, ": expected a sequence length T in [1, block_size = ",
                c.block_size, "], got ", T);
    // A bound of what a position's tensors take at once, 8 bytes an element: each layer's
    // activations (widths of n_embd, the MLP's hidden layer, a statistic per head) and the
    // logits with their gradient and the loss's buffers.
    const double L = double(c.n_layer), C = double(c.n_embd), H = double(c.hidden()), NH = double(c.n_head);
    const double per_position = 8.0 * (L * (8.0 * C + 4.0 * H + 2.0 * NH + 8.0) + 4.0 * double(c.vocab_size) + 8.0 * C);
    const double positions = double(B) * double(T);
    NT_CHECK_AS(ShapeError, positions * per_position <= kMaxActivationBytes, op,
                ": expected the step's activations, B * T positions times about ", per_position,
                " bytes a position (n_layer * (8 n_embd + 4 mlp hidden + 2 n_head) + 4 vocab_size elements of 8 "
                "bytes), to fit in 2^58 bytes, got B ", B, " * T ", T, ": about ", positions * per_position, " bytes");
}

int64_t num_parameters(const GPTConfig& c) {
    check_config(c);
    return parameter_count<int64_t>(c, c.hidden());
}

}  // namespace normtape
