// core/device.h: where tensor data lives: the CPU, or CUDA device `index`.
//
// Device::CPU and Device::CUDA (CUDA device 0) read like enum values; Device::cuda(i) names
// another GPU. The CUDA backend is built when CMake finds the CUDA toolkit (NORMTAPE_CUDA);
// cuda_is_available() tells at run time whether a GPU is visible.
#pragma once

#include <string>

namespace normtape {

enum class DeviceType { CPU, CUDA };

struct Device {
    DeviceType type = DeviceType::CPU;
    int index = 0;

    static const Device CPU;
    static const Device CUDA;
    static constexpr Device cuda(int index) { return Device{DeviceType::CUDA, index}; }

    constexpr bool is_cpu() const { return type == DeviceType::CPU; }
    constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
    constexpr bool operator==(const Device& other) const { return type == other.type && index == other.index; }
    constexpr bool operator!=(const Device& other) const { return !(*this == other); }
};

inline constexpr Device Device::CPU{DeviceType::CPU, 0};
inline constexpr Device Device::CUDA{DeviceType::CUDA, 0};

// "cpu", "cuda" (device 0) or "cuda:1", as PyTorch prints devices.
inline std::string device_name(Device device) {
    if (device.is_cpu()) return "cpu";
    return device.index == 0 ? "cuda" : "cuda:" + std::to_string(device.index);
}

// True when this build has the CUDA backend and at least one GPU is visible.
bool cuda_is_available();

// True when this build has the CUDA backend (whether or not a GPU is visible).
bool cuda_is_built();

// Waits until all work queued on `device` has finished (no-op on the cpu). Throws DeviceError for
// CUDA in a build without the backend, with no GPU visible or for a GPU index that is not there;
// Error on a CUDA error, which it reports with the failing call's file and line.
void synchronize(Device device);

}  // namespace normtape
