// examples/train_gpt/train_data.cpp: train_gpt's data (examples/train_gpt/train_data.h): reading the text, holding out
// its tail, and the validation loss. Not here: the batches (nn/data.h), the training step
// (examples/train_gpt/train_gpt.cpp).
#include "train_data.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

using namespace normtape;

std::string data_file(const Args& a) {
    if (a.data == "random") return "";
    return a.data.empty() ? kDefaultData : a.data;
}

std::string load_text(const Args& a, std::string* description) {
    std::string& desc = *description;
    if (a.data == "random") {
        desc = "random tokens in [0, " + std::to_string(a.vocab) + ")";
        return "";
    }
    desc = data_file(a);
    const std::string what = describe(a, "data", desc);
    // A checkpoint's data path may be relative to the directory of the run that saved it.
    const std::string hint = a.from_checkpoint.count("data") ? " (give --data FILE if the data is elsewhere now)" : "";
    std::error_code ec;
    if (std::filesystem::is_directory(desc, ec)) throw UsageError(what + ": is a directory, expected a text file");
    std::ifstream f(desc, std::ios::binary);
    if (!f) throw UsageError(what + ": cannot read the data file: " + std::strerror(errno) + hint);
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw UsageError(what + ": cannot read the data file: " + std::strerror(errno));
    std::string text = ss.str();
    if (static_cast<int64_t>(text.size()) < a.seq + 2)
        throw UsageError(what + ": the data file has " + std::to_string(text.size()) + " bytes; " +
                         describe(a, "seq", std::to_string(a.seq)) + " needs at least " + std::to_string(a.seq + 2));
    return text;
}

TextSplit split_text(const Args& a, const std::string& text) {
    const auto n_val = static_cast<size_t>(std::floor(static_cast<double>(text.size()) * a.val_fraction));
    TextSplit split{text.substr(0, text.size() - n_val), text.substr(text.size() - n_val)};
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", a.val_fraction);
    for (const auto& [part, what] : {std::pair{&split.train, "training part"}, {&split.val, "held-out tail"}})
        if (!part->empty() && static_cast<int64_t>(part->size()) < a.seq + 1)
            throw UsageError(describe(a, "val-fraction", fraction) + ": the " + what +
                             " of the data has " + std::to_string(part->size()) + " bytes; " +
                             describe(a, "seq", std::to_string(a.seq)) + " needs at least " +
                             std::to_string(a.seq + 1));
    return split;
}

double evaluate(GPT& model, Batcher& val, const std::string& start, int64_t batches) {
    NoGradGuard no_grad;
    struct EvalMode {  // training mode comes back even if a forward throws
        GPT& m;
        explicit EvalMode(GPT& model) : m(model) { m.eval(); }
        ~EvalMode() { m.train(); }
    } eval_mode(model);
    val.set_state(start);
    double total = 0;
    for (int64_t k = 0; k < batches; ++k) {
        auto [idx, targets] = val.next();
        total += model.loss(idx, targets).to(DType::F32).item<float>();
    }
    return total / static_cast<double>(batches);
}
