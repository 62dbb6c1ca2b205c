// examples/train_gpt/optimizers.cpp: train_gpt's optimizers (Note [The optimizers]).
#include "optimizers.h"

#include <cmath>
#include <vector>

using namespace normtape;

namespace {
// nanochat's rates of AdamW's groups (GPT.setup_optimizers' defaults; its matrix rate is --muon-lr's
// default).
constexpr double kEmbeddingLr = 0.2, kUnembeddingLr = 0.004;
}  // namespace

OptimizerGroups optimizer_groups(const Args& a, const GPT& model) {
    OptimizerGroups g;
    if (a.optimizer == "adamw") {
        g.adamw = {{{}, 0.1}, {{}, 0.0}};  // weight decay for matrices only
        for (const Tensor& p : model.parameters()) g.adamw[p.dim() >= 2 ? 0 : 1].params.push_back(p);
        return g;
    }
    const MuonParamSplit split = param_groups_for_muon(model);
    g.adamw = {{split.embeddings, 0.0, kEmbeddingLr}, {split.head, 0.0, kUnembeddingLr}, {split.vectors, 0.0, kUnembeddingLr}};
    g.muon = {{split.matrices, 0.0}};
    return g;
}

Optimizers make_optimizers(const Args& a, const GPT& model, OptimizerGroups groups) {
    Optimizers o;
    o.peak_lr = a.lr;
    AdamWOptions opt;
    opt.lr = a.lr;
    opt.beta2 = a.beta2;
    if (a.optimizer == "muon") {  // AdamW's lr: s (C / 768)^-0.5 times the schedule's multiplier
        o.adamw_scale = 1.0 / std::sqrt(static_cast<double>(model.config().n_embd) / 768.0);
        opt.beta1 = 0.8;
        opt.beta2 = 0.95;
        opt.eps = 1e-10;
        opt.weight_decay = 0.0;
        o.muon = std::make_unique<Muon>(std::move(groups.muon), MuonOptions{});
        o.muon_lr = a.muon_lr;
    }
    o.adamw = std::make_unique<AdamW>(std::move(groups.adamw), opt);
    return o;
}

Optimizers make_optimizers(const Args& a, const GPT& model) {
    return make_optimizers(a, model, optimizer_groups(a, model));
}

void Optimizers::set_lr(double lr) {
    if (!muon) {
        adamw->set_lr(lr);
        return;
    }
    const double multiplier = lr / peak_lr;
    adamw->set_lr(adamw_scale * multiplier);
    muon->set_lr(muon_lr * multiplier);
}

void Optimizers::step(const Tensor* grad_norm) {
    if (grad_norm) adamw->step_if_finite(*grad_norm);
    else adamw->step();
    if (muon && grad_norm) muon->step_if_finite(*grad_norm);
    else if (muon) muon->step();
}

void Optimizers::zero_grad() {
    adamw->zero_grad();
    if (muon) muon->zero_grad();
}

void Optimizers::set_step_count(int64_t t) {
    adamw->set_step_count(t);
    if (muon) muon->set_step_count(t);
}

int64_t Optimizers::adamw_moment_bytes() const {
    int64_t bytes = 0;
    for (const ParamGroup& g : adamw->groups())
        for (const Tensor& p : g.params) bytes += adamw->state(p).m.nbytes() + adamw->state(p).v.nbytes();
    return bytes;
}

int64_t Optimizers::muon_momentum_bytes() const {
    int64_t bytes = 0;
    if (muon)
        for (const ParamGroup& g : muon->groups())
            for (const Tensor& p : g.params) bytes += muon->state(p).momentum_buffer.nbytes();
    return bytes;
}

int64_t Optimizers::master_bytes() const {
    int64_t bytes = 0;
    for (const ParamGroup& g : adamw->groups())
        for (const Tensor& p : g.params) bytes += adamw->state(p).master.defined() ? adamw->state(p).master.nbytes() : 0;
    if (muon)
        for (const ParamGroup& g : muon->groups())
            for (const Tensor& p : g.params)
                bytes += muon->state(p).master.defined() ? muon->state(p).master.nbytes() : 0;
    return bytes;
}
