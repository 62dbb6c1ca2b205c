// examples/train_gpt/optimizers.cpp: train_gpt's optimizers (Note [The optimizers]).
#include "optimizers.h"

#include <cmath>
#include <vector>

using namespace normtape;

GPTParamGroups optimizer_groups(const Args& a, const GPT& model) {
    return gpt_param_groups(model, a.optimizer == "muon" ? StepOptimizer::Muon : StepOptimizer::AdamW);
}

Optimizers make_optimizers(const Args& a, const GPT& model, GPTParamGroups groups) {
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
        o.muon_lr = a.muon_lr;
    }
    static_cast<GPTOptimizers&>(o) = GPTOptimizers::make(std::move(groups), opt);
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

void Optimizers::set_step_count(int64_t t) {
    adamw->set_step_count(t);
    if (muon) muon->set_step_count(t);
}
