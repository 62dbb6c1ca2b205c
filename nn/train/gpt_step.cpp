// nn/train/gpt_step.cpp: the GPT's training step (Note [The training step], nn/train/gpt_step.h).
#include "nn/train/gpt_step.h"

#include "core/check.h"
#include "ops/elementwise.h"

namespace normtape {

namespace {
// nanochat's rates of AdamW's groups beside Muon (GPT.setup_optimizers' defaults).
constexpr double kEmbeddingLrScale = 0.2, kUnembeddingLrScale = 0.004;
}  // namespace

GPTParamGroups gpt_param_groups(const GPT& model, StepOptimizer optimizer) {
    GPTParamGroups g;
    if (optimizer == StepOptimizer::AdamW) {
        g.adamw = {{{}, 0.1}, {{}, 0.0}};  // weight decay for matrices only
        for (const Tensor& p : model.parameters()) g.adamw[p.dim() >= 2 ? 0 : 1].params.push_back(p);
        return g;
    }
    const MuonParamSplit split = param_groups_for_muon(model);
    g.adamw = {{split.embeddings, 0.0, kEmbeddingLrScale},
               {split.head, 0.0, kUnembeddingLrScale},
               {split.vectors, 0.0, kUnembeddingLrScale}};
    g.muon = {{split.matrices, 0.0}};
    return g;
}

GPTOptimizers GPTOptimizers::make(GPTParamGroups groups, const AdamWOptions& adamw_options,
                                  const MuonOptions& muon_options) {
    GPTOptimizers o;
    o.adamw = std::make_unique<AdamW>(std::move(groups.adamw), adamw_options);
    if (!groups.muon.empty()) o.muon = std::make_unique<Muon>(std::move(groups.muon), muon_options);
    return o;
}

void GPTOptimizers::zero_grad() {
    adamw->zero_grad();
    if (muon) muon->zero_grad();
}

int64_t GPTOptimizers::adamw_moment_bytes() const {
    int64_t bytes = 0;
    for (const auto& group : adamw->states())
        for (const AdamW::ParamState& st : group) bytes += st.m.nbytes() + st.v.nbytes();
    return bytes;
}

int64_t GPTOptimizers::muon_momentum_bytes() const {
    int64_t bytes = 0;
    if (muon)
        for (const auto& group : muon->states())
            for (const Muon::ParamState& st : group) bytes += st.momentum_buffer.nbytes();
    return bytes;
}

int64_t GPTOptimizers::master_bytes() const {
    auto of = [](const Tensor& master) { return master.defined() ? master.nbytes() : 0; };
    int64_t bytes = 0;
    for (const auto& group : adamw->states())
        for (const AdamW::ParamState& st : group) bytes += of(st.master);
    if (muon)
        for (const auto& group : muon->states())
            for (const Muon::ParamState& st : group) bytes += of(st.master);
    return bytes;
}

Tensor gpt_step(GPT& model, GPTOptimizers& optimizers, DataParallel* dp, const Tensor& idx, const Tensor& targets,
                int64_t micro_batch, bool skip_nonfinite, std::vector<Tensor>* losses, const GPTStepHooks& hooks) {
    NT_CHECK_AS(ShapeError, idx.dim() == 2 && idx.shape() == targets.shape(), "gpt_step: expected idx and targets "
                "of one shape [B, T], got ", shape_str(idx.shape()), " and ", shape_str(targets.shape()));
    const int64_t B = idx.size(0), rows = micro_batch > 0 ? micro_batch : B;
    NT_CHECK_AS(ShapeError, rows <= B && B % rows == 0, "gpt_step: expected micro_batch 0 (the whole batch) or a ",
                "divisor of B = ", B, ", got ", micro_batch);
    const int64_t n = B / rows;
    // Rows k * rows .. (k + 1) * rows - 1, in storage of their own (Note [The training step]).
    auto rows_of = [&](const Tensor& t, int64_t k) { return n == 1 ? t : t.narrow(0, k * rows, rows).clone(); };
    for (int64_t k = 0; k < n; ++k) {
        Tensor loss = model.loss(rows_of(idx, k), rows_of(targets, k));
        if (hooks.after_forward) hooks.after_forward(k, loss);
        if (dp) dp->set_sync(k == n - 1);
        if (n == 1) loss.backward();
        else scale(loss, 1.0 / static_cast<double>(n)).backward();
        if (hooks.after_backward) hooks.after_backward(k);
        if (losses) losses->push_back(loss.detach());
    }
    if (dp) dp->finish_gradients();
    Tensor norm = dp ? dp->clip_grad_norm_(1.0) : clip_grad_norm_tensor_(model.parameters(), 1.0);
    if (skip_nonfinite) optimizers.adamw->step_if_finite(norm);
    else optimizers.adamw->step();
    if (optimizers.muon && skip_nonfinite) optimizers.muon->step_if_finite(norm);
    else if (optimizers.muon) optimizers.muon->step();
    if (dp) dp->after_step();
    optimizers.zero_grad();
    return norm;
}

}  // namespace normtape
