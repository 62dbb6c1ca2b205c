// nn/checkpoint.cpp: a safetensors writer and reader over nlohmann::json.
#include "nn/checkpoint.h"

#include <cstring>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/autograd.h"

namespace normtape {

namespace {

const char* st_dtype(DType d) {
    switch (d) {
        case DType::F32: return "F32";
        case DType::F64: return "F64";
        case DType::BF16: return "BF16";
        case DType::I64: return "I64";
    }
    return "?";
}

bool parse_st_dtype(const std::string& s, DType* out) {
    if (s == "F32") *out = DType::F32;
    else if (s == "F64") *out = DType::F64;
    else if (s == "BF16") *out = DType::BF16;
    else if (s == "I64") *out = DType::I64;
    else return false;
    return true;
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::vector<Tensor> data;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
        NT_CHECK(names.insert(name).second, "save_safetensors: ", path, ": duplicate tensor name ", name);
        Tensor c = t.device().is_cuda() ? t.to(Device::CPU) : t.detach().contiguous();
        uint64_t n = static_cast<uint64_t>(c.nbytes());
        header[name] = {{"dtype", st_dtype(c.dtype())}, {"shape", c.shape()}, {"data_offsets", {offset, offset + n}}};
        offset += n;
        data.push_back(c);
    }
    // Names or metadata that are not valid UTF-8 are written with U+FFFD rather than throwing.
    std::string text = header.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    NT_CHECK(f.good(), "save_safetensors: cannot open ", path, " for writing");
    uint64_t len = text.size();
    unsigned char len_le[8];
    for (int i = 0; i < 8; ++i) len_le[i] = static_cast<unsigned char>(len >> (8 * i));
    f.write(reinterpret_cast<const char*>(len_le), 8);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Tensor& c : data)
        if (c.nbytes() > 0) f.write(static_cast<const char*>(c.storage()->data()) + c.impl().offset * element_size(c.dtype()), c.nbytes());
    f.flush();
    NT_CHECK(f.good(), "save_safetensors: error while writing ", path);
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    NT_CHECK(f.good(), "load_safetensors: cannot open ", path);
    uint64_t file_size = static_cast<uint64_t>(f.tellg());
    f.seekg(0);
    NT_CHECK(file_size >= 8, "load_safetensors: ", path, ": file of ", file_size, " bytes is too short for a header");
    unsigned char len_le[8];
    f.read(reinterpret_cast<char*>(len_le), 8);
    uint64_t len = 0;
    for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(len_le[i]) << (8 * i);
    NT_CHECK(len <= file_size - 8, "load_safetensors: ", path, ": header length ", len, " exceeds the file size ", file_size);
    std::string text(len, '\0');
    f.read(text.data(), static_cast<std::streamsize>(len));
    nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    NT_CHECK(header.is_object(), "load_safetensors: ", path, ": header is not a JSON object");
    uint64_t data_size = file_size - 8 - len;

    NamedTensors out;
    for (auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (metadata && entry.is_object())
                for (auto& [k, v] : entry.items()) (*metadata)[k] = v.is_string() ? v.get<std::string>() : v.dump();
            continue;
        }
        DType dtype;
        NT_CHECK(entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
                     parse_st_dtype(entry["dtype"].get<std::string>(), &dtype),
                 "load_safetensors: ", path, ": tensor ", name, " has a missing or unsupported dtype (expected F32, F64, BF16 or I64)");
        NT_CHECK(entry.contains("shape") && entry["shape"].is_array() && entry.contains("data_offsets") &&
                     entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
                 "load_safetensors: ", path, ": tensor ", name, " needs shape and data_offsets [begin, end]");
        Shape shape;
        uint64_t numel = 1;
        for (auto& d : entry["shape"]) {
            NT_CHECK(d.is_number_unsigned(), "load_safetensors: ", path, ": tensor ", name, " has a bad shape entry");
            shape.push_back(d.get<int64_t>());
            NT_CHECK(d.get<uint64_t>() <= (uint64_t(1) << 62) && !__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel) &&
                         numel <= (uint64_t(1) << 60),
                     "load_safetensors: ", path, ": tensor ", name, " has a shape too large for memory");
        }
        NT_CHECK(entry["data_offsets"][0].is_number_unsigned() && entry["data_offsets"][1].is_number_unsigned(),
                 "load_safetensors: ", path, ": tensor ", name, " has non-integer data_offsets");
        uint64_t begin = entry["data_offsets"][0].get<uint64_t>(), end = entry["data_offsets"][1].get<uint64_t>();
        NT_CHECK(begin <= end && end <= data_size && end - begin == numel * element_size(dtype), "load_safetensors: ",
                 path, ": tensor ", name, " has data_offsets [", begin, ", ", end, "] that do not fit its shape ",
                 shape_str(shape), " ", dtype_name(dtype), " within ", data_size, " data bytes");
        Tensor t = empty(shape, TensorOptions().dtype(dtype));
        f.seekg(static_cast<std::streamoff>(8 + len + begin));
        if (end > begin) f.read(static_cast<char*>(t.storage()->data()), static_cast<std::streamsize>(end - begin));
        NT_CHECK(f.good(), "load_safetensors: ", path, ": read error in tensor ", name);
        out.emplace_back(name, t);
    }
    return out;
}

void save_checkpoint(const std::string& path, const Module& module, const std::map<std::string, std::string>& metadata) {
    save_safetensors(path, module.named_parameters(), metadata);
}

void load_checkpoint(const std::string& path, Module& module) {
    NamedTensors file = load_safetensors(path);
    std::map<std::string, Tensor> by_name(file.begin(), file.end());
    NamedTensors params = module.named_parameters();
    for (const auto& [name, p] : params) {
        auto it = by_name.find(name);
        NT_CHECK(it != by_name.end(), "load_checkpoint: ", path, ": missing parameter ", name);
        NT_CHECK(it->second.shape() == p.shape() && it->second.dtype() == p.dtype(), "load_checkpoint: ", path,
                 ": parameter ", name, " expected ", shape_str(p.shape()), " ", dtype_name(p.dtype()), ", got ",
                 shape_str(it->second.shape()), " ", dtype_name(it->second.dtype()));
    }
    NoGradGuard no_grad;
    for (auto& [name, p] : params) Tensor(p).copy_(by_name[name].to(p.device()));
}

}  // namespace normtape
