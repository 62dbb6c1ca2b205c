// core/print.cpp: Tensor as text: shape_str ("[2, 3]") and operator<< (values, shape, dtype,
// device, autograd fields). Not here: Tensor's methods (core/tensor.cpp), the factories
// (core/factories.cpp).
#include "core/tensor.h"

#include <ostream>
#include <sstream>

#include "core/autograd.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"

namespace normtape {

std::string shape_str(const Shape& shape) {
    std::ostringstream ss;
    ss << "[";
    for (size_t i = 0; i < shape.size(); ++i) ss << (i ? ", " : "") << shape[i];
    ss << "]";
    return ss.str();
}

namespace {
template <class T>
void print_values(std::ostream& os, const T* p, const Shape& shape, size_t d, int64_t offset) {
    const int64_t edge = 3;
    int64_t n = shape[d];
    int64_t inner = 1;
    for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
    os << "[";
    for (int64_t i = 0; i < n; ++i) {
        if (n > 2 * edge && i == edge) {
            os << "..., ";
            i = n - edge;
        }
        if (d + 1 == shape.size()) os << p[offset + i];
        else print_values(os, p, shape, d + 1, offset + i * inner);
        if (i + 1 < n) os << ", ";
    }
    os << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
    if (!t.defined()) return os << "Tensor(undefined)";
    os << "tensor(";
    Tensor c = t.device().is_cuda() ? t.to(Device::CPU) : t.contiguous();
    dispatch_all(c.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* p = detail::device_ptr<T>(c);
        if (c.dim() == 0) os << p[0];
        else print_values(os, p, c.shape(), 0, 0);
    });
    os << ", shape=" << shape_str(t.shape()) << ", dtype=" << dtype_name(t.dtype());
    if (t.device().is_cuda()) os << ", device=" << device_name(t.device());
    if (t.grad_fn()) os << ", grad_fn=<" << t.grad_fn()->name() << ">";
    else if (t.requires_grad()) os << ", requires_grad=true";
    return os << ")";
}

}  // namespace normtape
