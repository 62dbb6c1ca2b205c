// nn/optim/step_scalars.cu: the kernel that advances an optimizer's step count on the device
// (nn/optim/step_scalars.h).
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "nn/optim/step_scalars.h"

namespace normtape::detail {

namespace {
__global__ void step_scalars_advance_kernel(double* s, double beta1, double beta2) {
    const double t = s[1] + 1.0;
    s[1] = t;
    s[2] = 1.0 - pow(beta1, t);
    s[3] = 1.0 - pow(beta2, t);
}
}  // namespace

void step_scalars_advance_cuda(double* scalars, double beta1, double beta2, int device) {
    step_scalars_advance_kernel<<<1, 1, 0, cuda::stream(device)>>>(scalars, beta1, beta2);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace normtape::detail
