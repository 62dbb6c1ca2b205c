// examples/train_data.cpp: train_gpt's data (examples/train_data.h): reading the text. Not here: the
// batches (nn/data.h), what is done with a batch (examples/train_gpt.cpp).
#include "train_data.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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
