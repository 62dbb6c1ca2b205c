// examples/train_gpt/train_flags.cpp: train_gpt's flags and presets (examples/train_gpt/train_flags.h).
#include "train_flags.h"

#include <CLI/CLI.hpp>

#include <string>

#include "../common/flag_syntax.h"

void add_flags(CLI::App& app, Args& a) {
    const CLI::Validator integer = number<int64_t>("an integer"), real = number<double>("a number"),
                         seed = number<uint64_t>("an integer from 0 to 2^64 - 1");
    app.add_option("--data", a.data,
                   "a text file, a token file (.bin: llm.c's shards or nanoGPT's uint16 ids), a glob pattern of "
                   "such files read in name order, or 'random' for random tokens (default: data/tinyshakespeare.txt "
                   "of the source tree)")
        ->check(kFileName)
        ->type_name("FILE");
    app.add_option("--data-format", a.data_format,
                   "how --data is read: text (each byte a token), llm.c (a 1024-byte header, then uint16 or uint32 "
                   "ids), raw (uint16 ids), or auto (a .bin file is llm.c's when it starts with llm.c's magic "
                   "number, else raw; any other file is text)");
    app.add_option("--tokenizer", a.tokenizer,
                   "a tokenizer that encodes a text --data before training, once (its ids cached beside the data): "
                   "a tiktoken rank file (NAME.tiktoken beside NAME.json, its split pattern and special tokens, as "
                   "scripts/fetch_tiktoken.sh and train_tokenizer write them) or a Hugging Face tokenizer.json; "
                   "--vocab defaults to its size (default: none)")
        ->check(kFileName)
        ->type_name("FILE");
    app.add_option("--steps", a.steps, "training steps per policy, 1 to 2^40")->check(integer);
    app.add_option("--batch", a.batch, "sequences per batch (B), 1 to 2^20")->check(integer);
    app.add_option("--micro-batch", a.micro_batch,
                   "sequences per forward and backward, dividing --batch: each step draws the batch, runs its "
                   "--batch / N micro-batches of N rows in turn, adding their gradients, then takes one optimizer step "
                   "(a forward saves one micro-batch's tensors; the gradients change by summation order, and dropout "
                   "draws its masks per micro-batch) (0, the default: --batch)")
        ->check(integer);
    app.add_option("--seq", a.seq, "sequence length (T), 1 to 2^20")->check(integer);
    app.add_option("--layers", a.layers, "transformer blocks (L), 1 to 1024")->check(integer);
    app.add_option("--heads", a.heads, "attention heads (NH), 1 to 1024")->check(integer);
    app.add_option("--embd", a.embd, "embedding width (C), 1 to 2^16, divisible by --heads")->check(integer);
    app.add_option("--arch", a.arch,
                   "gpt2: GPT-2's block (learned positions, LayerNorm, GELU, biases); nanochat: rotary positions, "
                   "QK-norm, weightless RMSNorm, ReLU^2, no biases, logit softcap 15; llama: rotary positions, RMSNorm, "
                   "SwiGLU, no biases");
    app.add_option("--kv-heads", a.kv_heads,
                   "key/value heads for grouped-query attention, dividing --heads (0, the default: --heads)")
        ->check(integer);
    app.add_option("--tie", a.tie, "on: lm_head's weight is the token embedding's (one tensor); off (default): its own");
    app.add_option("--norm", a.norm, "layer or rms (default: layer for --arch gpt2, rms for the others)");
    app.add_option("--policy", a.policy, "input, output, normalized, both (input and output) or all (the three)");
    app.add_option("--recompute-activation", a.recompute_activation,
                   "on (default): the MLP's activation (GELU, ReLU^2 or SwiGLU of its first Linear's output) is made "
                   "again in backward instead of saved (B*T*H elements a layer, H the hidden width); off: saved");
    app.add_option("--offload", a.offload,
                   "on: every tensor that the forward and the loss save for backward (the embeddings', the blocks', "
                   "the final norm's, the logits; not the parameters) goes to pinned host memory during the forward "
                   "and comes back in backward (SaveOnCpu; on the cpu nothing moves); off: they stay on the device");
    app.add_option("--checkpoint", a.checkpoint,
                   "blocks: each block saves only its input and runs its forward again in backward (activation "
                   "checkpointing); none: every block saves what its ops need");
    app.add_option("--checkpoint-every", a.checkpoint_every,
                   "with --checkpoint blocks: checkpoint blocks 0, K, 2K, ... only, 1 to 1024 (1: every block)")
        ->check(integer);
    app.add_option("--memory-budget", a.memory_budget,
                   "bytes a step may allocate on the device (6GiB, 512MiB, 8e9; auto: what the device has free): the "
                   "planner picks the fastest policy, activation recompute, fused loss, checkpointing, offload and "
                   "micro-batch whose predicted peak fits, prints it, trains with it, and exits 1 if the measured "
                   "peak exceeds the budget (leave those flags out) (default: none)")
        ->type_name("SIZE");
    app.add_flag("--memory-sweep", a.memory_sweep,
                 "instead of training, time every memory setting (within --memory-budget, if given) for --steps "
                 "steps and write each one's predicted and measured peak and step time to --json and the Pareto front "
                 "(step time against peak) to --chart (default: off)");
    app.add_option("--sweep-reference", a.sweep_reference,
                   "with --memory-sweep: scripts/bench_torch_gpt.py --json files whose step time and peak are drawn "
                   "beside the sweep's points (default: none)")
        ->check(CLI::ExistingFile)
        ->type_name("FILE")
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    app.add_option("--fused-loss", a.fused_loss,
                   "on: the loss runs lm_head and the cross-entropy as one op (GPTConfig::fused_head_loss), which "
                   "stores no [B, T, V] logits, only their log-sum-exp per position, and makes them again in backward; "
                   "off: lm_head's logits, then the cross-entropy");
    app.add_option("--shard-optimizer", a.shard_optimizer,
                   "on: with several processes (mpirun -np N, srun, torchrun), each keeps the optimizers' state of "
                   "1/N of the parameters (ZeRO-1); off: every process keeps all of it");
    app.add_option("--cuda-graph", a.cuda_graph,
                   "on: after two steps run as usual, each step replays a CUDA graph of the step (no host work or "
                   "launch gaps between its kernels); off: every step is queued by the host (default: off)");
    app.add_flag("--check-replicas", a.check_replicas,
                 "with several processes, check after every step that every parameter has the same bits on every "
                 "rank (always on in debug builds) (default: off)");
    app.add_flag("--memory-report", a.memory_report,
                 "after each run's first forward, print the largest saved tensors and the saved bytes by part of the "
                 "model (norms, attention, MLP, ...) (default: off)");
    app.add_option("--lr", a.lr, "peak learning rate, > 0 and <= 1e6 (linear warm-up, then cosine decay to --min-lr)")
        ->check(real);
    app.add_option("--warmup", a.warmup, "warm-up steps, 0 to --steps - 1 (default: 10% of --steps)")
        ->check(integer)
        ->default_str("");
    app.add_option("--min-lr", a.min_lr, "the learning rate the cosine decay ends at, 0 to --lr (default: lr/10)")
        ->check(real)
        ->default_str("");
    app.add_option("--beta2", a.beta2, "AdamW's second-moment decay, 0 to 1 (exclusive), with --optimizer adamw")
        ->check(real);
    app.add_option("--optimizer", a.optimizer,
                   "adamw (every parameter) or muon (Muon for the blocks' matrices, AdamW for the rest, at nanochat's "
                   "rates scaled by the schedule: --lr is then the schedule's peak, not a rate)");
    app.add_option("--muon-lr", a.muon_lr,
                   "with --optimizer muon: Muon's rate at the schedule's peak, > 0 and <= 1e6 (nanochat's 0.02)")
        ->check(real);
    app.add_option("--dropout", a.dropout,
                   "dropout probability on the embeddings, the attention probabilities and the residual projections, "
                   "0 to 1 (exclusive)")
        ->check(real);
    app.add_option("--seed", a.seed, "seed for initialization and batches, 0 to 2^64 - 1")->check(seed);
    app.add_option("--device", a.device, "cpu or cuda (default: cuda when a GPU is visible, else cpu)");
    app.add_option("--dtype", a.dtype, "f32 or bf16 (default: bf16 on cuda, f32 on cpu)");
    app.add_option("--vocab", a.vocab, "vocabulary size with --data random, a token file or --tokenizer, 2 to 2^24 (text is read as 256 bytes)")
        ->check(integer);
    app.add_option("--preset", a.preset,
                   "gpt2-medium-ish: V=32768 T=1024 C=1024 NH=16 L=12 B=16 on random tokens (default: none)");
    app.add_option("--threads", a.threads,
                   "cpu threads, 0 (every core) to 1024; the results are the same bit for bit whatever the count")
        ->check(integer);
    app.add_option("--sample", a.sample, "after training, print this many tokens sampled from the model (bytes, or decoded by --tokenizer), 0 to 2^20")
        ->check(integer);
    app.add_option("--log-every", a.log_every, "steps between progress lines")->check(integer);
    app.add_option("--json", a.json, "write the results as JSON to this file (default: none)")
        ->check(kFileName)
        ->type_name("FILE");
    app.add_option("--chart", a.chart, "SVG chart of the loss, of the memory during one step and of the saved bytes by category")
        ->check(kFileName)
        ->type_name("FILE");
    app.add_option("--save", a.save,
                   "write a checkpoint (safetensors: model, optimizer, step, data position, config) to this file at the "
                   "end (each run of --policy both or all saves over the last: with both the output run's, with all the "
                   "normalized run's) (default: none)")
        ->check(kFileName)
        ->type_name("FILE");
    app.add_option("--save-every", a.save_every,
                   "with --save, also write the checkpoint every N steps (0: only at the end)")
        ->check(integer);
    app.add_option("--val-fraction", a.val_fraction,
                   "the tail of the text held out for the validation loss, 0 to 0.5 (0: none)")
        ->check(real);
    app.add_option("--eval-every", a.eval_every,
                   "evaluate the held-out loss every N steps, and after the last (0: after the last only)")
        ->check(integer);
    app.add_option("--eval-batches", a.eval_batches, "held-out batches per evaluation, 1 to 2^20")->check(integer);
    app.add_flag("--save-best", a.save_best,
                 "with --save, write the checkpoint at each new best validation loss instead of at the end "
                 "(default: off)");
    app.add_option("--stop-at", a.stop_at,
                   "stop after this step; the learning-rate schedule still spans --steps, so --resume continues it "
                   "(0: at --steps)")
        ->check(integer);
    app.add_option("--resume", a.resume,
                   "continue the run saved in this checkpoint (flags left out take its values; others must match, except "
                   "the memory settings --recompute-activation, --offload, --checkpoint, --fused-loss and "
                   "--micro-batch) (default: none)")
        ->check(kFileName)
        ->type_name("FILE");
    app.add_option("--on-nan", a.on_nan,
                   "stop: a non-finite loss ends the run (status 1) before anything is saved over a checkpoint; "
                   "continue: train on, saving no checkpoint");
    app.add_flag("--detect-anomaly", a.detect_anomaly,
                 "stop at the first NaN or Inf that an op or a backward node produces, naming it (slow: checks every "
                 "output; on cuda copies each to the host) (default: off)");
}

void apply_preset(const CLI::App& app, Args& a) {
    if (a.preset == "gpt2-medium-ish") {  // explicit flags win over the preset
        auto set = [&](const char* flag, int64_t& field, int64_t value) {
            if (app.count(flag) == 0) field = value;
        };
        set("--vocab", a.vocab, 32768);
        set("--seq", a.seq, 1024);
        set("--embd", a.embd, 1024);
        set("--heads", a.heads, 16);
        set("--layers", a.layers, 12);
        set("--batch", a.batch, 16);
        if (app.count("--data") == 0) a.data = "random";
    }
}
