// core/device.h: where tensor data lives.
//
// Only the CPU backend is built today; Device::CUDA is named so that messages and checks can
// refer to it, and asking for it throws until the CUDA backend lands.
#pragma once

namespace normtape {

enum class Device { CPU, CUDA };

inline const char* device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

}  // namespace normtape
