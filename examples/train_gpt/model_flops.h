// examples/train_gpt/model_flops.h: the model FLOPs of train_gpt's step and its MFU (model FLOPs
// utilization) against the GPU's dense bf16 peak (Note [Model FLOPs]).
#pragma once

#include <cstdint>

#include "normtape.h"
#include "report.h"

// Note [Model FLOPs]
// The FLOPs a step's model needs, as PaLM counts them (Chowdhery et al. 2022, appendix B; nanoGPT's
// estimate_mfu): per token 6 N for the products of the N weights that multiply (every parameter
// but the position embedding and, untied, the token embedding, which are looked up), forward and
// backward, plus 12 L C T for attention's two products over T positions (the causal mask not
// discounted). Recomputation is not counted: it is the implementation's cost, not the model's.
double model_flops_per_token(const normtape::GPT& model, int64_t seq);

// The dense bf16 tensor-core peak of GPU `dev` in FLOP/s, by its name (NVIDIA's datasheets: H100
// SXM, PCIe and NVL, H200 SXM and NVL, A100); 0 for a GPU not in this table.
double dense_bf16_peak_flops(normtape::Device dev);

// Sets r.model_flops_per_step (`tokens_per_step` tokens of `model` at sequence length `seq`) and,
// for a bf16 run on a GPU of the table, r.mfu at r.step_ms_median against `processes` such GPUs;
// prints both as one line.
void report_model_flops(const normtape::GPT& model, int64_t seq, int64_t tokens_per_step, normtape::Device dev,
                        bool bf16, int processes, RunResult& r);
