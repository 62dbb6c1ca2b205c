// core/tensor.h: Tensor, a cheap shared handle over storage + shape + strides + dtype + device,
// with the autograd fields (requires_grad, grad, grad_fn), and the factories that make tensors.
//
// Shapes are row-major; strides count elements. Ops produce contiguous outputs; view(), reshape()
// and transpose() share storage with their input, contiguous() and clone() copy. Copying a Tensor
// copies the handle, never the data (as in libtorch). Not here: any op's math (ops/), the engine
// (core/autograd.h). The library is single-threaded: tensors are not shared between threads.
// Defined in core/tensor.cpp (Tensor's methods), core/factories.cpp (the factories),
// core/random.cpp (the global generator) and core/print.cpp (shape_str, operator<<).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace normtape {

using Shape = std::vector<int64_t>;

class Node;
struct Recipe;

// What a factory makes: TensorOptions().dtype(DType::F64).requires_grad(true). Defaults: f32, cpu,
// no gradient.
struct TensorOptions {
    DType dtype_ = DType::F32;
    Device device_ = Device::CPU;
    bool requires_grad_ = false;

    TensorOptions dtype(DType d) const { TensorOptions o = *this; o.dtype_ = d; return o; }
    TensorOptions device(Device d) const { TensorOptions o = *this; o.device_ = d; return o; }
    TensorOptions requires_grad(bool r) const { TensorOptions o = *this; o.requires_grad_ = r; return o; }
};

// The shared state behind a Tensor handle.
class Tensor;

struct TensorImpl {
    std::shared_ptr<Storage> storage;
    Shape shape;
    Shape strides;       // in elements
    int64_t offset = 0;  // in elements, into storage
    DType dtype = DType::F32;
    Device device = Device::CPU;
    bool requires_grad = false;
    std::shared_ptr<TensorImpl> grad;  // accumulated gradient (leaves only)
    std::shared_ptr<Node> grad_fn;     // the node that produced this tensor (non-leaves only)
    uint32_t output_nr = 0;            // which of grad_fn's outputs this is (record_outputs)
    std::shared_ptr<const Recipe> recipe;  // how to remake it from saved tensors, if it can be (core/autograd.h)
    // Leaves: called by backward() once this backward's gradient is complete, with their handles.
    std::vector<std::pair<int64_t, std::function<void(const Tensor&)>>> post_accumulate_grad_hooks;
};

class Tensor {
public:
    Tensor() = default;  // an undefined tensor: defined() is false
    explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

    bool defined() const { return impl_ != nullptr; }
    const Shape& shape() const { return impl().shape; }
    const Shape& strides() const { return impl().strides; }
    // Size of dimension `dim`; negative counts from the end. Throws ShapeError on a dim out of range.
    int64_t size(int64_t dim) const;
    int64_t dim() const { return static_cast<int64_t>(shape().size()); }
    int64_t numel() const;
    DType dtype() const { return impl().dtype; }
    Device device() const { return impl().device; }
    bool is_contiguous() const;
    // Bytes of this tensor's elements (numel * element_size), not of its whole storage.
    int64_t nbytes() const { return numel() * static_cast<int64_t>(element_size(dtype())); }
    const std::shared_ptr<Storage>& storage() const { return impl().storage; }

    // Pointer to the first element. Throws DTypeError if T does not match dtype(), DeviceError if
    // the tensor is not on the cpu (use to(Device::CPU) first).
    template <class T>
    T* data_ptr() const;
    // The value of a one-element tensor, converted to T (as libtorch's item<T>) and copied from the
    // GPU when needed. Throws ShapeError if numel() != 1, Error converting a float that does not
    // fit to i64.
    template <class T>
    T item() const;
    // The elements in row-major order (works on non-contiguous tensors). Throws DTypeError on a
    // dtype mismatch.
    template <class T>
    std::vector<T> to_vector() const;

    // Same storage, new shape; one dim may be -1. Throws ShapeError unless numel matches, the
    // new strides fit in int64 and the tensor is contiguous. Differentiable.
    Tensor view(const Shape& shape) const;
    // view() when contiguous, else a contiguous copy reshaped. Differentiable.
    Tensor reshape(const Shape& shape) const;
    // Same storage with dims dim0 and dim1 swapped (a non-contiguous view). Differentiable.
    // Throws ShapeError on a dim out of range.
    Tensor transpose(int64_t dim0, int64_t dim1) const;
    // Same storage, elements start .. start + length - 1 of dimension dim (PyTorch's narrow): a
    // view, contiguous when every dimension before dim has size 1 and this tensor is contiguous.
    // Differentiable; its backward saves nothing (the gradient lands in zeros of this shape).
    // Throws ShapeError on a dim out of range or a range outside [0, size(dim)].
    Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
    // This tensor if contiguous, else a contiguous copy. Differentiable.
    Tensor contiguous() const;
    // A contiguous copy with its own storage. Differentiable.
    Tensor clone() const;
    // Same storage, no grad_fn, requires_grad false: cuts the graph.
    Tensor detach() const;
    // A contiguous copy converted to `dtype` (any of f32, f64, bf16, i64). Floats to i64: on the
    // cpu a value out of range or NaN throws Error; on CUDA it saturates. Not differentiable.
    Tensor to(DType dtype) const;
    // A contiguous copy on `device` (cpu <-> cuda, or between GPUs), same dtype; a copy between
    // devices returns when it is done, a copy within one GPU is queued on its stream. Not
    // differentiable. Throws DeviceError when the device has no backend in this
    // build or no GPU is visible, OutOfMemoryError when the copy cannot be allocated.
    Tensor to(Device device) const;

    // Autograd. See core/autograd.h and Note [Gradient accumulation] there.
    bool requires_grad() const { return impl().requires_grad; }
    // Marks a leaf as requiring a gradient. Throws Error on a non-leaf, DTypeError on a
    // non-floating dtype.
    Tensor& requires_grad_(bool requires_grad = true);
    bool is_leaf() const { return impl().grad_fn == nullptr; }
    const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
    // The gradient accumulated into this leaf by backward(); undefined before the first backward
    // and after zero_grad().
    Tensor grad() const;
    // Drops the accumulated gradient (grad() becomes undefined), as PyTorch's set_to_none.
    void zero_grad();
    // Calls hook(this leaf) inside each backward() that reaches it, once every gradient of that
    // backward has been added into grad() (PyTorch's register_post_accumulate_grad_hook): after the
    // last node with an edge to it has run, even when that node passed it no gradient, if an earlier
    // one did. Hooks run in the order registered, with grad mode off; what one throws propagates
    // out of backward() (the nodes after it do not run). Returns a handle for
    // remove_post_accumulate_grad_hook. Throws Error on a non-leaf or a leaf that does not
    // require grad.
    int64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook);
    // Removes the hook of `handle`; a handle that is not registered here is ignored.
    void remove_post_accumulate_grad_hook(int64_t handle);
    // Runs reverse-mode autodiff from this tensor. `gradient` has this tensor's shape; it may be
    // omitted for a one-element tensor (then 1). Leaf gradients accumulate (+=). Unless
    // `retain_graph`, the saved tensors of every node run are released. Throws Error if this tensor
    // does not require grad, on a second backward through released nodes, or when a saved tensor
    // was modified in place since the forward (core/autograd.h); ShapeError, DTypeError
    // or DeviceError when `gradient` does not match this tensor (or is omitted for numel() != 1);
    // AnomalyError under anomaly detection (core/anomaly.h).
    void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

    // In-place, never recorded by autograd; each bumps the storage version. Throw Error if this
    // tensor requires grad while grad mode is on (as PyTorch does for leaves); ShapeError if it is
    // not contiguous or on a shape mismatch; DTypeError on a dtype mismatch and (add_, mul_) on an
    // i64 tensor; DeviceError when other/src is on another device; Error when fill_ on an i64
    // tensor is given NaN or a value outside [-2^63, 2^63).
    Tensor& add_(const Tensor& other, double alpha = 1.0);  // this += alpha * other
    Tensor& mul_(double value);                             // this *= value
    Tensor& fill_(double value);
    Tensor& zero_() { return fill_(0.0); }
    Tensor& copy_(const Tensor& src);                       // same shape and dtype

    // The tensor's state; every accessor above goes through it. Throws Error on an undefined
    // tensor (a default-constructed Tensor).
    TensorImpl& impl() const;
    const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

private:
    std::shared_ptr<TensorImpl> impl_;
};

// Factories. `shape` entries must be >= 0; a tensor of zero elements is allowed here (ops reject
// it). Each throws, naming itself: ShapeError on a negative size or when numel * element_size
// or a contiguous stride overflows int64; DTypeError on requires_grad with i64 (randn: any non-floating dtype);
// DeviceError for a CUDA device when this build has no CUDA backend or no GPU is visible;
// OutOfMemoryError when the allocator cannot give the bytes (the message gives shape and bytes).
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
// Standard normal samples; floating dtypes only. On the cpu from the global generator, on CUDA
// from the device's cuRAND Philox generator; manual_seed seeds both (their sequences differ).
Tensor randn(const Shape& shape, TensorOptions options = {});
// 0, 1, ..., end - 1 as a 1-D tensor of end elements; i64 unless options say otherwise.
Tensor arange(int64_t end, TensorOptions options = TensorOptions().dtype(DType::I64));
// A tensor holding `values` in row-major order; `shape` defaults to {values.size()}. The dtype
// is T's (options' dtype is ignored). Throws ShapeError if the counts differ.
// (The attribute exports its instantiations from libnormtape.so: GCC's visibility pragma does not
// reach function templates; see Note [Exported symbols] in normtape.h.)
template <class T>
[[gnu::visibility("default")]] Tensor from_vector(const std::vector<T>& values, const Shape& shape = {},
                                                  TensorOptions options = {});

// Seeds the global cpu generator used by randn and by nn's initializers (std::mt19937_64 +
// Box-Muller, so cpu sequences are the same on every platform), and every GPU's cuRAND Philox
// generator (core/cuda_context.h), whose offset it resets.
void manual_seed(uint64_t seed);
// One standard normal sample and one uniform [0, 1) sample from the global generator.
double randn_scalar();
double rand_scalar();

// "[2, 3]"
std::string shape_str(const Shape& shape);
// Prints values (at most 6 per dim, with ...), shape, dtype, device, and grad_fn or requires_grad.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Tensors with their names, in order: a module's parameters (nn/model/module.h), a safetensors file's
// contents (nn/formats/safetensors.h).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

}  // namespace normtape
