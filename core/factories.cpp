// core/factories.cpp: the factories that make tensors: empty, zeros, ones, full, randn, arange,
// from_vector (declared in core/tensor.h), and the checks of shape, dtype and device they share.
// Not here: the generator randn draws from (core/random.cpp), Tensor's methods (core/tensor.cpp).
#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "core/cuda_dispatch.h"
#include "core/dispatch.h"
#include "core/dry_run.h"
#include "core/tensor_cuda.h"
#include "core/tensor_internal.h"

namespace normtape {

using detail::empty_for;

namespace {

// Throws DeviceError naming `op` when `device` is a GPU that this build or this machine lacks.
void check_device(const char* op, Device device) {
    NT_CHECK_AS(DeviceError, device.is_cpu() || cuda_is_built(), op, ": expected device cpu, got ",
                device_name(device), ", which needs the CUDA backend that this build of normtape does not have");
    NT_CHECK_AS(DeviceError, device.is_cpu() || cuda_is_available(), op, ": expected a visible CUDA GPU for ",
                device_name(device), ", got none");
}

// numel of a shape about to back new data: throws ShapeError naming `op` when a size is
// negative, numel * elem_size would not fit in int64, or the strides would not
// (detail::check_strides_fit), so that no product below can overflow.
int64_t checked_numel(const char* op, const Shape& shape, size_t elem_size = 8) {
    for (int64_t s : shape)
        NT_CHECK_AS(ShapeError, s >= 0, op, ": expected sizes >= 0, got shape ", shape_str(shape));
    int64_t n = 1;
    for (int64_t s : shape) {
        NT_CHECK_AS(ShapeError, !__builtin_mul_overflow(n, s, &n) && n <= INT64_MAX / static_cast<int64_t>(elem_size),
                    op, ": shape ", shape_str(shape), " has more elements than fit in memory (expected numel * ",
                    elem_size, " bytes to fit in int64, got an overflow)");
    }
    detail::check_strides_fit(op, shape);
    return n;
}

Tensor full_for(const char* op, const Shape& shape, double value, TensorOptions options) {
    NT_CHECK_AS(DTypeError, !options.requires_grad_ || is_floating(options.dtype_), op,
                ": expected a floating dtype with requires_grad (only floating tensors can require grad), got ",
                dtype_name(options.dtype_));
    Tensor t = empty_for(op, shape, options.requires_grad(false));
    t.fill_(value);
    return t.requires_grad_(options.requires_grad_);
}

}  // namespace

Tensor detail::empty_for(const char* op, const Shape& shape, TensorOptions options) {
    int64_t n = checked_numel(op, shape, element_size(options.dtype_));
    NT_CHECK_AS(DTypeError, !options.requires_grad_ || is_floating(options.dtype_), op,
                ": expected a floating dtype with requires_grad (only floating tensors can require grad), got ",
                dtype_name(options.dtype_));
    check_device(op, options.device_);
    size_t nbytes = static_cast<size_t>(n) * element_size(options.dtype_);
    auto impl = std::make_shared<TensorImpl>();
    try {
        impl->storage = std::make_shared<Storage>(nbytes, options.device_);
    } catch (const OutOfMemoryError& e) {
        detail::throw_error<OutOfMemoryError>(op, ": cannot allocate a tensor of shape ", shape_str(shape), " ",
                                              dtype_name(options.dtype_), " (", nbytes, " bytes) on ",
                                              device_name(options.device_), ": ", e.what());
    }
    impl->shape = shape;
    impl->strides = contiguous_strides(shape);
    impl->dtype = options.dtype_;
    impl->device = options.device_;
    impl->requires_grad = options.requires_grad_;
    if (options.requires_grad_) impl->storage->mark_parameter();
    return Tensor(impl);
}

Tensor empty(const Shape& shape, TensorOptions options) { return empty_for("empty", shape, options); }
Tensor full(const Shape& shape, double value, TensorOptions options) { return full_for("full", shape, value, options); }
Tensor zeros(const Shape& shape, TensorOptions options) { return full_for("zeros", shape, 0.0, options); }
Tensor ones(const Shape& shape, TensorOptions options) { return full_for("ones", shape, 1.0, options); }

Tensor randn(const Shape& shape, TensorOptions options) {
    NT_CHECK_AS(DTypeError, is_floating(options.dtype_), "randn: expected a floating dtype, got ",
                dtype_name(options.dtype_));
    Tensor t = empty_for("randn", shape, options);
    if (t.device().is_cuda()) {  // cuRAND's normal generators make pairs: f32 (f64 for f64), an even count
        const int64_t n = t.numel();
        const DType pair_dtype = t.dtype() == DType::F64 ? DType::F64 : DType::F32;
        const Tensor pairs = empty_for("randn", {n + (n & 1)}, TensorOptions().dtype(pair_dtype).device(t.device()));
        if (!is_dry_run()) NT_CUDA(detail::randn_cuda(t, pairs));
        return t;
    }
    if (is_dry_run()) return t;  // Note [The dry run]: no values, and the generator does not advance
    dispatch_floating(t.dtype(), "randn", [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data_ptr<T>();
        for (int64_t i = 0, end = t.numel(); i < end; ++i) p[i] = static_cast<T>(randn_scalar());
    });
    return t;
}

Tensor arange(int64_t end, TensorOptions options) {
    NT_CHECK_AS(ShapeError, end >= 0, "arange: expected end >= 0, got ", end);
    if (options.device_.is_cuda()) {
        check_device("arange", options.device_);
        return arange(end, options.device(Device::CPU).requires_grad(false))
            .to(options.device_)
            .requires_grad_(options.requires_grad_);
    }
    Tensor t = empty_for("arange", {end}, options);
    if (is_dry_run()) return t;
    dispatch_all(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data_ptr<T>();
        for (int64_t i = 0; i < end; ++i) p[i] = static_cast<T>(i);
    });
    return t;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
    Shape s = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
    int64_t n = checked_numel("from_vector", s);
    NT_CHECK_AS(ShapeError, n == static_cast<int64_t>(values.size()), "from_vector: expected ", n,
                " values for shape ", shape_str(s), ", got ", values.size());
    check_device("from_vector", options.device_);
    Tensor t = empty_for("from_vector", s, options.dtype(dtype_of<T>()).device(Device::CPU));
    if (!is_dry_run()) std::copy(values.begin(), values.end(), t.data_ptr<T>());
    return options.device_.is_cuda() ? t.to(options.device_).requires_grad_(options.requires_grad_) : t;
}
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<bf16>(const std::vector<bf16>&, const Shape&, TensorOptions);

}  // namespace normtape
