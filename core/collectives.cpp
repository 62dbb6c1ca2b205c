// core/collectives.cpp: the collectives of core/distributed.h's ProcessGroup (all_reduce,
// reduce_scatter, all_gather, broadcast, barrier) over MPI (cpu tensors) and NCCL (CUDA tensors),
// Work, and their timeouts (Note [Collective timeouts]). Not here: how the group starts and ends
// (core/distributed.cpp).
#include "core/distributed.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/device_ptr.h"
#include "core/distributed_internal.h"
#include "core/dry_run.h"
#include "core/rendezvous.h"

#if NORMTAPE_WITH_NCCL
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#endif

namespace normtape {

namespace {

using clock = std::chrono::steady_clock;

[[maybe_unused]] std::string ranks_str(const std::vector<int>& ranks) {
    std::ostringstream s;
    for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
    return s.str();
}

}  // namespace

namespace detail {

#if NORMTAPE_WITH_NCCL
namespace {
void nccl_check(ncclResult_t r, const char* call, ncclComm_t comm) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    detail::throw_error<DistributedError>("NCCL error in ", call, ": ", ncclGetErrorString(r),
                                          last && *last ? std::string(" (") + last + ")" : std::string());
}
}  // namespace
#define NCCL_CHECK(call, comm) ::normtape::detail::nccl_check((call), #call, (comm))
#endif

#if NORMTAPE_WITH_NCCL
void ProcessGroupState::nccl_settle(int64_t number, const std::string& what) {
    const auto deadline = clock::now() + std::chrono::duration<double>(options.timeout_s);
    for (;;) {
        ncclResult_t r = ncclInProgress;
        nccl_check(ncclCommGetAsyncError(nccl, &r), "ncclCommGetAsyncError", nccl);
        if (r == ncclSuccess) return;
        nccl_check(r, what.c_str(), nccl);
        if (clock::now() > deadline) timed_out(number, what);
        std::this_thread::yield();
    }
}
#endif

int64_t ProcessGroupState::begin() {
    const int64_t number = next++;
#if NORMTAPE_WITH_MPI
    if (comm != MPI_COMM_NULL && world > 1) {
        while (!sent.empty()) {  // let go of the announcements that have left
            int done = 0;
            MPI_CHECK(MPI_Test(&sent.front().second, &done, MPI_STATUS_IGNORE));
            if (!done) break;
            sent.pop_front();
        }
        for (int r = 0; r < world; ++r) {
            if (r == rank) continue;
            auto value = std::make_unique<int64_t>(number);
            MPI_Request req;
            MPI_CHECK(MPI_Isend(value.get(), 1, MPI_INT64_T, r, kArrivalTag, monitor, &req));
            sent.emplace_back(std::move(value), req);
        }
        reached[rank] = number;
    }
#endif
    return number;
}

std::vector<int> ProcessGroupState::missing(int64_t number) {
    std::vector<int> out;
#if NORMTAPE_WITH_MPI
    if (comm != MPI_COMM_NULL && world > 1) {
        for (;;) {
            int flag = 0;
            MPI_Status st;
            MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, monitor, &flag, &st);
            if (!flag) break;
            int64_t n = 0;
            MPI_Recv(&n, 1, MPI_INT64_T, st.MPI_SOURCE, kArrivalTag, monitor, MPI_STATUS_IGNORE);
            reached[st.MPI_SOURCE] = std::max(reached[st.MPI_SOURCE], n);
            ++heard[st.MPI_SOURCE];
        }
        for (int r = 0; r < world; ++r)
            if (reached[r] < number) out.push_back(r);
    }
#endif
    (void)number;
    return out;
}

void ProcessGroupState::timed_out(int64_t number, const std::string& what) {
    std::ostringstream why;
    why << "collective #" << number << " (" << what << ") on rank " << rank << " of " << world
        << " did not finish within " << options.timeout_s << " s: ";
#if NORMTAPE_WITH_MPI
    if (comm != MPI_COMM_NULL && world > 1) {
        std::vector<int> late = missing(number);
        if (!late.empty())
            why << (late.size() == 1 ? "rank " : "ranks ") << ranks_str(late) << (late.size() == 1 ? " has" : " have")
                << " not reached it";
        else
            why << "every rank reached it, so their collectives differ (order, sizes or dtypes)";
    } else
#endif
        why << "a rank did not reach it (the ranks are named when the job is started by mpirun or srun)";
#if NORMTAPE_WITH_NCCL
    if (nccl) ncclCommAbort(nccl), nccl = nullptr;  // its kernels stop; the communicator is gone
#endif
    broken = true;
    broken_why = why.str();
    throw DistributedError("ProcessGroup: " + broken_why);
}

}  // namespace detail

// ---------------------------------------------------------------- Work

Work::Work() = default;
Work::Work(std::unique_ptr<detail::WorkState> state) : state_(std::move(state)) {}
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&& other) noexcept {
    if (this != &other) {
        if (state_) {
            try {
                wait();
            } catch (const std::exception& e) {
                std::fprintf(stderr, "normtape: a collective that was never waited for failed: %s\n", e.what());
            }
        }
        state_ = std::move(other.state_);
    }
    return *this;
}
Work::~Work() {
    if (!state_) return;
    try {
        wait();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "normtape: a collective that was never waited for failed: %s\n", e.what());
    }
}

void Work::wait() {
    if (!state_) return;
    std::unique_ptr<detail::WorkState> s = std::move(state_);
    if (s->local) return;
    detail::ProcessGroupState& g = *s->group;
    s->group->check_usable("wait");
    [[maybe_unused]] const auto deadline = clock::now() + std::chrono::duration<double>(g.timeout_s());
    [[maybe_unused]] auto idle = [polls = 0]() mutable {  // spin a little, then sleep between polls
        if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    };
#if NORMTAPE_WITH_NCCL
    if (s->done) {
        for (;;) {
            cudaError_t e = cudaEventQuery(s->done);
            if (e == cudaSuccess) break;
            NT_CHECK_AS(DistributedError, e == cudaErrorNotReady, "ProcessGroup: ", s->what, ": CUDA error ",
                        cudaGetErrorString(e));
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(g.nccl, &async);
            if (async != ncclSuccess && async != ncclInProgress) {
                g.broken = true;
                g.broken_why = std::string("NCCL: ") + ncclGetErrorString(async);
                detail::nccl_check(async, s->what.c_str(), g.nccl);
            }
            if (clock::now() > deadline) {
                cudaEventDestroy(s->done);
                g.timed_out(s->number, s->what);
            }
            g.missing(s->number);  // read the announcements as they come
            idle();
        }
        // The work queued after the collective waits for it (Note on ProcessGroup: tensor order).
        CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(s->device), s->done, 0));
        CUDA_CHECK(cudaEventDestroy(s->done));
        return;
    }
#endif
#if NORMTAPE_WITH_MPI
    for (;;) {
        int done = 0;
        MPI_CHECK(MPI_Test(&s->request, &done, MPI_STATUS_IGNORE));
        if (done) break;
        if (clock::now() > deadline) g.timed_out(s->number, s->what);
        g.missing(s->number);
        idle();
    }
    if (s->finish) s->finish();
#endif
}

// ---------------------------------------------------------------- the collectives

namespace {

enum class Op { AllReduce, ReduceScatter, AllGather, Broadcast };
const char* op_name(Op op) {
    switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::ReduceScatter: return "reduce_scatter";
    case Op::AllGather: return "all_gather";
    case Op::Broadcast: return "broadcast";
    }
    return "?";
}

std::string with_commas(int64_t n) {
    std::string s = std::to_string(n), out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return out;
}

// The checks every collective makes on a tensor it reads or writes.
void check_tensor(Op op, const char* arg, const Tensor& t, int device_index) {
    NT_CHECK(t.defined(), "ProcessGroup::", op_name(op), ": expected a defined ", arg, ", got an undefined tensor");
    NT_CHECK(t.is_contiguous(), "ProcessGroup::", op_name(op), ": expected a contiguous ", arg,
             ", got one of strides that are not row-major");
    const DType d = t.dtype();
    NT_CHECK_AS(DTypeError, d == DType::F32 || d == DType::F64 || d == DType::BF16 || d == DType::I64,
                "ProcessGroup::", op_name(op), ": expected ", arg, " of dtype f32, f64, bf16 or i64, got ", dtype_name(d));
    NT_CHECK_AS(DeviceError, t.device().is_cpu() || t.device().index == device_index, "ProcessGroup::", op_name(op),
                ": expected ", arg, " on this process's GPU ", device_name(Device::cuda(device_index)), ", got ",
                device_name(t.device()));
}

}  // namespace

// One function for the four collectives: checks, numbering, then MPI or NCCL.
static Work start_collective(detail::ProcessGroupState& s, Op op, const Tensor& in, const Tensor& out,
                             [[maybe_unused]] int root) {
    const char* name = op_name(op);
    check_tensor(op, "input", in, s.device_index);
    check_tensor(op, "output", out, s.device_index);
    NT_CHECK_AS(DTypeError, in.dtype() == out.dtype(), "ProcessGroup::", name,
                ": expected input and output of one dtype, got ", dtype_name(in.dtype()), " and ",
                dtype_name(out.dtype()));
    NT_CHECK_AS(DeviceError, in.device() == out.device(), "ProcessGroup::", name,
                ": expected input and output on one device, got ", device_name(in.device()), " and ",
                device_name(out.device()));
    const int64_t W = s.world;
    const int64_t n = op == Op::ReduceScatter ? out.numel() : in.numel();  // the elements one rank gives or gets
    if (op == Op::ReduceScatter)
        NT_CHECK_AS(ShapeError, in.numel() == W * n, "ProcessGroup::reduce_scatter: expected input of world_size (", W,
                    ") x output's ", n, " elements, got ", in.numel());
    if (op == Op::AllGather)
        NT_CHECK_AS(ShapeError, out.numel() == W * n, "ProcessGroup::all_gather: expected output of world_size (", W,
                    ") x input's ", n, " elements, got ", out.numel());
    if (op == Op::AllReduce || op == Op::Broadcast)
        NT_CHECK_AS(ShapeError, in.numel() == out.numel(), "ProcessGroup::", name, ": expected one tensor");
    const size_t esize = element_size(in.dtype());
    // Addresses only compared, never read: a dry run's tensors have them too.
    auto address = [esize](const Tensor& t) { return static_cast<char*>(t.storage()->data()) + t.impl().offset * esize; };
    char* inp = address(in);
    char* outp = address(out);
    // In place means exactly: one tensor (all_reduce, broadcast), the output this rank's part of the
    // input (reduce_scatter), the input this rank's part of the output (all_gather). Any other overlap
    // is refused: MPI and NCCL would read what they have already written.
    const int64_t part_bytes = n * static_cast<int64_t>(esize);
    const bool in_place = inp == outp || (op == Op::ReduceScatter && inp + s.rank * part_bytes == outp) ||
                          (op == Op::AllGather && outp + s.rank * part_bytes == inp);
    const bool overlap = inp < outp + out.nbytes() && outp < inp + in.nbytes();
    NT_CHECK(in_place || !overlap, "ProcessGroup::", name, ": expected input and output apart or exactly in place (",
             op == Op::ReduceScatter ? "the output this rank's part of the input"
             : op == Op::AllGather   ? "the input this rank's part of the output"
                                     : "one tensor",
             "), got bytes that overlap otherwise");
    s.check_usable(name);
    NT_CHECK(!is_dry_run() || s.launcher == "stand-in", "ProcessGroup::", name, ": a dry run (core/dry_run.h) ",
             "cannot send its tensors to other processes: expected a stand-in group (ProcessGroup::stand_in), got ",
             "one started by ", s.launcher);
    auto work = std::make_unique<detail::WorkState>();
    work->group = &s;
    work->what = std::string(name) + " of " + with_commas(n) + " " + dtype_name(in.dtype()) + " elements";
    work->input = in;
    work->output = out;
    if (s.launcher == "stand-in") {  // Note [The dry run]: checked and numbered, nothing sent
        NT_CHECK(is_dry_run(), "ProcessGroup::", name, ": a stand-in group (ProcessGroup::stand_in) serves dry runs "
                 "only (core/dry_run.h), got a collective outside one");
        work->number = s.begin();
        work->local = true;
        return Work(std::move(work));
    }

    if (in.device().is_cuda()) {
#if NORMTAPE_WITH_NCCL
        const int dev = s.device_index;
        if (!s.nccl) {  // the communicator starts with the first CUDA collective
            const int64_t number = s.begin();
            ncclUniqueId id;
            if (s.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
            std::string blob(reinterpret_cast<const char*>(&id), sizeof id);
#if NORMTAPE_WITH_MPI
            if (s.launcher == "mpi") {
                auto w = std::make_unique<detail::WorkState>();
                w->group = &s;
                w->number = number;
                w->what = "the broadcast of NCCL's unique id";
                MPI_CHECK(MPI_Ibcast(blob.data(), static_cast<int>(blob.size()), MPI_BYTE, 0, s.comm, &w->request));
                Work(std::move(w)).wait();
            }
#endif
            if (s.launcher == "torchrun")
                blob = detail::tcp_rendezvous(std::getenv("MASTER_ADDR"), detail::rendezvous_port(), s.rank, s.world, blob,
                                              s.timeout_s());
            std::memcpy(&id, blob.data(), sizeof id);
            cuda::stream(dev);  // makes the device current
            CUDA_CHECK(cudaStreamCreateWithFlags(&s.nccl_stream, cudaStreamNonBlocking));
            ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
            config.blocking = 0;  // Note [Collective timeouts]: a start that hangs can be aborted
            NCCL_CHECK(ncclCommInitRankConfig(&s.nccl, s.world, id, s.rank, &config), nullptr);
            s.nccl_settle(number, "the start of NCCL's communicator");
        }
        work->device = dev;
        const ncclDataType_t type = in.dtype() == DType::F32    ? ncclFloat32
                                    : in.dtype() == DType::F64  ? ncclFloat64
                                    : in.dtype() == DType::BF16 ? ncclBfloat16
                                                                : ncclInt64;
        cudaStream_t compute = cuda::stream(dev);
        cudaEvent_t ready;
        CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(ready, compute));  // the collective reads what was queued before it
        CUDA_CHECK(cudaStreamWaitEvent(s.nccl_stream, ready, 0));
        CUDA_CHECK(cudaEventDestroy(ready));
        const size_t count = static_cast<size_t>(n);
        work->number = s.begin();
        ncclResult_t r = ncclSuccess;
        switch (op) {
        case Op::AllReduce: r = ncclAllReduce(inp, outp, count, type, ncclSum, s.nccl, s.nccl_stream); break;
        case Op::ReduceScatter: r = ncclReduceScatter(inp, outp, count, type, ncclSum, s.nccl, s.nccl_stream); break;
        case Op::AllGather: r = ncclAllGather(inp, outp, count, type, s.nccl, s.nccl_stream); break;
        case Op::Broadcast: r = ncclBroadcast(inp, outp, count, type, root, s.nccl, s.nccl_stream); break;
        }
        if (r != ncclSuccess && r != ncclInProgress) {  // the ranks' collectives no longer match
            s.broken = true;
            s.broken_why = std::string(name) + " failed in NCCL";
            detail::nccl_check(r, name, s.nccl);
        }
        if (r == ncclInProgress) s.nccl_settle(work->number, work->what);
        CUDA_CHECK(cudaEventCreateWithFlags(&work->done, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(work->done, s.nccl_stream));
        return Work(std::move(work));
#else
        detail::throw_error<DistributedError>("ProcessGroup::", name,
                                              ": CUDA tensors need NCCL, which this build of normtape lacks");
#endif
    }

    if (s.world == 1) {  // a one-rank group on the cpu: the collective is a copy, or nothing
        work->number = s.begin();
        if (inp != outp) std::memcpy(outp, inp, static_cast<size_t>(n) * esize);
        work->local = true;
        return Work(std::move(work));
    }
#if NORMTAPE_WITH_MPI
    NT_CHECK_AS(DistributedError, s.launcher == "mpi", "ProcessGroup::", name,
                ": cpu tensors need MPI, and this job was started by ", s.launcher, "; start it with mpirun");
    NT_CHECK_AS(ShapeError, n <= INT32_MAX, "ProcessGroup::", name, ": expected at most 2^31 - 1 elements a rank, got ",
                n);
    work->number = s.begin();
    const int count = static_cast<int>(n);
    const DType d = in.dtype();
    const MPI_Datatype type = d == DType::F32    ? MPI_FLOAT
                              : d == DType::F64  ? MPI_DOUBLE
                              : d == DType::BF16 ? MPI_UINT16_T  // summed by bf16_sum_op
                                                 : MPI_INT64_T;
    MPI_Op sum = d == DType::BF16 ? s.bf16_sum : MPI_SUM;
    switch (op) {
    case Op::AllReduce:
        MPI_CHECK(MPI_Iallreduce(in_place ? MPI_IN_PLACE : inp, outp, count, type, sum, s.comm, &work->request));
        break;
    case Op::ReduceScatter:
        // In place, MPI takes the input from the receive buffer and writes the result at its start: moved to
        // this rank's part when done.
        MPI_CHECK(MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : inp, in_place ? inp : outp, count, type, sum,
                                            s.comm, &work->request));
        if (in_place && inp != outp) work->finish = [inp, outp, bytes = static_cast<size_t>(n) * esize] {
            std::memmove(outp, inp, bytes);
        };
        break;
    case Op::AllGather:
        MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : inp, count, type, outp, count, type, s.comm, &work->request));
        break;
    case Op::Broadcast:
        if (inp != outp) std::memcpy(outp, inp, static_cast<size_t>(n) * esize);
        MPI_CHECK(MPI_Ibcast(outp, count, type, root, s.comm, &work->request));
        break;
    }
    return Work(std::move(work));
#else
    detail::throw_error<DistributedError>("ProcessGroup::", name, ": this build of normtape has no MPI");
#endif
}

Work ProcessGroup::all_reduce_async(Tensor& t) { return start_collective(*state_, Op::AllReduce, t, t, 0); }
Work ProcessGroup::reduce_scatter_async(const Tensor& input, Tensor& output) {
    return start_collective(*state_, Op::ReduceScatter, input, output, 0);
}
Work ProcessGroup::all_gather_async(const Tensor& input, Tensor& output) {
    return start_collective(*state_, Op::AllGather, input, output, 0);
}
void ProcessGroup::all_reduce(Tensor& t) { all_reduce_async(t).wait(); }
void ProcessGroup::reduce_scatter(const Tensor& input, Tensor& output) { reduce_scatter_async(input, output).wait(); }
void ProcessGroup::all_gather(const Tensor& input, Tensor& output) { all_gather_async(input, output).wait(); }
void ProcessGroup::broadcast(Tensor& t, int root) {
    NT_CHECK(root >= 0 && root < state_->world, "ProcessGroup::broadcast: expected a root rank in [0, ",
             state_->world, "), got ", root);
    start_collective(*state_, Op::Broadcast, t, t, root).wait();
}

void ProcessGroup::barrier() {
    detail::ProcessGroupState& s = *state_;
    s.check_usable("barrier");
    NT_CHECK(!is_dry_run() || s.launcher == "stand-in", "ProcessGroup::barrier: a dry run (core/dry_run.h) cannot ",
             "wait for other processes: expected a stand-in group (ProcessGroup::stand_in), got one started by ",
             s.launcher);
#if NORMTAPE_WITH_MPI
    if (s.launcher == "mpi") {
        auto w = std::make_unique<detail::WorkState>();
        w->group = &s;
        w->number = s.begin();
        w->what = "barrier";
        MPI_CHECK(MPI_Ibarrier(s.comm, &w->request));
        Work(std::move(w)).wait();
        return;
    }
#endif
    if (s.launcher == "stand-in") {
        NT_CHECK(is_dry_run(), "ProcessGroup::barrier: a stand-in group (ProcessGroup::stand_in) serves dry runs only "
                 "(core/dry_run.h), got a barrier outside one");
        s.begin();
        return;
    }
    if (s.launcher == "torchrun") {
        Tensor one = zeros({1}, TensorOptions().dtype(DType::F32).device(Device::cuda(s.device_index)));
        all_reduce(one);
        synchronize(Device::cuda(s.device_index));
        return;
    }
    s.begin();  // one process: nothing to wait for
}

}  // namespace normtape
