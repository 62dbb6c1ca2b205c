// examples/train_gpt/saved_categories.cpp: the GPT's saved bytes by category and the --memory-report
// printout (examples/train_gpt/saved_categories.h).
#include "saved_categories.h"

#include <algorithm>
#include <cstdio>

#include "report.h"

using namespace normtape;

namespace {

// True when the dotted module path has the part `name` ("h.3.attn.c_proj" has "attn").
bool has_part(const std::string& path, const std::string& name) {
    size_t start = 0;
    while (start <= path.size()) {
        size_t end = path.find('.', start);
        if (end == std::string::npos) end = path.size();
        if (path.compare(start, end - start, name) == 0 && end - start == name.size()) return true;
        start = end + 1;
    }
    return false;
}

std::string first_part(const std::string& path) { return path.substr(0, path.find('.')); }

}  // namespace

const char* saved_category(const SavedTensorEntry& entry) {
    if (entry.holders.empty()) return "other";
    for (const SavedTensorHolder& h : entry.holders)
        if (h.via == "checkpoint") return "checkpointed block inputs";
    const SavedTensorHolder& h = entry.holders.front();
    const std::string& op = h.grad_fn;
    if (op == "LayerNormBackward" || op == "RMSNormBackward") return "norms";
    if (has_part(h.module, "attn")) return "attention";
    if (has_part(h.module, "mlp")) return "MLP";
    const std::string top = first_part(h.module);
    if (top == "wte" || top == "wpe" || op == "EmbeddingBackward" || (op == "AddBackward" && h.module.empty()))
        return "embeddings";
    if (top == "lm_head" || op == "CrossEntropyBackward") return "logits and loss";
    return "other";
}

std::vector<std::pair<std::string, int64_t>> saved_bytes_by_category(const SavedTensorsReport& report) {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const char* name : kSavedCategories) out.emplace_back(name, 0);
    for (const SavedTensorEntry& e : report.entries) {
        const std::string name = saved_category(e);
        for (auto& [category, bytes] : out)
            if (category == name) bytes += e.bytes;
    }
    return out;
}

void print_memory_report(const char* run, const SavedTensorsReport& report, Device device, size_t top) {
    std::vector<const SavedTensorEntry*> largest;
    for (const SavedTensorEntry& e : report.entries) largest.push_back(&e);
    std::stable_sort(largest.begin(), largest.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
    if (largest.size() > top) largest.resize(top);
    std::printf("[%-6s] saved for backward after the first forward: %zu storages, %s bytes (%s on %s); the %zu "
                "largest:\n",
                run, report.entries.size(), with_commas(report.total_bytes).c_str(),
                with_commas(report.bytes_on(device)).c_str(), device_name(device).c_str(), largest.size());
    std::printf("  %14s  %-28s %s\n", "bytes", "shape dtype device", "held by (node#seq.slot, module, via recipe)");
    for (const SavedTensorEntry* e : largest) {
        const SavedTensorHolder& h = e->holders.front();
        std::string what = shape_str(e->shape) + " " + dtype_name(e->dtype) + " " + device_name(e->device);
        if (e->packed) what += " packed";
        auto name = [](const SavedTensorHolder& h, bool module) {  // as SavedTensorsReport::table names it
            return h.grad_fn + "#" + std::to_string(h.sequence_nr) + "." + h.slot +
                   (module && !h.module.empty() ? " (" + h.module + ")" : "") + (h.via.empty() ? "" : " via " + h.via);
        };
        std::string by = name(h, true);
        if (e->holders.size() == 2) by += ", also " + name(e->holders[1], false);
        if (e->holders.size() > 2) by += ", +" + std::to_string(e->holders.size() - 1) + " more holders";
        std::printf("  %14s  %-28s %s\n", with_commas(e->bytes).c_str(), what.c_str(), by.c_str());
    }
    std::printf("[%-6s] saved bytes by category:\n", run);
    const double total = static_cast<double>(std::max<int64_t>(report.total_bytes, 1));
    for (const auto& [name, bytes] : saved_bytes_by_category(report))
        std::printf("  %14s %6.1f%%  %s\n", with_commas(bytes).c_str(), 100.0 * static_cast<double>(bytes) / total,
                    name.c_str());
    std::printf("  %14s %6.1f%%  total (saved_bytes())\n", with_commas(report.total_bytes).c_str(),
                report.total_bytes > 0 ? 100.0 : 0.0);
}
