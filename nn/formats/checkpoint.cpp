// nn/formats/checkpoint.cpp: module checkpoints, with or without the AdamW state, written and read as
// safetensors files. Not here: the file format itself (nn/formats/safetensors.cpp).
#include "nn/formats/checkpoint.h"

#include <cmath>
#include <cstdint>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/bf16.h"
#include "core/device_ptr.h"
#include "nn/formats/checkpoint_metadata.h"

namespace normtape {

namespace {

nlohmann::json groups_json(const std::vector<ParamGroup>& groups) {
    nlohmann::json j = nlohmann::json::array();
    for (const ParamGroup& g : groups)
        j.push_back({{"size", g.params.size()}, {"weight_decay", g.weight_decay}, {"lr_scale", g.lr_scale}});
    return j;
}

std::string optimizer_json(const AdamW& optimizer) {
    const AdamWOptions& o = optimizer.options();
    nlohmann::json j = {{"type", "AdamW"}, {"step", optimizer.step_count()}, {"beta1", o.beta1},
                        {"beta2", o.beta2},  {"eps", o.eps},                   {"groups", groups_json(optimizer.groups())}};
    return j.dump();
}

std::string optimizer_json(const Muon& optimizer) {
    const MuonOptions& o = optimizer.options();
    nlohmann::json j = {{"type", "Muon"},         {"step", optimizer.step_count()}, {"momentum", o.momentum},
                        {"nesterov", o.nesterov}, {"ns_steps", o.ns_steps},        {"groups", groups_json(optimizer.groups())}};
    return j.dump();
}

const std::string kAdamWKey = "optimizer", kMuonKey = "optimizer.muon";

// The parameters of an optimizer's groups (none for a null optimizer), by identity.
template <class Optimizer>
std::unordered_set<const TensorImpl*> members(const Optimizer* optimizer) {
    std::unordered_set<const TensorImpl*> set;
    if (optimizer)
        for (const ParamGroup& g : optimizer->groups())
            for (const Tensor& p : g.params) set.insert(&p.impl());
    return set;
}

// Whether parameter `name` is AdamW's (else Muon's): Error naming the file when it is in neither
// of the optimizers given or in both.
bool owned_by_adamw(const char* op, const std::string& path, const std::string& name, const Tensor& p,
                    const std::unordered_set<const TensorImpl*>& adamw, const std::unordered_set<const TensorImpl*>& muon) {
    const bool a = adamw.count(&p.impl()) > 0, m = muon.count(&p.impl()) > 0;
    NT_CHECK(a != m, op, ": ", path, ": expected parameter ", name, " in exactly one optimizer, it is in ",
             a ? "both AdamW and Muon" : "none of those given");
    return a;
}

const std::string kExpAvg = "optimizer.exp_avg.", kExpAvgSq = "optimizer.exp_avg_sq.", kMaster = "optimizer.master.",
                  kMomentumBuffer = "optimizer.momentum_buffer.";

// "parameter " or "optimizer state ", for messages about the file's tensor `name`.
const char* kind_of(const std::string& name) { return name.rfind("optimizer.", 0) == 0 ? "optimizer state " : "parameter "; }

// The flat index of the first NaN or Inf (or, with `non_negative`, value below 0) of a host
// tensor's contiguous elements of type T, or -1.
template <class T>
int64_t first_bad(const Tensor& t, bool non_negative, double* value) {
    const T* p = reinterpret_cast<const T*>(detail::byte_ptr(t));
    for (int64_t i = 0; i < t.numel(); ++i) {
        double v = static_cast<double>(p[i]);  // exact for each of float, double and bf16
        if (!std::isfinite(v) || (non_negative && v < 0)) {
            *value = v;
            return i;
        }
    }
    return -1;
}

// FormatError when the file's tensor `name` (`t`, any device; f32, f64 or bf16: others are not
// checked) holds a NaN or an Inf, or is AdamW's second moment (exp_avg_sq, a mean of squares) and
// holds a negative value, on which the next step would take the square root of a negative
// number; names the first bad value's flat index and the value.
void check_values(const std::string& path, const std::string& name, const Tensor& t) {
    Tensor c = t.device().is_cuda() ? t.to(Device::CPU) : t.contiguous();
    const bool non_negative = name.rfind(kExpAvgSq, 0) == 0;
    double value = 0.0;
    int64_t at = -1;
    switch (c.dtype()) {
        case DType::F32: at = first_bad<float>(c, non_negative, &value); break;
        case DType::F64: at = first_bad<double>(c, non_negative, &value); break;
        case DType::BF16: at = first_bad<bf16>(c, non_negative, &value); break;
        case DType::I64: break;
    }
    if (at < 0) return;
    const std::string where = " at flat index " + std::to_string(at) + " of " + shape_str(c.shape()) + " " +
                              dtype_name(c.dtype());
    NT_CHECK_AS(FormatError, std::isfinite(value), "load_checkpoint: ", path, ": ", kind_of(name), name,
                " holds a non-finite value (", std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf", ")", where,
                " (a checkpoint of a run that diverged?)");
    detail::throw_error<FormatError>("load_checkpoint: ", path, ": ", kind_of(name), name, " holds a negative value (",
                                     value, ")", where,
                                     ": expected AdamW's second moment, a mean of squares, >= 0 (the file was modified?)");
}

}  // namespace

void save_checkpoint(const std::string& path, const Module& module, const std::map<std::string, std::string>& metadata,
                     const AdamW* optimizer, const Muon* muon) {
    NamedTensors tensors = module.named_parameters();
    if (!optimizer && !muon) {
        save_safetensors(path, tensors, metadata);
        return;
    }
    for (const std::string& key : {kAdamWKey, kMuonKey})
        NT_CHECK(metadata.count(key) == 0, "save_checkpoint: ", path, ": the metadata key \"", key,
                 "\" is reserved for the optimizers' state");
    const auto in_adamw = members(optimizer), in_muon = members(muon);
    NamedTensors params = tensors;
    for (const auto& [name, p] : params) {
        Tensor master;
        if (owned_by_adamw("save_checkpoint", path, name, p, in_adamw, in_muon)) {
            const AdamW::ParamState& st = optimizer->state(p);
            tensors.emplace_back(kExpAvg + name, st.m);
            tensors.emplace_back(kExpAvgSq + name, st.v);
            master = st.master;
        } else {
            const Muon::ParamState& st = muon->state(p);
            tensors.emplace_back(kMomentumBuffer + name, st.momentum_buffer);
            master = st.master;
        }
        if (master.defined()) tensors.emplace_back(kMaster + name, master);
    }
    std::map<std::string, std::string> meta = metadata;
    if (optimizer) meta[kAdamWKey] = optimizer_json(*optimizer);
    if (muon) meta[kMuonKey] = optimizer_json(*muon);
    save_safetensors(path, tensors, meta);
}

void load_checkpoint(const std::string& path, Module& module, AdamW* optimizer, bool* checksummed, Muon* muon) {
    std::map<std::string, std::string> metadata;
    bool verified = false;
    NamedTensors file = load_safetensors(path, &metadata, &verified);
    load_checkpoint(path, file, metadata, module, optimizer, muon);
    if (checksummed) *checksummed = verified;
}

void load_checkpoint(const std::string& path, const NamedTensors& file, const std::map<std::string, std::string>& metadata,
                     Module& module, AdamW* optimizer, Muon* muon) {
    std::map<std::string, Tensor> by_name(file.begin(), file.end());
    // The file's tensor `name`, checked against the shape and dtype of `like`.
    auto find = [&](const std::string& name, const Shape& shape, DType dtype) -> const Tensor& {
        auto it = by_name.find(name);
        NT_CHECK_AS(FormatError, it != by_name.end(), "load_checkpoint: ", path, ": missing ", kind_of(name), name);
        const Tensor& t = it->second;
        NT_CHECK_AS(ShapeError, t.shape() == shape, "load_checkpoint: ", path, ": ", kind_of(name), name, " expected ",
                    shape_str(shape), " ", dtype_name(dtype), ", got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
        NT_CHECK_AS(DTypeError, t.dtype() == dtype, "load_checkpoint: ", path, ": ", kind_of(name), name, " expected ",
                    shape_str(shape), " ", dtype_name(dtype), ", got ", shape_str(t.shape()), " ", dtype_name(t.dtype()));
        return t;
    };
    NamedTensors params = module.named_parameters();
    // What to copy once everything has been checked: the file's tensor `name` into `dst`.
    struct Copy {
        std::string name;
        Tensor dst, src;
    };
    std::vector<Copy> copies;
    for (const auto& [name, p] : params) copies.push_back({name, p, find(name, p.shape(), p.dtype())});

    // Each optimizer's metadata checked against it; the steps to restore.
    int64_t adamw_step = 0, muon_step = 0;
    if (optimizer) adamw_step = detail::stored_step(path, metadata, kAdamWKey, optimizer_json(*optimizer));
    if (muon) muon_step = detail::stored_step(path, metadata, kMuonKey, optimizer_json(*muon));
    const auto in_adamw = members(optimizer), in_muon = members(muon);
    if (optimizer || muon)
        for (const auto& [name, p] : params) {
            Tensor master;
            if (owned_by_adamw("load_checkpoint", path, name, p, in_adamw, in_muon)) {
                const AdamW::ParamState& st = optimizer->state(p);
                copies.push_back({kExpAvg + name, st.m, find(kExpAvg + name, st.m.shape(), st.m.dtype())});
                copies.push_back({kExpAvgSq + name, st.v, find(kExpAvgSq + name, st.v.shape(), st.v.dtype())});
                master = st.master;
            } else {
                const Tensor& buf = muon->state(p).momentum_buffer;
                copies.push_back({kMomentumBuffer + name, buf, find(kMomentumBuffer + name, buf.shape(), buf.dtype())});
                master = muon->state(p).master;
            }
            if (master.defined())
                copies.push_back({kMaster + name, master, find(kMaster + name, master.shape(), master.dtype())});
            else
                NT_CHECK_AS(FormatError, by_name.count(kMaster + name) == 0, "load_checkpoint: ", path, ": holds ", kMaster,
                            name, " but parameter ", name, " is ", dtype_name(p.dtype()),
                            " (master copies are for bf16 parameters)");
        }
    // A NaN or an Inf, or a negative second moment, would make every later step NaN: refused
    // before anything is modified.
    for (const Copy& c : copies) check_values(path, c.name, c.src);
    NoGradGuard no_grad;
    for (Copy& c : copies) c.dst.copy_(c.src.to(c.dst.device()));
    if (optimizer) optimizer->set_step_count(adamw_step);
    if (muon) muon->set_step_count(muon_step);
}

}  // namespace normtape
