// core/cuda_context.cpp: per-device stream, cuBLAS and cuBLASLt handles with their workspace, and
// cuRAND generator; device queries.
#include "core/cuda_context.h"

#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_event.h"
#include "core/device.h"
#include "core/dry_run.h"
#include "core/tensor_cuda.h"

namespace normtape {

namespace {

struct DeviceContext {
    bool ready = false;
    cudaStream_t stream = nullptr;
    cublasHandle_t cublas = nullptr;
    cublasLtHandle_t cublaslt = nullptr;
    void* workspace = nullptr;
    curandGenerator_t curand = nullptr;
    int compute_capability = 0;  // major * 10 + minor
};

std::vector<DeviceContext>& contexts() {
    static std::vector<DeviceContext> c;
    return c;
}

uint64_t current_seed = 0;

DeviceContext& context(int device) {
    NT_CHECK_AS(DeviceError, cuda_is_available(), "cuda: expected a visible CUDA GPU for device ", device, ", got none");
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    NT_CHECK_AS(DeviceError, device >= 0 && device < count, "cuda: expected a device index in [0, ", count,
                ") (the visible GPUs), got ", device);
    if (contexts().size() < static_cast<size_t>(count)) contexts().resize(count);
    DeviceContext& c = contexts()[device];
    CUDA_CHECK(cudaSetDevice(device));
    if (!c.ready) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&c.cublas));
        CUBLAS_CHECK(cublasSetStream(c.cublas, c.stream));
        CUBLAS_CHECK(cublasSetMathMode(c.cublas, CUBLAS_DEFAULT_MATH));
        CUBLAS_CHECK(cublasLtCreate(&c.cublaslt));
        CUDA_CHECK(cudaMalloc(&c.workspace, cuda::kWorkspaceBytes));
        CUBLAS_CHECK(cublasSetWorkspace(c.cublas, c.workspace, cuda::kWorkspaceBytes));
        CURAND_CHECK(curandCreateGenerator(&c.curand, CURAND_RNG_PSEUDO_PHILOX4_32_10));
        CURAND_CHECK(curandSetStream(c.curand, c.stream));
        CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(c.curand, current_seed));
        int major = 0, minor = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
        c.compute_capability = major * 10 + minor;
        c.ready = true;
    }
    return c;
}

}  // namespace

namespace cuda {

cudaStream_t stream(int device) { return context(device).stream; }
cublasHandle_t cublas(int device) { return context(device).cublas; }
cublasLtHandle_t cublaslt(int device) { return context(device).cublaslt; }
void* workspace(int device) { return context(device).workspace; }
curandGenerator_t curand(int device) { return context(device).curand; }

void manual_seed(uint64_t seed) {
    current_seed = seed;
    for (DeviceContext& c : contexts()) {
        if (!c.ready) continue;
        CURAND_CHECK(curandSetPseudoRandomGeneratorSeed(c.curand, seed));
        CURAND_CHECK(curandSetGeneratorOffset(c.curand, 0));
    }
}

}  // namespace cuda

void detail::cuda_manual_seed(uint64_t seed) { cuda::manual_seed(seed); }

bool cuda_is_built() { return true; }

bool cuda_is_available() {
    static const bool available = [] {  // asked once: the answer cannot change within a process
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) {
            cudaGetLastError();  // clear the "no device" error
            return false;
        }
        return count > 0;
    }();
    return available;
}

int cuda_compute_capability(Device device) {
    NT_CHECK_AS(DeviceError, device.is_cuda(), "cuda_compute_capability: expected a CUDA device, got ", device_name(device));
    return context(device.index).compute_capability;
}

std::string cuda_device_name(Device device) {
    NT_CHECK_AS(DeviceError, device.is_cuda(), "cuda_device_name: expected a CUDA device, got ", device_name(device));
    cuda::stream(device.index);  // checks the device
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
    return prop.name;
}

void synchronize(Device device) {
    if (device.is_cuda() && !is_dry_run()) CUDA_CHECK(cudaStreamSynchronize(cuda::stream(device.index)));
}

namespace detail {

void cuda_end_dry_capture(int device) {
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(cuda::stream(device), &graph);
    if (graph) cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
        cudaGetLastError();  // the capture's error is not the context's
        throw_error<Error>("dry_run: CUDA refused a call while recording the dry run's kernels on cuda:",
                                   device, " (", cudaGetErrorString(err), "): a call that waits for the device or ",
                                   "for another stream cannot be dry-run");
    }
}

void cuda_graph_begin_capture(int device) {
    CUDA_CHECK(cudaStreamBeginCapture(cuda::stream(device), cudaStreamCaptureModeRelaxed));
}

namespace {
std::string refusal(int device, cudaError_t err) {
    return "CUDAGraph::capture: CUDA refused a call while capturing on cuda:" + std::to_string(device) + " (" +
           cudaGetErrorString(err) + "): a read of a device value on the host (item(), a copy to the host), a wait "
           "for the device or for another stream (offload's copies) or a collective cannot be captured";
}
}  // namespace

void* cuda_graph_end_capture(int device) {
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(cuda::stream(device), &graph);
    cudaGraphExec_t exec = nullptr;
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
        cudaGetLastError();  // the capture's error is not the context's
        throw_error<Error>(refusal(device, err));
    }
    return exec;
}

std::string cuda_graph_abort_capture(int device) noexcept {
    cudaGraph_t graph = nullptr;
    const cudaError_t err = cudaStreamEndCapture(cuda::stream(device), &graph);
    if (graph) cudaGraphDestroy(graph);
    if (err == cudaSuccess) return "";
    cudaGetLastError();
    try {
        return refusal(device, err);
    } catch (...) {  // no host memory for the message
        return "CUDAGraph::capture: CUDA refused a call while capturing";
    }
}

void cuda_graph_launch(void* exec, int device) {
    CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), cuda::stream(device)));
}

void cuda_graph_destroy(void* exec) noexcept { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)); }

void* cuda_event_create(int device) {
    cuda::stream(device);  // checks the device and makes it current
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreate(&event));
    return event;
}

void cuda_event_destroy(void* event) noexcept { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

void cuda_event_record(void* event, int device) {
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), cuda::stream(device)));
}

double cuda_event_elapsed_ms(void* start, void* end) {
    CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return ms;
}

}  // namespace detail

}  // namespace normtape
