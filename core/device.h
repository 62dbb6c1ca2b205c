// core/device.h: where tensor data lives: the CPU, or CUDA device `index`.
//
// Device::CPU and Device::CUDA (CUDA device 0) read like enum values; Device::cuda(i) names
// another GPU. The CUDA backend is built when CMake finds the CUDA toolkit (NORMTAPE_CUDA);
// cuda_is_available() tells at run time whether a GPU is visible.
#pragma once

#include <cstdint>
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

// The compute capability of CUDA device `device` as major * 10 + minor, as in sm_90: 80 for an
// A100, 86 for an RTX 3090, 89 for an RTX 4090 or L4, 90 for an H100, 120 for an RTX 5090.
// bf16 needs 80 or later (ops refuse it below, naming the op and this number); f32 runs on any GPU
// the build has kernels for. Throws DeviceError for the cpu, in a build without the CUDA backend,
// with no GPU visible, or for an index that is not there.
int cuda_compute_capability(Device device);

// The name of CUDA device `device` as the driver reports it (cudaDeviceProp::name, e.g. "NVIDIA
// H100 80GB HBM3"). Throws as cuda_compute_capability.
std::string cuda_device_name(Device device);

// Waits until all work queued on `device` has finished (no-op on the cpu). Throws DeviceError for
// CUDA in a build without the backend, with no GPU visible or for a GPU index that is not there;
// Error on a CUDA error, which it reports with the failing call's file and line.
void synchronize(Device device);

// A point in `device`'s queue of work, for timing that work without waiting for it (as PyTorch's
// torch.cuda.Event(enable_timing=True)). On CUDA a cudaEvent_t on normtape's stream for the
// device; on the cpu the host's steady clock (cpu ops are done when they return).
// Not copyable (it owns the CUDA event); movable.
class Event {
public:
    // Throws DeviceError as synchronize() does; Error on a CUDA error.
    explicit Event(Device device);
    ~Event();
    Event(Event&& other) noexcept;
    Event& operator=(Event&& other) noexcept;
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;

    // Marks the point reached once all the work queued on the device so far is done; queues
    // nothing else and returns at once. May be called again to mark a later point.
    void record();
    // The time from `start` to `end` in ms, once `end` is reached (waits for it; no more).
    // Throws Error naming elapsed_ms if either was never recorded or they are on different devices.
    static double elapsed_ms(const Event& start, const Event& end);

    Device device() const { return device_; }

private:
    Device device_;
    void* cuda_event_ = nullptr;  // cudaEvent_t on CUDA
    int64_t host_ns_ = 0;         // steady clock at record() on the cpu
    bool recorded_ = false;
};

}  // namespace normtape
