// nn/optim/muon.cpp: Muon and newton_schulz: checks, the cpu path (Eigen, one matrix per thread), the
// classes and launches of the CUDA path (nn/optim/muon.cu, Note [Muon on CUDA] there), and
// param_groups_for_muon.
#include "nn/optim/muon.h"

#include <Eigen/Core>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "nn/model/gpt.h"
#include "nn/optim/muon_update.h"
#include "nn/optim/optimizer_checks.h"
#include "nn/optim/step_scalars.h"

namespace normtape {

namespace {
using detail::device_ptr;

template <class A>
using RowMajor = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// newton_schulz on the cpu, in place on u [rows, cols] (row-major, acc_t): KellerJordan/Muon's
// iteration as written, in A. Eigen's own threads stay off (EIGEN_DONT_PARALLELIZE, CMakeLists.txt),
// so the result does not depend on the thread count.
template <class A>
void newton_schulz_cpu(A* u, int64_t rows, int64_t cols, int64_t steps) {
    Eigen::Map<RowMajor<A>> g(u, rows, cols);
    const bool tall = rows > cols;
    RowMajor<A> x = tall ? RowMajor<A>(g.transpose()) : RowMajor<A>(g);
    x /= x.norm() + A(detail::kNewtonSchulzEps);
    for (int64_t s = 0; s < steps; ++s) {
        const RowMajor<A> a = x * x.transpose();
        const RowMajor<A> b = A(detail::kNewtonSchulzB) * a + A(detail::kNewtonSchulzC) * (a * a);
        x = A(detail::kNewtonSchulzA) * x + b * x;
    }
    if (tall) g = x.transpose();
    else g = x;
}

// A parameter as Muon's matrix: [size(0), the product of the other sizes] (computed as a product:
// numel / size(0) would divide by zero for an empty matrix).
std::pair<int64_t, int64_t> matrix_shape(const Tensor& p) {
    int64_t cols = 1;
    for (int64_t d = 1; d < p.dim(); ++d) cols *= p.size(d);
    return {p.size(0), cols};
}

// A class of Note [Muon on CUDA]: the members (indices in their group) of one device, dtype and
// matrix shape.
struct MatrixClass {
    Device device;
    DType dtype;
    int64_t rows, cols;
    std::vector<size_t> members;
};

void check_options(const char* op, const MuonOptions& o) {
    detail::check_lr(op, o.lr);
    NT_CHECK(o.momentum >= 0 && o.momentum < 1, op, ": expected momentum in [0, 1), got momentum ", o.momentum);
    NT_CHECK(o.ns_steps >= 1 && o.ns_steps <= 100, op, ": expected ns_steps in [1, 100], got ns_steps ", o.ns_steps);
    detail::check_weight_decay(op, "", o.weight_decay);
}

#if NORMTAPE_WITH_CUDA
// One class of Note [Muon on CUDA]: `count` matrices [rows, cols] of dtype T, their momentum
// step (without buffers: the gradients themselves) and orthogonalization as one batch; returns the
// orthogonalized updates [count, rows, cols] in ns_t<T>. `matrices(first, n)` gives the kernel
// arguments of members first .. first + n - 1. Allocates its scratch (the two iterates, the Gram
// matrix and the polynomial, the chunks' sums of squares); all but the result is released on return.
template <class T, class Members>
Tensor orthogonalize_class(Device device, int64_t count, int64_t rows, int64_t cols, int64_t steps, double momentum,
                           bool nesterov, const Members& matrices, const double* skip) {
    using X = detail::ns_t<T>;
    const int64_t m = std::min(rows, cols), numel = rows * cols, chunks = detail::muon_chunks(numel);
    const TensorOptions xo = TensorOptions().dtype(dtype_of<X>()).device(device);
    Tensor x = empty({count, rows, cols}, xo), y = empty({count, rows, cols}, xo);
    Tensor a = empty({count, m, m}, xo), b = empty({count, m, m}, xo);
    Tensor sum = empty({count * chunks}, TensorOptions().dtype(dtype_of<acc_t<X>>()).device(device));
    for (int64_t first = 0; first < count; first += detail::kMuonMatricesPerLaunch) {
        const detail::MuonMatrices<T> mm = matrices(first, std::min<int64_t>(count - first, detail::kMuonMatricesPerLaunch));
        detail::muon_momentum_cuda<T>(mm, numel, momentum, nesterov, device_ptr<X>(x) + first * numel,
                                      device_ptr<acc_t<X>>(sum) + first * chunks, skip, device.index);
    }
    detail::muon_normalize_cuda<X>(device_ptr<X>(x), count, numel, device_ptr<acc_t<X>>(sum), device.index);
    X* out = detail::newton_schulz_cuda<X>(device_ptr<X>(x), device_ptr<X>(y), device_ptr<X>(a), device_ptr<X>(b), count,
                                           rows, cols, steps, device.index);
    return out == device_ptr<X>(x) ? x : y;
}
#endif  // NORMTAPE_WITH_CUDA

}  // namespace

Muon::Muon(std::vector<ParamGroup> groups, MuonOptions options)
    : options_(options), scalars_(std::make_shared<detail::StepScalars>(0.0, 0.0)) {
    check_options("Muon", options);
    groups_ = detail::checked_groups("Muon", groups, 2);
    for (const ParamGroup& g : groups_) {
        state_.emplace_back();
        for (const Tensor& p : g.params) {
            ParamState st{zeros(p.shape(), TensorOptions().dtype(stat_dtype(p.dtype())).device(p.device())), Tensor()};
            if (p.dtype() == DType::BF16) st.master = p.detach().to(DType::F32);
            state_.back().push_back(st);
        }
    }
}

Muon::Muon(const std::vector<Tensor>& params, MuonOptions options)
    : Muon(std::vector<ParamGroup>{{params, options.weight_decay}}, options) {}

void Muon::set_lr(double lr) {
    detail::check_lr("Muon::set_lr", lr);
    options_.lr = lr;
    scalars_->set_lr(lr);
}

void Muon::step() { step_impl(nullptr); }

void Muon::step_if_finite(const Tensor& grad_norm) { step_impl(&grad_norm); }

void Muon::step_impl(const Tensor* grad_norm) {
    NoGradGuard no_grad;
    if (grad_norm) detail::check_grad_norm("Muon", *grad_norm);
    for (size_t gi = 0; gi < groups_.size(); ++gi)
        for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
            const Tensor& p = groups_[gi].params[i];
            if (!p.grad().defined()) continue;
            detail::check_stepped("Muon", gi, i, p, state_[gi][i].momentum_buffer, state_[gi][i].master, grad_norm);
            const auto [rows, cols] = matrix_shape(p);
            NT_CHECK_AS(ShapeError, !p.device().is_cuda() || (rows <= INT_MAX && cols <= INT_MAX),
                        "Muon: expected matrices of at most ", INT_MAX, " rows and columns on CUDA (cuBLAS's int), got ",
                        shape_str(p.shape()));
        }
    const int64_t t_before = t_++;
    std::vector<Device> devices;  // of the CUDA matrices stepped
    for (const ParamGroup& group : groups_)
        for (const Tensor& p : group.params)
            if (p.grad().defined() && p.device().is_cuda() &&
                std::find(devices.begin(), devices.end(), p.device()) == devices.end())
                devices.push_back(p.device());
    scalars_->advance(devices, options_.lr, t_before);
    const bool skip_on_cpu = grad_norm && !grad_norm->device().is_cuda() && !std::isfinite(grad_norm->item<double>());
    Tensor norm;  // f64 on the device, read by the CUDA kernels
    if (grad_norm && grad_norm->device().is_cuda())
        norm = grad_norm->dtype() == DType::F64 ? *grad_norm : grad_norm->to(DType::F64);
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
        const ParamGroup& group = groups_[gi];
        const double lr = options_.lr * group.lr_scale, decay = 1.0 - lr * group.weight_decay;
        // The cpu matrices, one per task; the CUDA ones by class (Note [Muon on CUDA]): (device,
        // dtype, rows, cols) and the indices of its members, in order of first appearance.
        std::vector<size_t> on_cpu;
        std::vector<MatrixClass> classes;
        for (size_t i = 0; i < group.params.size(); ++i) {
            const Tensor& p = group.params[i];
            if (!p.grad().defined() || p.numel() == 0) continue;  // an empty matrix has nothing to update
            p.storage()->bump_version();
            if (!p.device().is_cuda()) {
                if (!skip_on_cpu) on_cpu.push_back(i);
                continue;
            }
            auto [rows, cols] = matrix_shape(p);
            auto it = std::find_if(classes.begin(), classes.end(), [&](const MatrixClass& c) {
                return c.device == p.device() && c.dtype == p.dtype() && c.rows == rows && c.cols == cols &&
                       static_cast<int64_t>(c.members.size()) < detail::kMuonMaxClass;
            });
            if (it == classes.end()) it = classes.insert(classes.end(), MatrixClass{p.device(), p.dtype(), rows, cols, {}});
            it->members.push_back(i);
        }
        detail::parallel_for(0, static_cast<int64_t>(on_cpu.size()), 1, [&](int64_t k0, int64_t k1) {
            for (int64_t k = k0; k < k1; ++k) {
                const size_t i = on_cpu[k];
                const Tensor& p = group.params[i];
                ParamState& st = state_[gi][i];
                auto [rows, cols] = matrix_shape(p);
                const double step = lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
                dispatch_floating(p.dtype(), "Muon", [&](auto tag) {
                    using T = decltype(tag);
                    using A = acc_t<T>;
                    const T* g = device_ptr<T>(p.grad());
                    A* buf = device_ptr<A>(st.momentum_buffer);
                    std::vector<A> u(static_cast<size_t>(p.numel()));
                    for (int64_t e = 0; e < p.numel(); ++e)
                        u[e] = detail::muon_momentum<A>(A(g[e]), buf + e, A(options_.momentum), options_.nesterov);
                    newton_schulz_cpu<A>(u.data(), rows, cols, options_.ns_steps);
                    T* pp = device_ptr<T>(p);
                    A* master = device_ptr<A>(st.master);
                    for (int64_t e = 0; e < p.numel(); ++e)
                        detail::muon_apply<T>(pp + e, master ? master + e : nullptr, u[e], A(decay), A(step));
                });
            }
        });
        for ([[maybe_unused]] const MatrixClass& c : classes) {
            NT_CUDA(dispatch_floating(c.dtype, "Muon", [&](auto tag) {
                using T = decltype(tag);
                using A = acc_t<T>;
                const double aspect = std::sqrt(std::max(1.0, double(c.rows) / double(c.cols)));
                auto matrices = [&](int64_t first, int64_t n) {
                    detail::MuonMatrices<T> mm{};
                    for (int64_t k = 0; k < n; ++k) {
                        const size_t i = c.members[first + k];
                        const Tensor& p = group.params[i];
                        mm.p[k] = device_ptr<T>(p);
                        mm.master[k] = device_ptr<A>(state_[gi][i].master);
                        mm.grad[k] = device_ptr<T>(p.grad());
                        mm.buf[k] = device_ptr<A>(state_[gi][i].momentum_buffer);
                    }
                    mm.count = static_cast<int32_t>(n);
                    return mm;
                };
                const double* skip = device_ptr<double>(norm);
                const int64_t count = static_cast<int64_t>(c.members.size()), numel = c.rows * c.cols;
                const Tensor o = orthogonalize_class<T>(c.device, count, c.rows, c.cols, options_.ns_steps,
                                                        options_.momentum, options_.nesterov, matrices, skip);
                for (int64_t first = 0; first < count; first += detail::kMuonMatricesPerLaunch)
                    detail::muon_apply_cuda<T>(
                        matrices(first, std::min<int64_t>(count - first, detail::kMuonMatricesPerLaunch)), numel,
                        device_ptr<detail::ns_t<T>>(o) + first * numel, scalars_->on(c.device), group.lr_scale,
                        group.weight_decay, aspect, skip, c.device.index);
            }));
        }
    }
}

const Muon::ParamState& Muon::state(const Tensor& p) const {
    NT_CHECK(p.defined(), "Muon::state: expected a parameter, got an undefined tensor");
    for (size_t gi = 0; gi < groups_.size(); ++gi)
        for (size_t i = 0; i < groups_[gi].params.size(); ++i)
            if (&groups_[gi].params[i].impl() == &p.impl()) return state_[gi][i];
    throw Error("Muon::state: the tensor " + shape_str(p.shape()) + " is not a parameter of this optimizer");
}

int64_t Muon::step_count() const { return scalars_->step_count(t_); }

void Muon::set_step_count(int64_t t) {
    NT_CHECK(t >= 0, "Muon::set_step_count: expected t >= 0, got ", t);
    t_ = t;
    scalars_->set_step_count(t);
}

void Muon::zero_grad() {
    for (ParamGroup& g : groups_)
        for (Tensor& p : g.params) p.zero_grad();
}

Tensor newton_schulz(const Tensor& g, int64_t steps) {
    NT_CHECK(g.defined(), "newton_schulz: expected a tensor, got an undefined one");
    NT_CHECK_AS(ShapeError, (g.dim() == 2 || g.dim() == 3) && g.numel() > 0,
                "newton_schulz: expected a non-empty [rows, cols] or [n, rows, cols] tensor, got shape ",
                shape_str(g.shape()));
    NT_CHECK_AS(DTypeError, is_floating(g.dtype()), "newton_schulz: expected a floating tensor, got ",
                dtype_name(g.dtype()));
    NT_CHECK(steps >= 1 && steps <= 100, "newton_schulz: expected steps in [1, 100], got ", steps);
    NoGradGuard no_grad;
    const int64_t count = g.dim() == 3 ? g.size(0) : 1, rows = g.size(-2), cols = g.size(-1);
    if (g.device().is_cuda()) {
        NT_CHECK_AS(ShapeError, count <= detail::kMuonMaxClass && rows <= INT_MAX && cols <= INT_MAX,
                    "newton_schulz: expected up to ", detail::kMuonMaxClass, " matrices of at most ", INT_MAX,
                    " rows and columns on CUDA, got shape ", shape_str(g.shape()));
        Tensor in = g.contiguous();
        Tensor out;
        NT_CUDA(dispatch_floating(g.dtype(), "newton_schulz", [&](auto tag) {
            using T = decltype(tag);
            auto matrices = [&](int64_t first, int64_t n) {
                detail::MuonMatrices<T> mm{};
                for (int64_t k = 0; k < n; ++k) mm.grad[k] = device_ptr<T>(in) + (first + k) * rows * cols;
                mm.count = static_cast<int32_t>(n);
                return mm;
            };
            out = orthogonalize_class<T>(g.device(), count, rows, cols, steps, 0.0, false, matrices, nullptr);
        }));
        return out.to(g.dtype()).reshape(g.shape());
    }
    const DType acc = stat_dtype(g.dtype());
    Tensor out = g.dtype() == acc ? g.clone() : g.to(acc);  // a copy of its own, contiguous
    dispatch_floating(out.dtype(), "newton_schulz", [&](auto tag) {
        using A = decltype(tag);
        if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double>) {
            A* u = device_ptr<A>(out);
            detail::parallel_for(0, count, 1, [&](int64_t k0, int64_t k1) {
                for (int64_t k = k0; k < k1; ++k) newton_schulz_cpu<A>(u + k * rows * cols, rows, cols, steps);
            });
        }
    });
    return out.to(g.dtype());
}

MuonParamSplit param_groups_for_muon(const GPT& model) {
    MuonParamSplit split;
    for (const auto& [name, p] : model.named_parameters()) {
        if (name.rfind("h.", 0) == 0 && p.dim() >= 2) split.matrices.push_back(p);
        else if (name.rfind("wte.", 0) == 0 || name.rfind("wpe.", 0) == 0) split.embeddings.push_back(p);
        else if (name.rfind("lm_head.", 0) == 0 && p.dim() >= 2) split.head.push_back(p);
        else split.vectors.push_back(p);
    }
    return split;
}

}  // namespace normtape
