// core/saved_report.cpp: saved_tensors_report() and its table and JSON.
#include "core/saved_report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/autograd.h"

namespace normtape {

namespace {

// (name, bytes) pairs of `totals`, largest first, ties by name.
std::vector<std::pair<std::string, int64_t>> sorted(const std::map<std::string, int64_t>& totals) {
    std::vector<std::pair<std::string, int64_t>> out(totals.begin(), totals.end());
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    return out;
}

std::string mib(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

std::string holder_str(const SavedTensorHolder& h) {
    std::string s = h.grad_fn + "#" + std::to_string(h.sequence_nr) + "." + h.slot;
    if (!h.module.empty()) s += " (" + h.module + ")";
    if (!h.via.empty()) s += " via " + h.via;
    return s;
}

}  // namespace

SavedTensorsReport saved_tensors_report() {
    SavedTensorsReport report;
    std::unordered_map<const Storage*, size_t> index;  // storage -> entry
    // Adds `holder` to the entry of each storage that `s` keeps alive (through recipes too).
    std::function<void(const SavedTensor&, SavedTensorHolder)> add = [&](const SavedTensor& s, SavedTensorHolder holder) {
        if (const Recipe* r = s.recipe()) {
            if (holder.via.empty()) holder.via = r->name;
            for (const SavedTensor& in : r->inputs) add(in, holder);
            return;
        }
        if (!s.holds_data()) return;
        const Tensor& t = s.data();
        const Storage* storage = t.storage().get();
        if (!storage || storage->is_parameter()) return;
        auto [it, fresh] = index.try_emplace(storage, report.entries.size());
        if (fresh) {
            SavedTensorEntry e;
            e.shape = t.shape();
            e.dtype = t.dtype();
            e.device = t.device();
            e.bytes = static_cast<int64_t>(storage->nbytes());
            e.packed = s.packed();
            report.entries.push_back(std::move(e));
            report.total_bytes += static_cast<int64_t>(storage->nbytes());
        }
        std::vector<SavedTensorHolder>& holders = report.entries[it->second].holders;
        const bool repeated = std::any_of(holders.begin(), holders.end(), [&](const SavedTensorHolder& h) {
            return h.sequence_nr == holder.sequence_nr && h.slot == holder.slot;
        });
        if (!repeated) holders.push_back(std::move(holder));  // a recipe may reach a storage twice
    };
    detail::for_each_live_node([&](Node& node) {
        for (SavedSlot slot : node.saved_tensors())
            add(*slot.tensor, SavedTensorHolder{node.name(), node.sequence_nr(), slot.name, node.module_path(), ""});
    });
    std::map<std::string, int64_t> by_module, by_op;
    for (const SavedTensorEntry& e : report.entries) {
        by_module[e.module()] += e.bytes;
        by_op[e.holders.front().grad_fn] += e.bytes;
    }
    report.bytes_by_module = sorted(by_module);
    report.bytes_by_op = sorted(by_op);
    return report;
}

int64_t SavedTensorsReport::bytes_on(Device device) const {
    int64_t n = 0;
    for (const SavedTensorEntry& e : entries)
        if (e.device == device) n += e.bytes;
    return n;
}

std::string SavedTensorsReport::table(size_t top) const {
    std::vector<const SavedTensorEntry*> shown;
    for (const SavedTensorEntry& e : entries) shown.push_back(&e);
    if (top > 0) {
        std::stable_sort(shown.begin(), shown.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
        if (shown.size() > top) shown.resize(top);
    }
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "saved tensors: %zu storages, %lld bytes (%s)%s\n", entries.size(),
                  static_cast<long long>(total_bytes), mib(total_bytes).c_str(),
                  top > 0 && entries.size() > top ? (", the " + std::to_string(top) + " largest:").c_str() : "");
    out += line;
    std::snprintf(line, sizeof line, "%14s  %-32s %s\n", "bytes", "shape dtype device", "held by (node#seq.slot, module, via recipe)");
    out += line;
    for (const SavedTensorEntry* e : shown) {
        std::string what = shape_str(e->shape) + " " + dtype_name(e->dtype) + " " + device_name(e->device);
        if (e->packed) what += " packed";
        for (size_t i = 0; i < e->holders.size(); ++i) {
            if (i == 0)
                std::snprintf(line, sizeof line, "%14lld  %-32s ", static_cast<long long>(e->bytes), what.c_str());
            else
                std::snprintf(line, sizeof line, "%14s  %-32s ", "", "");
            out += line + holder_str(e->holders[i]) + "\n";
        }
    }
    auto totals = [&](const char* title, const std::vector<std::pair<std::string, int64_t>>& rows) {
        out += title;
        for (const auto& [name, bytes] : rows) {
            std::snprintf(line, sizeof line, "%14lld  %s\n", static_cast<long long>(bytes),
                          name.empty() ? "(no module)" : name.c_str());
            out += line;
        }
    };
    totals("by op:\n", bytes_by_op);
    totals("by module:\n", bytes_by_module);
    return out;
}

std::string SavedTensorsReport::json(int indent) const {
    nlohmann::ordered_json j;
    j["total_bytes"] = total_bytes;
    j["entries"] = nlohmann::ordered_json::array();
    for (const SavedTensorEntry& e : entries) {
        nlohmann::ordered_json je;
        je["bytes"] = e.bytes;
        je["shape"] = e.shape;
        je["dtype"] = dtype_name(e.dtype);
        je["device"] = device_name(e.device);
        je["packed"] = e.packed;
        je["holders"] = nlohmann::ordered_json::array();
        for (const SavedTensorHolder& h : e.holders)
            je["holders"].push_back({{"grad_fn", h.grad_fn}, {"sequence_nr", h.sequence_nr}, {"slot", h.slot},
                                     {"module", h.module}, {"via", h.via}});
        j["entries"].push_back(std::move(je));
    }
    j["bytes_by_module"] = nlohmann::ordered_json::object();
    j["bytes_by_op"] = nlohmann::ordered_json::object();
    for (const auto& [name, bytes] : bytes_by_module) j["bytes_by_module"][name] = bytes;
    for (const auto& [name, bytes] : bytes_by_op) j["bytes_by_op"][name] = bytes;
    return j.dump(indent);
}

}  // namespace normtape
