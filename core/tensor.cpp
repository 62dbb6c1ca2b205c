// core/tensor.cpp: Tensor's methods: shape functions (view, reshape, transpose, contiguous,
// clone) and their autograd nodes, element access, copies across dtypes and devices, in-place
// updates; their cpu loops run in chunks on parallel threads (core/parallel.h). Not here: the
// factories (core/factories.cpp), the global generator (core/random.cpp), printing and shape_str
// (core/print.cpp).
#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/dry_run.h"
#include "core/parallel.h"
#include "core/tensor_cuda.h"
#include "core/tensor_internal.h"

namespace normtape {

Shape detail::contiguous_strides(const Shape& shape) {
    Shape strides(shape.size());
    int64_t s = 1;
    for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
        strides[i] = s;
        s *= shape[i];
    }
    return strides;
}

void detail::check_strides_fit(const char* op, const Shape& shape) {
    int64_t span = 1;
    for (int64_t s : shape)
        NT_CHECK_AS(ShapeError, !__builtin_mul_overflow(span, std::max<int64_t>(s, 1), &span), op, ": shape ",
                    shape_str(shape), " has strides that overflow int64 (expected the product of its nonzero sizes ",
                    "to fit in int64)");
}

using detail::check_strides_fit;
using detail::contiguous_strides;
using detail::empty_for;
using detail::kGrain;
using detail::parallel_for;

namespace {

int64_t shape_numel(const Shape& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
}

// Calls f(i, storage offset of element i) for the elements i in [i0, i1) of a strided tensor,
// numbered in row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t offset, int64_t i0, int64_t i1, F&& f) {
    if (i0 >= i1) return;
    const int64_t dims = static_cast<int64_t>(shape.size());
    std::vector<int64_t> index(shape.size(), 0);
    int64_t off = offset;
    for (int64_t d = dims - 1, rest = i0; d >= 0; --d) {  // element i0's index and offset
        index[d] = rest % shape[d];
        rest /= shape[d];
        off += index[d] * strides[d];
    }
    for (int64_t i = i0; i < i1; ++i) {
        f(i, off);
        for (int64_t d = dims - 1; d >= 0; --d) {
            if (++index[d] < shape[d]) {
                off += strides[d];
                break;
            }
            off -= (shape[d] - 1) * strides[d];
            index[d] = 0;
        }
    }
}

// Copies src (any strides, any dtype) into the contiguous tensor dst of the same numel and device.
// Throws naming `to` where a floating value does not fit in i64.
void copy_elements(const Tensor& dst, const Tensor& src) {
    NT_CHECK_AS(DeviceError, dst.device() == src.device(), "copy: expected tensors on one device, got ",
                device_name(dst.device()), " and ", device_name(src.device()), "; use to(Device)");
    if (dst.device().is_cuda()) {
        NT_CUDA(detail::copy_cuda(dst, src));
        return;
    }
    if (is_dry_run()) return;
    dispatch_all(dst.dtype(), [&](auto dst_tag) {
        using D = decltype(dst_tag);
        D* out = detail::device_ptr<D>(dst);
        dispatch_all(src.dtype(), [&](auto src_tag) {
            using S = decltype(src_tag);
            const S* in = static_cast<const S*>(src.storage()->data());
            auto convert = [&](int64_t i, int64_t off) {
                if constexpr (std::is_integral_v<D> && !std::is_integral_v<S>)
                    NT_CHECK(in[off] >= -0x1p63 && in[off] < 0x1p63, "to: value ", double(in[off]), " does not fit in ",
                             dtype_name(dst.dtype()), " (expected a value in [-2^63, 2^63))");
                if constexpr (std::is_integral_v<D>) out[i] = static_cast<D>(static_cast<acc_t<S>>(in[off]));
                else out[i] = static_cast<D>(in[off]);
            };
            const int64_t offset = src.impl().offset;
            const bool contiguous = src.is_contiguous();
            parallel_for(0, src.numel(), kGrain, [&](int64_t i0, int64_t i1) {
                if (contiguous) {
                    for (int64_t i = i0; i < i1; ++i) convert(i, offset + i);
                } else {
                    for_each_offset(src.shape(), src.strides(), offset, i0, i1, convert);
                }
            });
        });
    });
}

// Resolves one -1 in `shape` against numel; throws naming `op` when impossible.
Shape infer_shape(const char* op, const Shape& shape, int64_t numel, const Shape& from) {
    Shape out = shape;
    int64_t known = 1;
    int infer = -1;
    for (size_t i = 0; i < out.size(); ++i) {
        if (out[i] == -1) {
            NT_CHECK_AS(ShapeError, infer < 0, op, ": expected at most one dimension of -1, got shape ",
                        shape_str(shape));
            infer = static_cast<int>(i);
        } else {
            NT_CHECK_AS(ShapeError, out[i] >= 0, op, ": expected sizes >= 0 or -1, got shape ", shape_str(shape));
            NT_CHECK_AS(ShapeError, !__builtin_mul_overflow(known, out[i], &known), op, ": expected a shape of ",
                        numel, " elements (input of shape ", shape_str(from), "), got ", shape_str(shape),
                        ", whose element count overflows int64");
        }
    }
    if (infer >= 0) {
        NT_CHECK_AS(ShapeError, known != 0 && numel % known == 0, op, ": expected a shape of ", numel,
                    " elements (input of shape ", shape_str(from), "), got ", shape_str(shape));
        out[infer] = numel / known;
    }
    NT_CHECK_AS(ShapeError, shape_numel(out) == numel, op, ": expected a shape of ", numel, " elements (input of shape ",
                shape_str(from), "), got ", shape_str(shape));
    check_strides_fit(op, out);
    return out;
}

Tensor make_view(const Tensor& t, Shape shape, Shape strides) {
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = t.storage();
    impl->shape = std::move(shape);
    impl->strides = std::move(strides);
    impl->offset = t.impl().offset;
    impl->dtype = t.dtype();
    impl->device = t.device();
    return Tensor(impl);
}

// Backward of view/reshape: the gradient reshaped to the input's shape.
struct ViewBackward : Node {
    Shape input_shape;
    explicit ViewBackward(Shape s) : input_shape(std::move(s)) {}
    const char* name() const override { return "ViewBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {grad_output.contiguous().view(input_shape)};
    }
};

// Backward of transpose(dim0, dim1): the gradient transposed back.
struct TransposeBackward : Node {
    int64_t dim0, dim1;
    TransposeBackward(int64_t a, int64_t b) : dim0(a), dim1(b) {}
    const char* name() const override { return "TransposeBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {grad_output.transpose(dim0, dim1).contiguous()};
    }
};

// Backward of narrow(dim, start, length): the gradient written into zeros of the input's shape.
// With dim moved to the front, the narrowed rows of a contiguous tensor are one contiguous block.
struct NarrowBackward : Node {
    Shape input_shape;
    int64_t dim, start, length;
    NarrowBackward(Shape s, int64_t d, int64_t st, int64_t len)
        : input_shape(std::move(s)), dim(d), start(st), length(len) {}
    const char* name() const override { return "NarrowBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Shape front = input_shape;
        std::swap(front[0], front[dim]);
        Tensor grad = zeros(front, TensorOptions().dtype(grad_output.dtype()).device(grad_output.device()));
        grad.narrow(0, start, length).copy_(grad_output.transpose(0, dim).contiguous());
        return {grad.transpose(0, dim).contiguous()};
    }
};

// Backward of clone/contiguous: the gradient passes through unchanged.
struct CloneBackward : Node {
    const char* name() const override { return "CloneBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override { return {grad_output}; }
};

void check_inplace(const Tensor& t, const char* op) {
    NT_CHECK(!(grad_mode_enabled() && t.requires_grad()), op,
             ": expected a tensor that does not require grad, got one that does: it cannot be modified in place "
             "while grad mode is on; wrap the update in NoGradGuard");
}

// In-place ops write contiguous tensors only: throws ShapeError naming `op` otherwise.
void check_contiguous_destination(const Tensor& dst, const char* op) {
    NT_CHECK_AS(ShapeError, dst.is_contiguous(), op, ": expected a contiguous destination, got shape ",
                shape_str(dst.shape()), " with strides ", shape_str(dst.strides()));
}

// What an in-place op that reads `src` (named `arg`) element for element into `dst` expects: the
// same shape, dtype and device, and a contiguous destination. Throws ShapeError, DTypeError or
// DeviceError naming `op`.
void check_inplace_operand(const Tensor& dst, const Tensor& src, const char* op, const char* arg) {
    NT_CHECK_AS(ShapeError, src.shape() == dst.shape(), op, ": expected ", arg, " of shape ", shape_str(dst.shape()),
                ", got ", shape_str(src.shape()));
    NT_CHECK_AS(DTypeError, src.dtype() == dst.dtype(), op, ": expected ", arg, " of dtype ", dtype_name(dst.dtype()),
                ", got ", dtype_name(src.dtype()));
    check_contiguous_destination(dst, op);
    NT_CHECK_AS(DeviceError, src.device() == dst.device(), op, ": expected ", arg, " on ", device_name(dst.device()),
                ", got ", device_name(src.device()), "; use to(Device)");
}

}  // namespace

TensorImpl& Tensor::impl() const {
    NT_CHECK(impl_ != nullptr, "Tensor: expected a defined tensor, got an undefined one (default-constructed)");
    return *impl_;
}

int64_t Tensor::size(int64_t d) const {
    int64_t n = dim();
    NT_CHECK_AS(ShapeError, d >= -n && d < n, "Tensor::size: expected a dimension in [", -n, ", ", n, "), got ", d,
                " for a tensor of shape ", shape_str(shape()));
    return shape()[d < 0 ? d + n : d];
}

int64_t Tensor::numel() const { return shape_numel(shape()); }

bool Tensor::is_contiguous() const { return strides() == contiguous_strides(shape()); }

template <class T>
T* Tensor::data_ptr() const {
    NT_CHECK_AS(DTypeError, dtype() == dtype_of<T>(), "Tensor::data_ptr: expected the tensor's dtype ",
                dtype_name(dtype()), ", got a request for ", dtype_name(dtype_of<T>()));
    NT_CHECK_AS(DeviceError, device() == Device::CPU, "Tensor::data_ptr: expected a cpu tensor (host access), got ",
                device_name(device()), "; use to(Device::CPU)");
    return detail::device_ptr<T>(*this);  // which refuses a dry run's tensor
}

template <class T>
T Tensor::item() const {
    NT_CHECK_AS(ShapeError, numel() == 1, "Tensor::item: expected a tensor with one element, got shape ",
                shape_str(shape()));
    if (storage() && storage()->is_dry()) return T(0);  // Note [The dry run]: the placeholder
    if (device().is_cuda()) return to(Device::CPU).template item<T>();
    if (dtype() != dtype_of<T>()) return to(dtype_of<T>()).template item<T>();
    return *data_ptr<T>();
}

template <class T>
std::vector<T> Tensor::to_vector() const {
    Tensor c = device().is_cuda() ? to(Device::CPU) : contiguous();  // a copy made in a dry run is dry
    if (c.storage() && c.storage()->is_dry()) return std::vector<T>(static_cast<size_t>(numel()), T(0));
    const T* p = c.data_ptr<T>();
    return std::vector<T>(p, p + c.numel());
}

#define NT_INSTANTIATE(T)                           \
    template T* Tensor::data_ptr<T>() const;        \
    template T Tensor::item<T>() const;             \
    template std::vector<T> Tensor::to_vector<T>() const;
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(int64_t)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

Tensor Tensor::view(const Shape& new_shape) const {
    Shape s = infer_shape("view", new_shape, numel(), shape());
    NT_CHECK_AS(ShapeError, is_contiguous(), "view: expected a contiguous tensor, got shape ", shape_str(shape()),
                " with strides ", shape_str(strides()), "; use reshape()");
    Tensor out = make_view(*this, s, contiguous_strides(s));
    if (should_record(*this)) record(std::make_shared<ViewBackward>(shape()), out, *this);
    return out;
}

Tensor Tensor::reshape(const Shape& new_shape) const {
    infer_shape("reshape", new_shape, numel(), shape());  // report a bad shape as reshape's
    return is_contiguous() ? view(new_shape) : contiguous().view(new_shape);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
    int64_t n = dim();
    NT_CHECK_AS(ShapeError, dim0 >= -n && dim0 < n && dim1 >= -n && dim1 < n, "transpose: expected dimensions in [",
                -n, ", ", n, ") for shape ", shape_str(shape()), ", got (", dim0, ", ", dim1, ")");
    if (dim0 < 0) dim0 += n;
    if (dim1 < 0) dim1 += n;
    Shape s = shape(), st = strides();
    std::swap(s[dim0], s[dim1]);
    std::swap(st[dim0], st[dim1]);
    Tensor out = make_view(*this, s, st);
    if (should_record(*this)) record(std::make_shared<TransposeBackward>(dim0, dim1), out, *this);
    return out;
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
    int64_t n = this->dim();
    NT_CHECK_AS(ShapeError, dim >= -n && dim < n, "narrow: expected a dimension in [", -n, ", ", n, ") for shape ",
                shape_str(shape()), ", got ", dim);
    if (dim < 0) dim += n;
    NT_CHECK_AS(ShapeError, start >= 0 && length >= 0 && start <= size(dim) - length, "narrow: expected 0 <= start and ",
                "start + length <= ", size(dim), " (dimension ", dim, " of shape ", shape_str(shape()), "), got start ",
                start, " and length ", length);
    Shape s = shape();
    s[dim] = length;
    Tensor out = make_view(*this, s, strides());
    out.impl().offset += start * strides()[dim];
    if (should_record(*this)) record(std::make_shared<NarrowBackward>(shape(), dim, start, length), out, *this);
    return out;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
    Tensor out = empty_for("clone", shape(), TensorOptions().dtype(dtype()).device(device()));
    copy_elements(out, *this);
    if (should_record(*this)) record(std::make_shared<CloneBackward>(), out, *this);
    return out;
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides()); }

Tensor Tensor::to(Device d) const {
    Tensor src = detach().contiguous();
    Tensor out = empty_for("to", shape(), TensorOptions().dtype(dtype()).device(d));
    if (d == device()) {
        copy_elements(out, src);
    } else if (!is_dry_run()) {  // a copy across devices waits for them, which a CUDA dry run may not
        NT_CUDA(detail::copy_bytes_across(out, src));
    }
    return out;
}

Tensor Tensor::to(DType d) const {
    Tensor out = empty_for("to", shape(), TensorOptions().dtype(d).device(device()));
    copy_elements(out, *this);
    return out;
}

Tensor& Tensor::requires_grad_(bool r) {
    NT_CHECK(is_leaf(), "requires_grad_: expected a leaf tensor (only leaves can change requires_grad), got one with "
             "grad_fn ", grad_fn()->name());
    NT_CHECK_AS(DTypeError, !r || is_floating(dtype()),
                "requires_grad_: expected a floating dtype (only floating tensors can require grad), got ",
                dtype_name(dtype()));
    impl().requires_grad = r;
    if (r && storage()) storage()->mark_parameter();
    return *this;
}

Tensor Tensor::grad() const { return Tensor(impl().grad); }

void Tensor::zero_grad() { impl().grad.reset(); }

int64_t Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) {
    NT_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: expected a leaf that requires grad, got ",
             is_leaf() ? "a leaf that does not require grad" : "a tensor with a grad_fn");
    static int64_t next_handle = 0;
    impl().post_accumulate_grad_hooks.emplace_back(next_handle, std::move(hook));
    return next_handle++;
}

void Tensor::remove_post_accumulate_grad_hook(int64_t handle) {
    auto& hooks = impl().post_accumulate_grad_hooks;
    std::erase_if(hooks, [handle](const auto& h) { return h.first == handle; });
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
    detail::run_backward(*this, gradient, retain_graph);
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
    check_inplace(*this, "add_");
    check_inplace_operand(*this, other, "add_", "other");
    storage()->bump_version();
    detail::add_scaled_into(*this, *this, other.contiguous(), alpha);
    return *this;
}

void detail::add_scaled_into(const Tensor& out, const Tensor& a, const Tensor& b, double alpha) {
    if (out.device().is_cuda()) {
        NT_CUDA(detail::add_scaled_cuda(out, a, b, alpha));
        return;
    }
    if (is_dry_run()) return;
    dispatch_floating(out.dtype(), "add_", [&](auto tag) {
        using T = decltype(tag);
        T* o = out.data_ptr<T>();
        const T *x = a.data_ptr<T>(), *y = b.data_ptr<T>();
        acc_t<T> s = static_cast<acc_t<T>>(alpha);
        parallel_for(0, out.numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) o[i] = static_cast<T>(x[i] + s * y[i]);
        });
    });
}

Tensor& Tensor::mul_(double value) {
    check_inplace(*this, "mul_");
    check_contiguous_destination(*this, "mul_");
    storage()->bump_version();
    if (device().is_cuda()) {
        NT_CUDA(detail::mul_scalar_cuda(*this, value));
        return *this;
    }
    if (is_dry_run()) return *this;
    dispatch_floating(dtype(), "mul_", [&](auto tag) {
        using T = decltype(tag);
        T* a = data_ptr<T>();
        parallel_for(0, numel(), kGrain, [&](int64_t i0, int64_t i1) {
            for (int64_t i = i0; i < i1; ++i) a[i] = static_cast<T>(a[i] * static_cast<acc_t<T>>(value));
        });
    });
    return *this;
}

Tensor& Tensor::fill_(double value) {
    check_inplace(*this, "fill_");
    NT_CHECK(is_floating(dtype()) || (value >= -0x1p63 && value < 0x1p63), "fill_: value ", value, " does not fit in ",
             dtype_name(dtype()), " (expected a value in [-2^63, 2^63))");
    check_contiguous_destination(*this, "fill_");
    storage()->bump_version();
    if (device().is_cuda()) {
        NT_CUDA(detail::fill_cuda(*this, value));
        return *this;
    }
    if (is_dry_run()) return *this;
    dispatch_all(dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* a = data_ptr<T>();
        const T v = static_cast<T>(value);
        parallel_for(0, numel(), kGrain, [&](int64_t i0, int64_t i1) { std::fill(a + i0, a + i1, v); });
    });
    return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
    check_inplace(*this, "copy_");
    check_inplace_operand(*this, src, "copy_", "src");
    copy_elements(*this, src.storage() == storage() ? src.clone() : src);  // overlapping: copy through a temporary
    storage()->bump_version();
    return *this;
}

}  // namespace normtape
