// nn/checkpoint.cpp: module checkpoints, with or without the AdamW state, written and read as
// safetensors files. Not here: the file format itself (nn/safetensors.cpp).
#include "nn/checkpoint.h"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/bf16.h"
#include "core/device_ptr.h"

namespace normtape {

namespace {

std::string optimizer_json(const AdamW& optimizer) {
    nlohmann::json j;
    const AdamWOptions& o = optimizer.options();
    j["type"] = "AdamW";
    j["step"] = optimizer.step_count();
    j["beta1"] = o.beta1;
    j["beta2"] = o.beta2;
    j["eps"] = o.eps;
    j["groups"] = nlohmann::json::array();
    for (const ParamGroup& g : optimizer.groups())
        j["groups"].push_back({{"size", g.params.size()}, {"weight_decay", g.weight_decay}});
    return j.dump();
}

const std::string kExpAvg = "optimizer.exp_avg.", kExpAvgSq = "optimizer.exp_avg_sq.", kMaster = "optimizer.master.";

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
                     const AdamW* optimizer) {
    NamedTensors tensors = module.named_parameters();
    if (!optimizer) {
        save_safetensors(path, tensors, metadata);
        return;
    }
    NT_CHECK(metadata.count("optimizer") == 0, "save_checkpoint: ", path,
             ": the metadata key \"optimizer\" is reserved for the optimizer's state");
    NamedTensors params = tensors;
    for (const auto& [name, p] : params) {
        const AdamW::ParamState& st = optimizer->state(p);
        tensors.emplace_back(kExpAvg + name, st.m);
        tensors.emplace_back(kExpAvgSq + name, st.v);
        if (st.master.defined()) tensors.emplace_back(kMaster + name, st.master);
    }
    std::map<std::string, std::string> meta = metadata;
    meta["optimizer"] = optimizer_json(*optimizer);
    save_safetensors(path, tensors, meta);
}

void load_checkpoint(const std::string& path, Module& module, AdamW* optimizer, bool* checksummed) {
    std::map<std::string, std::string> metadata;
    bool verified = false;
    NamedTensors file = load_safetensors(path, &metadata, &verified);
    load_checkpoint(path, file, metadata, module, optimizer);
    if (checksummed) *checksummed = verified;
}

void load_checkpoint(const std::string& path, const NamedTensors& file, const std::map<std::string, std::string>& metadata,
                     Module& module, AdamW* optimizer) {
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

    int64_t step = 0;
    if (optimizer) {
        auto it = metadata.find("optimizer");
        NT_CHECK_AS(FormatError, it != metadata.end(), "load_checkpoint: ", path,
                    ": holds no optimizer state (no \"optimizer\" metadata; was it saved with the optimizer?)");
        nlohmann::json j = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
        const AdamWOptions& o = optimizer->options();
        bool well_formed = j.is_object() && j.contains("type") && j["type"] == "AdamW" && j.contains("step") &&
                           j["step"].is_number_unsigned() && j["step"].get<uint64_t>() <= uint64_t(INT64_MAX) &&
                           j.contains("beta1") && j["beta1"].is_number() && j.contains("beta2") &&
                           j["beta2"].is_number() && j.contains("eps") && j["eps"].is_number() && j.contains("groups") &&
                           j["groups"].is_array();
        if (well_formed)
            for (const nlohmann::json& g : j["groups"])
                well_formed = well_formed && g.is_object() && g.contains("size") && g["size"].is_number_unsigned() &&
                              g.contains("weight_decay") && g["weight_decay"].is_number();
        NT_CHECK_AS(FormatError, well_formed, "load_checkpoint: ", path, ": malformed optimizer metadata ", it->second);
        // Shortest round-trip decimal forms: equal strings mean equal doubles.
        auto num = [](double v) { return nlohmann::json(v).dump(); };
        std::string want = "betas (" + num(o.beta1) + ", " + num(o.beta2) + "), eps " + num(o.eps) + ", groups";
        std::string got = "betas (" + num(j["beta1"].get<double>()) + ", " + num(j["beta2"].get<double>()) + "), eps " +
                          num(j["eps"].get<double>()) + ", groups";
        for (const ParamGroup& g : optimizer->groups())
            want += " (" + std::to_string(g.params.size()) + " params, weight decay " + num(g.weight_decay) + ")";
        for (const nlohmann::json& g : j["groups"])
            got += " (" + std::to_string(g["size"].get<uint64_t>()) + " params, weight decay " +
                   num(g["weight_decay"].get<double>()) + ")";
        NT_CHECK(want == got, "load_checkpoint: ", path, ": the optimizer's hyperparameters differ from the file's: expected ",
                 want, ", the file has ", got);
        step = static_cast<int64_t>(j["step"].get<uint64_t>());
        for (const auto& [name, p] : params) {
            const AdamW::ParamState& st = optimizer->state(p);
            copies.push_back({kExpAvg + name, st.m, find(kExpAvg + name, st.m.shape(), st.m.dtype())});
            copies.push_back({kExpAvgSq + name, st.v, find(kExpAvgSq + name, st.v.shape(), st.v.dtype())});
            if (st.master.defined())
                copies.push_back({kMaster + name, st.master, find(kMaster + name, st.master.shape(), st.master.dtype())});
            else
                NT_CHECK_AS(FormatError, by_name.count(kMaster + name) == 0, "load_checkpoint: ", path, ": holds ",
                            kMaster, name, " but parameter ", name, " is ", dtype_name(p.dtype()),
                            " (master copies are for bf16 parameters)");
        }
    }
    // A NaN or an Inf, or a negative second moment, would make every later step NaN: refused
    // before anything is modified.
    for (const Copy& c : copies) check_values(path, c.name, c.src);
    NoGradGuard no_grad;
    for (Copy& c : copies) c.dst.copy_(c.src.to(c.dst.device()));
    if (optimizer) optimizer->set_step_count(step);
}

}  // namespace normtape
